#pragma once
// The state behind zero::DataLoader (zero/data.h), shared with what builds
// loaders: the Accelerator, which saves and restores their positions and
// reads how much of the last batch was padding, and the engine.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "zero/data.h"

namespace zero {

struct DataLoader::State {
  std::shared_ptr<Dataset> dataset;
  DataLoaderOptions options;
  uint64_t seed = 0;
  int64_t per_rank = 1;  // rows per rank per batch
  int dp_rank = 0;
  int dp_size = 1;
  at::Device device = at::kCPU;
  Position position;
  // Of the last batch handed out, the rows (all ranks) that are real samples
  // and not fill-up duplicates; equal to the global batch when it was full.
  int64_t last_real_rows = 0;
  // When it last handed out a batch (a count over all loaders), to find the
  // loader gather_for_metrics belongs to.
  uint64_t handed_out = 0;

  int64_t global_batch() const { return per_rank * dp_size; }
  int64_t num_samples() const { return dataset->size(); }
  // Batches left in the epoch from `samples` handed out.
  int64_t batches_from(int64_t samples) const;
  // The dataset index at `position` of epoch `epoch`'s order (cached per epoch).
  const std::vector<int64_t>& order(int64_t epoch);

 private:
  int64_t order_epoch_ = -1;
  std::vector<int64_t> order_;
};

// Note [Data that resumes]: a loader's position as a checkpoint keeps it
// (Engine::save_checkpoint, in the manifest's "engine" record), with what
// the position means: the dataset's size and the shuffle's seed and
// switch. Shuffled, those must be the same to resume; in order, a larger
// dataset resumes too (sample i is index i). Positions count samples of
// the epoch's order handed out by all ranks together, so they carry over
// to another world size.
struct SavedLoaderPosition {
  int64_t epoch = 0, samples = 0;
  int64_t dataset_size = 0, global_batch = 0;
  uint64_t seed = 0;
  bool shuffle = true;
};
// (The engine saves and restores them: engine/training_parts.h.)

}  // namespace zero
