// ShardedParams: flat buffers, gradient buckets and their collectives
// (Note [Flat layout] in partition.h), the master weights' gradients and
// their way back to the parameters (Note [Offload copies]). Stage 3's
// release and gather of buckets: stage3_storage.cpp.
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <thread>

#include "offload/cpu_optimizer.h"
#include "offload/host_tensors.h"
#include "zero/error.h"
#include "zero/partition.h"

namespace zero::partition {

using offload::empty_with_huge_pages;

// Runs after a parameter's AccumulateGrad: its gradient for this backward
// is complete (checked on LibTorch 1.13 and 2.11, see DESIGN.md).
struct GradReadyHook : torch::autograd::FunctionPostHook {
  GradReadyHook(ShardedParams* owner, int index) : owner(owner), index(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    owner->on_grad_ready(index);
    return outputs;
  }
  ShardedParams* owner;
  int index;
};

namespace {
int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }
}  // namespace

ShardedParams::ShardedParams(std::vector<Group> groups, std::shared_ptr<comm::ProcessGroup> pg, Options options)
    : pg_(std::move(pg)), options_(options) {
  owners_ = options_.stage == 0 ? 1 : pg_->size();
  rank_in_owners_ = options_.stage == 0 ? 0 : pg_->rank();

  // Layout: buckets per group (and per unit at stage 3), parameters in
  // reverse registration order (Note [Flat layout]).
  const bool units = options_.stage == 3;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
    Bucket current;
    current.group = g;
    auto close = [&] {
      if (current.params.empty()) return;
      int64_t used = 0;
      for (int i : current.params) used += params_[i].tensor.numel();
      current.offset = flat_numel_;
      current.numel = round_up(std::max<int64_t>(used, 1), owners_);
      current.shard_numel = current.numel / owners_;
      int64_t offset = current.offset;
      for (int i : current.params) {
        params_[i].offset = offset;
        params_[i].bucket = static_cast<int>(buckets_.size());
        offset += params_[i].tensor.numel();
      }
      flat_numel_ += current.numel;
      buckets_.push_back(current);
      current = Bucket();
      current.group = g;
    };
    int64_t filled = 0;
    for (int k = static_cast<int>(groups[g].params.size()) - 1; k >= 0; --k) {
      const at::Tensor& p = groups[g].params[k];
      const int unit = units && !groups[g].units.empty() ? groups[g].units[k] : -1;
      if (filled > 0 && (filled + p.numel() > options_.bucket_numel || unit != current.unit)) {
        close();
        filled = 0;
      }
      current.unit = unit;
      Param param;
      param.name = groups[g].names[k];
      param.tensor = p;
      current.params.push_back(static_cast<int>(params_.size()));
      params_.push_back(param);
      filled += p.numel();
      numel_ += p.numel();
    }
    close();
  }
  for (const auto& b : buckets_) {
    max_bucket_numel_ = std::max(max_bucket_numel_, b.numel);
    partition_numel_ += b.shard_numel;
  }
  // Note [Partial offload]: buckets go to the host in flat order while the
  // share offloaded stays below the ratio by at least half the next bucket
  // (the nearest split at a bucket boundary). Every rank has the same
  // buckets, so the same split.
  if (options_.offload_optimizer) {
    const double wanted = options_.offload_ratio * static_cast<double>(partition_numel_);
    int64_t offloaded = 0;
    for (auto& b : buckets_) {
      if (options_.offload_ratio < 1.0 && offloaded + b.shard_numel / 2.0 >= wanted) break;
      b.master_on_host = true;
      offloaded += b.shard_numel;
    }
  }
  // Note [Offload copies]: which gradients are copied to the host, and which
  // of those skip the device's partition.
  const bool accelerator = !params_.empty() && !params_.front().tensor.device().is_cpu();
  for (auto& b : buckets_) {
    b.grad_copied = b.master_on_host && (accelerator || options_.host_grad_copies);
    b.grad_off_device = b.grad_copied && options_.stage >= 2;
    partition_offset_.push_back(b.grad_off_device ? -1 : partition_grad_numel_);
    if (!b.grad_off_device) partition_grad_numel_ += b.shard_numel;
  }

  // Each bucket's buffer, filled from the parameters; mixed-precision master
  // weights start from the model's exact fp32 values.
  const bool mixed = options_.dtype != at::kFloat;
  // A host tensor with `source`'s values (or zeros), page-locked if `pinned`.
  auto host_tensor = [&](const at::Tensor& source, at::ScalarType dtype, bool pinned, bool zeros = false) {
    auto opts = torch::TensorOptions().dtype(dtype).device(at::kCPU);
    if (pinned) opts = opts.pinned_memory(true);
    at::Tensor t = empty_with_huge_pages(source.numel(), opts);
    if (zeros) {
      t.zero_();
    } else {
      t.copy_(source.reshape(-1));
    }
    return t;
  };
  master_.assign(groups.size(), {});
  for (auto& b : buckets_) {
    const auto device = params_[b.params.front()].tensor.device();
    // Host tensors copied to or from the accelerator every step are
    // page-locked when the config asks (pin_memory).
    const bool pin_transfers = options_.pin_memory && !device.is_cpu();
    at::Tensor values = empty_with_huge_pages(b.numel, torch::TensorOptions().dtype(at::kFloat).device(device)).zero_();
    for (int i : b.params) {
      const Param& p = params_[i];
      values.slice(0, p.offset - b.offset, p.offset - b.offset + p.tensor.numel()).copy_(p.tensor.detach().reshape(-1));
    }
    b.full = mixed ? empty_with_huge_pages(b.numel, values.options().dtype(options_.dtype)).copy_(values) : values;
    for (int i : b.params) {
      Param& p = params_[i];
      torch::NoGradGuard no_grad;
      p.tensor.set_data(b.full.slice(0, p.offset - b.offset, p.offset - b.offset + p.tensor.numel()).view(p.tensor.sizes()));
    }
    const int64_t start = rank_in_owners_ * b.shard_numel;
    at::Tensor mine = b.full.slice(0, start, start + b.shard_numel);
    b.persistent = options_.stage < 3 || b.unit < 0 || b.numel < options_.persistence_threshold;
    b.shard = b.persistent ? mine : mine.clone();  // a released bucket keeps its shard apart
    const bool shard_offloaded = !b.persistent && options_.offload_param != "none";
    if (shard_offloaded) b.shard = host_tensor(b.shard, options_.dtype, pin_transfers);  // gathered from here
    at::Tensor m;
    if (b.master_on_host) {  // Note [Offload copies]
      // The master weights stay on the host (the updated parameters leave
      // through the staging buffers): pageable.
      m = host_tensor(values.slice(0, start, start + b.shard_numel), at::kFloat, /*pinned=*/false);
      // The reduced gradients, in the training dtype: copied to the host
      // when the parameters are elsewhere; read in place when they are there.
      master_grads_.push_back(b.grad_copied ? host_tensor(m, options_.dtype, pin_transfers, /*zeros=*/true) : at::Tensor());
    } else {
      // Separate from the parameters in mixed precision, or when the shard
      // leaves for the host or disk.
      m = mixed || shard_offloaded ? values.slice(0, start, start + b.shard_numel).clone() : b.shard;
      if (options_.offload_optimizer) master_grads_.push_back(at::Tensor());  // updated where it is
    }
    if (shard_offloaded && options_.offload_param == "nvme") {
      if (!param_store_) param_store_ = std::make_unique<offload::SwappedTensors>(options_.param_swap);
      b.swap_id = param_store_->add(b.shard, "params" + std::to_string(&b - buckets_.data()));
    }
    master_[b.group].push_back(m);
    master_flat_.push_back(m);
    if (!b.persistent) release(b);
  }
  if (param_store_) param_store_->swap_out_all();

  const auto device = params_.empty() ? at::Device(at::kCPU) : params_.front().tensor.device();
  const auto grad_options = torch::TensorOptions().dtype(options_.dtype).device(device);
  if (options_.stage <= 1) {
    flat_grads_ = empty_with_huge_pages(flat_numel_, grad_options).zero_();
  } else {
    partition_grads_ = empty_with_huge_pages(partition_grad_numel_, grad_options).zero_();
  }

  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i].tensor);
    if (!acc) throw PartitionError("parameter " + params_[i].name + " is not a leaf that requires grad");
    acc->add_post_hook(std::make_unique<GradReadyHook>(this, i));
    params_[i].accumulator = std::move(acc);
  }
}

