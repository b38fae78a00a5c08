// ShardedParams::step: one optimizer step of the partition, from the reduced
// gradients of its buckets to the new parameters.
//
// Note [The step]: the engine calls ShardedParams::step once per optimizer
// step, at the accumulation boundary, with its optimizer (a BucketOptimizer)
// and a StepRequest (the fp16 loss scale and the clipping bound); nothing
// of the step returns to the engine before it ends. In order:
// 1. Attach: each bucket's master tensor gets its reduced gradient
//    (GradReducer::shard_grad, this rank's shard; the whole bucket at stage
//    0), or with offload the host copy (Note [Offload copies]). It stays in
//    the training dtype where the optimizer reads that (the fused host
//    kernels), and is widened to fp32 for torch::optim.
// 2. Squares: each bucket's sum of squares is added once, where the
//    gradient lies, times the bucket's norm weight (Note [Gradient norm]).
// 3. Norm: the sum is all-reduced over the norm group (the world with
//    tensor or pipeline parallelism) when more than one rank holds a part
//    of it. Not finite: with fp16 every rank skips the step, the gradients
//    are cleared and the caller lowers the loss scale.
// 4. Clip: the norm of the unscaled gradients gives the clipping
//    coefficient (as torch::nn::utils::clip_grad_norm_), which with the
//    loss scale's inverse makes one factor.
// 5. Update: the optimizer updates master tensor k, which is bucket k's,
//    multiplying its gradient by the factor as it reads it. A host
//    optimizer writes each updated bucket in the training dtype where
//    MasterStore::update_target(k) says and sends it on at once
//    (send_updated: the bucket's all-gather, or its write to NVMe), while
//    it updates the next one.
// 6. Publish: MasterStore::publish() sends the buckets not yet sent (from
//    the fp32 master weights, converted) and waits until every bucket's
//    parameters are whole again.
// 7. Clear: the master tensors drop their gradients, the reducer's buffers
//    start the next accumulation from zero.
#include <torch/torch.h>

#include <chrono>
#include <cmath>

#include "core/fault.h"
#include "partition/partition.h"

namespace zero::partition {

StepResult ShardedParams::step(BucketOptimizer& optimizer, const StepRequest& request) {
  StepResult result;
  attach_master_grads(/*widen=*/!optimizer.reads_training_dtype());
  const double squares = global_squares();
  if (request.skip_if_not_finite && !std::isfinite(squares)) {
    result.skipped = true;
    detach_master_grads();
    zero_grads();
    return result;
  }
  result.norm = std::sqrt(squares) / request.loss_scale;
  double factor = 1.0 / request.loss_scale;
  if (request.clip > 0) {
    const double coef = request.clip / (result.norm + 1e-6);  // as torch::nn::utils::clip_grad_norm_
    if (coef < 1.0) factor *= coef;
  }
  optimizer.update(masters_, factor);
  detach_master_grads();
  const auto publish_start = std::chrono::steady_clock::now();
  masters_.publish();
  result.publish_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - publish_start).count();
  zero_grads();
  return result;
}

// Each bucket's gradient is attached and its squares added once per step
// (Note [Gradient norm] in partition/grad_norm.h).
void ShardedParams::attach_master_grads(bool widen) {
  squares_.reset();
  if (host_grads_) host_grads_->wait();  // copies started during backward land before the host reads them
  for (size_t k = 0; k < num_buckets(); ++k) {
    const double weight = layout_.buckets()[k].norm_weight;
    if (host_grads_ && host_grads_->off_device(k)) {  // its host copy is complete
      masters_.tensors()[k].mutable_grad() = host_grads_->for_step(k);
      if (host_grads_->device_squares(k).defined()) {
        squares_.add_device_sum(host_grads_->device_squares(k), weight);
      } else {
        squares_.add(masters_.tensors()[k].grad(), weight);
      }
      continue;
    }
    at::Tensor grad = reducer_->shard_grad(k);
    if (options_.offload_optimizer) {
      // The host optimizer reads the gradient in the training dtype (Note
      // [Offload copies]); stages 2-3 copied it when the bucket was reduced.
      // A bucket updated on the accelerator (Note [Partial offload]) keeps it
      // there, in the training dtype too. Squared where it was reduced.
      squares_.add(grad, weight);
      if (host_grads_->copied(k)) {
        if (!host_grads_->holds(k)) host_grads_->copy_from(k, grad, /*non_blocking=*/false);
        grad = host_grads_->copy(k);
      }
      masters_.tensors()[k].mutable_grad() = grad;
      continue;
    }
    if (widen && grad.scalar_type() != at::kFloat) grad = grad.to(at::kFloat);
    masters_.tensors()[k].mutable_grad() = grad;
    squares_.add(grad, weight);
  }
}

void ShardedParams::detach_master_grads() {
  for (auto m : masters_.tensors()) m.mutable_grad() = at::Tensor();
  if (host_grads_) host_grads_->clear();
}

// The sum over the norm group (Note [Gradient norm]): all-reduced when it
// reaches beyond the data-parallel group or the shards split the gradient.
double ShardedParams::global_squares() {
  at::Tensor sum = torch::tensor({squares_.total()}, torch::kDouble);
  comm::ProcessGroup& group = options_.norm_group ? *options_.norm_group : *pg_;
  if (group.size() > pg_->size() || owners() > 1) group.all_reduce(sum, comm::ReduceOp::Sum);
  fault::reached("step.reduced", group.rank());
  return sum.item<double>();
}

}  // namespace zero::partition
