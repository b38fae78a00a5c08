#pragma once
// What a run trains with, which checkpointing saves and restores.
#include <torch/torch.h>

#include <map>
#include <memory>
#include <set>
#include <string>

#include "data/data_loader.h"
#include "engine/client_optimizer.h"
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

// The parts a run trains with and the counters it keeps: Engine::Impl is
// these plus its per-step bookkeeping (engine_impl.h), and checkpointing
// (checkpoint_save.cpp, checkpoint_load.cpp, weights_load.cpp) borrows
// them as they are, so there is one list of what a checkpoint saves and
// restores of a run.
struct TrainingParts {
  Config config;
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<comm::ProcessGroup> pg;  // the world
  std::shared_ptr<Mesh> mesh;              // its tp x dp x pp layout; ZeRO works over mesh->dp_group()
  // Tensor-parallel parameters, by name (after AutoTP): checkpoints store
  // their full shapes and write their slices in full coordinates.
  std::map<std::string, tp::Split> splits;
  at::ScalarType dtype = at::kFloat;  // of the parameters
  int64_t gas = 1;                    // gradient_accumulation_steps
  std::unique_ptr<partition::ShardedParams> sharded;  // over mesh->dp_group()
  // With offload_optimizer "nvme", sharded->masters().nvme_store() holds its states too.
  std::unique_ptr<optim::MasterOptimizer> optimizer;
  std::unique_ptr<LrSchedule> schedule;
  // A client optimizer given to initialize, which `optimizer` steps (Note
  // [Client optimizer] in engine/client_optimizer.h); null otherwise.
  std::unique_ptr<ClientOptimizer> client;
  std::unique_ptr<LossScaler> scaler;  // fp16 only
  StepCounters steps;
  // Set by a load that failed after it began writing (what failed), cleared
  // by one that succeeds: the engine refuses to train or save meanwhile.
  std::string partly_loaded;
  // Set by an optimizer step that failed part-way (Note [A failed transfer
  // in the step] in partition/step.cpp), naming it: the engine refuses to
  // train, save or load, since its parameters and optimizer states are
  // partly updated; a new engine loads the last checkpoint.
  std::string stopped;
  // A pipeline's tied modules: the parameters and buffers another stage
  // writes (the first stage holding each), so each is saved once.
  std::set<std::string> written_elsewhere;
  // The loaders Engine::data_loader made, in order (Note [Data that
  // resumes]): a checkpoint keeps their positions, and a load restores
  // them, to loaders made before it at once and to those made after it as
  // they are made (loaded_positions, and where they came from).
  std::vector<std::weak_ptr<DataLoader::State>> data_loaders;
  std::vector<SavedLoaderPosition> loaded_positions;
  std::string loaded_from;

  // The rate the next optimizer step uses: the schedule's, or with a client
  // optimizer and no config "scheduler", its first group's.
  double next_lr() const;
};

// Note [Data that resumes] (engine/data_loader.cpp):
SavedLoaderPosition saved_position(const DataLoader::State& loader);
// Throws a CheckpointError naming loader `index` of the checkpoint at
// `where` when `saved` would name other samples in `loader`: shuffle on in
// one and off in the other, or shuffled over another dataset size or seed,
// or in order past the end of the dataset.
void check_position(const DataLoader::State& loader, const SavedLoaderPosition& saved, size_t index, const std::string& where);
// Loader `index` of s.data_loaders to its saved position (checked), when
// the last load held one for it.
void restore_loader(TrainingParts& s, size_t index);

// Engine::save_checkpoint and Engine::load_checkpoint (include/zero/engine.h).
struct FolderPerNode;  // engine/memory_copies.h
void save_checkpoint(TrainingParts& parts, const std::string& dir, const std::string& tag,
                     const std::string& client_state, const SaveOptions& options = {},
                     const FolderPerNode* per_node = nullptr);
std::string load_checkpoint(TrainingParts& parts, const std::string& dir, const std::string& tag,
                            const LoadOptions& options);
// Engine::load_weights (engine/weights_load.cpp).
void load_weights(TrainingParts& parts, const std::string& path, const WeightsLoadOptions& options);

}  // namespace zero::engine
