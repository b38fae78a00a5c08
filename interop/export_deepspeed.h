#pragma once
// zero-ckpt export --to deepspeed: a zero checkpoint (Note [Checkpoint
// layout]) written as the folder DeepSpeed 0.19's engine.save_checkpoint
// would have written (Note [DeepSpeed layout]) for the ds_config and world
// size DeepSpeed will resume with. Torch-free.
#include <string>
#include <utility>
#include <vector>

namespace zero::interop {

struct ExportOptions {
  std::string from;    // the zero checkpoint folder
  std::string out;     // the DeepSpeed folder to create: absent or empty
  std::string tag;     // empty: the one from/latest names
  std::string config;  // the ds_config file DeepSpeed will run with (stage, bf16, optimizer, scheduler)
  int world_size = 0;  // DeepSpeed's data-parallel world size; 0: the checkpoint's
  // DeepSpeed names -> zero names (the import's map, read in its order,
  // which is also the DeepSpeed model's parameter order).
  std::vector<std::pair<std::string, std::string>> rename;
};

struct ExportSummary {
  std::string tag;
  int world_size = 0, stage = 0;
  std::string dtype;
  int64_t params = 0, elements = 0;
  std::vector<std::string> notes;
};

// Stages the folder beside `out` and renames it into place when complete;
// CheckpointError names what is wrong and nothing is left at `out`.
// Memory: one DeepSpeed rank's partition (its master weights and states),
// and at stages 1-2 the model in the training dtype for the model states.
ExportSummary export_deepspeed(const ExportOptions& options);

}  // namespace zero::interop
