#pragma once
// Host tensors whose bytes live in files under nvme_path between uses
// (ZeRO-Infinity's NVMe tier), moved by NvmeSwapper (io_uring).
//
// A tensor keeps its TensorImpl (so optimizer states and master weights
// stay registered where they are); only the memory behind it comes and
// goes, as with stage-3 parameters (Note [Stage 3 storage] in
// partition/param_storage.h). Resident
// memory is 4 KiB-aligned so that O_DIRECT reads and writes go straight
// to and from it. Used from one thread.
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "offload/swapper.h"

namespace zero::offload {

class SwappedTensors {
 public:
  explicit SwappedTensors(SwapOptions options);
  ~SwappedTensors();

  // Registers a contiguous host tensor that owns its whole storage; its
  // values go to disk with the next swap_out. Returns its id. The values
  // move into aligned memory (one copy); the tensor keeps its TensorImpl.
  int add(const at::Tensor& tensor, const std::string& key);
  // Registers a new 1-D tensor of `dtype` with `source`'s values
  // (flattened, converted), copied once, straight into the aligned memory
  // that its reads and writes use: what initialize streams to disk makes
  // no other copy on its way. Returns the tensor and its id.
  std::pair<at::Tensor, int> add_copy(const at::Tensor& source, at::ScalarType dtype, const std::string& key);
  // Registers a host tensor that holds `value` everywhere (an optimizer
  // state as it starts): its memory is let go now and nothing is written;
  // until its first write, reading it fills `value` instead of reading a
  // file. Initialize then costs neither the memory nor the disk time.
  int add_filled(const at::Tensor& tensor, const std::string& key, double value);
  // Lets the tensors' memory and files go for good (their values are no
  // longer needed); the ids must not be used again.
  void remove(const std::vector<int>& ids);

  // Reads start at once; wait_in() makes the tensors usable.
  void swap_in(const std::vector<int>& ids);
  void wait_in(const std::vector<int>& ids);
  // Writes start at once; wait_out() frees the memory once they are done.
  void swap_out(const std::vector<int>& ids);
  void wait_out(const std::vector<int>& ids);
  // Waits for their writes, keeping the memory (to change it and write again).
  void settle_out(const std::vector<int>& ids);
  // Streaming writes: starts writing `id` and, with more than kWritesBehind
  // earlier ones still in flight, waits for the oldest (its memory goes), so
  // that a stream of tensors larger than memory never is in it at once.
  // wait_behind() waits for the rest.
  static constexpr size_t kWritesBehind = 2;
  void write_behind(int id);
  void wait_behind();
  // Memory without reading (the caller overwrites all of it), or memory let
  // go without writing (the file is current).
  void materialize(const std::vector<int>& ids);
  void drop(const std::vector<int>& ids);
  // After a failed transfer: waits for what is in flight on them (its errors
  // were reported, or are forfeit) and lets their memory go unwritten. Their
  // files hold whatever the disk has; the caller reloads them before use.
  void forget(const std::vector<int>& ids) noexcept;
  void swap_in_all();   // and wait
  void swap_out_all();  // and wait
  bool resident(int id) { return entry(id).resident; }
  // The id `tensor` (the same TensorImpl) was added under, or -1.
  int find(const at::Tensor& tensor) const;

  int64_t nvme_bytes() const;      // bytes kept on disk
  int64_t resident_bytes() const;  // bytes in host memory now
  // The most bytes in host memory at once since construction or reset_peak().
  int64_t peak_resident_bytes() const { return peak_; }
  void reset_peak() { peak_ = resident_; }
  bool direct_io() const;

 private:
  struct Entry {
    at::Tensor tensor;
    std::string key;
    size_t bytes = 0;
    bool resident = true;
    bool on_disk = false;
    SwapTicket ticket = 0;
    bool reading = false, writing = false;
    std::optional<double> fill;  // add_filled: its value until it is written
    bool removed = false;
  };
  static Entry entry_for(const at::Tensor& tensor, const std::string& key);  // checked, not yet registered
  Entry& entry(int id);
  std::vector<int> live_ids() const;  // every id not removed
  void allocate(Entry& e);
  void free_memory(Entry& e);

  bool reports_progress_ = false;  // rank 0
  std::unique_ptr<NvmeSwapper> swapper_;
  std::vector<Entry> entries_;
  int64_t resident_ = 0, peak_ = 0;
  std::vector<int> behind_;  // write_behind()'s writes, oldest first
};

}  // namespace zero::offload
