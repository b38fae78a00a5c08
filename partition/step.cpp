// ShardedParams::step: one optimizer step of the partition, from the reduced
// gradients of its buckets to the new parameters.
//
// Note [The step]: the engine calls ShardedParams::step once per optimizer
// step, at the accumulation boundary, with its optimizer (a BucketOptimizer)
// and a StepRequest (the fp16 loss scale and the clipping bound); nothing
// of the step returns to the engine before it ends. In order:
// 1. Attach: each bucket's master tensor gets its reduced gradient
//    (GradReducer::shard_grad, this rank's shard; the whole bucket at stage
//    0), or with offload the host copy (Note [Offload copies]). It stays in
//    the training dtype where the optimizer reads that (the fused host
//    kernels), and is widened to fp32 for torch::optim.
// 2. Squares: each bucket's sum of squares is added once, where the
//    gradient lies, times the bucket's norm weight (Note [Gradient norm]).
// 3. Norm: the sum is all-reduced over the norm group (the world with
//    tensor or pipeline parallelism) when more than one rank holds a part
//    of it. Not finite: with fp16 every rank skips the step, the gradients
//    are cleared and the caller lowers the loss scale.
// 4. Clip: the norm of the unscaled gradients gives the clipping
//    coefficient (as torch::nn::utils::clip_grad_norm_), which with the
//    loss scale's inverse makes one factor.
// 5. Update: the optimizer begins the step with the factor, which it
//    multiplies each gradient by as it reads it. A per-bucket optimizer
//    (the fused host kernels, an elementwise kernel per tensor) is then
//    driven here, bucket by bucket: update(k) writes bucket k's new values
//    in the training dtype where MasterStore::update_target(k) says, in
//    the same pass, and send_updated(k) sends them on at once (the
//    bucket's all-gather, or its write to NVMe) while the next bucket is
//    updated. With partial offload the buckets kept on the accelerator go
//    first (queued there, they run while the host updates its share).
//    With offload_optimizer "nvme" the host buckets come in sub-groups of
//    about sub_group_size elements: the next sub-group's master weights
//    and states are read while this one is updated, the previous one's
//    written back, so that at most three are resident. An optimizer that
//    takes every tensor at once (torch::optim, Lamb) updates them all in
//    begin_step().
// 6. Publish: MasterStore::publish() sends the buckets not yet sent (from
//    the fp32 master weights, converted) and waits until every bucket's
//    parameters are whole again.
// 7. Clear: the master tensors drop their gradients, the reducer's buffers
//    start the next accumulation from zero.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <vector>

#include "core/fault.h"
#include "partition/partition.h"

namespace zero::partition {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }
}  // namespace

StepResult ShardedParams::step(BucketOptimizer& optimizer, const StepRequest& request) {
  StepResult result;
  attach_master_grads(/*widen=*/!optimizer.reads_training_dtype());
  const double squares = global_squares();
  if (request.skip_if_not_finite && !std::isfinite(squares)) {
    result.skipped = true;
    detach_master_grads();
    zero_grads();
    return result;
  }
  result.norm = std::sqrt(squares) / request.loss_scale;
  double factor = 1.0 / request.loss_scale;
  if (request.clip > 0) {
    const double coef = request.clip / (result.norm + 1e-6);  // as torch::nn::utils::clip_grad_norm_
    if (coef < 1.0) factor *= coef;
  }
  optimizer.begin_step(factor);
  if (optimizer.per_bucket()) update_buckets(optimizer, result);
  detach_master_grads();
  const auto publish_start = Clock::now();
  masters_.publish();
  result.publish_seconds = seconds_since(publish_start);
  zero_grads();
  return result;
}

void ShardedParams::update_bucket(BucketOptimizer& optimizer, size_t k) {
  const at::Tensor target = masters_.update_target(k);
  optimizer.update(k, target);
  masters_.send_updated(k);
}

// Step 5 for a per-bucket optimizer: each bucket updated, then sent on.
void ShardedParams::update_buckets(BucketOptimizer& optimizer, StepResult& result) {
  std::vector<size_t> host;
  for (size_t k = 0; k < num_buckets(); ++k) {
    if (options_.offload_optimizer && !masters_.on_host(k)) {
      update_bucket(optimizer, k);  // Note [Partial offload]: kept on the accelerator, queued first
    } else {
      host.push_back(k);
    }
  }
  if (masters_.nvme_store()) return update_swapped(optimizer, host, result);
  const auto start = Clock::now();
  for (size_t k : host) update_bucket(optimizer, k);
  result.host_update_seconds += seconds_since(start);
}

