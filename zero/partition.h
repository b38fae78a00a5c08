#pragma once
// zero/'s one internal header: the trainable parameters of a model,
// flattened into buckets and sharded across the data-parallel ranks.
//
// Note [Flat layout]: parameters of one group are laid out in reverse
// registration order (the order backward produces their gradients) and cut
// into buckets of at most reduce_bucket_size elements (a larger parameter
// gets a bucket of its own); a bucket never mixes parameter groups. Each
// bucket is padded to a multiple of the number of owners (the world size at
// stages 1-3, 1 at stage 0) and rank r owns the r-th contiguous shard of
// every bucket, ignoring parameter boundaries (Megatron's distributed
// optimizer). A rank's partition is its shards of all buckets; one
// reduce-scatter per bucket lands exactly on it, one all-gather per bucket
// rebuilds the bucket.
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "zero/comm.h"

namespace zero::partition {

struct Options {
  int stage = 0;
  int64_t bucket_numel = 500000000;
  at::ScalarType dtype = at::kFloat;  // training dtype of the parameters
  bool overlap_comm = false;          // reduce buckets while backward goes on
};

struct Bucket {
  int group = 0;
  int64_t offset = 0;           // in the flat buffer
  int64_t numel = 0;            // padded to a multiple of the owners
  int64_t shard_numel = 0;      // numel / owners
  std::vector<int> params;      // indices into ShardedParams' parameter list
  // Per backward:
  int pending = 0;              // parameters whose gradient has not arrived
  bool launched = false;
  bool fresh_output = false;    // stage 2: reduce straight into the partition
  comm::WorkHandle work;
  at::Tensor staging;           // stage 2: the bucket's gradients until reduced (a slice of staging_base)
  at::Tensor staging_base;      // stage 2: a pooled buffer of the largest bucket's size
  at::Tensor reduced;           // stage 2: reduce-scatter output, added to the partition
};

struct Param {
  std::string name;
  at::Tensor tensor;            // the model's parameter (a view into the flat buffer)
  int bucket = 0;
  int64_t offset = 0;           // in the flat buffer
  bool fired = false;           // its gradient arrived in this backward
  std::shared_ptr<torch::autograd::Node> accumulator;  // keeps the hook alive
};

// The trainable parameters of a model, flattened and sharded (Note [Flat layout]).
class ShardedParams {
 public:
  struct Group {
    std::vector<std::string> names;
    std::vector<at::Tensor> params;
  };
  ShardedParams(std::vector<Group> groups, std::shared_ptr<comm::ProcessGroup> pg, Options options);
  ~ShardedParams();
  ShardedParams(const ShardedParams&) = delete;
  ShardedParams& operator=(const ShardedParams&) = delete;

  // Brackets each micro-step's backward. `boundary`: the last micro-step
  // before an optimizer step (stages 0-1 reduce only then).
  void begin_backward(bool boundary);
  void end_backward();

  // Per parameter group, the fp32 tensors the optimizer updates: this
  // rank's shard of each bucket of the group (all of it at stage 0).
  const std::vector<std::vector<at::Tensor>>& master() const { return master_; }
  // Gives each master tensor its fp32 gradient (the reduced gradient of its shard).
  void attach_master_grads();
  void detach_master_grads();
  // Over this rank's master gradients (attached): sum of squares, finiteness, scaling.
  double local_grad_sq_norm() const;
  bool local_grads_finite() const;
  void scale_master_grads(double factor);
  // Copies the updated master weights into the parameters and all-gathers them.
  void publish();
  void zero_grads();

  int owners() const { return owners_; }
  int64_t numel() const { return numel_; }            // trainable elements, unpadded
  int64_t flat_numel() const { return flat_numel_; }  // padded
  int64_t partition_numel() const { return partition_numel_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  int64_t param_bytes() const;
  int64_t grad_bytes() const;
  int64_t master_bytes() const;

 private:
  friend struct GradReadyHook;
  void on_grad_ready(int index);
  void launch_in_order();
  void launch(Bucket& bucket);
  void finish(Bucket& bucket);
  void acquire_staging(Bucket& bucket);
  at::Tensor my_shard(const at::Tensor& flat, const Bucket& bucket) const;
  at::Tensor partition_slice(const Bucket& bucket) const;

  std::shared_ptr<comm::ProcessGroup> pg_;
  Options options_;
  int owners_ = 1;
  int rank_in_owners_ = 0;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> partition_offset_;  // per bucket: where its shard sits in the partition
  int64_t numel_ = 0, flat_numel_ = 0, partition_numel_ = 0;
  at::Tensor flat_params_;   // training dtype, all buckets
  at::Tensor flat_grads_;    // stages 0-1: full gradient buffer (training dtype)
  at::Tensor partition_grads_;  // stage 2: this rank's reduced gradients (training dtype)
  std::vector<at::Tensor> staging_pool_;   // stage 2: free bucket buffers
  int64_t staging_bytes_ = 0;
  int64_t max_bucket_numel_ = 0;
  std::vector<std::vector<at::Tensor>> master_;
  std::vector<at::Tensor> master_flat_;    // per bucket, same tensors as master_
  bool in_backward_ = false;
  bool boundary_ = false;
  bool partition_fresh_ = true;  // stage 2: nothing accumulated since zero_grads
  size_t next_launch_ = 0;
};

}  // namespace zero::partition
