// ShardedParams: the parameters flattened (flat_layout.h) into their
// buckets' memory (param_storage.h), the master weights beside them
// (master_store.h), and each master tensor's gradient from the stage's
// GradReducer (grad_reducer.h) or the host copies (host_grads.h).
#include <torch/csrc/autograd/variable.h>

#include "offload/host_tensors.h"
#include "zero/error.h"
#include "partition/construction.h"
#include "partition/partition.h"
#include "partition/update_run.h"

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
// Each parameter's norm weight (Note [Gradient norm]): 1 over the ranks
// of the norm group holding the same gradient, its replicas outside the
// data-parallel group and, at stage 0 summed beyond it, the dp ranks too.
FlatLayout layout_of(const std::vector<ShardedParams::Group>& groups, const comm::ProcessGroup& pg,
                     const Options& options) {
  const bool sharded = options.stage > 0;
  const bool beyond_dp = options.norm_group && options.norm_group->size() > pg.size();
  const double per_holder = !sharded && beyond_dp ? 1.0 / pg.size() : 1.0;
  std::vector<std::vector<ParamSpec>> specs;
  for (const auto& g : groups) {
    specs.emplace_back();
    for (size_t i = 0; i < g.params.size(); ++i) {
      const int replicas = g.replicas.empty() ? 1 : g.replicas[i];
      specs.back().push_back({g.names[i], g.params[i].numel(), g.units.empty() ? -1 : g.units[i],
                              replicas == 1 ? per_holder : per_holder / replicas});
    }
  }
  return FlatLayout(specs, options.bucket_numel, sharded ? pg.size() : 1, sharded ? pg.rank() : 0, options.stage == 3);
}

// Per bucket, its master weights live on the host (Note [Partial offload]).
std::vector<bool> masters_on_host(const FlatLayout& layout, const Options& options) {
  if (!options.offload_optimizer) return std::vector<bool>(layout.buckets().size(), false);
  return layout.offloaded_buckets(options.offload_ratio);
}

StorageOptions storage_options(const Options& options) {
  StorageOptions o;
  o.offload_param = options.offload_param;
  o.swap = options.param_swap;
  o.pin_memory = options.pin_memory;
  o.quantized_block = options.quantized_weights_block;
  o.secondary_group = options.secondary_group;
  return o;
}

}  // namespace

ShardedParams::ShardedParams(std::vector<Group> groups, std::shared_ptr<comm::ProcessGroup> pg, Options options)
    : pg_(std::move(pg)),
      options_(options),
      layout_(layout_of(groups, *pg_, options)),
      storage_(pg_, layout_.owners(), storage_options(options)),
      masters_(layout_, storage_, masters_on_host(layout_, options), groups.size(), options.master_swap) {
  // The parameters in the layout's order: reverse registration order, group by group.
  std::vector<at::Tensor> tensors;
  for (const auto& g : groups) tensors.insert(tensors.end(), g.params.rbegin(), g.params.rend());
  const size_t n = layout_.buckets().size();
  const bool accelerator = !tensors.empty() && !device_of(tensors.front()).is_cpu();
  if (options_.offload_optimizer) {
    // The reduced gradients of offloaded buckets are copied to the host
    // when the parameters are elsewhere; at stages 2-3 they then skip the
    // device's partition (Note [Offload copies]).
    std::vector<bool> copied(n, false);
    const bool on_nvme = options_.grads_on_nvme && masters_.nvme_store() && options_.stage >= 2;
    for (size_t k = 0; k < n; ++k) {
      copied[k] = masters_.on_host(k) && (on_nvme || accelerator || options_.host_grad_copies);
    }
    if (on_nvme) {  // Note [Gradients on NVMe] in host_grads.h
      host_grads_ = std::make_unique<HostGrads>(layout_, copied, options_.dtype, *masters_.nvme_store());
    } else {
      host_grads_ = std::make_unique<HostGrads>(layout_, copied, options_.stage >= 2, options_.dtype,
                                                options_.pin_memory && accelerator);
    }
  }
  params_.resize(tensors.size());
  build_buckets(tensors);  // with each parameter's GradReadyHook
  storage_.seal();

  ReducerOptions reducer;
  reducer.stage = options_.stage;
  reducer.overlap_comm = options_.overlap_comm;
  reducer.quantized = options_.quantized_gradients;
  reducer.huge_pages = !options_.master_swap;
  const auto device = tensors.empty() ? at::Device(at::kCPU) : device_of(tensors.front());
  reducer.grad_options = torch::TensorOptions().dtype(options_.dtype).device(device);
  reducer_ = GradReducer::for_stage(layout_, pg_, host_grads_.get(), reducer);
}

