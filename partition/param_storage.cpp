// ParamStorage: stage 3's release and gather of buckets (Note [Stage 3
// storage] in param_storage.h), with offload_param's shards read from host
// memory or NVMe.
#include "partition/param_storage.h"

#include <c10/util/accumulate.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "offload/host_tensors.h"
#include "partition/block_quant.h"
#include "zero/error.h"
#include "zero/unit.h"

namespace zero::partition {
namespace {

// zero::gathered_shape's record: the shapes of the parameters that a
// ParamStorage releases, by tensor, while it lives. Process-wide, as
// DeepSpeed keeps ds_shape on the parameter itself.
struct GatheredShapes {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, std::vector<int64_t>> shapes;
};
GatheredShapes& gathered_shapes() {
  static GatheredShapes registry;
  return registry;
}

// The bucket's tensor and the parameters' views stay; only the memory
// behind them comes and goes (Note [Stage 3 storage]).
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
}  // namespace zero::partition

namespace zero {

std::vector<int64_t> gathered_shape(const at::Tensor& param) {
  auto& registry = partition::gathered_shapes();
  std::lock_guard<std::mutex> lock(registry.mutex);
  auto it = registry.shapes.find(param.unsafeGetTensorImpl());
  return it != registry.shapes.end() ? it->second : param.sizes().vec();
}

int64_t gathered_numel(const at::Tensor& param) { return c10::multiply_integers(gathered_shape(param)); }

}  // namespace zero

namespace zero::partition {

ParamStorage::ParamStorage(std::shared_ptr<comm::ProcessGroup> pg, int owners, StorageOptions options)
    : pg_(std::move(pg)), owners_(owners), options_(std::move(options)) {}

ParamStorage::~ParamStorage() {
  auto& registry = gathered_shapes();
  std::lock_guard<std::mutex> lock(registry.mutex);
  for (auto& b : buckets_) {
    try {  // gathers a failed step left in flight
      if (b.gather_work) b.gather_work->wait();
    } catch (...) {
    }
    if (!b.persistent) {
      for (const auto& v : b.params) registry.shapes.erase(v.param.unsafeGetTensorImpl());
    }
  }
}

void ParamStorage::add(const at::Tensor& full, int64_t shard_start, int64_t shard_numel, bool persistent,
                       std::vector<ParamView> params) {
  if (options_.secondary_group && full.numel() % options_.secondary_group->size() != 0) {
    throw PartitionError("hpZ: a bucket of " + std::to_string(full.numel()) + " elements does not split over " +
                         std::to_string(options_.secondary_group->size()) + " ranks of a node");
  }
  Bucket b;
  b.full = full;
  b.params = std::move(params);
  b.empty = at::empty({0}, full.options());
  b.persistent = persistent;
  if (!persistent) {
    auto& registry = gathered_shapes();
    std::lock_guard<std::mutex> lock(registry.mutex);
    for (const auto& v : b.params) registry.shapes[v.param.unsafeGetTensorImpl()] = v.shape;
  }
  const at::Tensor mine = full.slice(0, shard_start, shard_start + shard_numel);
  if (persistent) {
    b.shard = mine;
  } else if (options_.offload_param == OffloadDevice::nvme) {
    // To its file now, copied once on its way: a few shards are in memory
    // while the model is laid out, however large it is.
    if (!store_) store_ = std::make_unique<offload::SwappedTensors>(options_.swap);
    std::tie(b.shard, b.swap_id) = store_->add_copy(mine, mine.scalar_type(), "params" + std::to_string(buckets_.size()));
    store_->write_behind(b.swap_id);
  } else if (options_.offload_param == OffloadDevice::cpu) {
    // Host tensors copied to the accelerator for every gather are
    // page-locked when the config asks (pin_memory).
    b.shard = offload::host_copy(mine, mine.scalar_type(), options_.pin_memory && !full.is_cpu());
  } else {
    b.shard = mine.clone();
  }
  if (!persistent) gathered_now_ += full.numel() * full.element_size();  // gathered until the first release
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
  buckets_.push_back(std::move(b));
}

void ParamStorage::seal() {
  if (store_) store_->wait_behind();
}

// Note [Secondary partition]: ZeRO++'s hpZ. A unit is gathered over every
// rank for its forward (across nodes), and again for its backward. With
// secondary_group (the ranks of this node), the forward's gather leaves
// each rank holding 1/L of the buffer it received (L ranks a node), so that
// the backward's gather is an all-gather within the node, of the same
// values (quantized ones with qwZ). A secondary lives until the backward is
// done (release_all) or the shard changes (prepare_write, send_shard), so it
// never holds stale weights; it costs 1/L of each gathered unit between its
// forward and backward. An exact gather neither uses nor leaves one.
void ParamStorage::gather(size_t k, bool async, bool exact) {
  Bucket& b = buckets_[k];
  if (b.gathered) return;
  b.from_secondary = !exact && b.secondary.defined();
  b.quantized = options_.quantized_block > 0 && !exact && !b.from_secondary;
  b.keep_secondary = options_.secondary_group && !exact && !b.from_secondary;
  refill_storage(b.full);
  view_params(b);
  b.gathered = true;
  if (!b.persistent) gathered_now_ += b.full.numel() * b.full.element_size();
  gathered_peak_ = std::max(gathered_peak_, gathered_now_);
  if (b.from_secondary) {
    b.gather_work = options_.secondary_group->all_gather_async(b.full, b.secondary);
    if (!async) wait_gathered(k);
    return;
  }
  if (b.swap_id >= 0) {
    // offload_param "nvme": the shard is read back first.
    // Note [NVMe read-ahead]: a shard read ahead has had a unit's compute to
    // arrive, so a prefetch starts its all-gather at once (it overlaps the
    // compute before the unit runs); otherwise a prefetch only starts the
    // read and the all-gather follows when the unit waits for it.
    const bool was_read_ahead = b.read_ahead;
    b.read_ahead = false;
    store_->swap_in({b.swap_id});
    b.read_pending = true;
    if (async && !was_read_ahead) return;
  }
  start_gather(b);
  if (!async) wait_gathered(k);
}

void ParamStorage::read_ahead(size_t k) {
  Bucket& b = buckets_[k];
  if (b.gathered || b.read_ahead || b.swap_id < 0) return;
  store_->swap_in({b.swap_id});
  b.read_ahead = true;
}

void ParamStorage::view_params(Bucket& b) {
  for (auto& v : b.params) {
    const int64_t numel = c10::multiply_integers(v.shape);
    v.param.set_data(b.full.slice(0, v.offset, v.offset + numel).view(v.shape));
  }
}

void ParamStorage::start_gather(Bucket& b) {
  if (b.read_pending) {
    store_->wait_in({b.swap_id});
    b.read_pending = false;
  }
  b.gather_input = b.shard.device() == b.full.device() ? b.shard : b.shard.to(b.full.device(), /*non_blocking=*/true);
  if (!b.quantized) {
    b.gather_work = pg_->all_gather_async(b.full, b.gather_input);
    return;
  }
  // qwZ: every rank's shard as int8 blocks and their scales, in one
  // all-gather of bytes; dequantized into `full` by finish_gather.
  const int64_t bytes = packed_bytes(b.shard.numel(), options_.quantized_block);
  const auto byte_options = b.full.options().dtype(at::kByte);
  b.packed_in = at::empty({bytes}, byte_options);
  quantize_into(b.gather_input, b.packed_in, options_.quantized_block);
  b.packed_out = at::empty({bytes * owners_}, byte_options);
  b.gather_work = pg_->all_gather_async(b.packed_out, b.packed_in);
}

void ParamStorage::finish_gather(Bucket& b) {
  if (b.quantized) {
    const int64_t bytes = b.packed_in.numel(), shard = b.shard.numel();
    for (int r = 0; r < owners_; ++r) {
      dequantize_into(b.packed_out.slice(0, r * bytes, (r + 1) * bytes), b.full.slice(0, r * shard, (r + 1) * shard),
                      options_.quantized_block);
    }
    b.packed_in = b.packed_out = at::Tensor();
  }
  b.gather_input = at::Tensor();
  if (b.keep_secondary) {
    const auto& node = *options_.secondary_group;
    const int64_t part = b.full.numel() / node.size();
    b.secondary = b.full.slice(0, node.rank() * part, (node.rank() + 1) * part).clone();
    b.keep_secondary = false;
  }
}

void ParamStorage::wait_gathered(size_t k) {
  Bucket& b = buckets_[k];
  if (!b.read_pending && !b.gather_work) return;
  const auto start = std::chrono::steady_clock::now();
  if (b.read_pending) start_gather(b);
  b.gather_work->wait();
  b.gather_work.reset();
  finish_gather(b);
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (b.swap_id >= 0 && !b.from_secondary) store_->drop({b.swap_id});  // the file still holds it
}

void ParamStorage::release(size_t k) {
  Bucket& b = buckets_[k];
  if (b.persistent || !b.gathered) return;
  wait_gathered(k);
  empty_storage(b.full);
  for (auto& v : b.params) v.param.set_data(b.empty);
  b.gathered = false;
  gathered_now_ -= b.full.numel() * b.full.element_size();
}

void ParamStorage::release_all() {
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (!b.persistent && b.gathered) release(k);
    if (b.read_ahead) {  // read for a prefetch that did not come
      store_->drop({b.swap_id});
      b.read_ahead = false;
    }
    b.secondary = at::Tensor();
  }
}

void ParamStorage::prepare_write(size_t k) {
  buckets_[k].secondary = at::Tensor();  // the shard changes
  if (buckets_[k].swap_id >= 0) store_->materialize({buckets_[k].swap_id});  // written back by send_shard()
}

comm::WorkHandle ParamStorage::send_shard(size_t k) {
  Bucket& b = buckets_[k];
  b.secondary = at::Tensor();
  if (b.persistent) return owners_ > 1 ? pg_->all_gather_async(b.full, b.shard) : nullptr;
  if (b.swap_id >= 0) {
    // A step over a partition larger than memory never holds all of it.
    store_->write_behind(b.swap_id);
  }
  return nullptr;
}

void ParamStorage::wait_writes() {
  if (store_) store_->wait_behind();
}

int64_t ParamStorage::bytes() const {
  int64_t bytes = 0;
  for (const auto& b : buckets_) {
    if (!b.persistent) bytes += b.shard.nbytes();
    if (b.gathered) bytes += b.full.numel() * b.full.element_size();
    if (b.secondary.defined()) bytes += b.secondary.nbytes();
  }
  return bytes;
}

int64_t ParamStorage::offloaded_bytes(bool nvme) const {
  int64_t bytes = 0;
  for (const auto& b : buckets_) {
    if (b.persistent || options_.offload_param == OffloadDevice::none) continue;
    if ((b.swap_id >= 0) == nvme) bytes += b.shard.nbytes();
  }
  return bytes;
}

}  // namespace zero::partition
