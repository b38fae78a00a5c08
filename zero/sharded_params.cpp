// ShardedParams: the master weights over the flat layout (flat_layout.h),
// their gradients from the stage's GradReducer (grad_reducer.h) or the host
// copies (host_grads.h), and their way back to the parameters (Note
// [Offload copies]). The buckets' memory, with stage 3's release and
// gather: param_storage.cpp.
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <cmath>
#include <optional>
#include <thread>

#include "offload/cpu_optimizer.h"
#include "offload/host_tensors.h"
#include "zero/error.h"
#include "zero/internal/partition.h"

namespace zero::partition {

using offload::empty_with_huge_pages;

// Runs after a parameter's AccumulateGrad: its gradient for this backward
// is complete (checked on LibTorch 1.13 and 2.11, ARCHITECTURE.md).
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

// The layout of `groups`' parameters (Note [Flat layout]): stage 0 keeps
// whole buckets on every rank, stage 3 cuts buckets at unit boundaries.
FlatLayout layout_of(const std::vector<ShardedParams::Group>& groups, const comm::ProcessGroup& pg,
                     const Options& options) {
  std::vector<std::vector<ParamSpec>> specs;
  for (const auto& g : groups) {
    specs.emplace_back();
    for (size_t i = 0; i < g.params.size(); ++i) {
      specs.back().push_back({g.names[i], g.params[i].numel(), g.units.empty() ? -1 : g.units[i]});
    }
  }
  const bool sharded = options.stage > 0;
  return FlatLayout(specs, options.bucket_numel, sharded ? pg.size() : 1, sharded ? pg.rank() : 0, options.stage == 3);
}

StorageOptions storage_options(const Options& options) {
  StorageOptions o;
  o.offload_param = options.offload_param;
  o.swap = options.param_swap;
  o.pin_memory = options.pin_memory;
  return o;
}

}  // namespace

ShardedParams::ShardedParams(std::vector<Group> groups, std::shared_ptr<comm::ProcessGroup> pg, Options options)
    : pg_(std::move(pg)),
      options_(options),
      layout_(layout_of(groups, *pg_, options)),
      storage_(pg_, layout_.owners(), storage_options(options)) {
  // The parameters in the layout's order: reverse registration order, group by group.
  std::vector<at::Tensor> tensors;
  for (const auto& g : groups) tensors.insert(tensors.end(), g.params.rbegin(), g.params.rend());
  const size_t n = layout_.buckets().size();
  const bool accelerator = !tensors.empty() && !tensors.front().device().is_cpu();
  std::vector<bool> on_host(n, false);
  if (options_.offload_optimizer) {
    on_host = layout_.offloaded_buckets(options_.offload_ratio);  // Note [Partial offload]
    // Note [Offload copies]: the reduced gradients of offloaded buckets are
    // copied to the host when the parameters are elsewhere; at stages 2-3
    // they then skip the device's partition.
    std::vector<bool> copied(n, false);
    for (size_t k = 0; k < n; ++k) copied[k] = on_host[k] && (accelerator || options_.host_grad_copies);
    host_grads_ = std::make_unique<HostGrads>(layout_, copied, options_.stage >= 2, options_.dtype,
                                              options_.pin_memory && accelerator);
  }
  master_on_host_ = on_host;
  sent_.assign(n, false);
  params_.resize(tensors.size());
  master_.assign(groups.size(), {});
  build_buckets(tensors);
  storage_.seal();

  ReducerOptions reducer;
  reducer.stage = options_.stage;
  reducer.overlap_comm = options_.overlap_comm;
  const auto device = tensors.empty() ? at::Device(at::kCPU) : tensors.front().device();
  reducer.grad_options = torch::TensorOptions().dtype(options_.dtype).device(device);
  reducer_ = GradReducer::for_stage(layout_, pg_, host_grads_.get(), reducer);

  for (int i = 0; i < static_cast<int>(params_.size()); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i].tensor);
    if (!acc) throw PartitionError("parameter " + param_name(i) + " is not a leaf that requires grad");
    acc->add_post_hook(std::make_unique<GradReadyHook>(this, i));
    params_[i].accumulator = std::move(acc);
  }
}