ShardedParams::~ShardedParams() {
  for (auto* unit : units_) unit->detach();
  auto settle = [](comm::WorkHandle& w) {  // an error was raised already, if any
    try {
      if (w) w->wait();
    } catch (...) {
    }
  };
  for (auto& b : buckets_) settle(b.work);
  for (auto& w : update_works_) settle(w);  // a step that stopped on an error
}

at::Tensor ShardedParams::partition_slice(const Bucket& b) const {
  const int64_t start = partition_offset_[&b - buckets_.data()];
  if (start < 0) throw PartitionError("internal: a bucket whose gradients go to the host has no partition slice");
  return partition_grads_.slice(0, start, start + b.shard_numel);
}

void ShardedParams::begin_backward(bool boundary) {
  in_backward_ = true;
  if (scheduler_) scheduler_->begin_backward();
  boundary_ = boundary;
  next_launch_ = 0;
  for (auto& p : params_) p.fired = false;
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
  }
}

void ShardedParams::on_grad_ready(int index) {
  if (!in_backward_) {
    throw PartitionError("gradient of " + params_[index].name +
                         " arrived outside engine.backward(); call engine.backward(loss) instead of loss.backward()");
  }
  Param& p = params_[index];
  Bucket& b = buckets_[p.bucket];
  at::Tensor grad = p.tensor.grad();
  if (!grad.defined()) return;
  if (b.launched) {
    throw PartitionError("parameter " + p.name +
                         " received a second gradient in one backward after its bucket was reduced; "
                         "call engine.backward() once per micro-step (or use a larger reduce_bucket_size)");
  }
  at::Tensor target;
  if (options_.stage <= 1) {
    target = flat_grads_;
  } else {
    if (!b.staging.defined()) acquire_staging(b);
    target = b.staging;
  }
  const int64_t start = options_.stage <= 1 ? p.offset : p.offset - b.offset;
  target.slice(0, start, start + p.tensor.numel()).add_(grad.reshape(-1));
  p.tensor.mutable_grad() = at::Tensor();  // the bucket holds it now
  if (!p.fired) {
    p.fired = true;
    --b.pending;
  }
  if (b.pending == 0) {
    release(b);  // stage 3: its backward is done (a no-op for buckets that stay gathered)
    launch_in_order();
  }
}

