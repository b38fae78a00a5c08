// The staging folder of a checkpoint save, and a load's agreement on the
// save it reads (checkpoint_staging.h).
#include "engine/checkpoint_staging.h"

#include <fcntl.h>     // renameat2
#include <sys/file.h>  // flock
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>

#include "zero/error.h"

namespace zero::engine {

namespace fs = std::filesystem;

void move_into_place(const fs::path& staging, const fs::path& final_dir, const fs::path& replaced) {
  std::error_code ignored;
  if (!fs::exists(final_dir)) {
    fs::rename(staging, final_dir);
    return;
  }
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(staging, ignored);  // the old checkpoint now
    return;
  }
  const int e = errno;
  // Only a file system that cannot swap takes the two renames: had the
  // staging folder gone, the first would move the old checkpoint away.
  if (e != EINVAL && e != ENOSYS && e != EOPNOTSUPP)
    throw CheckpointError("cannot swap " + staging.string() + " with " + final_dir.string() + ": " + std::strerror(e) +
                          "; " + final_dir.string() + " is untouched");
  fs::remove_all(replaced, ignored);
  fs::rename(final_dir, replaced);
  fs::rename(staging, final_dir);
  fs::remove_all(replaced, ignored);
}

// Note [Concurrent saves]: two jobs may save into one folder (a restarted
// job while the old one is still finishing, a mistake). Each save stages in
// a folder of its own, <dir>/.saving/<id>/<tag>, and what a killed save
// left in .saving is removed only by a save that runs alone: rank 0 holds
// a shared flock on <dir> for the whole save and clears .saving (and the
// staging files of `latest` killed saves left, ckpt::is_staging_name_for)
// only while it holds the lock exclusively (no other save in progress),
// before it makes its own folder. Each write of `latest` stages under a
// name of its own, so two saves finishing together both land it whole. Before, every save removed all of .saving first,
// so a save's folder could vanish under it: its manifest was then written
// into a fresh folder without the rank files and moved into place, or the
// old checkpoint of its tag moved away (tests/ckpt/concurrent_saver.sh).
// A tag saved again while it is being loaded: the save's id is in its
// manifest and in each rank file's metadata; the loading ranks agree on
// the manifest's, and each file they open must carry it (its descriptor
// then stays on that save's file), so a load takes one save whole or
// fails on every rank. Before, ranks could read different saves' manifests
// and files, and load weights that neither save held.
bool SavingLock::acquire(const fs::path& root) {
  fd_ = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) return false;
  const bool alone = ::flock(fd_, LOCK_EX | LOCK_NB) == 0;
  if (!alone && errno != EWOULDBLOCK) {
    release();
    return false;
  }
  if (alone) return true;
  ::flock(fd_, LOCK_SH);  // waits only while another save clears leftovers
  return false;
}

void SavingLock::share() {
  if (fd_ >= 0) ::flock(fd_, LOCK_SH);
}

void SavingLock::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string staging_id(comm::ProcessGroup& pg) {
  at::Tensor name = torch::zeros({128}, at::kByte);
  if (pg.rank() == 0) {
    char host[64] = {0};
    ::gethostname(host, sizeof host - 1);
    const std::string id = std::string(host) + "-" + std::to_string(::getpid()) + "-" +
                           std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    std::memcpy(name.data_ptr(), id.data(), std::min<size_t>(id.size(), 127));
  }
  pg.broadcast(name, 0);
  return reinterpret_cast<const char*>(name.data_ptr<uint8_t>());
}

void discard_staging(const fs::path& own, const fs::path& saving_root) {
  std::error_code ignored;
  fs::remove_all(own, ignored);
  fs::remove(saving_root, ignored);  // only if empty: another save may be staging there
}

ckpt::Manifest agreed_manifest(comm::ProcessGroup& pg, const std::string& dir, const std::string& tag,
                               const std::string& where) {
  ckpt::Manifest m;
  std::string error;
  try {
    m = ckpt::read_manifest(dir, tag);
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  error = comm::agreed_error(pg, error, "load_checkpoint: " + where);
  if (!error.empty()) throw CheckpointError(error);
  // Checkpoints written before save ids: the manifest's own digest.
  const std::string save = !m.save_id.empty() ? m.save_id : "digest " + std::to_string(std::hash<std::string>{}(m.to_json().dump()));
  // The key names the tag, not the folder: with in-memory copies each node
  // reads its own folder (Note [In-memory copies] in engine/memory_copies.h).
  const std::string differs = comm::disagreement(pg, {{"the save that wrote tag " + tag + "'s manifest.json", save}});
  if (!differs.empty()) {
    throw CheckpointError("load_checkpoint: " + where + ": " + differs +
                          "; the tag was saved again while the ranks read it: is another job saving into the same "
                          "folder? Load again, or load a tag that nothing is saving");
  }
  return m;
}

}  // namespace zero::engine
