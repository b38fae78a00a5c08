#pragma once
// The partition's main header: the trainable parameters of a model,
// flattened into buckets and sharded across the data-parallel ranks.
//
// The pieces, each in its own file: the flat layout (flat_layout.h, Note
// [Flat layout]: buckets, offsets, shards), the gradient strategy of each
// stage (grad_reducer.h), the host copies of offloaded gradients
// (host_grads.h), the gradient norm (grad_norm.h), the parameters' memory
// with stage 3's release and gather (param_storage.h), the master weights
// and their way back to the parameters (master_store.h, Notes [Offload
// copies] and [Partial offload]) and the units' schedule (units.cpp).
// ShardedParams holds them together: it builds them from the model's
// parameters, and runs the optimizer step of its buckets from their reduced
// gradients to the new parameters (step.cpp, Note [The step]).
//
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/torch_compat.h"
#include "offload/swapped_tensors.h"
#include "zero/choices.h"
#include "zero/comm.h"
#include "partition/flat_layout.h"
#include "partition/grad_norm.h"
#include "partition/grad_reducer.h"
#include "partition/host_grads.h"
#include "partition/master_store.h"
#include "partition/param_storage.h"
#include "partition/step.h"
#include "zero/unit.h"

namespace zero::partition {

class ConstructionParts;

struct Options {
  int stage = 0;
  int64_t bucket_numel = 500000000;
  at::ScalarType dtype = at::kFloat;  // training dtype of the parameters
  bool overlap_comm = false;          // reduce buckets while backward goes on
  // Stage 3
  int64_t persistence_threshold = 100000;  // buckets smaller than this stay gathered
  int64_t prefetch_numel = 50000000;       // stage3_prefetch_bucket_size
  int64_t max_live_numel = 1000000000;     // stage3_max_live_parameters
  int64_t max_reuse_numel = 1000000000;    // stage3_max_reuse_distance (Note [Reuse distance] in units.cpp)
  // ZeRO++ (stage 3)
  int64_t quantized_weights_block = 0;     // qwZ: StorageOptions::quantized_block
  std::shared_ptr<comm::ProcessGroup> secondary_group;           // hpZ: StorageOptions::secondary_group
  std::shared_ptr<QuantizedReduceScatter> quantized_gradients;   // qgZ: ReducerOptions::quantized
  // The ranks whose gradients together make the model's (Note [Gradient
  // norm]): the world, which is larger than the data-parallel group with
  // tensor or pipeline parallelism. Null: the data-parallel group.
  std::shared_ptr<comm::ProcessGroup> norm_group;
  // offload_optimizer (Note [Offload copies])
  bool offload_optimizer = false;
  double offload_ratio = 1.0;              // Note [Partial offload]
  bool pin_memory = false;                 // page-locked host tensors (with CUDA parameters)
  // offload_optimizer "nvme": the host master weights go to files as each
  // bucket's is made; the optimizer's states join them (Note [The step]).
  std::optional<offload::SwapOptions> master_swap;
  // With master_swap: the step brings them back in sub-groups of about this
  // many elements (zero_optimization.sub_group_size).
  int64_t sub_group_numel = 1000000000;
  // With master_swap: the reduced gradients of host buckets live in its
  // files too (Note [Gradients on NVMe] in host_grads.h).
  bool grads_on_nvme = false;
  // Copy the reduced gradients of offloaded buckets to host tensors even
  // when the parameters are in host memory (CPU ranks), as an accelerator
  // needs: the same bookkeeping runs, and is tested, without one.
  bool host_grad_copies = false;
  // offload_param (stage 3): "none", "cpu" (the shards of released buckets
  // live in host memory) or "nvme" (in files, read back for each gather).
  OffloadDevice offload_param = OffloadDevice::none;
  offload::SwapOptions param_swap;         // with "nvme"
  // Parameters partitioned as they were built (zero::Init, Note
  // [Partitioned construction]): each is gathered from its parts when its
  // bucket is filled. None: every parameter is whole.
  std::shared_ptr<ConstructionParts> parts;
};

class UnitScheduler;

// The trainable parameters of a model, flattened and sharded (Note [Flat layout]).
class ShardedParams {
 public:
  struct Group {
    std::vector<std::string> names;
    std::vector<at::Tensor> params;
    std::vector<int> units;  // per parameter: its stage-3 unit, -1 for none
    // Per parameter: how many ranks of the norm group outside the
    // data-parallel group hold the same gradient (tp for a parameter every
    // tensor-parallel rank holds whole, times the pipeline stages sharing
    // a tie; Note [Gradient norm]). Empty: all 1.
    std::vector<int> replicas;
  };
  ShardedParams(std::vector<Group> groups, std::shared_ptr<comm::ProcessGroup> pg, Options options);
  ~ShardedParams();
  ShardedParams(const ShardedParams&) = delete;
  ShardedParams& operator=(const ShardedParams&) = delete;

