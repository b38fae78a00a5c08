// GradReducer and its three strategies (grad_reducer.h).
#include "partition/grad_reducer.h"

#include "offload/host_tensors.h"
#include "zero/error.h"
#include "partition/flat_layout.h"
#include "partition/host_grads.h"

namespace zero::partition {
namespace {

at::Tensor zeroed_buffer(int64_t numel, const ReducerOptions& options) {
  at::Tensor t = options.huge_pages ? offload::empty_with_huge_pages(numel, options.grad_options)
                                    : torch::empty({numel}, options.grad_options);
  return t.zero_();
}

}  // namespace

GradReducer::GradReducer(const FlatLayout& layout, std::shared_ptr<comm::ProcessGroup> pg, const ReducerOptions& options)
    : layout_(layout), pg_(std::move(pg)), options_(options) {
  const size_t n = layout_.buckets().size();
  works_.resize(n);
  pending_.assign(n, 0);
  launched_.assign(n, false);
  fired_.assign(layout_.params().size(), false);
  written_.assign(layout_.params().size(), false);
}

void GradReducer::begin_backward(bool boundary) {
  boundary_ = boundary;
  next_launch_ = 0;
  fired_.assign(fired_.size(), false);
  for (size_t k = 0; k < pending_.size(); ++k) {
    pending_[k] = static_cast<int>(layout_.buckets()[k].params.size());
    launched_[k] = false;
  }
}

bool GradReducer::add(int param, const at::Tensor& grad) {
  const auto& p = layout_.params()[param];
  const size_t k = p.bucket;
  if (launched_[k]) {
    throw PartitionError("parameter " + p.name +
                         " received a second gradient in one backward after its bucket was reduced; "
                         "call engine.backward() once per micro-step (or use a larger reduce_bucket_size)");
  }
  at::Tensor target = slot(k, p.offset - layout_.buckets()[k].offset, p.numel);
  if (written_[param]) {
    target.add_(grad.reshape(-1));
  } else {
    target.copy_(grad.reshape(-1));
    written_[param] = true;
  }
  if (fired_[param]) return false;
  fired_[param] = true;
  return --pending_[k] == 0;
}

// Buckets are reduced in index order on every rank, whatever order their
// gradients complete in, so that all ranks issue the same collectives.
void GradReducer::launch_ready() {
  while (next_launch_ < launched_.size() && pending_[next_launch_] == 0) {
    const size_t k = next_launch_++;
    launched_[k] = true;
    start(k);
    if (!options_.overlap_comm) finish(k);
    if (on_launch_) on_launch_(k);
  }
}

void GradReducer::end_backward() {
  // Buckets with parameters that got no gradient (unused in this forward)
  // are reduced too, with zeros there.
  pending_.assign(pending_.size(), 0);
  launch_ready();
  for (size_t k = 0; k < works_.size(); ++k) finish(k);
  backward_done();
}

void GradReducer::finish(size_t k) {
  if (!works_[k]) return;
  comm::WorkHandle work = std::move(works_[k]);
  work->wait();
  land(k);
}

void GradReducer::forget_written(size_t k) {
  for (int i : layout_.buckets()[k].params) written_[i] = false;
}

void GradReducer::set_all_written(bool written) { written_.assign(written_.size(), written); }

void GradReducer::fill_unwritten(size_t k) {
  const auto& b = layout_.buckets()[k];
  const auto zero = [&](int64_t from, int64_t to) {
    if (to > from) slot(k, from - b.offset, to - from).zero_();
  };
  int64_t cursor = b.offset;
  for (int i : b.params) {  // in flat order
    const auto& p = layout_.params()[i];
    zero(cursor, p.offset);
    if (!written_[i]) zero(p.offset, p.offset + p.numel);
    written_[i] = true;
    cursor = p.offset + p.numel;
  }
  zero(cursor, b.offset + b.numel);
}

void GradReducer::check_size(const at::Tensor& values, int64_t expected) {
  if (values.numel() != expected) {
    throw PartitionError("accumulated gradients of " + std::to_string(values.numel()) +
                         " elements do not fit this rank's " + std::to_string(expected));
  }
}

void GradReducer::settle() noexcept {
  for (auto& w : works_) {
    try {
      if (w) w->wait();
    } catch (...) {
    }
  }
}

namespace {

// Stages 0-1: a full gradient buffer, accumulated over the micro-steps and
// reduced bucket by bucket at the boundary only.
class BoundaryReducer : public GradReducer {
 public:
  BoundaryReducer(const FlatLayout& layout, std::shared_ptr<comm::ProcessGroup> pg, const ReducerOptions& options)
      : GradReducer(layout, std::move(pg), options),
        flat_(zeroed_buffer(layout.flat_numel(), options)) {}