// Made while the parameter is whole: AccumulateGrad keeps the shape it had
// then, and checks the gradient against it (Note [Stage 3 storage]).
void ShardedParams::hook_grad(int i) {
  auto acc = torch::autograd::impl::grad_accumulator(params_[i].tensor);
  if (!acc) throw PartitionError("parameter " + param_name(i) + " is not a leaf that requires grad");
  acc->add_post_hook(std::make_unique<GradReadyHook>(this, i));
  params_[i].accumulator = std::move(acc);
}

// Each bucket's buffer, filled from the parameters, which become views into
// it; the master weights beside it. Mixed-precision master weights start
// from the model's exact fp32 values.
void ShardedParams::build_buckets(const std::vector<at::Tensor>& tensors) {
  const bool mixed = options_.dtype != at::kFloat;
  auto read_parts_ahead = [&](size_t k) {  // remote_device "nvme" (Note [Partitioned construction])
    if (!options_.parts || k >= layout_.buckets().size()) return;
    std::vector<at::Tensor> params;
    for (int i : layout_.buckets()[k].params) params.push_back(tensors[i]);
    options_.parts->read_ahead(params);
  };
  read_parts_ahead(0);
  for (size_t k = 0; k < layout_.buckets().size(); ++k) {
    const LayoutBucket& span = layout_.buckets()[k];
    const auto device = device_of(tensors[span.params.front()]);
    const bool persistent = options_.stage < 3 || span.unit < 0 || span.numel < options_.persistence_threshold;
    // Huge pages for what stays: a bucket released below is gathered into
    // memory of its own at each use, and its first touch here would only
    // compact memory (offload/huge_pages.h).
    const auto value_options = torch::TensorOptions().dtype(at::kFloat).device(device);
    at::Tensor values = persistent ? empty_with_huge_pages(span.numel, value_options) : torch::empty({span.numel}, value_options);
    const LayoutParam& last = layout_.params()[span.params.back()];
    values.slice(0, last.offset + last.numel - span.offset).zero_();  // the padding: the parameters fill the rest
    auto in_bucket = [&](const at::Tensor& t, int i) {
      const int64_t start = layout_.params()[i].offset - span.offset;
      return t.slice(0, start, start + layout_.params()[i].numel);
    };
    read_parts_ahead(k + 1);  // while this bucket is laid out
    for (int i : span.params) {
      const bool parted = options_.parts && options_.parts->holds(tensors[i]);  // Note [Partitioned construction]
      if (parted) {
        options_.parts->gather(tensors[i], layout_.params()[i].name, in_bucket(values, i));
      } else {
        in_bucket(values, i).copy_(tensors[i].detach().reshape(-1));
      }
    }
    at::Tensor full = mixed ? empty_with_huge_pages(span.numel, values.options().dtype(options_.dtype)).copy_(values) : values;
    std::vector<ParamView> views;
    for (int i : span.params) {
      torch::NoGradGuard no_grad;
      at::Tensor p = tensors[i];
      p.set_data(in_bucket(full, i).view(p.sizes()));
      params_[i].tensor = p;
      hook_grad(i);
      views.push_back({p, layout_.params()[i].offset - span.offset, p.sizes().vec()});
    }
    const int64_t start = layout_.rank() * span.shard_numel;
    storage_.add(full, start, span.shard_numel, persistent, std::move(views));
    // Mixed-precision master weights, and those of a shard that leaves for
    // the host or disk, are apart from the parameters.
    const bool shard_offloaded = !persistent && options_.offload_param != OffloadDevice::none;
    masters_.add(values.slice(0, start, start + span.shard_numel), mixed || shard_offloaded);
    storage_.release(k);  // stage 3: until its unit runs (a no-op for buckets that stay gathered)
  }
}

at::Device ShardedParams::device_of(const at::Tensor& param) const {
  return options_.parts ? options_.parts->device_of(param) : param.device();
}

ShardedParams::~ShardedParams() {
  abandon_update_in_backward();
  for (auto* unit : units_) unit->detach();
  if (reducer_) reducer_->settle();  // an error was raised already, if any
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

int64_t ShardedParams::offload_buffer_bytes() const {
  return (host_grads_ ? host_grads_->bytes() : 0) + masters_.staging_bytes();
}

}  // namespace zero::partition
