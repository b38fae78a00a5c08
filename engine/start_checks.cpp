// Note [Refuse at the start]: an option whose outcome is known before
// training (a folder a save will write into, the checkpoint a load will
// read) is checked before the model is built, so that a run does not train
// for hours and then fail at its last line. Programs call these right after
// parsing their options (tools/llama/main.cpp, examples/accelerate_gpt.cpp).
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <string>
#include <vector>
#include <system_error>

#include "ckpt/checkpoint.h"
#include "zero/engine.h"
#include "zero/error.h"

namespace zero {

namespace fs = std::filesystem;

void check_save_dir(const std::string& dir, const std::string& option) {
  const auto refuse = [&](const std::string& why) {
    throw CheckpointError(option + " " + dir + ": " + why + "; choose a folder this process can write");
  };
  if (dir.empty()) refuse("the path is empty");
  std::error_code ec;
  // The folder itself, or the nearest parent that exists: a save creates the rest.
  const fs::path whole = fs::absolute(dir, ec);
  if (ec) refuse("the path cannot be resolved (" + ec.message() + ")");
  fs::path existing = whole;
  while (!fs::exists(fs::symlink_status(existing, ec)) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  if (!fs::is_directory(existing, ec))
    refuse(existing == whole ? "it is not a folder" : existing.string() + " is not a folder");
  if (::access(existing.c_str(), W_OK | X_OK) != 0)
    refuse("cannot write into " + existing.string() + " (" + std::generic_category().message(errno) + ")");
}

std::string checkpoint_to_load(const std::string& dir, const std::string& tag) {
  const std::string chosen = tag.empty() ? ckpt::read_latest(dir) : tag;
  ckpt::read_manifest(dir, chosen);  // the tag's manifest, checked as load_checkpoint checks it
  return chosen;
}

std::map<std::string, std::vector<int64_t>> weight_shapes(const std::string& path) {
  const ckpt::WeightFiles files(path);  // headers only
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : files.tensors()) shapes.emplace(name, tensor.shape);
  return shapes;
}

}  // namespace zero
