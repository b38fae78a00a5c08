#pragma once
// The master weights of this rank's partition, one fp32 tensor per bucket
// (its shard; the whole bucket at stage 0), and the one way back from them
// to the parameters.
//
// Note [Offload copies]: with offload_optimizer the master weights (and the
// optimizer's states, made by the optimizer beside them) live in host
// memory, apart from the parameters even in fp32 when the parameters are on
// an accelerator. The reduced gradients stay in the training dtype: copied
// to host tensors as each bucket is reduced when the parameters are on an
// accelerator (HostGrads, host_grads.h), read in place when they are in
// host memory; the host optimizer widens them and applies the loss scale
// and clipping as it reads them (no fp32 copy, no pass of their own). The
// updated parameters go the other way bucket by bucket while the optimizer
// updates the next bucket (update_target, send_updated): the optimizer writes a
// bucket's shard in the training dtype, in the same pass, straight into the
// shard when the shard is in host memory (CPU ranks, offload_param), or else
// into one of two page-locked staging buffers, copied to the accelerator
// asynchronously; a bucket that stays gathered starts its all-gather at
// once. No host copy of the whole partition in the training dtype is kept.
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
#include <torch/torch.h>

#include <c10/core/Event.h>

#include <memory>
#include <optional>
#include <vector>

#include "offload/swapped_tensors.h"
#include "zero/comm.h"
#include "partition/flat_layout.h"
#include "partition/param_storage.h"

namespace zero::partition {

class MasterStore {
 public:
  // `on_host`: per bucket of `layout`, its master weights live in host
  // memory (offload_optimizer; Note [Partial offload]). `groups`: the
  // number of parameter groups (one may have no bucket).
  // `nvme` (offload_optimizer "nvme"): the master weights on the host go
  // to files under its nvme_path as each bucket's is made, and the
  // optimizer's states join them there (add_nvme_state).
  MasterStore(const FlatLayout& layout, ParamStorage& storage, std::vector<bool> on_host, size_t groups,
              std::optional<offload::SwapOptions> nvme = std::nullopt);
  ~MasterStore();  // waits for the all-gathers a failed step left running
  MasterStore(const MasterStore&) = delete;
  MasterStore& operator=(const MasterStore&) = delete;

  // Adds the next bucket's master weights, from its shard's fp32 values.
  // `separate`: apart from the parameters' shard (mixed precision, or a
  // shard that leaves for the host or disk); otherwise, unless on the host,
  // the master weights are the parameters' shard itself.
  void add(const at::Tensor& shard_values, bool separate);

  size_t size() const { return tensors_.size(); }
  const std::vector<at::Tensor>& tensors() const { return tensors_; }  // per bucket
  // Per parameter group, its buckets' tensors (the optimizer's groups).
  const std::vector<std::vector<at::Tensor>>& by_group() const { return by_group_; }
  bool on_host(size_t k) const { return on_host_[k]; }

  // offload_optimizer "nvme" (ZeRO-Infinity): the store that holds the host
  // master weights (key "master<k>") and their optimizer states between
  // steps; null without NVMe. The step brings each bucket's back
  // (nvme_ids(k): its master weights, then its states) around its update.
  offload::SwappedTensors* nvme_store() { return nvme_.get(); }
  const std::vector<int>& nvme_ids(size_t k) const { return nvme_ids_[k]; }
  // A state of bucket k's master weights, as it starts (`value` everywhere),
  // joins them: registered by value, not written, so that a state larger
  // than memory is never in it. Once every state has joined,
  // nvme_states_added() sends every tensor to its file, and the resident
  // peak counts from there.
  void add_nvme_state(size_t k, const at::Tensor& state, double value);
  void nvme_states_added();

  // The one way back to the parameters (Note [Offload copies]):
  // update_target(k) is where bucket k's updated shard is to be written in
  // the training dtype (undefined: the master weights are the parameters);
  // send_updated(k), once it is written, starts its way on (the bucket's
  // all-gather, or its write to NVMe). A host optimizer does both as it
  // updates each bucket; publish_bucket(k) does both from the master
  // weights. publish() publishes every bucket not yet sent since the last
  // publish() and waits until all of them have arrived.
  at::Tensor update_target(size_t k);
  void send_updated(size_t k);
  void publish_bucket(size_t k);
  void publish();
  // Instead of publish() after a failed NVMe transfer (Note [A failed
  // transfer in the step] in step.cpp): sends nothing more (what was not
  // sent has no collective to join), waits for what was sent; a further
  // failure is the same step's and goes unreported.
  void settle_after_failure() noexcept;

  // Bytes of master weights apart from the parameters, and of the staging buffers.
  int64_t bytes() const;
  int64_t staging_bytes() const;

 private:
  bool is_param_shard(size_t k) const;
  at::Tensor staging_for(size_t k, const at::Tensor& shard);

  const FlatLayout& layout_;
  ParamStorage& storage_;
  std::vector<bool> on_host_;
  std::vector<at::Tensor> tensors_;
  std::vector<std::vector<at::Tensor>> by_group_;
  // Page-locked buffers for updated shards on their way to the accelerator,
  // each free once its copy has run (`copied`).
  struct Staging {
    at::Tensor buffer;
    std::unique_ptr<c10::Event> copied;
    int bucket = -1;  // the bucket it holds until send_updated()
  };
  std::vector<Staging> staging_;
  size_t next_staging_ = 0;
  std::vector<comm::WorkHandle> works_;  // all-gathers send_updated() started
  std::vector<bool> sent_;               // per bucket: send_updated() since the last publish()
  std::unique_ptr<offload::SwappedTensors> nvme_;
  std::vector<std::vector<int>> nvme_ids_;  // per bucket: its tensors in nvme_ (none when not on the host)
};

}  // namespace zero::partition