// Buckets are reduced in index order on every rank, whatever order their
// gradients complete in, so that all ranks issue the same collectives.
void ShardedParams::launch_in_order() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_++]);
  }
}

void ShardedParams::launch(Bucket& b) {
  b.launched = true;
  if (options_.stage <= 1 && !boundary_) return;  // accumulate until the boundary
  if (options_.stage == 0) {
    b.work = pg_->all_reduce_async(flat_grads_.slice(0, b.offset, b.offset + b.numel), comm::ReduceOp::Avg);
  } else if (options_.stage == 1) {
    at::Tensor bucket = flat_grads_.slice(0, b.offset, b.offset + b.numel);
    at::Tensor mine = bucket.slice(0, rank_in_owners_ * b.shard_numel, (rank_in_owners_ + 1) * b.shard_numel);
    b.work = pg_->reduce_scatter_async(mine, bucket, comm::ReduceOp::Avg);
  } else {
    if (!b.staging.defined()) acquire_staging(b);  // no gradient arrived: zeros
    b.fresh_output = partition_fresh_ && !b.grad_off_device;
    b.reduced = b.fresh_output ? partition_slice(b) : torch::empty({b.shard_numel}, b.staging.options());
    b.work = pg_->reduce_scatter_async(b.reduced, b.staging, comm::ReduceOp::Avg);
  }
  if (!options_.overlap_comm) finish(b);
}

