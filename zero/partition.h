#pragma once
// zero/'s one internal header: the trainable parameters of a model,
// flattened into buckets and sharded across the data-parallel ranks.
//
// Note [Flat layout]: parameters of one group are laid out in reverse
// registration order (the order backward produces their gradients) and cut
// into buckets of at most reduce_bucket_size elements (a larger parameter
// gets a bucket of its own); a bucket never mixes parameter groups or stage-3
// units. Each bucket is padded to a multiple of the number of owners (the
// world size at stages 1-3, 1 at stage 0) and rank r owns the r-th
// contiguous shard of every bucket, ignoring parameter boundaries
// (Megatron's distributed optimizer). A rank's partition is its shards of all
// buckets; one reduce-scatter per bucket lands exactly on it, one all-gather
// per bucket rebuilds the bucket. Each bucket's parameters are views into
// the bucket's own buffer (`full`).
//
// Note [Stage 3 storage]: at stage 3 a bucket of a unit keeps only its shard
// between uses; `full` keeps its tensor (and the parameters their views)
// while its storage is emptied (set_data_ptr_noswap, nbytes 0) and refilled
// by an all-gather before the unit's forward and backward. Autograd's saved
// tensors point at the same storage, so backward sees the refilled data.
// Buckets of the root unit (parameters outside every unit, or shared by
// several units) and buckets smaller than stage3_param_persistence_threshold
// stay gathered.
//
// Note [Offload copies]: with offload_optimizer the master weights (and the
// optimizer's states, made by the optimizer beside them) live in host
// memory, apart from the parameters even in fp32 when the parameters are on
// an accelerator. The reduced gradients stay in the training dtype: copied
// to host tensors as each bucket is reduced when the parameters are on an
// accelerator, read in place when they are in host memory; the host
// optimizer widens them and applies the loss scale and clipping as it reads
// them (no fp32 copy, no pass of their own). The updated parameters go the
// other way bucket by bucket while the optimizer updates the next bucket
// (update_target, updated): the optimizer writes a bucket's shard in the
// training dtype, in the same pass, straight into the shard when the shard
// is in host memory (CPU ranks, offload_param), or else into one of two
// page-locked staging buffers, copied to the accelerator asynchronously; a
// bucket that stays gathered starts its all-gather at once. No host copy of
// the whole partition in the training dtype is kept.
// At stages 2-3 a bucket whose gradients go to the host has no part in the
// accelerator's gradient partition at all: its reduce-scatter lands in a
// temporary that is copied to the host at once, and its sum of squares is
// taken there from that temporary. With gradient accumulation (or a second
// backward before the step) the next micro-step adds to the host copy
// through the accelerator, as DeepSpeed does: a round trip over the bus per
// micro-step buys the accelerator the offloaded share's gradients, which
// for a model that barely fits is the difference between training and
// running out of memory.
//
// Note [Partial offload]: offload_ratio below 1 (DeepSpeed's
// offload_optimizer.ratio, ZeRO-Offload++'s "Twin-Flow") offloads only the
// first buckets in flat order, whole buckets, until about that share of the
// partition's elements is on the host: the layers whose gradients arrive
// first, so their copies to the host overlap the rest of backward. The
// other buckets keep their master weights and states where the parameters
// are and are updated there while the host updates its share; their
// gradients stay in the training dtype too (the optimizer widens one bucket
// at a time). With NVMe offload only the host share is swapped to files.
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <c10/core/Event.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "offload/swapped_tensors.h"
#include "zero/comm.h"
#include "zero/unit.h"