  // Brackets each micro-step's backward. `boundary`: the last micro-step
  // before an optimizer step (stages 0-1 reduce only then).
  void begin_backward(bool boundary);
  void end_backward();

  // The optimizer step of every bucket, from the reduced gradients to the
  // new parameters (Note [The step] in step.cpp). A collective. The
  // gradients are cleared after it, skipped or not.
  StepResult step(BucketOptimizer& optimizer, const StepRequest& request);

  // Note [Updates in backward] (step.cpp): the next backward, a boundary's,
  // updates each bucket as soon as its reduction is complete; step() then
  // does the rest. Only for an update that needs no global norm: the
  // caller has checked that nothing clips or skips. `grad_scale`: what
  // begin_step() gets; `on_host_threads` runs the host kernels where the
  // step would (the rank's threads). The optimizer must update bucket by
  // bucket, and every bucket be on the host (no partial offload).
  using HostThreads = std::function<void(const std::function<void()>&)>;
  void update_in_backward(BucketOptimizer& optimizer, double grad_scale, HostThreads on_host_threads);
  // An update in backward has begun and step() has not finished it.
  bool step_in_progress() const { return early_ != nullptr; }
  // After a failed backward: waits for the reads and writes in flight and
  // forgets the update in backward (the buckets updated stay updated).
  void abandon_update_in_backward() noexcept;

  // The fp32 tensors the optimizer updates, per bucket this rank's shard
  // (all of it at stage 0), and their way back to the parameters.
  MasterStore& masters() { return masters_; }
  const MasterStore& masters() const { return masters_; }
  // Host bytes offload keeps besides master weights and states: the
  // gradient shard's copy and the staging buffers.
  int64_t offload_buffer_bytes() const;
  // offload_param: bytes of parameter shards in host memory, and on NVMe.
  int64_t offloaded_param_bytes(bool nvme) const { return storage_.offloaded_bytes(nvme); }
  void zero_grads() { reducer_->zero(); }
  // Bucket k's gradient as reduced over the data-parallel group (this rank's
  // shard; the whole bucket at stage 0), before step(); undefined where
  // offload already moved it to the host.
  at::Tensor reduced_grad(size_t k) { return reducer_->shard_grad(k); }

  // Stage 3 (Note [Stage 3 storage] in param_storage.h).
  // Gathers the released buckets holding any of `tensors`; returns them.
  std::vector<int> gather_buckets_of(const std::vector<at::Tensor>& tensors);
  void release_buckets(const std::vector<int>& buckets);
  // Installs the unit hooks on `units` (index = unit id).
  void attach_units(const std::vector<UnitBase*>& units);

  const FlatLayout& layout() const { return layout_; }
  // For optimizers that need whole-parameter norms (Lamb): per master tensor
  // (bucket by bucket, so group by group as masters().by_group() lists them) the
  // pieces of parameters in it.
  std::vector<std::vector<FlatLayout::Piece>> master_pieces() const { return layout_.shard_pieces(); }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  const std::string& param_name(int64_t i) const { return layout_.params()[i].name; }

  // Note [Checkpoint layout] (ckpt/checkpoint.h): the pieces of parameters
  // in this rank's master tensors, in model space.
  std::vector<FlatLayout::Fragment> fragments() const { return layout_.fragments(); }
  // Mid-accumulation checkpoints: the gradient accumulated so far, as this
  // rank holds it, and its restoration (GradReducer::accumulated).
  at::Tensor accumulated_grads() { return reducer_->accumulated(); }
  void restore_accumulated_grads(const at::Tensor& grads) { reducer_->restore(grads); }