void ShardedParams::finish(Bucket& b) {
  if (!b.work) return;
  b.work->wait();
  b.work.reset();
  if (options_.stage >= 2) {
    if (b.grad_off_device) {
      grad_to_host(b, b.reduced);
    } else if (!b.fresh_output) {
      partition_slice(b).add_(b.reduced);
    }
    b.reduced = at::Tensor();
    staging_pool_.push_back(b.staging_base);
    b.staging = b.staging_base = at::Tensor();
    // Offload: at the boundary the bucket's part of the partition is final;
    // it leaves for the host while backward goes on (Note [Offload copies]).
    const size_t k = &b - buckets_.data();
    if (boundary_ && b.grad_copied && !b.grad_off_device) {
      master_grads_[k].copy_(partition_slice(b), /*non_blocking=*/true);
      b.grad_on_host = true;
    }
  }
}

// A grad_off_device bucket's reduced shard goes to its host copy (Note
// [Offload copies]): copied, or added through the device when the copy
// already holds a backward's (a second backward before the step). Its sum
// of squares is taken on the device, from the value the copy will hold.
void ShardedParams::grad_to_host(Bucket& b, const at::Tensor& reduced) {
  at::Tensor& host = master_grads_[&b - buckets_.data()];
  at::Tensor value = reduced;
  if (b.grad_on_host) value = host.to(reduced.device(), /*non_blocking=*/true).add_(reduced);
  host.copy_(value, /*non_blocking=*/true);
  b.grad_on_host = true;
  if (!value.is_cpu()) b.grad_sq = squares_on_device(value);
}

// Stages 2-3 keep no full gradient: a bucket borrows a buffer from a small
// pool while its gradients arrive and returns it once reduced. The pool
// holds one buffer (two with overlap_comm); when none is free, a completed
// reduction or else the oldest in flight is waited for. Only buckets still
// being filled can make it grow beyond that (their reduction must wait for
// an earlier bucket). It grows to its size before reusing a buffer, so how
// many buffers there are does not depend on when reductions complete: the
// memory report is the same in every run.
void ShardedParams::acquire_staging(Bucket& b) {
  const size_t limit = options_.overlap_comm ? 2 : 1;
  const auto grow = [&] {
    staging_pool_.push_back(torch::empty({max_bucket_numel_}, partition_grads_.options()));
    staging_bytes_ += staging_pool_.back().nbytes();
    ++staging_buffers_;
  };
  if (staging_pool_.empty() && staging_buffers_ < limit) grow();
  while (staging_pool_.empty()) {
    for (auto& other : buckets_) {
      if (other.work && other.work->is_completed()) finish(other);
    }
    if (!staging_pool_.empty()) break;
    Bucket* oldest = nullptr;
    for (auto& other : buckets_) {
      if (other.work) {
        oldest = &other;
        break;
      }
    }
    if (!oldest) {
      grow();
      break;
    }
    finish(*oldest);
  }
  b.staging_base = staging_pool_.back();
  staging_pool_.pop_back();
  b.staging = b.staging_base.slice(0, 0, b.numel);
  b.staging.zero_();
}