// offload_optimizer "nvme": the host buckets in sub-groups of about
// sub_group_numel elements, read one ahead and written one behind.
void ShardedParams::update_swapped(BucketOptimizer& optimizer, const std::vector<size_t>& buckets,
                                   StepResult& result) {
  if (buckets.empty()) return;
  offload::SwappedTensors& store = *masters_.nvme_store();
  std::vector<std::vector<size_t>> sub_groups(1);
  int64_t filled = 0;
  for (size_t k : buckets) {
    const int64_t numel = masters_.tensors()[k].numel();
    if (filled > 0 && filled + numel > options_.sub_group_numel) {
      sub_groups.emplace_back();
      filled = 0;
    }
    sub_groups.back().push_back(k);
    filled += numel;
  }
  auto ids_of = [&](size_t s) {
    std::vector<int> ids;
    for (size_t k : sub_groups[s]) ids.insert(ids.end(), masters_.nvme_ids(k).begin(), masters_.nvme_ids(k).end());
    return ids;
  };
  auto wait = Clock::now();
  store.swap_in(ids_of(0));
  result.nvme_wait_seconds += seconds_since(wait);
  for (size_t s = 0; s < sub_groups.size(); ++s) {
    wait = Clock::now();
    if (s + 1 < sub_groups.size()) store.swap_in(ids_of(s + 1));
    store.wait_in(ids_of(s));
    result.nvme_wait_seconds += seconds_since(wait);
    const auto start = Clock::now();
    for (size_t k : sub_groups[s]) update_bucket(optimizer, k);
    result.host_update_seconds += seconds_since(start);
    wait = Clock::now();
    store.swap_out(ids_of(s));
    if (s > 0) store.wait_out(ids_of(s - 1));
    result.nvme_wait_seconds += seconds_since(wait);
  }
  wait = Clock::now();
  store.wait_out(ids_of(sub_groups.size() - 1));
  result.nvme_wait_seconds += seconds_since(wait);
}

// Each bucket's gradient is attached and its squares added once per step
// (Note [Gradient norm] in partition/grad_norm.h).
void ShardedParams::attach_master_grads(bool widen) {
  squares_.reset();
  if (host_grads_) host_grads_->wait();  // copies started during backward land before the host reads them
  for (size_t k = 0; k < num_buckets(); ++k) {
    const double weight = layout_.buckets()[k].norm_weight;
    if (host_grads_ && host_grads_->off_device(k)) {  // its host copy is complete
      masters_.tensors()[k].mutable_grad() = host_grads_->for_step(k);
      if (host_grads_->device_squares(k).defined()) {
        squares_.add_device_sum(host_grads_->device_squares(k), weight);
      } else {
        squares_.add(masters_.tensors()[k].grad(), weight);
      }
      continue;
    }
    at::Tensor grad = reducer_->shard_grad(k);
    if (options_.offload_optimizer) {
      // The host optimizer reads the gradient in the training dtype (Note
      // [Offload copies]); stages 2-3 copied it when the bucket was reduced.
      // A bucket updated on the accelerator (Note [Partial offload]) keeps it
      // there, in the training dtype too. Squared where it was reduced.
      squares_.add(grad, weight);
      if (host_grads_->copied(k)) {
        if (!host_grads_->holds(k)) host_grads_->copy_from(k, grad, /*non_blocking=*/false);
        grad = host_grads_->copy(k);
      }
      masters_.tensors()[k].mutable_grad() = grad;
      continue;
    }
    if (widen && grad.scalar_type() != at::kFloat) grad = grad.to(at::kFloat);
    masters_.tensors()[k].mutable_grad() = grad;
    squares_.add(grad, weight);
  }
}

void ShardedParams::detach_master_grads() {
  for (auto m : masters_.tensors()) m.mutable_grad() = at::Tensor();
  if (host_grads_) host_grads_->clear();
}

// The sum over the norm group (Note [Gradient norm]): all-reduced when it
// reaches beyond the data-parallel group or the shards split the gradient.
double ShardedParams::global_squares() {
  at::Tensor sum = torch::tensor({squares_.total()}, torch::kDouble);
  comm::ProcessGroup& group = options_.norm_group ? *options_.norm_group : *pg_;
  if (group.size() > pg_->size() || owners() > 1) group.all_reduce(sum, comm::ReduceOp::Sum);
  fault::reached("step.reduced", group.rank());
  return sum.item<double>();
}

}  // namespace zero::partition
