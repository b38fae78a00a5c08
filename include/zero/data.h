#pragma once
// Datasets and the data loader that hands each data-parallel rank its share
// of every global batch: zero::Accelerator::prepare(dataset) and
// zero::Engine::data_loader(dataset) return one.
//
//   auto tokens = std::make_shared<zero::TokenDataset>("train.bin", 1024);  // nanoGPT's uint16 ids
//   zero::DataLoader loader = engine.data_loader(tokens);   // micro-batches of [micro, 1024]
//   for (const auto& batch : loader) { ... batch[0] ... }   // one epoch, this rank's rows
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace zero {

// A map-style dataset: example i is a few tensors (inputs, labels, ...).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual std::vector<at::Tensor> get(int64_t index) const = 0;
  // The examples at `indices` collated: each tensor stacked along a new
  // first dimension. Override when a dataset can do it at once.
  virtual std::vector<at::Tensor> get_batch(const std::vector<int64_t>& indices) const;
};

// Rows of tensors that share their first dimension (torch's TensorDataset).
class TensorDataset : public Dataset {
 public:
  explicit TensorDataset(std::vector<at::Tensor> tensors);
  int64_t size() const override;
  std::vector<at::Tensor> get(int64_t index) const override;
  std::vector<at::Tensor> get_batch(const std::vector<int64_t>& indices) const override;

 private:
  std::vector<at::Tensor> tensors_;
};

struct DataLoaderOptions {
  // Rows per rank per batch, or the global batch under the Accelerator's
  // split_batches. Unset: the Accelerator's 1 (torch's default), the
  // engine's train_micro_batch_size_per_gpu (DeepSpeed's deepspeed_io).
  std::optional<int64_t> batch_size;
  bool shuffle = true;   // a new order each epoch, from (seed, epoch) alone
  // The last, incomplete global batch: dropped, or filled up with samples
  // from the start of the epoch's order so every rank gets a full batch
  // (Accelerate's even_batches); gather_for_metrics drops those again.
  bool drop_last = false;
  std::optional<uint64_t> seed;  // unset: the Accelerator's seed
};

// The data loader Accelerator::prepare(dataset) and Engine::data_loader()
// return (DeepSpeed's deepspeed_io, torch's DataLoader over a
// DistributedSampler). Each global batch is `batch_size x
// data-parallel ranks` consecutive samples of the epoch's order and rank d
// takes rows [d*b, (d+1)*b): every sample once per epoch across the ranks,
// and the same global batches at any world size with the same global batch.
// Iterating goes on from the current position (after load_state: mid-epoch)
// to the end of the epoch, which moves the position to the next epoch.
class DataLoader {
 public:
  using Batch = std::vector<at::Tensor>;
  // Where the loader is: the next batch it hands out is the one at
  // `samples` of epoch `epoch`'s order. A batch counts as handed out as soon
  // as the iterator holds it, so inside a range-for's body position() is
  // already past the batch being trained on: saved there, a resume goes on
  // with the next batch. Engine::save_checkpoint saves it for you.
  struct Position {
    int64_t epoch = 0;
    int64_t samples = 0;  // samples of the epoch's order already handed out, all ranks together
  };

  int64_t epoch() const;
  // Starts epoch `epoch` from its first batch; keeps the position when it is
  // already in that epoch (so a resumed loop may call it).
  void set_epoch(int64_t epoch);
  // Batches this rank gets in the rest of the current epoch.
  int64_t remaining_batches() const;
  // Batches per epoch (on each rank).
  int64_t batches_per_epoch() const;
  int64_t global_batch_size() const;
  int64_t batch_size_per_rank() const;
  Position position() const;
  void set_position(const Position& position);
  // The dataset indices of global batch `batch` (counted from `position`'s
  // samples) of `epoch`, all ranks' rows in order; what the loader hands out.
  std::vector<int64_t> global_batch_indices(int64_t epoch, int64_t first_sample) const;

  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;
    iterator() = default;
    explicit iterator(DataLoader* loader);
    const Batch& operator*() const { return batch_; }
    const Batch* operator->() const { return &batch_; }
    iterator& operator++();
    bool operator==(const iterator& other) const { return loader_ == other.loader_; }
    bool operator!=(const iterator& other) const { return !(*this == other); }

   private:
    void load();
    DataLoader* loader_ = nullptr;
    Batch batch_;
  };
  iterator begin() { return iterator(this); }
  iterator end() { return iterator(); }

  struct State;  // accelerate/data_loader.h
  explicit DataLoader(std::shared_ptr<State> state);
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};

// A token file cut into sequences: raw little-endian ids (nanoGPT's uint16,
// or uint32), memory-mapped, so a file larger than memory works. Example i is
// one tensor, the `sequence_length` ids at [i*T, (i+1)*T) as int64; a
// shorter remainder at the end is dropped. The ids are read when a batch is
// made; check_ids() reads them all once, to refuse bad data before training.
class TokenDataset : public Dataset {
 public:
  // `bytes_per_token`: 2 (uint16) or 4 (uint32).
  TokenDataset(const std::string& path, int64_t sequence_length, int bytes_per_token = 2);
  int64_t size() const override;  // whole sequences in the file
  std::vector<at::Tensor> get(int64_t index) const override;
  std::vector<at::Tensor> get_batch(const std::vector<int64_t>& indices) const override;
  int64_t tokens() const;  // ids in the file
  int64_t sequence_length() const;
  const std::string& path() const;
  // Every id of the whole sequences below `vocab_size`, or an EngineError
  // naming the file, the id and its byte offset.
  void check_ids(int64_t vocab_size) const;

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> map_;
  int64_t sequence_length_;
};

}  // namespace zero