void ShardedParams::end_backward() {
  // Buckets with parameters that got no gradient (unused in this forward)
  // are reduced too, with zeros there.
  for (auto& b : buckets_) b.pending = 0;
  launch_in_order();
  for (auto& b : buckets_) finish(b);
  for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();
  in_backward_ = false;
  if (options_.stage >= 2) partition_fresh_ = false;
  if (options_.stage == 3) {
    release_all_unpersistent();  // unused units, prefetched ones
    if (scheduler_) scheduler_->end_step();
  }
}

// Offload with an accelerator: the accelerator squares a bucket's gradients
// in a fraction of the time the host would take to read its copy, so the
// norm is summed there (local_grad_sq_norm). fp32 pieces of 16 Mi elements
// keep the temporary small.
at::Tensor ShardedParams::squares_on_device(const at::Tensor& grad) {
  constexpr int64_t kPiece = int64_t{1} << 24;
  at::Tensor sum = at::zeros({}, grad.options().dtype(at::kDouble));
  for (int64_t start = 0; start < grad.numel(); start += kPiece) {
    const at::Tensor piece = grad.slice(0, start, std::min(grad.numel(), start + kPiece)).to(at::kFloat);
    sum += piece.pow(2).sum(at::kDouble);
  }
  return sum;
}

void ShardedParams::add_squares_on_device(const at::Tensor& sum) {
  device_grad_sq_ = device_grad_sq_.defined() ? device_grad_sq_ + sum : sum;
}

// Copies to the host started during backward must land before the host reads them.
void ShardedParams::wait_for_host_grad_copies() const {
  bool pending = false;
  for (const auto& b : buckets_) pending = pending || (b.grad_on_host && b.full.is_cuda());
  if (pending) torch::cuda::synchronize();
}

void ShardedParams::attach_master_grads() {
  device_grad_sq_ = at::Tensor();
  host_grad_sq_.reset();
  wait_for_host_grad_copies();
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    if (b.grad_off_device) {  // its host copy is complete (zeros when no backward ran since the last step)
      if (!b.grad_on_host) {
        master_grads_[k].zero_();
      } else if (b.grad_sq.defined()) {
        add_squares_on_device(b.grad_sq);
      }
      master_flat_[k].mutable_grad() = master_grads_[k];
      continue;
    }
    at::Tensor grad;
    if (options_.stage == 0) {
      grad = flat_grads_.slice(0, b.offset, b.offset + b.numel);
    } else if (options_.stage == 1) {
      const int64_t start = b.offset + rank_in_owners_ * b.shard_numel;
      grad = flat_grads_.slice(0, start, start + b.shard_numel);
    } else {
      grad = partition_slice(b);
    }
    if (options_.offload_optimizer) {
      // The host optimizer reads the gradient in the training dtype (Note
      // [Offload copies]); stages 2-3 copied it when the bucket was reduced.
      // A bucket updated on the accelerator (Note [Partial offload]) keeps it
      // there, in the training dtype too.
      if (!grad.is_cpu()) add_squares_on_device(squares_on_device(grad));
      if (master_grads_[k].defined()) {
        if (!b.grad_on_host) master_grads_[k].copy_(grad);
        grad = master_grads_[k];
      }
      master_flat_[k].mutable_grad() = grad;
      continue;
    }
    master_flat_[k].mutable_grad() = grad.scalar_type() == at::kFloat ? grad : grad.to(at::kFloat);
  }
}

void ShardedParams::detach_master_grads() {
  host_grad_sq_.reset();
  for (auto& m : master_flat_) m.mutable_grad() = at::Tensor();
  for (auto& b : buckets_) {
    b.grad_on_host = false;
    b.grad_sq = at::Tensor();
  }
}


// Whether master tensor k's gradient is summed on the accelerator
// (device_grad_sq_): with offload, every bucket's is when the parameters are there.
bool ShardedParams::squared_on_device(size_t k) const {
  return device_grad_sq_.defined() && !buckets_[k].full.is_cpu();
}

