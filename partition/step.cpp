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
//
// Note [Updates in backward]: with offload_optimizer's super_offload (as
// DeepSpeed's SuperOffload) the update of step 5 runs inside the boundary's
// backward, bucket by bucket as the reductions complete, so that the host
// kernels, and with "nvme" the reads and writes of the optimizer's
// sub-groups, run while backward computes and communicates. It is the same
// step, bit for bit: only an update that needs no global norm first may
// run early, so the engine arms it only without gradient_clipping and
// without fp16's dynamic loss scale (with either, DeepSpeed's SuperOffload
// speculates and rolls back; zero waits for step() instead, and says so
// at initialize). The order of everything that adds up stays as in step():
// buckets are attached (gradient and squares, steps 1-2) in bucket order,
// and updated in bucket order. The dependencies:
// - Bucket k is attached when bucket k + 1's reduction starts (with
//   overlap_comm: one reduction stays in flight beside the update; without,
//   when k's own has ended). The reducer calls back at each start, in bucket
//   order on every rank, so the all-gathers that send updated buckets
//   (stage 2, stage 3's persistent buckets) come in the same order
//   everywhere, between the same reductions.
// - A bucket's parameters are not read again in this backward once its
//   gradients are complete: every node that used them has run (that is
//   what completes the gradient), so writing them in place is safe. Stage 3
//   has released them already.
// - With "nvme", sub-group 0's read starts when the backward begins, s + 1's
//   when s is updated, and s's write is waited for after s + 1's update.
// - step() attaches what is left, all-reduces the squares (the norm is
//   reported, not used), updates the rest and publishes as usual. A second
//   backward before step() is refused by the engine (the update has begun),
//   as is a checkpoint between them.
//
// Note [A failed transfer in the step]: with offload to NVMe the step reads
// and writes files, and a write can fail part-way (a disk that fills, a
// device error) on one rank while the others succeed. The ranks must still
// meet in the same collectives (stage 3's persistent buckets are
// all-gathered as they are updated, the reductions of an update in
// backward go on), so a failed transfer does not leave the loop: the
// UpdateRun records the first OffloadError, lets go of what it holds
// unwritten, and sends each remaining bucket's shard as it stands without
// reading or updating anything (UpdateRun::send_only, update_run.cpp).
// After publish, every rank gives its failure to one all-gather
// (comm::agreed_error over the norm group), and all of them raise the same
// error, naming the file. The
// parameters and optimizer states are then partly updated on every rank
// (and a file may hold a half-written state), so the engine stops: it
// refuses to train, save or load, and a new engine loads the last
// checkpoint, which nothing here touched.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <vector>

#include "core/fault.h"
#include "partition/partition.h"
#include "partition/update_run.h"
#include "zero/error.h"

namespace zero::partition {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }
}  // namespace

StepResult ShardedParams::step(BucketOptimizer& optimizer, const StepRequest& request) {
  StepResult result;
  std::string failure;  // Note [A failed transfer in the step]
  if (early_) {
    result = finish_early_step(request, failure);
  } else {
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
    if (optimizer.per_bucket()) failure = update_buckets(optimizer, result);
  }
  detach_master_grads();
  const auto publish_start = Clock::now();
  if (failure.empty()) {
    try {
      masters_.publish();
    } catch (const OffloadError& e) {  // the parameters' own writes
      failure = e.what();
    }
  }
  if (!failure.empty()) masters_.settle_after_failure();
  result.publish_seconds = seconds_since(publish_start);
  zero_grads();
  agree_on_transfers(failure);
  return result;
}

void ShardedParams::agree_on_transfers(const std::string& failure) {
  if (!masters_.nvme_store() && options_.offload_param != OffloadDevice::nvme) return;  // nothing to fail
  comm::ProcessGroup& group = options_.norm_group ? *options_.norm_group : *pg_;
  const std::string error =
      group.size() > 1 ? comm::agreed_error(group, failure, "an NVMe transfer failed") : failure;
  if (error.empty()) return;
  throw OffloadError(error + "\nthe optimizer step did not complete on any rank, and the checkpoints on disk are "
                     "untouched: free space (or fix the device) under nvme_path, then create a new engine and load "
                     "the last checkpoint");
}

void ShardedParams::update_bucket(BucketOptimizer& optimizer, size_t k) {
  const at::Tensor target = masters_.update_target(k);
  optimizer.update(k, target);
  masters_.send_updated(k);
}

