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
  return DataLoader(state);
}

}  // namespace zero
