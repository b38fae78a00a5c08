#pragma once
// The folder a checkpoint save stages its files in, its move into place
// under the tag (engine/checkpoint_save.cpp), and the save a load reads
// (engine/checkpoint_load.cpp): Note [Concurrent saves].
#include <filesystem>
#include <string>

#include "ckpt/checkpoint.h"
#include "zero/comm.h"

namespace zero::engine {

// The complete checkpoint in `staging` becomes `final_dir`. A tag saved again
// is swapped with the old one in one step (renameat2 RENAME_EXCHANGE), so a
// crash leaves the old or the new checkpoint under the tag, never neither;
// where the file system cannot swap, two renames (the old one parked at
// `replaced` in between).
void move_into_place(const std::filesystem::path& staging, const std::filesystem::path& final_dir,
                     const std::filesystem::path& replaced);

// Rank 0's lock on the checkpoint folder for one save (Note [Concurrent saves]).
class SavingLock {
 public:
  // Locks `root` (shared) for a save; returns whether the lock was first
  // exclusive, so that leftovers may be cleared. A file system without
  // flock: no lock, and nothing is cleared.
  bool acquire(const std::filesystem::path& root);
  void share();
  void release();
  ~SavingLock() { release(); }

 private:
  int fd_ = -1;
};

// A name no other save uses now: rank 0's host, process and clock, shared
// with the other ranks. A collective.
std::string staging_id(comm::ProcessGroup& pg);

// After a save, failed or not, nothing staged stays behind: this save's
// folder (with the staging folder if it was not moved into place) and
// `.saving` once it is empty.
void discard_staging(const std::filesystem::path& own, const std::filesystem::path& saving_root);

// The manifest of `tag`, the same on every rank: each reads it itself, and
// another job saving the tag again meanwhile could give them different
// saves, or one rank none (CheckpointError on every rank). The files are
// then taken only from that save (FragmentReader checks each file's save
// id). A collective.
ckpt::Manifest agreed_manifest(comm::ProcessGroup& pg, const std::string& dir, const std::string& tag,
                               const std::string& where);

}  // namespace zero::engine