namespace zero::partition {

struct Options {
  int stage = 0;
  int64_t bucket_numel = 500000000;
  at::ScalarType dtype = at::kFloat;  // training dtype of the parameters
  bool overlap_comm = false;          // reduce buckets while backward goes on
  // Stage 3
  int64_t persistence_threshold = 100000;  // buckets smaller than this stay gathered
  int64_t prefetch_numel = 50000000;       // stage3_prefetch_bucket_size
  int64_t max_live_numel = 1000000000;     // stage3_max_live_parameters
  // offload_optimizer (Note [Offload copies])
  bool offload_optimizer = false;
  double offload_ratio = 1.0;              // Note [Partial offload]
  bool pin_memory = false;                 // page-locked host tensors (with CUDA parameters)
  bool offload_master_to_disk = false;     // NVMe: the master weights are not resident, so fp32 gets copies too
  // Copy the reduced gradients of offloaded buckets to host tensors even
  // when the parameters are in host memory (CPU ranks), as an accelerator
  // needs: the same bookkeeping runs, and is tested, without one.
  bool host_grad_copies = false;
  // offload_param (stage 3): "none", "cpu" (the shards of released buckets
  // live in host memory) or "nvme" (in files, read back for each gather).
  std::string offload_param = "none";
  offload::SwapOptions param_swap;         // with "nvme"
};

struct Bucket {
  int group = 0;
  int unit = -1;                // stage 3: the unit it belongs to (-1: root)
  int64_t offset = 0;           // in the flat index space
  int64_t numel = 0;            // padded to a multiple of the owners
  int64_t shard_numel = 0;      // numel / owners
  std::vector<int> params;      // indices into ShardedParams' parameter list
  at::Tensor full;              // the parameters' buffer (training dtype)
  at::Tensor shard;             // this rank's shard of it (a view at stages 0-2)
  bool persistent = true;       // stage 3: stays gathered
  bool gathered = true;
  comm::WorkHandle gather_work; // stage 3: a gather in flight
  // Per backward:
  int pending = 0;              // parameters whose gradient has not arrived
  bool launched = false;
  bool fresh_output = false;    // stages 2-3: reduce straight into the partition
  comm::WorkHandle work;
  at::Tensor staging;           // stages 2-3: the bucket's gradients until reduced (slice of staging_base)
  at::Tensor staging_base;      // a pooled buffer of the largest bucket's size
  at::Tensor reduced;           // reduce-scatter output, added to the partition
  int swap_id = -1;             // offload_param "nvme": the shard's id in the parameter store
  bool master_on_host = false;  // offload: its master weights and states live in host memory (Note [Partial offload])
  bool grad_copied = false;     // offload: its reduced gradients are copied to a host tensor for the optimizer
  bool grad_off_device = false; // ... and have no slice of the device's partition (Note [Offload copies])
  bool grad_on_host = false;    // offload: the host copy holds this step's reduced gradients
  at::Tensor grad_sq;           // grad_off_device on an accelerator: the host copy's sum of squares, there
  bool read_pending = false;    // offload_param "nvme": a prefetch's read is in flight, its all-gather not started
  bool read_ahead = false;      // offload_param "nvme": its shard is being read for the next prefetch (not gathered yet)
  at::Tensor gather_input;      // the shard on the parameters' device while a gather runs
};

struct Param {
  std::string name;
  at::Tensor tensor;            // the model's parameter (a view into its bucket's buffer)
  int bucket = 0;
  int64_t offset = 0;           // in the flat index space
  bool fired = false;           // its gradient arrived in this backward
  std::shared_ptr<torch::autograd::Node> accumulator;  // keeps the hook alive
};

class UnitScheduler;

// The trainable parameters of a model, flattened and sharded (Note [Flat layout]).
class ShardedParams {
 public:
  struct Group {
    std::vector<std::string> names;
    std::vector<at::Tensor> params;
    std::vector<int> units;  // per parameter: its stage-3 unit, -1 for none
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
  // Gives each master tensor its gradient (the reduced gradient of its
  // shard): fp32, or with offload in the training dtype (Note [Offload copies]).
  void attach_master_grads();
  void detach_master_grads();
  double local_grad_sq_norm() const;
  bool local_grads_finite() const;
  void scale_master_grads(double factor);  // not with offload: the host optimizer scales
  // Copies the master weights into the parameters (all-gathering the
  // buckets that stay gathered).
  void publish();
  // publish() of one bucket (index into buckets()): the all-gather it
  // started, if any, for the caller to wait on.
  comm::WorkHandle publish_bucket(size_t k);
  // offload_param "nvme": waits for the shard writes publish_bucket started.
  void wait_param_writes();
  // offload_optimizer (Note [Offload copies]): the host tensor the host
  // optimizer writes bucket k's updated shard to (undefined: the master
  // weights are the parameters); updated(k) once it is written starts its
  // way to the parameters; finish_updates() waits for all of it.
  at::Tensor update_target(size_t k);
  void updated(size_t k);
  void finish_updates();
  // Host bytes offload keeps besides master weights and states: the
  // gradient shard's copy and the staging buffers.
  int64_t offload_buffer_bytes() const;
  // offload_param: bytes of parameter shards in host memory, and on NVMe.
  int64_t offloaded_param_bytes(bool nvme) const;
  void zero_grads();

  // Stage 3 (Note [Stage 3 storage]).
  void gather(Bucket& bucket, bool async);
  void start_gather(Bucket& bucket);  // the all-gather, once the shard is in memory
  void read_ahead(Bucket& bucket);    // offload_param "nvme": start reading the shard for a later gather
  void wait_gathered(Bucket& bucket);
  void release(Bucket& bucket);
  void release_all_unpersistent();
  // Gathers the released buckets holding any of `tensors`; returns them.
  std::vector<int> gather_buckets_of(const std::vector<at::Tensor>& tensors);
  // Installs the unit hooks on `units` (index = unit id).
  void attach_units(const std::vector<UnitBase*>& units);

  // For optimizers that need whole-parameter norms (Lamb): per master tensor
  // (group by group, as master() lists them) the pieces of parameters in it,
  // as {parameter index, start in the shard, length}.
  struct Piece {
    int64_t param, start, length;
  };
  std::vector<std::vector<Piece>> master_pieces() const;
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  const Param& param(int64_t i) const { return params_[i]; }

