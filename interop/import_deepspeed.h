#pragma once
// zero-ckpt import --from deepspeed: a DeepSpeed checkpoint (Note
// [DeepSpeed layout]) written as a zero checkpoint (Note [Checkpoint
// layout]). Torch-free; peak memory is one parameter's piece.
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace zero::interop {

struct ImportOptions {
  std::string from;  // DeepSpeed's checkpoint folder (holding `latest` and the tag folders)
  std::string out;   // the zero checkpoint folder to create: absent or empty
  std::string tag;   // empty: the one from/latest names
  // DeepSpeed's parameter and buffer names -> the zero model's; names not
  // in it are kept. Every key must name a tensor of the checkpoint.
  std::map<std::string, std::string> rename;
};

struct ImportSummary {
  std::string tag;
  int world_size = 0, stage = 0;
  std::string dtype;
  int64_t params = 0, elements = 0, buffers = 0;
  std::vector<std::string> states;
  int64_t global_steps = 0;
  std::vector<std::string> notes;  // what was left out, for the user to read
};

// Writes everything under a staging folder beside `out`, renamed to `out`
// only when complete; on any failure nothing is left at `out` and
// CheckpointError names what is wrong.
ImportSummary import_deepspeed(const ImportOptions& options);

// {"deepspeed name": "zero name", ...} from a JSON file, in the file's
// order; CheckpointError naming the file when it is not such an object,
// or maps two names to one.
std::vector<std::pair<std::string, std::string>> read_name_map(const std::string& path);

}  // namespace zero::interop