// Step 5 for a per-bucket optimizer: each bucket updated, then sent on.
std::string ShardedParams::update_buckets(BucketOptimizer& optimizer, StepResult& result) {
  std::vector<size_t> host;
  for (size_t k = 0; k < num_buckets(); ++k) {
    if (options_.offload_optimizer && !masters_.on_host(k)) {
      update_bucket(optimizer, k);  // Note [Partial offload]: kept on the accelerator, queued first
    } else {
      host.push_back(k);
    }
  }
  UpdateRun run(*this, optimizer, host);
  run.finish(result);
  return run.failure();
}

void ShardedParams::update_in_backward(BucketOptimizer& optimizer, double grad_scale, HostThreads on_host_threads) {
  // The engine and the config refuse what cannot (Note [Updates in backward]).
  bool all_on_host = true;
  for (size_t k = 0; k < num_buckets(); ++k) all_on_host = all_on_host && (!options_.offload_optimizer || masters_.on_host(k));
  if (early_ || !optimizer.per_bucket() || !all_on_host) {
    throw PartitionError("internal: an update in backward needs a per-bucket optimizer, every bucket on the host and "
                         "no update in backward begun before");
  }
  auto e = std::make_unique<EarlyStep>();
  e->on_host_threads = std::move(on_host_threads);
  e->widen = !optimizer.reads_training_dtype();
  std::vector<size_t> all(num_buckets());
  for (size_t k = 0; k < all.size(); ++k) all[k] = k;
  e->run = std::make_unique<UpdateRun>(*this, optimizer, all);
  squares_.reset();
  optimizer.begin_step(grad_scale);  // a per-bucket optimizer only keeps the factor
  e->run->read_ahead();  // sub-group 0's states come while the backward computes
  if (host_grads_) host_grads_->keep_for_update(true);  // Note [Gradients on NVMe]
  early_ = std::move(e);
  reducer_->on_launch([this](size_t k) { attach_through(options_.overlap_comm ? k : k + 1); });
}

void ShardedParams::attach_through(size_t buckets) {
  EarlyStep& e = *early_;
  if (buckets <= e.attached) return;
  e.on_host_threads([&] {
    if (host_grads_) host_grads_->wait();  // copies started during backward land before the host reads them
    for (; e.attached < buckets; ++e.attached) {
      reducer_->wait_reduced(e.attached);
      attach_bucket(e.attached, e.widen);
    }
    e.run->advance(e.attached, e.result);
  });
}

StepResult ShardedParams::finish_early_step(const StepRequest& request, std::string& failure) {
  reducer_->on_launch(nullptr);
  if (host_grads_) host_grads_->keep_for_update(false);
  EarlyStep& e = *early_;
  if (host_grads_) host_grads_->wait();
  for (; e.attached < num_buckets(); ++e.attached) attach_bucket(e.attached, e.widen);
  StepResult result = e.result;
  result.norm = std::sqrt(global_squares()) / request.loss_scale;  // reported; the update did not need it
  e.run->finish(result);
  failure = e.run->failure();
  early_.reset();
  return result;  // step() publishes and clears, as after any update
}

void ShardedParams::abandon_update_in_backward() noexcept {
  if (!early_) return;
  reducer_->on_launch(nullptr);
  if (host_grads_) host_grads_->keep_for_update(false);
  early_->run->settle();
  early_.reset();
  detach_master_grads();
}

// Each bucket's gradient is attached and its squares added once per step
// (Note [Gradient norm] in partition/grad_norm.h).
void ShardedParams::attach_master_grads(bool widen) {
  squares_.reset();
  if (host_grads_) host_grads_->wait();  // copies started during backward land before the host reads them
  for (size_t k = 0; k < num_buckets(); ++k) attach_bucket(k, widen);
}

void ShardedParams::attach_bucket(size_t k, bool widen) {
  const double weight = layout_.buckets()[k].norm_weight;
  if (host_grads_ && host_grads_->off_device(k)) {  // its host copy is complete
    masters_.tensors()[k].mutable_grad() = host_grads_->for_step(k);
    if (host_grads_->device_squares(k).defined()) {
      squares_.add_device_sum(host_grads_->device_squares(k), weight);
    } else if (host_grads_->on_nvme()) {  // taken by land(), from the values the step reads
      squares_.add_host_sum(host_grads_->host_squares(k), weight);
    } else {
      squares_.add(masters_.tensors()[k].grad(), weight);
    }
    return;
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
    return;
  }
  if (widen && grad.scalar_type() != at::kFloat) grad = grad.to(at::kFloat);
  masters_.tensors()[k].mutable_grad() = grad;
  squares_.add(grad, weight);
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