  void zero() override { set_all_written(false); }
  int64_t bytes() const override { return flat_.nbytes(); }
  at::Tensor accumulated() override {
    for (size_t k = 0; k < layout_.buckets().size(); ++k) fill_unwritten(k);
    return flat_;
  }
  void restore(const at::Tensor& values) override {
    check_size(values, flat_.numel());
    flat_.copy_(values.reshape(-1));
    set_all_written(true);
  }

 protected:
  at::Tensor slot(size_t k, int64_t start, int64_t numel) override {
    const int64_t at = layout_.buckets()[k].offset + start;
    return flat_.slice(0, at, at + numel);
  }
  at::Tensor bucket(size_t k) const {
    const auto& b = layout_.buckets()[k];
    return flat_.slice(0, b.offset, b.offset + b.numel);
  }
  at::Tensor shard(size_t k) const {
    const int64_t start = layout_.shard_start(k);
    return flat_.slice(0, start, start + layout_.buckets()[k].shard_numel);
  }
  at::Tensor flat_;
};

// Stage 0: every rank keeps the whole averaged gradient.
class AllReduceGrads final : public BoundaryReducer {
 public:
  using BoundaryReducer::BoundaryReducer;
  at::Tensor shard_grad(size_t k) override {
    fill_unwritten(k);  // a step with no backward since the last one: zeros
    return bucket(k);
  }

 protected:
  void start(size_t k) override {
    if (!boundary_) return;
    fill_unwritten(k);
    works_[k] = pg_->all_reduce_async(bucket(k), comm::ReduceOp::Avg);
  }
};

// Stage 1: the averaged shard lands in place in the full buffer.
class ReduceScatterAtBoundary final : public BoundaryReducer {
 public:
  using BoundaryReducer::BoundaryReducer;
  at::Tensor shard_grad(size_t k) override {
    fill_unwritten(k);  // a step with no backward since the last one: zeros
    return shard(k);
  }

 protected:
  void start(size_t k) override {
    if (!boundary_) return;
    fill_unwritten(k);
    works_[k] = pg_->reduce_scatter_async(shard(k), bucket(k), comm::ReduceOp::Avg);
  }
};

// Stages 2-3: each bucket's gradients are summed in a pooled buffer and
// reduce-scattered into the partition as soon as they are complete.
class ReduceScatterPerBucket final : public GradReducer {
 public:
  ReduceScatterPerBucket(const FlatLayout& layout, std::shared_ptr<comm::ProcessGroup> pg, HostGrads* host,
                         const ReducerOptions& options)
      : GradReducer(layout, std::move(pg), options), host_(host) {
    const size_t n = layout.buckets().size();
    staging_.resize(n);
    staging_base_.resize(n);
    outputs_.resize(n);
    for (size_t k = 0; k < n; ++k) {  // buckets whose gradients go to the host have no slice
      partition_offset_.push_back(off_device(k) ? -1 : partition_numel_);
      if (!off_device(k)) partition_numel_ += layout.buckets()[k].shard_numel;
    }
    partition_ = zeroed_buffer(partition_numel_, options);
    // The pool's buffers are made now (DeepSpeed makes its reduce buffers at
    // initialize too), so the memory report before the first backward is the
    // one training holds: one, two with overlap_comm and a second bucket.
    while (pool_buffers_ < std::min(pool_limit(), n)) grow();
  }

  at::Tensor shard_grad(size_t k) override { return off_device(k) ? at::Tensor() : partition_slice(k); }
  void zero() override {
    partition_.zero_();
    fresh_ = true;
  }
  int64_t bytes() const override { return partition_.nbytes() + pool_bytes_; }
  at::Tensor accumulated() override;
  void restore(const at::Tensor& values) override;

 protected:
  at::Tensor slot(size_t k, int64_t start, int64_t numel) override {
    if (!staging_[k].defined()) acquire(k);
    return staging_[k].slice(0, start, start + numel);
  }
  void start(size_t k) override;
  void land(size_t k) override;
  void backward_done() override { fresh_ = false; }

 private:
  bool off_device(size_t k) const { return host_ && host_->off_device(k); }
  at::Tensor partition_slice(size_t k) const {
    const int64_t start = partition_offset_[k];
    return partition_.slice(0, start, start + layout_.buckets()[k].shard_numel);
  }
  void acquire(size_t k);
  size_t pool_limit() const { return options_.overlap_comm ? 2 : 1; }
  void grow() {
    pool_.push_back(torch::empty({layout_.max_bucket_numel()}, options_.grad_options));
    pool_bytes_ += pool_.back().nbytes();
    ++pool_buffers_;
  }