// Each bucket's buffer, filled from the parameters, which become views into
// it; the master weights beside it. Mixed-precision master weights start
// from the model's exact fp32 values.
void ShardedParams::build_buckets(const std::vector<at::Tensor>& tensors) {
  const bool mixed = options_.dtype != at::kFloat;
  for (size_t k = 0; k < layout_.buckets().size(); ++k) {
    const LayoutBucket& span = layout_.buckets()[k];
    const auto device = tensors[span.params.front()].device();
    at::Tensor values = empty_with_huge_pages(span.numel, torch::TensorOptions().dtype(at::kFloat).device(device)).zero_();
    auto in_bucket = [&](const at::Tensor& t, int i) {
      const int64_t start = layout_.params()[i].offset - span.offset;
      return t.slice(0, start, start + layout_.params()[i].numel);
    };
    for (int i : span.params) in_bucket(values, i).copy_(tensors[i].detach().reshape(-1));
    at::Tensor full = mixed ? empty_with_huge_pages(span.numel, values.options().dtype(options_.dtype)).copy_(values) : values;
    for (int i : span.params) {
      torch::NoGradGuard no_grad;
      at::Tensor p = tensors[i];
      p.set_data(in_bucket(full, i).view(p.sizes()));
      params_[i].tensor = p;
    }
    const int64_t start = layout_.rank() * span.shard_numel;
    const bool persistent = options_.stage < 3 || span.unit < 0 || span.numel < options_.persistence_threshold;
    storage_.add(full, start, span.shard_numel, persistent);
    const bool shard_offloaded = !persistent && options_.offload_param != "none";
    at::Tensor mine_fp32 = values.slice(0, start, start + span.shard_numel);
    at::Tensor m;
    if (master_on_host_[k]) {
      // Note [Offload copies]: the master weights stay on the host (the
      // updated parameters leave through the staging buffers): pageable.
      m = offload::host_copy(mine_fp32, at::kFloat, /*pinned=*/false);
    } else {
      // Separate from the parameters in mixed precision, or when the shard
      // leaves for the host or disk.
      m = mixed || shard_offloaded ? mine_fp32.clone() : storage_.shard(k);
    }
    master_[span.group].push_back(m);
    master_flat_.push_back(m);
    storage_.release(k);  // stage 3: until its unit runs (a no-op for buckets that stay gathered)
  }
}

ShardedParams::~ShardedParams() {
  for (auto* unit : units_) unit->detach();
  if (reducer_) reducer_->settle();  // an error was raised already, if any
  for (auto& w : update_works_) {    // a step that stopped on an error
    try {
      if (w) w->wait();
    } catch (...) {
    }
  }
}

void ShardedParams::begin_backward(bool boundary) {
  in_backward_ = true;
  if (scheduler_) scheduler_->begin_backward();
  reducer_->begin_backward(boundary);
}

void ShardedParams::on_grad_ready(int index) {
  if (!in_backward_) {
    throw PartitionError("gradient of " + param_name(index) +
                         " arrived outside engine.backward(); call engine.backward(loss) instead of loss.backward()");
  }
  at::Tensor& grad = params_[index].tensor.mutable_grad();
  if (!grad.defined()) return;
  const bool bucket_complete = reducer_->add(index, grad);
  grad = at::Tensor();  // the reducer holds it now
  if (bucket_complete) {
    storage_.release(layout_.params()[index].bucket);  // stage 3: its backward is done (a no-op for buckets that stay gathered)
    reducer_->launch_ready();
  }
}

void ShardedParams::end_backward() {
  reducer_->end_backward();
  for (auto& p : params_) p.tensor.mutable_grad() = at::Tensor();
  in_backward_ = false;
  if (options_.stage == 3) {
    storage_.release_all();  // unused units, prefetched ones
    if (scheduler_) scheduler_->end_step();
  }
}

// Each bucket's gradient is attached and its squares added once per step
// (Note [Gradient norm] in zero/internal/grad_norm.h).
void ShardedParams::attach_master_grads() {
  squares_.reset();
  if (host_grads_) host_grads_->wait();  // copies started during backward land before the host reads them
  for (size_t k = 0; k < num_buckets(); ++k) {
    if (host_grads_ && host_grads_->off_device(k)) {  // its host copy is complete
      master_flat_[k].mutable_grad() = host_grads_->for_step(k);
      if (host_grads_->device_squares(k).defined()) {
        squares_.add_device_sum(host_grads_->device_squares(k));
      } else {
        squares_.add(master_flat_[k].grad());
      }
      continue;
    }
    at::Tensor grad = reducer_->shard_grad(k);
    if (options_.offload_optimizer) {
      // The host optimizer reads the gradient in the training dtype (Note
      // [Offload copies]); stages 2-3 copied it when the bucket was reduced.
      // A bucket updated on the accelerator (Note [Partial offload]) keeps it
      // there, in the training dtype too. Squared where it was reduced.
      squares_.add(grad);
      if (host_grads_->copied(k)) {
        if (!host_grads_->holds(k)) host_grads_->copy_from(k, grad, /*non_blocking=*/false);
        grad = host_grads_->copy(k);
      }
      master_flat_[k].mutable_grad() = grad;
      continue;
    }
    master_flat_[k].mutable_grad() = grad.scalar_type() == at::kFloat ? grad : grad.to(at::kFloat);
    squares_.add(master_flat_[k].grad());
  }
}

