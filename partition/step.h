#pragma once
// What the partition's optimizer step asks of an optimizer, and what it
// answers the engine (Note [The step] in step.cpp). Apart from partition.h
// so that an optimizer sees only this: no MasterStore, no buckets' memory.
#include <ATen/Tensor.h>

#include <cstddef>

namespace zero::partition {

// The update of the master weights, as the partition's step drives it. Its
// tensors are the master tensors in bucket order: tensor k is bucket k's.
class BucketOptimizer {
 public:
  virtual ~BucketOptimizer() = default;
  // Whether it reads the gradients in the training dtype (the fused host
  // kernels widen them as they read); otherwise the partition widens them
  // to fp32 first.
  virtual bool reads_training_dtype() const = 0;
  // Whether update(k, target) updates master tensor k by itself (an
  // elementwise kernel), so that the partition sends each bucket on as
  // soon as it is updated. Otherwise begin_step() updates every tensor at
  // once (torch::optim's step takes them all; Lamb's trust ratios are
  // all-reduced across the ranks) and the partition sends them after.
  virtual bool per_bucket() const = 0;
  // Once per step, before any bucket: every gradient element is to be
  // multiplied by `grad_scale` (the loss scale's inverse times the
  // clipping coefficient) as it is read.
  virtual void begin_step(double grad_scale) = 0;
  // per_bucket(): updates master tensor k from its gradient and writes the
  // new values to `target` (in target's dtype) when it is defined.
  virtual void update(size_t k, const at::Tensor& target) = 0;
};

// One optimizer step as the engine asks for it.
struct StepRequest {
  double loss_scale = 1.0;  // fp16: the gradients carry it; the update divides it out
  bool skip_if_not_finite = false;  // fp16: an overflow on any rank skips the step on every rank
  double clip = 0.0;  // gradient_clipping: the bound of the global norm; 0: none
};

struct StepResult {
  bool skipped = false;          // the gradients were not finite: nothing was updated
  double norm = 0.0;             // the global L2 norm of the unscaled gradients (0 when skipped)
  double publish_seconds = 0.0;  // of the step, sending the updated parameters on
  // A per-bucket optimizer: seconds in update() for the buckets whose
  // master weights are on the host (all of them without offload), and
  // offload_optimizer "nvme": seconds waiting for the files.
  double host_update_seconds = 0.0;
  double nvme_wait_seconds = 0.0;
};

}  // namespace zero::partition
