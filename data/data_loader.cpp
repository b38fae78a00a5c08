// zero::DataLoader: each rank's share of every global batch (zero/data.h).
#include "data/data_loader.h"

#include <ATen/CPUGeneratorImpl.h>

#include <atomic>

#include "zero/error.h"

namespace zero {

std::vector<at::Tensor> Dataset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<std::vector<at::Tensor>> columns;
  for (int64_t index : indices) {
    std::vector<at::Tensor> example = get(index);
    if (columns.empty()) columns.resize(example.size());
    if (example.size() != columns.size()) {
      throw EngineError("Dataset::get(" + std::to_string(index) + ") returned " + std::to_string(example.size()) +
                        " tensors where earlier examples had " + std::to_string(columns.size()));
    }
    for (size_t c = 0; c < example.size(); ++c) columns[c].push_back(std::move(example[c]));
  }
  std::vector<at::Tensor> batch;
  for (auto& column : columns) batch.push_back(torch::stack(column));
  return batch;
}

TensorDataset::TensorDataset(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {
  if (tensors_.empty()) throw EngineError("TensorDataset needs at least one tensor");
  for (const auto& t : tensors_) {
    if (t.dim() == 0 || t.size(0) != tensors_[0].size(0)) {
      throw EngineError("TensorDataset: every tensor needs the same first dimension (" +
                        std::to_string(tensors_[0].size(0)) + "), one has shape " + c10::str(t.sizes()));
    }
  }
}

int64_t TensorDataset::size() const { return tensors_[0].size(0); }

std::vector<at::Tensor> TensorDataset::get(int64_t index) const {
  std::vector<at::Tensor> out;
  for (const auto& t : tensors_) out.push_back(t[index]);
  return out;
}

std::vector<at::Tensor> TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  const at::Tensor rows = torch::tensor(indices, torch::kLong);
  std::vector<at::Tensor> out;
  for (const auto& t : tensors_) out.push_back(t.index_select(0, rows));
  return out;
}

int64_t DataLoader::State::batches_from(int64_t samples) const {
  const int64_t left = std::max<int64_t>(0, num_samples() - samples);
  const int64_t g = global_batch();
  return options.drop_last ? left / g : (left + g - 1) / g;
}

const std::vector<int64_t>& DataLoader::State::order(int64_t epoch) {
  if (order_epoch_ == epoch) return order_;
  const int64_t n = num_samples();
  at::Tensor perm;
  if (options.shuffle) {
    // From (seed, epoch) alone: the same order at every world size and on resume.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(epoch));
    perm = torch::randperm(n, gen, torch::kLong);
  } else {
    perm = torch::arange(n, torch::kLong);
  }
  order_.assign(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n);
  order_epoch_ = epoch;
  return order_;
}

DataLoader::DataLoader(std::shared_ptr<State> state) : state_(std::move(state)) {}

int64_t DataLoader::epoch() const { return state_->position.epoch; }

void DataLoader::set_epoch(int64_t epoch) {
  if (epoch < 0) throw EngineError("DataLoader::set_epoch: epoch must be >= 0, got " + std::to_string(epoch));
  if (state_->position.epoch != epoch) state_->position = Position{epoch, 0};
}

int64_t DataLoader::remaining_batches() const { return state_->batches_from(state_->position.samples); }
int64_t DataLoader::batches_per_epoch() const { return state_->batches_from(0); }
int64_t DataLoader::global_batch_size() const { return state_->global_batch(); }
int64_t DataLoader::batch_size_per_rank() const { return state_->per_rank; }
DataLoader::Position DataLoader::position() const { return state_->position; }

void DataLoader::set_position(const Position& position) {
  if (position.epoch < 0 || position.samples < 0) {
    throw EngineError("DataLoader::set_position: epoch and samples must be >= 0");
  }
  state_->position = position;
}

std::vector<int64_t> DataLoader::global_batch_indices(int64_t epoch, int64_t first_sample) const {
  const auto& order = state_->order(epoch);
  const int64_t n = static_cast<int64_t>(order.size());
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(state_->global_batch()));
  for (int64_t i = 0; i < state_->global_batch(); ++i) {
    const int64_t pos = first_sample + i;
    // Past the end: filled up from the start of the epoch's order.
    out.push_back(order[static_cast<size_t>(pos < n ? pos : (pos - n) % n)]);
  }
  return out;
}

DataLoader::iterator::iterator(DataLoader* loader) : loader_(loader) {
  State& s = *loader_->state_;
  if (s.batches_from(s.position.samples) == 0) {
    // Nothing left of this epoch (or only a remainder drop_last drops).
    s.position = Position{s.position.epoch + 1, 0};
    loader_ = nullptr;
    return;
  }
  load();
}

DataLoader::iterator& DataLoader::iterator::operator++() {
  State& s = *loader_->state_;
  if (s.batches_from(s.position.samples) == 0) {
    s.position = Position{s.position.epoch + 1, 0};
    loader_ = nullptr;
    batch_.clear();
    return *this;
  }
  load();
  return *this;
}

// Hands out the batch at the position and moves the position past it, so
// that a save_state inside the loop's body resumes with the next batch.
void DataLoader::iterator::load() {
  State& s = *loader_->state_;
  const int64_t first = s.position.samples;
  const std::vector<int64_t> global = loader_->global_batch_indices(s.position.epoch, first);
  const auto begin = global.begin() + s.dp_rank * s.per_rank;
  batch_ = s.dataset->get_batch(std::vector<int64_t>(begin, begin + s.per_rank));
  if (s.device != at::Device(at::kCPU)) {
    for (auto& t : batch_) t = t.to(s.device, /*non_blocking=*/true);
  }
  s.last_real_rows = std::min(s.global_batch(), s.num_samples() - first);
  static std::atomic<uint64_t> clock{0};
  s.handed_out = ++clock;
  s.position.samples = first + s.global_batch();
}

}  // namespace zero
