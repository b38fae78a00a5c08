#pragma once
// The host copies of reduced gradients that offload_optimizer reads
// (Note [Offload copies] in master_store.h): one per offloaded bucket, in the
// training dtype, when the parameters are not in host memory (or when a
// test asks for them on CPU ranks).
#include <torch/torch.h>

#include <vector>

namespace zero::partition {

class FlatLayout;

class HostGrads {
 public:
  // `copied[k]`: bucket k's reduced gradients are copied to the host.
  // `off_device`: those buckets keep no slice of the device's gradient
  // partition (stages 2-3): their reductions land here directly.
  HostGrads(const FlatLayout& layout, std::vector<bool> copied, bool off_device, at::ScalarType dtype, bool pinned);

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
  void land(size_t k, const at::Tensor& reduced);
  // An on-device bucket's final gradients.
  void copy_from(size_t k, const at::Tensor& grads, bool non_blocking);
  // Bucket k's copy, complete for the step: zeros when no backward reached it.
  const at::Tensor& for_step(size_t k);
  // The sum of squares land() took on the device (undefined: none).
  const at::Tensor& device_squares(size_t k) const { return squares_[k]; }
  // Restores a mid-accumulation checkpoint's values.
  void restore(size_t k, const at::Tensor& values);
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
};

}  // namespace zero::partition
