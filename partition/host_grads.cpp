// HostGrads: the reduced gradients of offloaded buckets, in host memory
// (Note [Offload copies] in master_store.h) or on NVMe (Note [Gradients on
// NVMe] in host_grads.h).
#include "partition/host_grads.h"

#include <torch/cuda.h>

#include "offload/host_tensors.h"
#include "offload/swapped_tensors.h"
#include "zero/error.h"
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

HostGrads::HostGrads(const FlatLayout& layout, std::vector<bool> copied, at::ScalarType dtype,
                     offload::SwappedTensors& store)
    : off_device_(true), store_(&store) {
  const size_t n = layout.buckets().size();
  copies_.resize(n);
  holds_.assign(n, false);
  squares_.resize(n);
  nvme_ids_.assign(n, -1);
  host_squares_.assign(n, 0.0);
  for (size_t k = 0; k < n; ++k) {
    if (!copied[k]) continue;
    copies_[k] = torch::empty({layout.buckets()[k].shard_numel}, torch::TensorOptions().dtype(dtype));
    nvme_ids_[k] = store.add_filled(copies_[k], "grad" + std::to_string(k), 0.0);  // nothing written yet
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
void HostGrads::land(size_t k, const at::Tensor& reduced, bool boundary) {
  if (store_) return land_on_nvme(k, reduced, boundary);
  at::Tensor value = reduced;
  if (holds_[k]) value = copies_[k].to(reduced.device(), /*non_blocking=*/true).add_(reduced);
  copies_[k].copy_(value, /*non_blocking=*/true);
  holds_[k] = true;
  if (!value.is_cpu()) {
    device_copies_ = true;
    squares_[k] = GradSquares::on_device(value);
  }
}

void HostGrads::land_on_nvme(size_t k, const at::Tensor& reduced, bool boundary) {
  const bool add = holds_[k];  // to what an earlier micro-step left
  holds_[k] = true;
  if (!failure_.empty()) return;  // the step fails on every rank anyway
  const int id = nvme_ids_[k];
  at::Tensor& copy = copies_[k];
  try {
    store_->settle_out({id});  // its last write done, its memory kept
    if (add) {
      store_->wait_in({id});
    } else {
      store_->materialize({id});
    }
    if (reduced.is_cpu()) {
      add ? copy.add_(reduced) : copy.copy_(reduced);
    } else {
      copy.copy_(add ? copy.to(reduced.device()).add_(reduced) : reduced);  // blocking: written next
      device_copies_ = true;
    }
    if (boundary) {  // as GradSquares::add would take it from this copy (Note [Gradient norm])
      squares_[k] = at::Tensor();
      if (auto host = offload::grad_array(copy)) {
        host_squares_[k] = offload::sum_of_squares(*host, copy.numel());
      } else {
        squares_[k] = GradSquares::on_device(copy);
      }
    }
    if (!(boundary && keep_)) store_->write_behind(id);
  } catch (const OffloadError& e) {
    failure_ = e.what();
    store_->forget({id});
  }
}

void HostGrads::copy_from(size_t k, const at::Tensor& grads, bool non_blocking) {
  copies_[k].copy_(grads, non_blocking);
  holds_[k] = true;
  device_copies_ = device_copies_ || !grads.is_cpu();
}

const at::Tensor& HostGrads::for_step(size_t k) {
  if (!holds_[k]) {
    if (store_) {
      store_->materialize({nvme_ids_[k]});
      host_squares_[k] = 0.0;
      squares_[k] = at::Tensor();
    }
    copies_[k].zero_();
  }
  return copies_[k];
}

void HostGrads::restore(size_t k, const at::Tensor& values) {
  if (store_) {
    store_->settle_out({nvme_ids_[k]});
    store_->materialize({nvme_ids_[k]});
  }
  copies_[k].copy_(values);
  if (store_) store_->write_behind(nvme_ids_[k]);
  holds_[k] = true;  // later reductions add to it
}

at::Tensor HostGrads::value(size_t k) {
  if (!holds_[k]) return at::zeros(copies_[k].sizes(), copies_[k].options());
  if (!store_) return copies_[k];
  const int id = nvme_ids_[k];
  const bool resident = store_->resident(id);
  store_->wait_in({id});
  at::Tensor v = copies_[k].clone();
  if (!resident) store_->drop({id});
  return v;
}

void HostGrads::wait() const {
  if (!device_copies_) return;
  bool pending = false;
  for (bool h : holds_) pending = pending || h;
  if (pending) torch::cuda::synchronize();
}

void HostGrads::clear() {
  // On NVMe: what the step did not read and let go (a skipped step) goes
  // unwritten; the next backward starts afresh.
  if (store_) store_->forget(nvme_ids_);
  holds_.assign(holds_.size(), false);
  for (auto& s : squares_) s = at::Tensor();
}

int64_t HostGrads::bytes() const {
  if (store_) return 0;  // the store counts them
  int64_t bytes = 0;
  for (const auto& t : copies_) {
    if (t.defined()) bytes += t.nbytes();
  }
  return bytes;
}

}  // namespace zero::partition
