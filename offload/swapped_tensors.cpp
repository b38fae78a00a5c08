#include "offload/swapped_tensors.h"

#include <algorithm>
#include <exception>
#include <cstdlib>
#include <cstring>

#include "core/progress.h"
#include "zero/error.h"

namespace zero::offload {
namespace {

void free_aligned(void* p) { std::free(p); }

size_t round_up(size_t n) { return (n + kIoAlignment - 1) / kIoAlignment * kIoAlignment; }

}  // namespace

SwappedTensors::SwappedTensors(SwapOptions options)
    : reports_progress_(options.rank == 0), swapper_(std::make_unique<NvmeSwapper>(std::move(options))) {}

SwappedTensors::~SwappedTensors() {
  try {
    swapper_->wait_all();
  } catch (...) {  // the folder goes away with the swapper anyway
  }
}

SwappedTensors::Entry SwappedTensors::entry_for(const at::Tensor& tensor, const std::string& key) {
  if (!tensor.is_cpu() || !tensor.is_contiguous() || tensor.storage_offset() != 0 ||
      tensor.storage().nbytes() != tensor.nbytes()) {
    throw OffloadError("NVMe offload of \"" + key + "\": the tensor must be a contiguous host tensor owning its storage");
  }
  Entry e;
  e.tensor = tensor;
  e.key = key;
  e.bytes = tensor.nbytes();
  return e;
}

int SwappedTensors::add(const at::Tensor& tensor, const std::string& key) {
  Entry e = entry_for(tensor, key);
  // Move the values into aligned memory (O_DIRECT reads and writes use it
  // in place); the old memory goes when `values` does.
  const at::DataPtr values = tensor.storage().unsafeGetStorageImpl()->set_data_ptr(at::DataPtr(nullptr, at::Device(at::kCPU)));
  allocate(e);
  if (e.bytes > 0) std::memcpy(e.tensor.data_ptr(), values.get(), e.bytes);
  entries_.push_back(std::move(e));
  return static_cast<int>(entries_.size()) - 1;
}

std::pair<at::Tensor, int> SwappedTensors::add_copy(const at::Tensor& source, at::ScalarType dtype, const std::string& key) {
  if (!source.is_cpu()) throw OffloadError("NVMe offload of \"" + key + "\": the source must be a host tensor");
  Entry e;
  e.key = key;
  e.bytes = static_cast<size_t>(source.numel()) * c10::elementSize(dtype);
  e.tensor = at::empty({0}, at::TensorOptions().dtype(dtype));  // its memory: allocate()'s
  allocate(e);
  e.tensor.unsafeGetTensorImpl()->set_sizes_contiguous({source.numel()});
  e.tensor.copy_(source.reshape(-1));
  at::Tensor tensor = e.tensor;
  entries_.push_back(std::move(e));
  return {tensor, static_cast<int>(entries_.size()) - 1};
}

int SwappedTensors::add_filled(const at::Tensor& tensor, const std::string& key, double value) {
  Entry e = entry_for(tensor, key);
  e.fill = value;
  resident_ += static_cast<int64_t>(e.bytes);  // free_memory() takes it off
  free_memory(e);
  entries_.push_back(std::move(e));
  return static_cast<int>(entries_.size()) - 1;
}

void SwappedTensors::remove(const std::vector<int>& ids) {
  for (int id : ids) {
    Entry& e = entry(id);
    swapper_->remove(e.key);
    behind_.erase(std::remove(behind_.begin(), behind_.end(), id), behind_.end());
    e.reading = e.writing = false;
    if (e.resident) free_memory(e);
    e.on_disk = false;
    e.fill.reset();
    e.removed = true;
  }
}

SwappedTensors::Entry& SwappedTensors::entry(int id) {
  Entry& e = entries_.at(id);
  if (e.removed) throw OffloadError("\"" + e.key + "\" was removed from NVMe offload and cannot be used again");
  return e;
}

void SwappedTensors::allocate(Entry& e) {
  void* p = nullptr;
  if (posix_memalign(&p, kIoAlignment, std::max<size_t>(round_up(e.bytes), kIoAlignment)) != 0) {
    throw OffloadError("out of host memory allocating " + std::to_string(e.bytes) + " bytes for \"" + e.key + "\"");
  }
  c10::StorageImpl* storage = e.tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(p, p, &free_aligned, at::Device(at::kCPU)));
  storage->set_nbytes(e.bytes);
  e.resident = true;
  resident_ += static_cast<int64_t>(e.bytes);
  peak_ = std::max(peak_, resident_);
}

void SwappedTensors::free_memory(Entry& e) {
  c10::StorageImpl* storage = e.tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, at::Device(at::kCPU)));
  storage->set_nbytes(0);
  e.resident = false;
  resident_ -= static_cast<int64_t>(e.bytes);
}

