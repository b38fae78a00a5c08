#pragma once
// Note [In-memory copies]
// checkpoint.in_memory.interval K (zero's own key; Gemini, SOSP 2023, keeps
// checkpoints in the memory of peer machines): after every K-th optimizer
// step each rank writes its shard of the training state, as a checkpoint's
// rank file (Note [Checkpoint layout]), into a folder of its node's memory
// (tmpfs, /dev/shm): no disk I/O. A process that dies does not take these
// files with it; a node that dies does. So where the job spans nodes, each
// rank also sends its file to the rank of the same local index on the next
// node (a ring over the nodes), which keeps it in its own node's folder:
// one node lost still leaves every shard somewhere.
//
// Each node keeps two copies: the newest, and the one before, whose files
// the next copy overwrites in place. On these VMs tmpfs writes 2.7 GB/s
// into pages it has and 0.54 GB/s into new ones (dd, 248 MiB), and the
// kernel's clearing of new pages was the largest part of a copy. A copy is
// not checked for NaN and infinities (the training's own state; a
// disk checkpoint still refuses them).
//
// The folder: $ZERO_MEMORY_CHECKPOINTS (zero-run makes one per node and
// job, and removes it when the job ends), else
// /dev/shm/zero-in-memory-<run id>-<port>-node<n> under torchrun, read only
// on a restart (TORCHELASTIC_RESTART_COUNT > 0), so another job's copies are
// never taken.
//
// A copy is a save through engine::save_checkpoint with a folder per node
// (FolderPerNode): each node's first rank creates, moves into place and
// names its folder's `latest`; rank 0's manifest goes to every node. A node
// drops its older copy only after every node has the new one, so a fault
// during a copy leaves the previous whole copy.
//
// engine.load_checkpoint_if_present(dir) asks newest() first: the ranks
// share what their nodes hold, take the newest copy whose files the
// surviving nodes hold between them, send each node the files it lacks, and
// load it when it is at least as new as dir's newest checkpoint. Otherwise
// (no copy, or a shard and its copy both lost) the disk's checkpoint is
// loaded, and the log says why. A copy that fails (tmpfs full) is a warning:
// training goes on, and the previous copy or the disk stays the way back.
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "zero/comm.h"

namespace zero::engine {

struct TrainingParts;

// A save into a folder of each node's own instead of one shared folder.
struct FolderPerNode {
  bool leader = false;  // this rank does its node's folder work
  // After every rank's file is complete in `staging`: this rank's file to
  // the next node's staging, and the previous node's file into this node's.
  // A collective; returns this rank's error or "".
  std::function<std::string(const std::filesystem::path& staging)> replicate;
  // Rank 0's manifest on every rank. A collective.
  std::function<ckpt::Manifest(const ckpt::Manifest& mine)> from_rank0;
  // An old file to overwrite in place for the file `name`, or "".
  std::function<std::string(const std::string& name)> recycle;
};

class MemoryCopies {
 public:
  // A collective when the world spans nodes (the pairs a copy travels in).
  MemoryCopies(std::shared_ptr<comm::ProcessGroup> world, int64_t interval);
  // After an optimizer step: a copy every `interval` steps. A collective.
  void after_step(TrainingParts& s);
  // The copy load_checkpoint_if_present(disk_dir) resumes from: this node's
  // folder and the tag, every file of it then present there; nullopt when
  // the disk's checkpoint (or none) is the way back. A collective.
  std::optional<std::pair<std::string, std::string>> newest(const std::string& disk_dir);
  const std::string& folder() const { return folder_; }

 private:
  std::string replicate(const std::filesystem::path& staging);
  ckpt::Manifest from_rank0(const ckpt::Manifest& mine);
  // Sends file `name` from world rank `holder` to the leaders of the nodes in `lacking`.
  void spread(const std::string& tag, const std::string& name, int holder, const std::vector<bool>& lacking);

  std::shared_ptr<comm::ProcessGroup> world_;
  int64_t interval_;
  std::string folder_;
  // This node's newest whole copy and the one before it, whose files the
  // next copy is written over (tmpfs pages reused); "" when none.
  std::string newest_, spare_;
  bool readable_ = false;  // copies in the folder are this job's
  bool leader_ = false;
  int next_ = -1, previous_ = -1;  // the ranks a copy goes to and comes from (-1: one node)
  std::map<std::pair<int, int>, std::shared_ptr<comm::ProcessGroup>> pairs_;
  std::vector<int> color_;  // per node: the phase in which its ranks send (Note in replicate)
};

}  // namespace zero::engine