// The sum of squares of the gradients in host memory (offload, CPU ranks),
// made in one fused pass per step that the fp16 overflow check and the norm
// share: the sum is not finite exactly when an element is not.
double ShardedParams::host_grad_sq() const {
  if (!host_grad_sq_) {
    double sum = 0.0;
    for (size_t k = 0; k < master_flat_.size(); ++k) {
      const at::Tensor& g = master_flat_[k].grad();
      if (squared_on_device(k)) continue;
      if (auto h = offload::grad_array(g)) sum += offload::sum_of_squares(*h, g.numel());
    }
    host_grad_sq_ = sum;
  }
  return *host_grad_sq_;
}

// One device-to-host read per call, not one per bucket.
double ShardedParams::local_grad_sq_norm() const {
  if (master_flat_.empty()) return 0.0;
  at::Tensor sum = at::zeros({}, master_flat_.front().options().dtype(at::kDouble));
  if (device_grad_sq_.defined()) sum += device_grad_sq_.cpu();
  for (size_t k = 0; k < master_flat_.size(); ++k) {
    const at::Tensor& g = master_flat_[k].grad();
    if (!squared_on_device(k) && !offload::grad_array(g)) sum += g.pow(2).sum(at::kDouble);
  }
  return host_grad_sq() + sum.item<double>();
}

bool ShardedParams::local_grads_finite() const {
  if (master_flat_.empty()) return true;
  at::Tensor finite = at::ones({}, master_flat_.front().options().dtype(at::kBool));
  for (size_t k = 0; k < master_flat_.size(); ++k) {
    const at::Tensor& g = master_flat_[k].grad();
    if (!squared_on_device(k) && !offload::grad_array(g)) finite.logical_and_(g.isfinite().all());
  }
  const bool device_finite = !device_grad_sq_.defined() || std::isfinite(device_grad_sq_.item<double>());
  return std::isfinite(host_grad_sq()) && device_finite && finite.item<bool>();
}

void ShardedParams::scale_master_grads(double factor) {
  if (options_.offload_optimizer) {
    throw PartitionError("scale_master_grads: with offload the host optimizer applies the scale as it reads the gradients");
  }
  for (auto& m : master_flat_) m.mutable_grad().mul_(factor);
}

void ShardedParams::publish() {
  std::vector<comm::WorkHandle> works;
  for (size_t k = 0; k < buckets_.size(); ++k) works.push_back(publish_bucket(k));
  for (auto& w : works) {
    if (w) w->wait();
  }
  wait_param_writes();
}

comm::WorkHandle ShardedParams::publish_bucket(size_t k) {
  torch::NoGradGuard no_grad;
  Bucket& b = buckets_[k];
  // copy_ converts the fp32 master to the parameters' dtype and device.
  const at::Tensor& source = master_flat_[k];
  const bool separate = source.unsafeGetTensorImpl() != b.shard.unsafeGetTensorImpl();
  if (options_.stage == 0) {
    if (separate) b.full.copy_(source);  // else the master weights are the parameters
  } else if (b.persistent) {
    // The shard is this rank's slot of the gathered bucket: the updated
    // values go there and the bucket is gathered in place.
    if (separate) b.shard.copy_(source);
    return pg_->all_gather_async(b.full, b.shard);
  } else if (separate) {
    // Gathered again when its unit runs; offload_param "nvme": written back.
    if (b.swap_id >= 0) param_store_->materialize({b.swap_id});
    b.shard.copy_(source);
    if (b.swap_id >= 0) {
      param_store_->swap_out({b.swap_id});  // waited for by wait_param_writes()
      param_writes_.push_back(b.swap_id);
    }
  }
  return nullptr;
}