  int owners() const { return layout_.owners(); }
  const Options& options() const { return options_; }
  int64_t numel() const { return layout_.numel(); }            // trainable elements, unpadded
  int64_t partition_numel() const { return layout_.partition_numel(); }
  size_t num_buckets() const { return layout_.buckets().size(); }
  int64_t param_bytes() const { return storage_.bytes(); }
  int64_t gathered_param_peak() const { return storage_.gathered_peak(); }  // stage 3's units, since construction
  int64_t gathered_param_bytes() const { return storage_.gathered_bytes(); }  // stage 3's units, now
  double gather_wait_seconds() const { return storage_.wait_seconds(); }    // stage 3's units, since construction
  int64_t grad_bytes() const { return reducer_->bytes(); }

 private:
  friend struct GradReadyHook;
  struct Param {
    at::Tensor tensor;  // the model's parameter (a view into its bucket's buffer)
    compat::GradAccumulatorPtr accumulator;  // keeps the hook alive (Note [LibTorch 1.13 and 2.x])
  };
  void on_grad_ready(int index);
  void build_buckets(const std::vector<at::Tensor>& tensors);
  void hook_grad(int index);  // on_grad_ready after the parameter's AccumulateGrad
  at::Device device_of(const at::Tensor& param) const;  // where it was built (zero::Init leaves no memory behind it)
  // step(): each master tensor's gradient and its squares, and their removal.
  void attach_master_grads(bool widen);
  void attach_bucket(size_t k, bool widen);
  void detach_master_grads();
  double global_squares();
  // step(): the per-bucket optimizer's loop over the buckets.
  class UpdateRun;
  // Returns the first failed NVMe transfer, or "" (Note [A failed transfer in the step]).
  std::string update_buckets(BucketOptimizer& optimizer, StepResult& result);
  void update_bucket(BucketOptimizer& optimizer, size_t k);
  // Note [Updates in backward].
  struct EarlyStep;
  void attach_through(size_t buckets);  // attach, then update what is whole
  StepResult finish_early_step(const StepRequest& request, std::string& failure);
  void agree_on_transfers(const std::string& failure);
  std::unique_ptr<EarlyStep> early_;
  std::shared_ptr<comm::ProcessGroup> pg_;
  Options options_;
  FlatLayout layout_;
  std::vector<Param> params_;    // in the layout's order
  ParamStorage storage_;         // the buckets' memory
  MasterStore masters_;
  std::unique_ptr<HostGrads> host_grads_;  // offload_optimizer: the host copies of reduced gradients
  std::unique_ptr<GradReducer> reducer_;   // the stage's strategy
  GradSquares squares_;                    // of the attached gradients
  std::shared_ptr<UnitScheduler> scheduler_;  // stage 3
  std::vector<UnitBase*> units_;
  bool in_backward_ = false;
};

// Stage 3: gathers and releases units around their forward and backward,
// with prefetch along the order recorded in the previous step (units.cpp).
class UnitScheduler : public UnitHooks, public std::enable_shared_from_this<UnitScheduler> {
 public:
  UnitScheduler(ParamStorage& storage, const FlatLayout& layout, const Options& options, int units);
  void pre_forward(int unit) override;
  void post_forward(int unit, const at::Tensor& output) override;
  void pre_backward(int unit);
  void begin_backward();
  void end_step();  // after backward: the recorded order becomes the prefetch plan

 private:
  void gather_unit(int unit, bool async);
  void release_unit(int unit);
  void prefetch_after(int position, bool backward);
  bool reused_within_distance(int position) const;
  int64_t unit_numel(int unit) const;

  ParamStorage& storage_;
  const FlatLayout& layout_;
  const Options& options_;
  std::vector<std::vector<int>> buckets_of_;  // unit -> its buckets
  std::vector<int> plan_;       // forward order of the previous step
  std::vector<int> trace_;      // forward order of this step
  std::vector<bool> backward_seen_;  // per forward position: its backward has started
  bool in_backward_ = false;         // forwards now are recomputes (activation checkpointing)
  bool plan_valid_ = false;
  bool warned_ = false;
};

}  // namespace zero::partition
