#pragma once
// The update loop of the partition's step (Note [The step] in step.cpp),
// resumable so that the backward can drive it (Note [Updates in backward]),
// internal to partition/.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "partition/partition.h"

namespace zero::partition {

// Step 5 over the host buckets: in sub-groups, each updated once every
// bucket in it holds its gradient. Without offload_optimizer "nvme" a
// sub-group is one bucket; with it, about sub_group_size elements whose
// master weights and states are read one sub-group ahead and written one
// behind, so that at most three are in memory.
class ShardedParams::UpdateRun {
 public:
  UpdateRun(ShardedParams& owner, BucketOptimizer& optimizer, const std::vector<size_t>& buckets);
  // Starts reading the next sub-group's tensors, if it has not started.
  void read_ahead();
  // Buckets [0, attached) hold their gradients: updates every sub-group
  // that lies within.
  void advance(size_t attached, StepResult& result);
  // The rest, then the last writes.
  void finish(StepResult& result);
  // After a failure: waits for the reads and writes in flight and lets go
  // of what was read and not updated (its files are current).
  void settle() noexcept;
  // The first NVMe transfer that failed (Note [A failed transfer in the
  // step] in step.cpp), or "".
  const std::string& failure() const { return failure_; }
  // A failure from elsewhere (a gradient lost in backward): from here on
  // as after a failed transfer of the run's own.
  void fail(const std::string& failure);

 private:
  std::vector<int> states_of(size_t s) const;  // sub-group s's master weights and states
  std::vector<int> grads_of(size_t s) const;   // and its gradients on NVMe
  std::vector<int> ids_of(size_t s) const;     // both
  template <class F>
  void transfer(F&& f);  // f(); an OffloadError becomes failure_
  void send_only(size_t k);  // bucket k after a failure: its collective, nothing else
  void forget_all() noexcept;

  ShardedParams& owner_;
  BucketOptimizer& optimizer_;
  offload::SwappedTensors* store_;  // null without offload_optimizer "nvme"
  std::vector<std::vector<size_t>> sub_groups_;
  size_t next_ = 0;        // the next sub-group to update
  bool reading_ = false;   // sub-group next_'s read has started
  long writing_ = -1;      // the sub-group whose write has not been waited for
  std::string failure_;
};

// An update in backward (Note [Updates in backward]) from its start to step().
struct ShardedParams::EarlyStep {
  HostThreads on_host_threads;
  std::unique_ptr<UpdateRun> run;
  size_t attached = 0;  // buckets [0, attached) hold their gradients and squares
  bool widen = false;
  StepResult result;    // the times spent so far
};

}  // namespace zero::partition