at::Tensor ShardedParams::update_target(size_t k) {
  Bucket& b = buckets_[k];
  if (master_flat_[k].unsafeGetTensorImpl() == b.shard.unsafeGetTensorImpl()) return {};
  if (b.swap_id >= 0) param_store_->materialize({b.swap_id});  // written back by updated()
  // Written in place: a host shard by the host optimizer, or (Note [Partial
  // offload]) a shard on the accelerator by the update made there.
  if (b.shard.is_cpu() || !b.master_on_host) return b.shard;
  // The shard is on the accelerator: a staging buffer whose previous copy has run.
  if (update_staging_.empty()) {
    int64_t largest = 0;
    for (const auto& other : buckets_) largest = std::max(largest, other.shard_numel);
    for (int i = 0; i < 2; ++i) {
      Staging s;
      s.buffer = torch::empty({largest}, torch::TensorOptions().dtype(b.shard.scalar_type()).pinned_memory(true));
      s.copied = std::make_unique<c10::Event>(b.shard.device().type());
      update_staging_.push_back(std::move(s));
    }
  }
  Staging& s = update_staging_[next_staging_++ % update_staging_.size()];
  while (!s.copied->query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  s.bucket = static_cast<int>(k);
  return s.buffer.slice(0, 0, b.shard_numel);
}

void ShardedParams::updated(size_t k) {
  torch::NoGradGuard no_grad;
  Bucket& b = buckets_[k];
  for (auto& s : update_staging_) {
    if (s.bucket != static_cast<int>(k)) continue;
    // Asynchronous from page-locked memory on the current stream, which the
    // all-gather below waits for; the event frees the buffer.
    b.shard.copy_(s.buffer.slice(0, 0, b.shard_numel), /*non_blocking=*/true);
    const auto impl = c10::impl::VirtualGuardImpl(b.shard.device().type());
    s.copied->record(impl.getStream(b.shard.device()));
    s.bucket = -1;
  }
  if (b.persistent) {
    update_works_.push_back(pg_->all_gather_async(b.full, b.shard));
  } else if (b.swap_id >= 0) {
    param_store_->swap_out({b.swap_id});
    param_writes_.push_back(b.swap_id);
  }
}

void ShardedParams::finish_updates() {
  for (auto& w : update_works_) {
    if (w) w->wait();
  }
  update_works_.clear();
  wait_param_writes();
}

void ShardedParams::wait_param_writes() {
  if (param_store_) param_store_->wait_out(param_writes_);
  param_writes_.clear();
}

int64_t ShardedParams::offloaded_param_bytes(bool nvme) const {
  int64_t bytes = 0;
  for (const auto& b : buckets_) {
    if (b.persistent || options_.offload_param == "none") continue;
    if ((b.swap_id >= 0) == nvme) bytes += b.shard.nbytes();
  }
  return bytes;
}

int64_t ShardedParams::offload_buffer_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : update_staging_) bytes += s.buffer.nbytes();
  for (const auto& t : master_grads_) {
    if (t.defined()) bytes += t.nbytes();
  }
  return bytes;
}

void ShardedParams::zero_grads() {
  if (flat_grads_.defined()) flat_grads_.zero_();
  if (partition_grads_.defined()) partition_grads_.zero_();
  partition_fresh_ = true;
}

int64_t ShardedParams::param_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : buckets_) {
    if (!b.persistent) bytes += b.shard.nbytes();
    if (b.gathered) bytes += b.full.numel() * b.full.element_size();
  }
  return bytes;
}

int64_t ShardedParams::grad_bytes() const {
  if (flat_grads_.defined()) return flat_grads_.nbytes();
  return partition_grads_.nbytes() + staging_bytes_;
}

int64_t ShardedParams::master_bytes() const {
  int64_t bytes = 0;  // master weights apart from the parameters (mixed precision, offload)
  for (size_t k = 0; k < buckets_.size(); ++k) {
    if (master_flat_[k].unsafeGetTensorImpl() != buckets_[k].shard.unsafeGetTensorImpl()) bytes += master_flat_[k].nbytes();
  }
  return bytes;
}

}  // namespace zero::partition
