#pragma once
// The host copies of reduced gradients that offload_optimizer reads
// (Note [Offload copies] in master_store.h): one per offloaded bucket, in the
// training dtype, when the parameters are not in host memory (or when a
// test asks for them on CPU ranks), or when they live on NVMe.
//
// Note [Gradients on NVMe]: with offload_optimizer "nvme" and its
// nvme_gradients, each host bucket's copy is a tensor of the optimizer's
// SwappedTensors, so that no gradient partition stays in host memory
// between backward and the step (ZeRO-Infinity swaps gradients too). The
// reducer treats every host bucket as off the device, even on CPU ranks:
// its reduce-scatter lands in a temporary and land() puts it in the copy.
// - The first reduction after a step copies it there; a later one (gradient
//   accumulation) reads the file back, adds, and writes again. Writes go
//   behind (SwappedTensors::write_behind): at most two in flight besides the
//   bucket being landed, each freeing its memory when done.
// - At the accumulation boundary land() also takes the bucket's sum of
//   squares, with the same kernel and from the same values as the step
//   would: the step's norm is bit for bit that of in-memory gradients,
//   and the step reads no gradient before its update.
// - The step's UpdateRun reads each sub-group's gradients with its master
//   weights and states, and lets the gradients go unwritten after the
//   update (update_run.cpp).
// - With an update in backward (super_offload) the boundary's gradients are
//   not written at all: the update takes them from memory within a
//   sub-group's time (keep_for_update).
// - A failed read or write in backward is kept, not raised (a rank that
//   left backward would leave the others waiting in its collectives); the
//   step fails with it on every rank (Note [A failed transfer in the step]).
#include <torch/torch.h>

#include <string>
#include <vector>

namespace zero::offload {
class SwappedTensors;
}

namespace zero::partition {

class FlatLayout;

class HostGrads {
 public:
  // `copied[k]`: bucket k's reduced gradients are copied to the host.
  // `off_device`: those buckets keep no slice of the device's gradient
  // partition (stages 2-3): their reductions land here directly.
  HostGrads(const FlatLayout& layout, std::vector<bool> copied, bool off_device, at::ScalarType dtype, bool pinned);
  // Note [Gradients on NVMe]: the copies live in `store` (off the device).
  HostGrads(const FlatLayout& layout, std::vector<bool> copied, at::ScalarType dtype, offload::SwappedTensors& store);

  bool copied(size_t k) const { return copies_[k].defined(); }
  bool off_device(size_t k) const { return off_device_ && copied(k); }
  bool any_off_device() const;
  // Bucket k's host copy (undefined when it has none).
  const at::Tensor& copy(size_t k) const { return copies_[k]; }
  // Whether the copy holds this step's gradients (else it is stale).
  bool holds(size_t k) const { return holds_[k]; }

  // An off-device bucket's reduced shard: copied, or added through the
  // device when the copy already holds a backward's. Its sum of squares is
  // taken on the device, from the value the copy will hold.
  // `boundary`: the last reduction before the step (on NVMe, it takes the
  // sum of squares then).
  void land(size_t k, const at::Tensor& reduced, bool boundary);
  // An on-device bucket's final gradients.
  void copy_from(size_t k, const at::Tensor& grads, bool non_blocking);
  // Bucket k's copy, complete for the step: zeros when no backward reached it.
  // On NVMe it is resident only once the step has read it.
  const at::Tensor& for_step(size_t k);
  // The sum of squares land() took on the device (undefined: none).
  const at::Tensor& device_squares(size_t k) const { return squares_[k]; }
  // Restores a mid-accumulation checkpoint's values.
  void restore(size_t k, const at::Tensor& values);
  // Bucket k's values now, in memory (zeros when it holds none).
  at::Tensor value(size_t k);

  // Note [Gradients on NVMe]
  bool on_nvme() const { return store_ != nullptr; }
  // Bucket k's copy in the store (-1: none).
  int nvme_id(size_t k) const { return nvme_ids_.empty() ? -1 : nvme_ids_[k]; }
  // The boundary's sum of squares of an NVMe bucket, taken by land().
  double host_squares(size_t k) const { return host_squares_[k]; }
  // The boundary's copies stay in memory for an update in backward.
  void keep_for_update(bool keep) { keep_ = keep; }
  // The first failed read or write in backward, or "".
  const std::string& failure() const { return failure_; }
  // Waits for the asynchronous copies to the host, before the host reads.
  void wait() const;
  // After the step: no copy holds gradients any more.
  void clear();
  int64_t bytes() const;

 private:
  bool off_device_ = false;
  std::vector<at::Tensor> copies_;
  std::vector<bool> holds_;
  std::vector<at::Tensor> squares_;
  bool device_copies_ = false;  // the gradients come from an accelerator
  // Note [Gradients on NVMe]
  offload::SwappedTensors* store_ = nullptr;
  std::vector<int> nvme_ids_;
  std::vector<double> host_squares_;
  bool keep_ = false;
  std::string failure_;
  void land_on_nvme(size_t k, const at::Tensor& reduced, bool boundary);
};

}  // namespace zero::partition