void ShardedParams::detach_master_grads() {
  for (auto& m : master_flat_) m.mutable_grad() = at::Tensor();
  if (host_grads_) host_grads_->clear();
}

void ShardedParams::publish_bucket(size_t k) {
  at::Tensor target = update_target(k);
  if (target.defined()) {
    torch::NoGradGuard no_grad;
    target.copy_(master_flat_[k]);  // converts the fp32 master to the parameters' dtype
  }
  updated(k);
}

void ShardedParams::publish() {
  for (size_t k = 0; k < num_buckets(); ++k) {
    if (!sent_[k]) publish_bucket(k);
  }
  for (auto& w : update_works_) {
    if (w) w->wait();
  }
  update_works_.clear();
  storage_.wait_writes();
  sent_.assign(num_buckets(), false);
}

at::Tensor ShardedParams::update_target(size_t k) {
  const at::Tensor& shard = storage_.shard(k);
  if (master_flat_[k].unsafeGetTensorImpl() == shard.unsafeGetTensorImpl()) return {};
  storage_.prepare_write(k);
  // Written in place: a host shard by the host optimizer, or (Note [Partial
  // offload]) a shard on the accelerator by the update made there.
  if (shard.is_cpu() || !master_on_host_[k]) return shard;
  // The shard is on the accelerator: a staging buffer whose previous copy has run.
  if (update_staging_.empty()) {
    int64_t largest = 0;
    for (const auto& other : layout_.buckets()) largest = std::max(largest, other.shard_numel);
    for (int i = 0; i < 2; ++i) {
      Staging s;
      s.buffer = torch::empty({largest}, torch::TensorOptions().dtype(shard.scalar_type()).pinned_memory(true));
      s.copied = std::make_unique<c10::Event>(shard.device().type());
      update_staging_.push_back(std::move(s));
    }
  }
  Staging& s = update_staging_[next_staging_++ % update_staging_.size()];
  while (!s.copied->query()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  s.bucket = static_cast<int>(k);
  return s.buffer.slice(0, 0, layout_.buckets()[k].shard_numel);
}

void ShardedParams::updated(size_t k) {
  torch::NoGradGuard no_grad;
  const at::Tensor& shard = storage_.shard(k);
  for (auto& s : update_staging_) {
    if (s.bucket != static_cast<int>(k)) continue;
    // Asynchronous from page-locked memory on the current stream, which the
    // all-gather below waits for; the event frees the buffer.
    shard.copy_(s.buffer.slice(0, 0, layout_.buckets()[k].shard_numel), /*non_blocking=*/true);
    const auto impl = c10::impl::VirtualGuardImpl(shard.device().type());
    s.copied->record(impl.getStream(shard.device()));
    s.bucket = -1;
  }
  // A bucket that stays gathered is all-gathered in place, when it has
  // more than one owner; a released one is gathered again when its unit
  // runs (offload_param "nvme": written back first).
  if (auto work = storage_.written(k)) update_works_.push_back(std::move(work));
  sent_[k] = true;
}

int64_t ShardedParams::offload_buffer_bytes() const {
  int64_t bytes = host_grads_ ? host_grads_->bytes() : 0;
  for (const auto& s : update_staging_) bytes += s.buffer.nbytes();
  return bytes;
}

int64_t ShardedParams::master_bytes() const {
  int64_t bytes = 0;  // master weights apart from the parameters (mixed precision, offload)
  for (size_t k = 0; k < num_buckets(); ++k) {
    if (master_flat_[k].unsafeGetTensorImpl() != storage_.shard(k).unsafeGetTensorImpl()) bytes += master_flat_[k].nbytes();
  }
  return bytes;
}

}  // namespace zero::partition
