// zero-run's folder for the ranks' in-memory checkpoint copies.
#include "memory_folder.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace zero_run {

// Note [Memory folder]
// The ranks' in-memory checkpoint copies (Note [In-memory copies] in
// engine/memory_copies.h) live in a folder of this node's memory that must
// outlive a rank, so that a restart finds them, but not the job. zero-run
// makes one (/dev/shm/zero-run.XXXXXX) and passes it as
// ZERO_MEMORY_CHECKPOINTS, and removes it when the job ends however it
// ends (a re-raised signal too), unless the user set ZERO_MEMORY_CHECKPOINTS:
// then the folder is theirs. Only a launcher killed by SIGKILL leaves it.
namespace {
std::string memory_folder;
}  // namespace

MemoryFolder::MemoryFolder() {
  if (std::getenv("ZERO_MEMORY_CHECKPOINTS") != nullptr) return;
  std::string templ = "/dev/shm/zero-run.XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return;  // no /dev/shm: the engine's default folder then
  memory_folder = templ;
  ::setenv("ZERO_MEMORY_CHECKPOINTS", memory_folder.c_str(), 1);
}

void remove_memory_folder() {
  if (memory_folder.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(memory_folder, ec);
  memory_folder.clear();
}

}  // namespace zero_run
