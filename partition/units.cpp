// Stage 3 units: gather before forward and backward, release after, and
// prefetch the next unit along the order the previous step recorded. When
// the order changes, this step gathers on demand and says so once; nothing
// waits on a plan that no longer holds.
#include <ATen/core/grad_mode.h>

#include <set>
#include <unordered_map>

#include "zero/log.h"
#include "partition/partition.h"

namespace zero::partition {

UnitScheduler::UnitScheduler(ParamStorage& storage, const FlatLayout& layout, const Options& options, int units)
    : storage_(storage), layout_(layout), options_(options), buckets_of_(units) {
  for (int b = 0; b < static_cast<int>(storage_.size()); ++b) {
    const int unit = layout_.buckets()[b].unit;
    if (unit >= 0 && !storage_.persistent(b)) buckets_of_[unit].push_back(b);
  }
}

int64_t UnitScheduler::unit_numel(int unit) const {
  int64_t numel = 0;
  for (int b : buckets_of_[unit]) numel += layout_.buckets()[b].numel;
  return numel;
}

void UnitScheduler::gather_unit(int unit, bool async) {
  for (int b : buckets_of_[unit]) storage_.gather(b, async, /*exact=*/false);
  if (!async) {
    for (int b : buckets_of_[unit]) storage_.wait_gathered(b);
  }
}

void UnitScheduler::release_unit(int unit) {
  for (int b : buckets_of_[unit]) storage_.release(b);
}

// Starts gathering the unit that comes after `position` in this step's plan
// (forward) or before it (backward), within the prefetch and live budgets.
void UnitScheduler::prefetch_after(int position, bool backward) {
  const std::vector<int>& order = backward ? trace_ : plan_;
  const int next = backward ? position - 1 : position + 1;
  if (next < 0 || next >= static_cast<int>(order.size())) return;
  const int unit = order[next];
  const int64_t numel = unit_numel(unit);
  int64_t live = 0;
  for (size_t b = 0; b < storage_.size(); ++b) {
    if (!storage_.persistent(b) && storage_.gathered(b)) live += layout_.buckets()[b].numel;
  }
  if (numel > options_.prefetch_numel || live + numel > options_.max_live_numel) {
    // Not gathered ahead; with offload_param "nvme" its shards are still
    // read ahead (Note [NVMe read-ahead] in param_storage.cpp): a shard is
    // 1/world of the unit, and a unit larger than the prefetch budget would
    // otherwise wait for its read and its all-gather in series.
    for (int b : buckets_of_[unit]) storage_.read_ahead(b);
    return;
  }
  gather_unit(unit, /*async=*/true);
  // offload_param "nvme" (Note [NVMe read-ahead] in param_storage.cpp): the
  // unit after it starts reading its shards, so that its all-gather can
  // start at the next prefetch.
  const int after = backward ? next - 1 : next + 1;
  if (after < 0 || after >= static_cast<int>(order.size())) return;
  for (int b : buckets_of_[order[after]]) storage_.read_ahead(b);
}

void UnitScheduler::pre_forward(int unit) {
  // Evaluation (no backward follows), or a unit nested in a checkpointed
  // one (run without a graph, then again in backward): no plan to keep.
  if (!at::GradMode::is_enabled() || in_backward_) {
    gather_unit(unit, /*async=*/false);
    return;
  }
  const int position = static_cast<int>(trace_.size());
  trace_.push_back(unit);
  if (plan_valid_ && (position >= static_cast<int>(plan_.size()) || plan_[position] != unit)) {
    plan_valid_ = false;
    // A unit prefetched for the old order is released by end_step, unused.
    if (!warned_) {
      warned_ = true;
      log::info("stage3", "the order of units changed from the previous step (unit " + std::to_string(unit) +
                              " at position " + std::to_string(position) +
                              "); gathering on demand until the new order repeats");
    }
  }
  gather_unit(unit, /*async=*/false);
  if (plan_valid_) prefetch_after(position, /*backward=*/false);
}

// Note [Reuse distance]
// DeepSpeed's stage3_max_reuse_distance (default 1e9 elements): after a
// module's forward, its parameters stay gathered when they are used again
// before more than that many parameter elements have been used in between,
// along the order the previous step recorded (forward, then backward in
// reverse). With units that order is this step's plan: the units after the
// unit's position in forward, then the plan backward from its end, until
// the unit comes round again. A unit is kept when the elements passed on
// the way, twice those of the units after it, stay below the distance: the
// last units of forward, backward's first. A model smaller than the
// default is then gathered once per step instead of twice (stage 3 sends
// 2Psi(N-1)/N, not 3Psi(N-1)/N) and holds all of it gathered between
// forward and backward, as DeepSpeed does; 0 releases every unit after its
// forward. A kept unit is released once its gradients are reduced, or by
// end_backward if no backward reaches it. The first step has no plan yet
// and releases them all, as DeepSpeed does before its trace is complete.
bool UnitScheduler::reused_within_distance(int position) const {
  const int unit = plan_[position];
  const int n = static_cast<int>(plan_.size());
  int64_t passed = 0;
  for (int i = position + 1; i < 2 * n; ++i) {  // forward's rest, then backward from the end
    if (passed >= options_.max_reuse_numel) return false;
    const int next = i < n ? plan_[i] : plan_[2 * n - 1 - i];
    if (next == unit) return true;
    passed += unit_numel(next);
  }
  return false;
}

void UnitScheduler::post_forward(int unit, const at::Tensor& output) {
  // This forward's position in the plan: the unit's last entry in the trace
  // (units nested in it come after it).
  int position = -1;
  if (at::GradMode::is_enabled() && !in_backward_ && plan_valid_) {
    for (int i = static_cast<int>(trace_.size()) - 1; i >= 0; --i) {
      if (trace_[i] == unit) {
        position = i;
        break;
      }
    }
  }
  if (position < 0 || position >= static_cast<int>(plan_.size()) || !reused_within_distance(position)) {
    release_unit(unit);
  }
  if (!output.defined() || !output.requires_grad()) return;
  std::weak_ptr<UnitScheduler> self = shared_from_this();
  output.register_hook([self, unit](const at::Tensor& grad) {
    if (auto scheduler = self.lock()) scheduler->pre_backward(unit);
    return grad;
  });
}

void UnitScheduler::pre_backward(int unit) {
  gather_unit(unit, /*async=*/false);
  // The unit used last in forward runs first in backward: prefetch the one
  // before it in this step's forward order.
  for (int position = static_cast<int>(trace_.size()) - 1; position >= 0; --position) {
    if (trace_[position] == unit && !backward_seen_[position]) {
      backward_seen_[position] = true;
      prefetch_after(position, /*backward=*/true);
      return;
    }
  }
}

void UnitScheduler::begin_backward() {
  backward_seen_.assign(trace_.size(), false);
  in_backward_ = true;
}

// This step's forward order becomes the plan for the next one.
void UnitScheduler::end_step() {
  in_backward_ = false;
  plan_ = trace_;
  plan_valid_ = !plan_.empty();
  trace_.clear();
}

// ---- ShardedParams' stage-3 side ----

std::vector<int> ShardedParams::gather_buckets_of(const std::vector<at::Tensor>& tensors) {
  std::set<int> wanted;
  std::unordered_map<const void*, int> bucket_of;
  for (size_t i = 0; i < params_.size(); ++i) bucket_of[params_[i].tensor.unsafeGetTensorImpl()] = layout_.params()[i].bucket;
  for (const auto& t : tensors) {
    auto it = bucket_of.find(t.unsafeGetTensorImpl());
    if (it != bucket_of.end() && !storage_.persistent(it->second) && !storage_.gathered(it->second)) wanted.insert(it->second);
  }
  for (int b : wanted) storage_.gather(b, /*async=*/true, /*exact=*/true);  // Note [Block quantization]: never for reading
  for (int b : wanted) storage_.wait_gathered(b);
  return {wanted.begin(), wanted.end()};
}

void ShardedParams::release_buckets(const std::vector<int>& buckets) {
  for (int b : buckets) storage_.release(b);
}

void ShardedParams::attach_units(const std::vector<UnitBase*>& units) {
  scheduler_ = std::make_shared<UnitScheduler>(storage_, layout_, options_, static_cast<int>(units.size()));
  units_ = units;
  for (size_t u = 0; u < units.size(); ++u) units[u]->attach(scheduler_, static_cast<int>(u));
}

}  // namespace zero::partition
