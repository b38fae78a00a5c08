#pragma once
// What a checkpoint saves and restores of a run. The engine hands this to
// checkpointing (engine/checkpoint_save.cpp, checkpoint_load.cpp) instead
// of itself: the parts, by reference, and the counters it keeps.
#include <torch/torch.h>

#include <set>
#include <string>

#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "partition/partition.h"
#include "zero/mesh.h"
#include "zero/tensor_parallel.h"

namespace zero::engine {

// The engine's counters, by DeepSpeed's names.
struct StepCounters {
  int64_t micro_steps = 0, global_steps = 0, skipped_steps = 0;
  // The scheduler's step is global_steps - skipped_steps - schedule_start
  // (a checkpoint loaded without its scheduler state restarts the schedule).
  int64_t schedule_start = 0;
  double lr = 0.0;
  int64_t scheduler_steps() const { return global_steps - skipped_steps - schedule_start; }
};

struct TrainingState {
  const Config& config;
  at::ScalarType dtype;  // of the parameters
  int64_t gas;           // gradient_accumulation_steps
  torch::nn::Module& module;
  comm::ProcessGroup& pg;  // the world
  const Mesh& mesh;        // params is sharded over mesh.dp_group()
  // Tensor-parallel parameters, by name: checkpoints store their full
  // shapes and write their slices in full coordinates.
  const std::map<std::string, tp::Split>& splits;
  partition::ShardedParams& params;
  optim::MasterOptimizer& optimizer;  // with offload_optimizer "nvme", params.masters().nvme_store() holds its states too
  const LrSchedule& schedule;
  LossScaler* scaler;  // fp16 only
  StepCounters& counters;
  // Set by a load that failed after it began writing (what failed), cleared
  // by one that succeeds: the engine refuses to train or save meanwhile.
  std::string& partly_loaded;
  // A pipeline's tied modules: the parameters and buffers another stage
  // writes (the first stage holding each), so each is saved once.
  std::set<std::string> written_elsewhere = {};
};

// Engine::save_checkpoint and Engine::load_checkpoint (include/zero/engine.h).
void save_checkpoint(TrainingState& state, const std::string& dir, const std::string& tag,
                     const std::string& client_state, const SaveOptions& options = {});
std::string load_checkpoint(TrainingState& state, const std::string& dir, const std::string& tag,
                            const LoadOptions& options);
// Engine::load_weights (engine/weights_load.cpp).
void load_weights(TrainingState& state, const std::string& path, const WeightsLoadOptions& options);

}  // namespace zero::engine