  // Note [Checkpoint layout] (ckpt/checkpoint.h): the pieces of parameters
  // in this rank's master tensors, in model space.
  struct Fragment {
    int64_t param;         // index into the parameter list
    int64_t param_offset;  // first element in the flattened parameter
    int64_t bucket;        // master tensor (one per bucket, master_tensors()[bucket])
    int64_t start;         // first element in that master tensor
    int64_t length;
  };
  std::vector<Fragment> fragments() const;
  const std::vector<at::Tensor>& master_tensors() const { return master_flat_; }
  // Mid-accumulation checkpoints: the gradient accumulated so far, as this
  // rank holds it (stages 0-1: the whole unreduced buffer; stages 2-3: the
  // reduced partition), and its restoration.
  at::Tensor accumulated_grads() const;
  void restore_accumulated_grads(const at::Tensor& grads);

  int owners() const { return owners_; }
  int stage() const { return options_.stage; }
  const Options& options() const { return options_; }
  int64_t numel() const { return numel_; }            // trainable elements, unpadded
  int64_t flat_numel() const { return flat_numel_; }  // padded
  int64_t partition_numel() const { return partition_numel_; }
  std::vector<Bucket>& buckets() { return buckets_; }
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
  static at::Tensor squares_on_device(const at::Tensor& grad);  // a 0-d sum on grad's device
  void add_squares_on_device(const at::Tensor& sum);              // into device_grad_sq_
  void wait_for_host_grad_copies() const;
  void grad_to_host(Bucket& bucket, const at::Tensor& reduced);
  bool squared_on_device(size_t k) const;
  double host_grad_sq() const;
  at::Tensor partition_slice(const Bucket& bucket) const;

  std::shared_ptr<comm::ProcessGroup> pg_;
  Options options_;
  int owners_ = 1;
  int rank_in_owners_ = 0;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> partition_offset_;  // per bucket: where its shard sits in the partition
  int64_t numel_ = 0, flat_numel_ = 0, partition_numel_ = 0;
  int64_t partition_grad_numel_ = 0;       // of partition_grads_: the buckets with a slice there
  at::Tensor flat_grads_;       // stages 0-1: full gradient buffer (training dtype)
  at::Tensor partition_grads_;  // stages 2-3: this rank's reduced gradients (training dtype), but grad_off_device buckets'
  std::vector<at::Tensor> staging_pool_;   // free bucket buffers
  int64_t staging_bytes_ = 0;
  size_t staging_buffers_ = 0;
  int64_t max_bucket_numel_ = 0;
  std::vector<std::vector<at::Tensor>> master_;
  std::vector<at::Tensor> master_flat_;    // per bucket, same tensors as master_
  std::vector<at::Tensor> master_grads_;   // offload: per bucket, host gradients (training dtype; none on CPU ranks)
  at::Tensor device_grad_sq_;              // offload with an accelerator: their sum of squares, summed there
  mutable std::optional<double> host_grad_sq_;  // host gradients' sum of squares, once per step (host_grad_sq)
  // Note [Offload copies]: page-locked buffers for updated shards on their
  // way to the accelerator, each free once its copy has run (`copied`).
  struct Staging {
    at::Tensor buffer;
    std::unique_ptr<c10::Event> copied;
    int bucket = -1;  // the bucket it holds until updated()
  };
  std::vector<Staging> update_staging_;
  size_t next_staging_ = 0;
  std::vector<comm::WorkHandle> update_works_;  // all-gathers updated() started
  std::unique_ptr<offload::SwappedTensors> param_store_;  // offload_param "nvme"
  std::vector<int> param_writes_;                         // shard writes in flight
  std::shared_ptr<UnitScheduler> scheduler_;  // stage 3
  std::vector<UnitBase*> units_;
  bool in_backward_ = false;
  bool boundary_ = false;
  bool partition_fresh_ = true;
  size_t next_launch_ = 0;
};

// Stage 3: gathers and releases units around their forward and backward,
// with prefetch along the order recorded in the previous step (units.cpp).
class UnitScheduler : public UnitHooks, public std::enable_shared_from_this<UnitScheduler> {
 public:
  UnitScheduler(ShardedParams& params, int units);
  void pre_forward(int unit) override;
  void post_forward(int unit, const at::Tensor& output) override;
  void pre_backward(int unit);
  void begin_backward();
  void end_step();  // after backward: the recorded order becomes the prefetch plan

 private:
  void gather_unit(int unit, bool async);
  void release_unit(int unit);
  void prefetch_after(int position, bool backward);
  int64_t unit_numel(int unit) const;

  ShardedParams& params_;
  std::vector<std::vector<int>> buckets_of_;  // unit -> its buckets
  std::vector<int> plan_;       // forward order of the previous step
  std::vector<int> trace_;      // forward order of this step
  std::vector<bool> backward_seen_;  // per forward position: its backward has started
  bool plan_valid_ = false;
  bool warned_ = false;
};

}  // namespace zero::partition
