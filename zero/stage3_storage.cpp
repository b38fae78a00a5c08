// ShardedParams at stage 3: a bucket's memory released after its unit ran
// and gathered again before it runs (Note [Stage 3 storage] in
// partition.h), with offload_param's shards read from host memory or NVMe.
#include <set>
#include <unordered_map>

#include "zero/internal/partition.h"

namespace zero::partition {

// Note [Stage 3 storage]: the bucket's tensor and the parameters' views stay;
// only the memory behind them comes and goes.
namespace {
void empty_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}
void refill_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = t.numel() * t.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}
}  // namespace

void ShardedParams::gather(Bucket& b, bool async) {
  if (b.gathered) return;
  refill_storage(b.full);
  b.gathered = true;
  if (b.swap_id >= 0) {
    // offload_param "nvme": the shard is read back first.
    // Note [NVMe read-ahead]: a shard read ahead has had a unit's compute to
    // arrive, so a prefetch starts its all-gather at once (it overlaps the
    // compute before the unit runs); otherwise a prefetch only starts the
    // read and the all-gather follows when the unit waits for it.
    const bool was_read_ahead = b.read_ahead;
    b.read_ahead = false;
    param_store_->swap_in({b.swap_id});
    b.read_pending = true;
    if (async && !was_read_ahead) return;
  }
  start_gather(b);
  if (!async) wait_gathered(b);
}

void ShardedParams::read_ahead(Bucket& b) {
  if (b.gathered || b.read_ahead || b.swap_id < 0) return;
  param_store_->swap_in({b.swap_id});
  b.read_ahead = true;
}

void ShardedParams::start_gather(Bucket& b) {
  if (b.read_pending) {
    param_store_->wait_in({b.swap_id});
    b.read_pending = false;
  }
  b.gather_input = b.shard.device() == b.full.device() ? b.shard : b.shard.to(b.full.device(), /*non_blocking=*/true);
  b.gather_work = pg_->all_gather_async(b.full, b.gather_input);
}

void ShardedParams::wait_gathered(Bucket& b) {
  if (b.read_pending) start_gather(b);
  if (!b.gather_work) return;
  b.gather_work->wait();
  b.gather_work.reset();
  b.gather_input = at::Tensor();
  if (b.swap_id >= 0) param_store_->drop({b.swap_id});  // the file still holds it
}

void ShardedParams::release(Bucket& b) {
  if (b.persistent || !b.gathered) return;
  wait_gathered(b);
  empty_storage(b.full);
  b.gathered = false;
}

std::vector<int> ShardedParams::gather_buckets_of(const std::vector<at::Tensor>& tensors) {
  std::set<int> wanted;
  std::unordered_map<const void*, int> bucket_of;
  for (size_t i = 0; i < params_.size(); ++i) bucket_of[params_[i].tensor.unsafeGetTensorImpl()] = layout_.params()[i].bucket;
  for (const auto& t : tensors) {
    auto it = bucket_of.find(t.unsafeGetTensorImpl());
    if (it != bucket_of.end() && !buckets_[it->second].persistent && !buckets_[it->second].gathered) wanted.insert(it->second);
  }
  for (int b : wanted) gather(buckets_[b], /*async=*/true);
  for (int b : wanted) wait_gathered(buckets_[b]);
  return {wanted.begin(), wanted.end()};
}

void ShardedParams::release_buckets(const std::vector<int>& buckets) {
  for (int b : buckets) release(buckets_[b]);
}

void ShardedParams::release_all_unpersistent() {
  for (auto& b : buckets_) {
    if (!b.persistent && b.gathered) release(b);
    if (b.read_ahead) {  // read for a prefetch that did not come
      param_store_->drop({b.swap_id});
      b.read_ahead = false;
    }
  }
}

void ShardedParams::attach_units(const std::vector<UnitBase*>& units) {
  scheduler_ = std::make_shared<UnitScheduler>(*this, static_cast<int>(units.size()));
  units_ = units;
  for (size_t u = 0; u < units.size(); ++u) units[u]->attach(scheduler_, static_cast<int>(u));
}

}  // namespace zero::partition
