// Engine::data_loader: DeepSpeed's deepspeed_io, the engine's own data
// loader (zero/data.h) over its data-parallel ranks.
#include <torch/torch.h>

#include "data/data_loader.h"
#include "engine/engine_impl.h"
#include "zero/engine.h"
#include "zero/error.h"

namespace zero {

DataLoader Engine::data_loader(std::shared_ptr<Dataset> dataset, const DataLoaderOptions& options) {
  if (!dataset) throw EngineError("Engine::data_loader got no dataset");
  const auto& micro = impl_->config.batch.train_micro_batch_size_per_gpu;
  const int64_t rows = options.batch_size.value_or(micro.value_or(1));
  if (rows < 1) throw EngineError("Engine::data_loader: batch_size must be >= 1, got " + std::to_string(rows));
  if (dataset->size() < 1) throw EngineError("Engine::data_loader: the dataset is empty");
  auto state = std::make_shared<DataLoader::State>();
  state->dataset = std::move(dataset);
  state->options = options;
  state->seed = options.seed.value_or(0);  // DistributedSampler's default seed
  state->per_rank = rows;
  // Tensor-parallel and pipeline ranks of one data-parallel rank read the same rows.
  state->dp_rank = impl_->mesh->dp_group()->rank();
  state->dp_size = impl_->mesh->dp_group()->size();
  state->device = impl_->model_device;
  impl_->data_loaders.push_back(state);
  engine::restore_loader(*impl_, impl_->data_loaders.size() - 1);  // made after a load: its saved position
  return DataLoader(state);
}

namespace engine {

SavedLoaderPosition saved_position(const DataLoader::State& loader) {
  SavedLoaderPosition p;
  p.epoch = loader.position.epoch;
  p.samples = loader.position.samples;
  p.dataset_size = loader.num_samples();
  p.global_batch = loader.global_batch();
  p.seed = loader.seed;
  p.shuffle = loader.options.shuffle;
  return p;
}

void check_position(const DataLoader::State& loader, const SavedLoaderPosition& saved, size_t index, const std::string& where) {
  // In order, sample i is index i at any dataset size: a longer dataset
  // (more steps planned) keeps the position. Shuffled, the size and the
  // seed make the order.
  const bool same_order = saved.shuffle == loader.options.shuffle &&
                          (saved.shuffle ? saved.dataset_size == loader.num_samples() && saved.seed == loader.seed
                                         : saved.samples <= loader.num_samples());
  if (!same_order) {
    auto describe = [](int64_t size, uint64_t seed, bool shuffle) {
      return std::to_string(size) + " samples (" + (shuffle ? "shuffled, seed " + std::to_string(seed) : "in order") + ")";
    };
    throw CheckpointError("data loader " + std::to_string(index) + " (in the order engine.data_loader made them) was saved in " +
                          where + " over " + describe(saved.dataset_size, saved.seed, saved.shuffle) +
                          " and this one reads " + describe(loader.num_samples(), loader.seed, loader.options.shuffle) +
                          ": its position would name other samples; make the same loaders, in the same order");
  }
}

void restore_loader(TrainingParts& s, size_t index) {
  if (index >= s.loaded_positions.size()) return;
  auto loader = s.data_loaders[index].lock();
  if (!loader) return;
  const SavedLoaderPosition& saved = s.loaded_positions[index];
  check_position(*loader, saved, index, s.loaded_from);
  loader->position = DataLoader::Position{saved.epoch, saved.samples};
}

}  // namespace engine

}  // namespace zero
