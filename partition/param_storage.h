#pragma once
// The parameters' memory, bucket by bucket: each bucket's buffer, into
// which the parameters are views, and this rank's shard of it. A bucket
// that stays gathered ("persistent": every bucket below stage 3) has its
// shard as a view of the buffer. A released one keeps its shard apart, on
// the parameters' device, in host memory (offload_param "cpu") or in a file
// (offload_param "nvme").
//
// Note [Stage 3 storage]: at stage 3 a bucket of a unit keeps only its shard
// between uses; `full` keeps its tensor while its storage is emptied
// (set_data_ptr_noswap, nbytes 0) and refilled by an all-gather before the
// unit's forward and backward. Autograd's saved tensors point at the same
// storage, so backward sees the refilled data. The bucket's parameters are
// set (set_data) to an empty tensor while it is released, as DeepSpeed
// empties param.data: a released parameter shows 0 elements instead of its
// shape over no memory, and zero::gathered_shape (unit.h) says what it has
// when gathered. They are views of `full` again as the gather starts; a
// parameter autograd saved is the same tensor, so it too is whole again by
// the time its unit's backward runs.
// Buckets of the root unit (parameters outside every unit, or shared by
// several units) and buckets smaller than stage3_param_persistence_threshold
// stay gathered.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "offload/swapped_tensors.h"
#include "zero/choices.h"
#include "zero/comm.h"

namespace zero::partition {

struct StorageOptions {
  OffloadDevice offload_param = OffloadDevice::none;  // where released shards live: "none" (with the parameters), "cpu", "nvme"
  offload::SwapOptions swap;           // with "nvme"
  bool pin_memory = false;             // host shards page-locked when the parameters are on an accelerator
  // ZeRO++'s qwZ (zero_quantized_weights): a unit's gather carries int8
  // blocks of this many elements with a scale each (Note [Block
  // quantization]); 0: the exact values.
  int64_t quantized_block = 0;
  // ZeRO++'s hpZ (zero_hpz_partition_size): the ranks of this node, over
  // which a unit's gathered buffer is kept as a secondary partition from
  // its forward until its backward has gathered again (Note [Secondary
  // partition]); null: none.
  std::shared_ptr<comm::ProcessGroup> secondary_group;
};

// A parameter in a bucket: where it starts in the bucket's buffer and its shape.
struct ParamView {
  at::Tensor param;
  int64_t offset = 0;
  std::vector<int64_t> shape;
};

class ParamStorage {
 public:
  // `owners`: the ranks each bucket is sharded over (1 at stage 0).
  ParamStorage(std::shared_ptr<comm::ProcessGroup> pg, int owners, StorageOptions options);
  ~ParamStorage();
  ParamStorage(const ParamStorage&) = delete;
  ParamStorage& operator=(const ParamStorage&) = delete;

  // Adds the next bucket: `full` holds its parameters; this rank's shard is
  // `shard_numel` elements from `shard_start`. A bucket that is not
  // persistent copies its shard apart now (offload_param "nvme": and starts
  // writing it to its file) and stays gathered until release(); seal()
  // after the last one. `params`: the parameters viewing `full`.
  void add(const at::Tensor& full, int64_t shard_start, int64_t shard_numel, bool persistent,
           std::vector<ParamView> params);
  // offload_param "nvme": waits until every shard is in its file.
  void seal();

  size_t size() const { return buckets_.size(); }
  const at::Tensor& full(size_t k) const { return buckets_[k].full; }
  const at::Tensor& shard(size_t k) const { return buckets_[k].shard; }
  bool persistent(size_t k) const { return buckets_[k].persistent; }
  bool gathered(size_t k) const { return buckets_[k].gathered; }

  // Refills bucket k's buffer with every rank's shard (no-op when
  // gathered). `async`: returns once the all-gather is started (offload_param
  // "nvme": once the shard's read is started, Note [NVMe read-ahead]).
  // `exact`: the shards' own values even with quantized_block (what
  // gather_parameters, checkpoints and state dicts read); otherwise a
  // unit's forward and backward see them as quantization leaves them.
  void gather(size_t k, bool async, bool exact);
  void wait_gathered(size_t k);
  // offload_param "nvme": starts reading bucket k's shard for a later gather.
  void read_ahead(size_t k);
  // Empties bucket k's buffer (no-op when persistent or released).
  void release(size_t k);
  // Releases every bucket that is not persistent and drops shards read
  // ahead for nothing, and the secondary partitions (a backward is done).
  void release_all();

  // The way back after an update: before bucket k's shard is written, its
  // memory (offload_param "nvme"); send_shard(k), once it is written,
  // starts its way on: a bucket that stays gathered is all-gathered in
  // place (the returned work; none with one rank), a released one's NVMe
  // shard goes back to its file.
  void prepare_write(size_t k);
  comm::WorkHandle send_shard(size_t k);
  void wait_writes();  // the file writes send_shard() started

  // The parameters' bytes on this rank now: gathered buffers, the
  // secondary partitions (hpZ), and the shards kept apart wherever they are; of those, offloaded_bytes() are in
  // host memory (nvme false) or on NVMe (true).
  int64_t bytes() const;
  int64_t offloaded_bytes(bool nvme) const;

  // Of bytes(): the buffers of buckets that are released between uses
  // (stage 3's units) and gathered now, and the most of them at once since
  // reset_gathered_peak() (what stage3_max_live_parameters and the prefetch
  // bound).
  int64_t gathered_bytes() const { return gathered_now_; }
  int64_t gathered_peak() const { return gathered_peak_; }
  // Seconds spent waiting in wait_gathered() for a bucket's all-gather (and
  // its NVMe read) to complete, since construction: the part of stage 3's
  // forward and backward that prefetching did not hide.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Bucket {
    at::Tensor full;
    at::Tensor shard;
    std::vector<ParamView> params;  // views of `full` while gathered, `empty` while released
    at::Tensor empty;
    bool persistent = true;
    bool gathered = true;
    comm::WorkHandle gather_work;  // a gather in flight
    at::Tensor gather_input;       // the shard on the parameters' device while a gather runs
    bool quantized = false;        // the gather in flight carries quantized shards
    bool from_secondary = false;   // ... comes from the node's secondary partition (hpZ)
    bool keep_secondary = false;   // ... leaves a secondary partition behind
    at::Tensor secondary;          // hpZ: this rank's part of `full` for the node's next gather
    at::Tensor packed_in, packed_out;  // ... this rank's, and every rank's
    int swap_id = -1;              // offload_param "nvme": the shard's id in the store
    bool read_pending = false;     // "nvme": a prefetch's read is in flight, its all-gather not started
    bool read_ahead = false;       // "nvme": read for the next prefetch, not gathered yet
  };
  void start_gather(Bucket& b);  // the all-gather, once the shard is in memory
  void finish_gather(Bucket& b);  // after it: quantized shards into `full`
  static void view_params(Bucket& b);   // the parameters as views of `full`

  std::shared_ptr<comm::ProcessGroup> pg_;
  int owners_;
  StorageOptions options_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<offload::SwappedTensors> store_;  // offload_param "nvme"
  int64_t gathered_now_ = 0, gathered_peak_ = 0;    // buckets that are not persistent, gathered
  double wait_seconds_ = 0;
};

}  // namespace zero::partition