  HostGrads* host_;
  at::Tensor partition_;                   // this rank's reduced gradients, but off-device buckets'
  std::vector<int64_t> partition_offset_;  // per bucket: its slice of partition_ (-1: none)
  int64_t partition_numel_ = 0;
  std::vector<at::Tensor> staging_;        // per bucket: its gradients until reduced (a slice of staging_base_)
  std::vector<at::Tensor> staging_base_;   // the pooled buffer it borrowed
  std::vector<at::Tensor> outputs_;        // the reduce-scatter's output, when not the partition itself
  std::vector<at::Tensor> pool_;           // free bucket buffers
  int64_t pool_bytes_ = 0;
  size_t pool_buffers_ = 0;
  bool fresh_ = true;                      // the partition holds no gradient yet: reduce straight into it
};

void ReduceScatterPerBucket::start(size_t k) {
  if (!staging_[k].defined()) acquire(k);
  fill_unwritten(k);  // parameters no gradient reached, and the padding: zeros
  const bool into_partition = fresh_ && !off_device(k);
  outputs_[k] = into_partition ? at::Tensor() : torch::empty({layout_.buckets()[k].shard_numel}, staging_[k].options());
  at::Tensor out = into_partition ? partition_slice(k) : outputs_[k];
  works_[k] = options_.quantized ? options_.quantized->start(out, staging_[k])
                                 : pg_->reduce_scatter_async(out, staging_[k], comm::ReduceOp::Avg);
}

void ReduceScatterPerBucket::land(size_t k) {
  if (off_device(k)) {
    host_->land(k, outputs_[k], boundary_);
  } else if (outputs_[k].defined()) {
    partition_slice(k).add_(outputs_[k]);
  }
  outputs_[k] = at::Tensor();
  pool_.push_back(staging_base_[k]);
  staging_[k] = staging_base_[k] = at::Tensor();
  // Offload: at the boundary the bucket's part of the partition is final;
  // it leaves for the host while backward goes on (Note [Offload copies]).
  if (boundary_ && host_ && host_->copied(k) && !off_device(k)) host_->copy_from(k, partition_slice(k), /*non_blocking=*/true);
}

// The pool holds one buffer (two with overlap_comm); when none is free, a
// completed reduction or else the oldest in flight is waited for. Only
// buckets still being filled can make it grow beyond that (their reduction
// must wait for an earlier bucket). It grows to its size before reusing a
// buffer, so how many buffers there are does not depend on when reductions
// complete: the memory report is the same in every run.
void ReduceScatterPerBucket::acquire(size_t k) {
  if (pool_.empty() && pool_buffers_ < pool_limit()) grow();
  while (pool_.empty()) {
    for (size_t other = 0; other < works_.size(); ++other) {
      if (works_[other] && works_[other]->is_completed()) finish(other);
    }
    if (!pool_.empty()) break;
    size_t oldest = 0;
    while (oldest < works_.size() && !works_[oldest]) ++oldest;
    if (oldest == works_.size()) {
      grow();
      break;
    }
    finish(oldest);
  }
  staging_base_[k] = pool_.back();
  pool_.pop_back();
  staging_[k] = staging_base_[k].slice(0, 0, layout_.buckets()[k].numel);
  forget_written(k);  // not cleared: the first gradients are copied in (Note [First gradient copies])
}

// Assembled in host memory when some shards are there, so that the layout
// is the same with and without offload.
at::Tensor ReduceScatterPerBucket::accumulated() {
  if (!host_ || !host_->any_off_device()) return partition_;
  host_->wait();
  std::vector<at::Tensor> shards;
  for (size_t k = 0; k < layout_.buckets().size(); ++k) {
    if (!off_device(k)) {
      shards.push_back(partition_slice(k).to(at::kCPU));
    } else {  // zeros when no backward ran since the last step
      shards.push_back(host_->value(k));
    }
  }
  return at::cat(shards);
}

void ReduceScatterPerBucket::restore(const at::Tensor& values) {
  check_size(values, layout_.partition_numel());
  const at::Tensor flat = values.reshape(-1);
  int64_t start = 0;
  for (size_t k = 0; k < layout_.buckets().size(); ++k) {
    const at::Tensor shard = flat.slice(0, start, start + layout_.buckets()[k].shard_numel);
    start += layout_.buckets()[k].shard_numel;
    if (off_device(k)) {
      host_->restore(k, shard);
    } else {
      partition_slice(k).copy_(shard);
    }
  }
  fresh_ = false;  // later reductions add to it
}

}  // namespace

std::unique_ptr<GradReducer> GradReducer::for_stage(const FlatLayout& layout, std::shared_ptr<comm::ProcessGroup> pg,
                                                    HostGrads* host, const ReducerOptions& options) {
  switch (options.stage) {
    case 0: return std::make_unique<AllReduceGrads>(layout, std::move(pg), options);
    case 1: return std::make_unique<ReduceScatterAtBoundary>(layout, std::move(pg), options);
    default: return std::make_unique<ReduceScatterPerBucket>(layout, std::move(pg), host, options);
  }
}

}  // namespace zero::partition
