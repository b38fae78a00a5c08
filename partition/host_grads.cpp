// HostGrads: the reduced gradients of offloaded buckets, in host memory
// (Note [Offload copies] in master_store.h).
#include "partition/host_grads.h"

#include <torch/cuda.h>

#include "offload/host_tensors.h"
#include "partition/grad_norm.h"
#include "partition/flat_layout.h"

namespace zero::partition {

HostGrads::HostGrads(const FlatLayout& layout, std::vector<bool> copied, bool off_device, at::ScalarType dtype,
                     bool pinned)
    : off_device_(off_device) {
  const size_t n = layout.buckets().size();
  copies_.resize(n);
  holds_.assign(n, false);
  squares_.resize(n);
  auto options = torch::TensorOptions().dtype(dtype).device(at::kCPU);
  if (pinned) options = options.pinned_memory(true);
  for (size_t k = 0; k < n; ++k) {
    if (copied[k]) copies_[k] = offload::empty_with_huge_pages(layout.buckets()[k].shard_numel, options).zero_();
  }
}

bool HostGrads::any_off_device() const {
  for (size_t k = 0; k < copies_.size(); ++k) {
    if (off_device(k)) return true;
  }
  return false;
}

// With gradient accumulation (or a second backward before the step) the
// next micro-step adds to the copy through the device, as DeepSpeed does
// (Note [Offload copies]).
void HostGrads::land(size_t k, const at::Tensor& reduced) {
  at::Tensor value = reduced;
  if (holds_[k]) value = copies_[k].to(reduced.device(), /*non_blocking=*/true).add_(reduced);
  copies_[k].copy_(value, /*non_blocking=*/true);
  holds_[k] = true;
  if (!value.is_cpu()) {
    device_copies_ = true;
    squares_[k] = GradSquares::on_device(value);
  }
}

void HostGrads::copy_from(size_t k, const at::Tensor& grads, bool non_blocking) {
  copies_[k].copy_(grads, non_blocking);
  holds_[k] = true;
  device_copies_ = device_copies_ || !grads.is_cpu();
}

const at::Tensor& HostGrads::for_step(size_t k) {
  if (!holds_[k]) copies_[k].zero_();
  return copies_[k];
}

void HostGrads::restore(size_t k, const at::Tensor& values) {
  copies_[k].copy_(values);
  holds_[k] = true;  // later reductions add to it
}

void HostGrads::wait() const {
  if (!device_copies_) return;
  bool pending = false;
  for (bool h : holds_) pending = pending || h;
  if (pending) torch::cuda::synchronize();
}

void HostGrads::clear() {
  holds_.assign(holds_.size(), false);
  for (auto& s : squares_) s = at::Tensor();
}

int64_t HostGrads::bytes() const {
  int64_t bytes = 0;
  for (const auto& t : copies_) {
    if (t.defined()) bytes += t.nbytes();
  }
  return bytes;
}

}  // namespace zero::partition