void SwappedTensors::swap_in(const std::vector<int>& ids) {
  for (int id : ids) {
    Entry& e = entry(id);
    if (e.resident || e.reading) continue;
    allocate(e);
    if (e.fill) {  // never written: its value, without reading
      e.tensor.fill_(*e.fill);
      continue;
    }
    e.ticket = swapper_->read(e.key, e.tensor.data_ptr(), e.bytes);
    e.reading = true;
  }
}

void SwappedTensors::wait_in(const std::vector<int>& ids) {
  swap_in(ids);
  for (int id : ids) {
    Entry& e = entry(id);
    if (!e.reading) continue;
    e.reading = false;
    swapper_->wait(e.ticket);
  }
}

void SwappedTensors::swap_out(const std::vector<int>& ids) {
  for (int id : ids) {
    Entry& e = entry(id);
    if (!e.resident || e.writing) continue;
    if (e.reading) wait_in({id});
    e.ticket = swapper_->write(e.key, e.tensor.data_ptr(), e.bytes);
    e.writing = true;
  }
}

void SwappedTensors::wait_out(const std::vector<int>& ids) {
  for (int id : ids) {
    Entry& e = entry(id);
    if (!e.writing) continue;
    settle_out({id});
    free_memory(e);
  }
}

void SwappedTensors::settle_out(const std::vector<int>& ids) {
  for (int id : ids) {
    Entry& e = entry(id);
    if (!e.writing) continue;
    e.writing = false;
    swapper_->wait(e.ticket);
    e.on_disk = true;
    e.fill.reset();
  }
}

void SwappedTensors::write_behind(int id) {
  swap_out({id});
  behind_.erase(std::remove(behind_.begin(), behind_.end(), id), behind_.end());  // written again
  behind_.push_back(id);
  if (behind_.size() > kWritesBehind) {
    wait_out({behind_.front()});
    behind_.erase(behind_.begin());
  }
}

// Every write is waited for, even after one fails (none stays in flight on
// memory the caller may free); then the first failure is raised.
void SwappedTensors::wait_behind() {
  std::exception_ptr first;
  for (int id : behind_) {
    try {
      wait_out({id});
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  behind_.clear();
  if (first) std::rethrow_exception(first);
}

void SwappedTensors::materialize(const std::vector<int>& ids) {
  for (int id : ids) {
    Entry& e = entry(id);
    if (e.reading) wait_in({id});
    if (!e.resident) allocate(e);
  }
}

void SwappedTensors::drop(const std::vector<int>& ids) {
  for (int id : ids) {
    Entry& e = entry(id);
    if (e.reading) wait_in({id});
    if (e.writing) wait_out({id});
    if (!e.on_disk && !e.fill) throw OffloadError("\"" + e.key + "\" was never written to NVMe; swap it out instead of dropping it");
    if (e.resident) free_memory(e);
  }
}

void SwappedTensors::forget(const std::vector<int>& ids) noexcept {
  for (int id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= entries_.size() || entries_[id].removed) continue;
    Entry& e = entries_[id];
    if (e.reading || e.writing) {
      try {
        swapper_->wait(e.ticket);
      } catch (...) {  // the step reports its first failure
      }
      e.reading = e.writing = false;
    }
    behind_.erase(std::remove(behind_.begin(), behind_.end(), id), behind_.end());
    if (e.resident) free_memory(e);
  }
}

std::vector<int> SwappedTensors::live_ids() const {
  std::vector<int> ids;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].removed) ids.push_back(static_cast<int>(i));
  }
  return ids;
}

void SwappedTensors::swap_in_all() { wait_in(live_ids()); }

// The first write of everything resident (the engine's initialize, where
// nothing was written as it was made) lays out the swap files: the long
// one, with a progress report on rank 0.
void SwappedTensors::swap_out_all() {
  std::vector<int> all = live_ids();
  int64_t total = 0;
  for (int id : all) total += entries_[id].resident ? static_cast<int64_t>(entries_[id].bytes) : 0;
  swap_out(all);
  Progress progress("writing the NVMe swap files", total, reports_progress_ && total > 0);
  for (int id : all) {
    const bool written = entries_[id].writing;
    wait_out({id});
    if (written) progress.advance(static_cast<int64_t>(entries_[id].bytes));
  }
}

int SwappedTensors::find(const at::Tensor& tensor) const {
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].tensor.unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl()) return static_cast<int>(i);
  }
  return -1;
}

int64_t SwappedTensors::nvme_bytes() const {
  int64_t bytes = 0;
  for (const auto& e : entries_) bytes += e.removed ? 0 : static_cast<int64_t>(e.bytes);
  return bytes;
}

int64_t SwappedTensors::resident_bytes() const { return resident_; }

bool SwappedTensors::direct_io() const { return swapper_->direct_io(); }

}  // namespace zero::offload
