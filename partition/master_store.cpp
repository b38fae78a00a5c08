// MasterStore: the master weights and their way back to the parameters
// (Note [Offload copies] in partition/master_store.h).
#include "partition/master_store.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "core/torch_compat.h"
#include "offload/host_tensors.h"
#include "zero/error.h"

namespace zero::partition {

MasterStore::MasterStore(const FlatLayout& layout, ParamStorage& storage, std::vector<bool> on_host, size_t groups,
                         std::optional<offload::SwapOptions> nvme)
    : layout_(layout), storage_(storage), on_host_(std::move(on_host)), by_group_(groups), sent_(on_host_.size(), false) {
  if (nvme) nvme_ = std::make_unique<offload::SwappedTensors>(*nvme);
}

MasterStore::~MasterStore() {
  for (auto& w : works_) {  // a step that stopped on an error
    try {
      if (w) w->wait();
    } catch (...) {
    }
  }
}

void MasterStore::add(const at::Tensor& shard_values, bool separate) {
  const size_t k = tensors_.size();
  nvme_ids_.emplace_back();
  at::Tensor m;
  if (on_host_[k]) {
    if (nvme_) {
      // To its file now, copied once on its way: the master weights of a
      // partition larger than memory never are in it at once.
      int id = -1;
      std::tie(m, id) = nvme_->add_copy(shard_values, at::kFloat, "master" + std::to_string(k));
      nvme_->write_behind(id);
      nvme_ids_.back().push_back(id);
    } else {
      // The updated parameters leave through update_target: pageable.
      m = offload::host_copy(shard_values, at::kFloat, /*pinned=*/false);
    }
  } else {
    m = separate ? shard_values.clone() : storage_.shard(k);
  }
  tensors_.push_back(m);
  by_group_[layout_.buckets()[k].group].push_back(m);
}

void MasterStore::add_nvme_state(size_t k, const at::Tensor& state, double value) {
  if (!nvme_ || nvme_ids_[k].empty()) throw OffloadError("internal: bucket " + std::to_string(k) + " has no master weights on NVMe");
  const std::string key = "master" + std::to_string(k) + ".state" + std::to_string(nvme_ids_[k].size() - 1);
  nvme_ids_[k].push_back(nvme_->add_filled(state, key, value));
}

void MasterStore::nvme_states_added() {
  if (!nvme_) return;
  nvme_->wait_behind();
  nvme_->swap_out_all();
  nvme_->reset_peak();  // from here on the step's pipeline bounds it
}

bool MasterStore::is_param_shard(size_t k) const {
  return tensors_[k].unsafeGetTensorImpl() == storage_.shard(k).unsafeGetTensorImpl();
}

void MasterStore::publish_bucket(size_t k) {
  at::Tensor target = update_target(k);
  if (target.defined()) {
    torch::NoGradGuard no_grad;
    target.copy_(tensors_[k]);  // converts the fp32 master to the parameters' dtype
  }
  send_updated(k);
}

void MasterStore::publish() {
  for (size_t k = 0; k < size(); ++k) {
    if (!sent_[k]) publish_bucket(k);
  }
  for (auto& w : works_) {
    if (w) w->wait();
  }
  works_.clear();
  storage_.wait_writes();
  sent_.assign(size(), false);
}

void MasterStore::settle_after_failure() noexcept {
  for (auto& w : works_) {
    try {
      if (w) w->wait();
    } catch (...) {  // a collective's own failure surfaces at the ranks' agreement
    }
  }
  works_.clear();
  try {
    storage_.wait_writes();
  } catch (...) {
  }
  sent_.assign(size(), false);
}

at::Tensor MasterStore::update_target(size_t k) {
  if (is_param_shard(k)) return {};
  storage_.prepare_write(k);
  const at::Tensor& shard = storage_.shard(k);
  // Written in place: a host shard by the host optimizer, or (Note [Partial
  // offload]) a shard on the accelerator by the update made there.
  if (shard.is_cpu() || !on_host_[k]) return shard;
  return staging_for(k, shard);
}

// The shard is on the accelerator: a staging buffer whose previous copy has run.
at::Tensor MasterStore::staging_for(size_t k, const at::Tensor& shard) {
  if (staging_.empty()) {
    int64_t largest = 0;
    for (const auto& other : layout_.buckets()) largest = std::max(largest, other.shard_numel);
    for (int i = 0; i < 2; ++i) {
      Staging s;
      s.buffer = torch::empty({largest}, torch::TensorOptions().dtype(shard.scalar_type()).pinned_memory(true));
      s.copied = std::make_unique<c10::Event>(shard.device().type());
      staging_.push_back(std::move(s));
    }
  }
  Staging& s = staging_[next_staging_++ % staging_.size()];
  compat::synchronize(*s.copied);
  s.bucket = static_cast<int>(k);
  return s.buffer.slice(0, 0, layout_.buckets()[k].shard_numel);
}

void MasterStore::send_updated(size_t k) {
  torch::NoGradGuard no_grad;
  const at::Tensor& shard = storage_.shard(k);
  for (auto& s : staging_) {
    if (s.bucket != static_cast<int>(k)) continue;
    // Asynchronous from page-locked memory on the current stream, which the
    // all-gather below waits for; the event frees the buffer.
    shard.copy_(s.buffer.slice(0, 0, layout_.buckets()[k].shard_numel), /*non_blocking=*/true);
    const auto impl = c10::impl::VirtualGuardImpl(shard.device().type());
    s.copied->record(impl.getStream(shard.device()));
    s.bucket = -1;
  }
  // A bucket that stays gathered is all-gathered in place, when it has
  // more than one owner; a released one is gathered again when its unit
  // runs (offload_param "nvme": written back first).
  if (auto work = storage_.send_shard(k)) works_.push_back(std::move(work));
  sent_[k] = true;
}

int64_t MasterStore::bytes() const {
  int64_t bytes = 0;
  for (size_t k = 0; k < size(); ++k) {
    if (!is_param_shard(k)) bytes += tensors_[k].nbytes();
  }
  return bytes;
}

int64_t MasterStore::staging_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : staging_) bytes += s.buffer.nbytes();
  return bytes;
}

}  // namespace zero::partition
