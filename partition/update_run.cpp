// ShardedParams::UpdateRun (update_run.h): step 5 of Note [The step] over
// the host buckets, in sub-groups, with offload_optimizer "nvme"'s reads one
// sub-group ahead and writes one behind, and Note [A failed transfer in the
// step] (both in step.cpp).
#include "partition/update_run.h"

#include <torch/torch.h>

#include <chrono>
#include <string>
#include <vector>

#include "partition/host_grads.h"
#include "zero/error.h"

namespace zero::partition {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }
}  // namespace

ShardedParams::UpdateRun::UpdateRun(ShardedParams& owner, BucketOptimizer& optimizer,
                                    const std::vector<size_t>& buckets)
    : owner_(owner), optimizer_(optimizer), store_(owner.masters_.nvme_store()) {
  int64_t filled = 0;
  for (size_t k : buckets) {
    const int64_t numel = owner_.masters_.tensors()[k].numel();
    if (sub_groups_.empty() || !store_ || (filled > 0 && filled + numel > owner_.options_.sub_group_numel)) {
      sub_groups_.emplace_back();
      filled = 0;
    }
    sub_groups_.back().push_back(k);
    filled += numel;
  }
}

// Its master weights and states, which the update writes back.
std::vector<int> ShardedParams::UpdateRun::states_of(size_t s) const {
  std::vector<int> ids;
  for (size_t k : sub_groups_[s]) {
    const auto& of = owner_.masters_.nvme_ids(k);
    ids.insert(ids.end(), of.begin(), of.end());
  }
  return ids;
}

// Its gradients on NVMe (Note [Gradients on NVMe] in host_grads.h), read
// with the states and let go unwritten.
std::vector<int> ShardedParams::UpdateRun::grads_of(size_t s) const {
  std::vector<int> ids;
  const HostGrads* grads = owner_.host_grads_.get();
  if (!grads || !grads->on_nvme()) return ids;
  for (size_t k : sub_groups_[s]) {
    if (grads->nvme_id(k) >= 0) ids.push_back(grads->nvme_id(k));
  }
  return ids;
}

std::vector<int> ShardedParams::UpdateRun::ids_of(size_t s) const {
  std::vector<int> ids = states_of(s);
  const std::vector<int> grads = grads_of(s);
  ids.insert(ids.end(), grads.begin(), grads.end());
  return ids;
}

void ShardedParams::UpdateRun::read_ahead() {
  if (!store_ || reading_ || !failure_.empty() || next_ >= sub_groups_.size()) return;
  transfer([&] { store_->swap_in(ids_of(next_)); });
  reading_ = failure_.empty();
}

template <class F>
void ShardedParams::UpdateRun::transfer(F&& f) {
  try {
    f();
  } catch (const OffloadError& e) {
    if (failure_.empty()) {
      failure_ = e.what();
      forget_all();
    }
  }
}

// Every sub-group's tensors let go unwritten: after a failure, nothing of
// this run reaches the disk any more.
void ShardedParams::UpdateRun::forget_all() noexcept {
  if (!store_) return;
  for (size_t s = 0; s < sub_groups_.size(); ++s) store_->forget(ids_of(s));
  reading_ = false;
  writing_ = -1;
}

// Note [A failed transfer in the step]: the shard as it stands goes where
// an updated one would (a persistent bucket's all-gather, which every rank
// must join); a shard on NVMe that is not in memory writes nothing.
void ShardedParams::UpdateRun::send_only(size_t k) {
  transfer([&] { owner_.masters_.send_updated(k); });
}

void ShardedParams::UpdateRun::fail(const std::string& failure) {
  if (!failure_.empty() || failure.empty()) return;
  failure_ = failure;
  forget_all();
}

void ShardedParams::UpdateRun::advance(size_t attached, StepResult& result) {
  if (owner_.host_grads_) fail(owner_.host_grads_->failure());  // a gradient lost in backward
  while (next_ < sub_groups_.size() && sub_groups_[next_].back() < attached) {
    const size_t s = next_;
    auto wait = Clock::now();
    if (store_ && failure_.empty()) {
      transfer([&] {
        read_ahead();  // s itself, when nothing read it ahead
        if (s + 1 < sub_groups_.size()) store_->swap_in(ids_of(s + 1));
        store_->wait_in(ids_of(s));
      });
      result.nvme_wait_seconds += seconds_since(wait);
    }
    const auto start = Clock::now();
    for (size_t k : sub_groups_[s]) {
      if (failure_.empty()) {
        transfer([&] { owner_.update_bucket(optimizer_, k); });
      } else {
        send_only(k);
      }
    }
    result.host_update_seconds += seconds_since(start);
    ++next_;
    reading_ = store_ && failure_.empty() && next_ < sub_groups_.size();
    if (store_ && failure_.empty()) {
      wait = Clock::now();
      transfer([&] {
        store_->swap_out(states_of(s));
        store_->drop(grads_of(s));
        if (writing_ >= 0) store_->wait_out(states_of(static_cast<size_t>(writing_)));
        writing_ = static_cast<long>(s);
      });
      result.nvme_wait_seconds += seconds_since(wait);
    }
  }
}

void ShardedParams::UpdateRun::finish(StepResult& result) {
  advance(owner_.num_buckets(), result);
  if (store_ && writing_ >= 0) {
    const auto wait = Clock::now();
    transfer([&] { store_->wait_out(states_of(static_cast<size_t>(writing_))); });
    writing_ = -1;
    result.nvme_wait_seconds += seconds_since(wait);
  }
}

void ShardedParams::UpdateRun::settle() noexcept {
  if (!store_) return;
  try {
    if (reading_) {
      store_->wait_in(ids_of(next_));
      store_->forget(grads_of(next_));  // unwritten: the step did not take them
      store_->drop(states_of(next_));
      reading_ = false;
    }
    if (writing_ >= 0) store_->wait_out(states_of(static_cast<size_t>(writing_)));
    writing_ = -1;
  } catch (...) {  // an error was raised already
  }
}

}  // namespace zero::partition
