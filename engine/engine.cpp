// The Engine: DeepSpeed's training loop over ShardedParams (zero/).
#include "zero/engine.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/env.h"
#include "engine/engine_impl.h"
#include "engine/host_optimizer.h"
#include "engine/optimizer.h"
#include "zero/error.h"
#include "zero/log.h"
#include "zero/internal/partition.h"

namespace zero {
namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string human_bytes(int64_t bytes) {
  char text[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1e9) {
    std::snprintf(text, sizeof(text), "%.2f GB", b / 1e9);
  } else if (b >= 1e6) {
    std::snprintf(text, sizeof(text), "%.2f MB", b / 1e6);
  } else {
    std::snprintf(text, sizeof(text), "%.1f kB", b / 1e3);
  }
  return text;
}

at::ScalarType training_dtype(const Config& c) {
  if (c.fp16.enabled) return at::kHalf;
  if (c.bf16.enabled) return at::kBFloat16;
  return at::kFloat;
}

std::shared_ptr<comm::ProcessGroup> join(const Config& config) {
  comm::GroupOptions options;
  if (!env::is_set("ZERO_COMM_TIMEOUT")) options.timeout = std::chrono::seconds(config.zero.comm_timeout_s);
  if (!env::is_set("ZERO_CUDA_BACKEND")) options.cuda_backend = config.zero.cuda_comm_backend;
  return comm::init_process_group(options);
}

}  // namespace

std::string MemoryReport::describe() const {
  std::ostringstream out;
  out << "params " << human_bytes(params) << ", grads " << human_bytes(gradients) << ", fp32 master "
      << human_bytes(fp32_master) << ", optimizer " << human_bytes(optimizer_states) << ", buffers "
      << human_bytes(buffers);
  if (offload_buffers > 0) out << ", offload buffers " << human_bytes(offload_buffers);
  out << " (total " << human_bytes(total()) << ")";
  if (host_offloaded > 0) out << "; offloaded to host " << human_bytes(host_offloaded);
  if (nvme_offloaded > 0) out << ", to NVMe " << human_bytes(nvme_offloaded);
  if (nvme_host_peak > 0) out << " (host peak " << human_bytes(nvme_host_peak) << ")";
  return out.str();
}

void Engine::Impl::build_params(InitOptions& options) {
  // Every parameter once (a tied weight is registered under several names).
  std::unordered_map<const void*, std::string> names;
  std::vector<at::Tensor> trainable;
  for (const auto& item : module->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!names.emplace(p.unsafeGetTensorImpl(), item.key()).second) continue;
    if (p.requires_grad()) {
      trainable.push_back(p);
    } else {
      // Frozen floating weights are converted to the training dtype below.
      const auto kept = at::isFloatingType(p.scalar_type()) ? dtype : p.scalar_type();
      frozen_bytes += p.numel() * static_cast<int64_t>(c10::elementSize(kept));
    }
  }
  if (options.param_groups.empty()) options.param_groups.push_back(ParamGroup{trainable, std::nullopt});

  // Stage 3 units (zero::Unit): each parameter belongs to the innermost unit
  // that holds it; one shared by units that do not nest (a tied weight)
  // belongs to none and stays gathered, as do parameters outside every unit.
  std::unordered_map<const void*, int> unit_of;
  if (config.zero_optimization.stage == 3) {
    // Registrations per tensor, in the whole model and in each unit: a
    // tensor also registered outside its unit is used there too.
    std::unordered_map<const void*, int> registrations;
    for (const auto& p : module->named_parameters()) ++registrations[p.value().unsafeGetTensorImpl()];
    std::vector<std::unordered_map<const void*, int>> held;
    for (const auto& m : module->modules(/*include_self=*/true)) {
      auto* unit = dynamic_cast<UnitBase*>(m.get());
      if (!unit) continue;
      units.push_back(unit);
      held.emplace_back();
      for (const auto& p : unit->named_parameters()) ++held.back()[p.value().unsafeGetTensorImpl()];
    }
    auto nests = [&](int a, int b) {  // unit b inside unit a
      for (const auto& p : held[b]) {
        if (!held[a].count(p.first)) return false;
      }
      return true;
    };
    for (const auto& item : names) {
      int best = -1;
      bool shared = false;
      for (int u = 0; u < static_cast<int>(units.size()); ++u) {
        if (!held[u].count(item.first)) continue;
        if (best < 0 || nests(best, u)) {
          best = u;
        } else if (!nests(u, best)) {
          shared = true;
        }
      }
      if (best >= 0 && !shared && held[best][item.first] == registrations[item.first]) unit_of[item.first] = best;
    }
    if (units.empty()) {
      log::warn("stage3", "the model has no zero::Unit: its parameters stay gathered, so stage 3 saves no "
                          "parameter memory; wrap its blocks in zero::Unit (see include/zero/unit.h)");
    }
  }

  std::vector<partition::ShardedParams::Group> groups;
  std::vector<double> decays;
  std::set<const void*> grouped;
  for (size_t g = 0; g < options.param_groups.size(); ++g) {
    partition::ShardedParams::Group group;
    for (const auto& p : options.param_groups[g].params) {
      auto it = names.find(p.unsafeGetTensorImpl());
      if (it == names.end()) throw EngineError("parameter group " + std::to_string(g) + " holds a tensor that is not a parameter of the model");
      if (!p.requires_grad()) continue;  // frozen: left alone
      if (!grouped.insert(p.unsafeGetTensorImpl()).second) {
        throw EngineError("parameter " + it->second + " appears in more than one parameter group");
      }
      group.names.push_back(it->second);
      group.params.push_back(p);
      auto unit = unit_of.find(p.unsafeGetTensorImpl());
      group.units.push_back(unit == unit_of.end() ? -1 : unit->second);
    }
    groups.push_back(std::move(group));
    decays.push_back(options.param_groups[g].weight_decay.value_or(config.optimizer.params.weight_decay));
  }
  for (const auto& p : trainable) {
    if (!grouped.count(p.unsafeGetTensorImpl())) {
      throw EngineError("parameter " + names[p.unsafeGetTensorImpl()] +
                        " requires grad but is in no parameter group; add it to one or set requires_grad(false)");
    }
  }

  // Every rank starts from rank 0's weights and buffers, as DeepSpeed does.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : module->parameters()) pg->broadcast(p.data(), 0);
    for (auto& b : module->buffers()) pg->broadcast(b, 0);
  }

  partition::Options popts;
  popts.stage = config.zero_optimization.stage;
  popts.bucket_numel = config.zero_optimization.reduce_bucket_size;
  popts.dtype = dtype;
  popts.overlap_comm = config.zero_optimization.overlap_comm;
  popts.persistence_threshold = config.zero_optimization.stage3_param_persistence_threshold;
  popts.prefetch_numel = config.zero_optimization.stage3_prefetch_bucket_size;
  popts.max_live_numel = config.zero_optimization.stage3_max_live_parameters;
  const auto& offload = config.zero_optimization.offload_optimizer;
  popts.offload_optimizer = offload.device == "cpu" || offload.device == "nvme";
  popts.offload_ratio = offload.ratio;
  popts.host_grad_copies = env::offload_host_grad_copies();  // for tests (Note [Offload copies])
  popts.offload_master_to_disk = offload.device == "nvme";
  popts.pin_memory = offload.pin_memory;
  const auto& offload_param = config.zero_optimization.offload_param;
  popts.offload_param = offload_param.device;
  if (offload_param.device == "nvme") {
    popts.param_swap.nvme_path = offload_param.nvme_path;
    popts.param_swap.rank = pg->rank();
    popts.param_swap.block_size = config.aio.block_size;
    popts.param_swap.queue_depth = config.aio.queue_depth;
    popts.param_swap.buffer_count = offload_param.buffer_count;
  }
  popts.pin_memory = popts.pin_memory || offload_param.pin_memory;
  sharded = std::make_unique<partition::ShardedParams>(std::move(groups), pg, popts);
  if (!units.empty()) sharded->attach_units(units);

  if (dtype != at::kFloat) {  // frozen weights and buffers follow the training dtype
    torch::NoGradGuard no_grad;
    for (auto& p : module->parameters()) {
      if (!p.requires_grad() && at::isFloatingType(p.scalar_type())) p.set_data(p.to(dtype));
    }
    for (auto& b : module->buffers()) {
      if (at::isFloatingType(b.scalar_type())) b.set_data(b.to(dtype));
    }
  }

  std::vector<engine::OptimizerGroup> opt_groups;
  for (size_t g = 0; g < sharded->master().size(); ++g) opt_groups.push_back({sharded->master()[g], decays[g]});
  engine::ShardLayout layout;
  for (const auto& pieces : sharded->master_pieces()) {
    layout.pieces.emplace_back();
    for (const auto& piece : pieces) layout.pieces.back().push_back({piece.param, piece.start, piece.length});
  }
  layout.num_params = sharded->num_params();
  const bool shared = sharded->owners() > 1;
  auto group = pg;
  layout.all_reduce_sum = [group, shared](at::Tensor& t) {
    if (shared) group->all_reduce(t, comm::ReduceOp::Sum);
  };
  // The optimizer's tensors are master() group by group; each is one bucket.
  std::vector<size_t> bucket_of;
  for (size_t g = 0; g < sharded->master().size(); ++g) {
    for (size_t k = 0; k < sharded->num_buckets(); ++k) {
      if (sharded->layout().buckets()[k].group == static_cast<int>(g)) bucket_of.push_back(k);
    }
  }
  engine::HostStep host;
  host.enabled = popts.offload_optimizer;
  int64_t offloaded = 0;
  for (size_t k = 0; k < sharded->num_buckets(); ++k) {  // Note [Partial offload]
    if (!host.enabled) break;
    if (sharded->master_on_host(k)) {
      offloaded += sharded->layout().buckets()[k].shard_numel;
    } else {
      host.elsewhere.push_back(sharded->master_tensors()[k]);
    }
  }
  if (host.enabled && popts.offload_ratio < 1.0) {  // the split falls at bucket boundaries: say where
    std::ostringstream line;
    line.setf(std::ios::fixed);
    line.precision(1);
    line << "partial offload (ratio " << popts.offload_ratio << "): " << 100.0 * offloaded / std::max<int64_t>(sharded->partition_numel(), 1)
         << "% of this rank's partition is offloaded (" << offloaded << " of " << sharded->partition_numel()
         << " elements: whole buckets, and a smaller reduce_bucket_size splits finer, down to one parameter)";
    log::info("offload", line.str());
  }
  partition::ShardedParams* params = sharded.get();
  host.sink = {[params, bucket_of](size_t i) { return params->update_target(bucket_of[i]); },
               [params, bucket_of](size_t i) { params->updated(bucket_of[i]); }};
  optimizer = engine::make_optimizer(config.optimizer, opt_groups, layout, host);
  if (popts.offload_master_to_disk) {
    // ZeRO-Infinity: every offloaded master shard and its states go to
    // files under nvme_path (with partial offload, the others stay with the
    // parameters); the optimizer step brings them back sub-group by sub-group.
    engine::HostOptimizer* host_optimizer = optimizer->host();
    host_optimizer->make_states();
    offload::SwapOptions so;
    so.nvme_path = offload.nvme_path;
    so.rank = pg->rank();
    so.block_size = config.aio.block_size;
    so.queue_depth = config.aio.queue_depth;
    so.buffer_count = offload.buffer_count;
    nvme = std::make_unique<offload::SwappedTensors>(so);
    std::vector<std::vector<int>> ids;
    for (const auto& p : optimizer->tensors()) {
      const std::string key = "master" + std::to_string(ids.size());
      if (!sharded->master_on_host(bucket_of[ids.size()])) {
        ids.emplace_back();  // Note [Partial offload]: not swapped
        continue;
      }
      ids.push_back({nvme->add(p, key)});
      int state = 0;
      for (const auto& name : optimizer->state_names()) {
        ids.back().push_back(nvme->add(optimizer->state(p, name, false), key + ".state" + std::to_string(state++)));
      }
    }
    nvme->swap_out_all();
    nvme->reset_peak();  // initialize held everything once; from here on the pipeline bounds it
    host_optimizer->use_store(nvme.get(), std::move(ids), config.zero_optimization.sub_group_size);
  }
}

Engine::Engine(const Config& config, std::shared_ptr<torch::nn::Module> module, InitOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.config = config;
  s.module = std::move(module);
  if (!s.module) throw EngineError("zero::initialize got no model");
  s.pg = options.group ? options.group : join(config);
  if (!s.config.resolved() || s.config.world_size() != s.pg->size()) s.config.resolve(s.pg->size());
  for (const auto& w : s.config.warnings()) log::warn_once("config:" + w, "config", w);

  const auto& z = s.config.zero_optimization;
  s.dtype = training_dtype(s.config);
  s.gas = *s.config.batch.gradient_accumulation_steps;
  s.build_params(options);

  const auto& opt = s.config.optimizer;
  s.schedule = std::make_unique<LrSchedule>(LrSchedule::from_config(s.config.scheduler, opt));
  if (s.config.fp16.enabled) s.scaler = std::make_unique<LossScaler>(s.config.fp16);
  s.steps.lr = s.schedule->lr_at(0);

  log::info("engine", "stage " + std::to_string(z.stage) + ", " + c10::toString(s.dtype) + ", " +
                          std::to_string(s.pg->size()) + " rank(s), " + std::to_string(s.sharded->numel()) +
                          " trainable parameters in " + std::to_string(s.sharded->num_buckets()) +
                          " bucket(s); this rank holds " + memory_report().describe());
}

Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

bool Engine::is_gradient_accumulation_boundary() const { return (impl_->steps.micro_steps + 1) % impl_->gas == 0; }

void Engine::backward(const at::Tensor& loss) {
  Impl& s = *impl_;
  if (!loss.requires_grad()) throw EngineError("engine.backward: the loss does not require grad (was it computed under no_grad or eval?)");
  const auto start = Clock::now();
  s.t_forward += std::chrono::duration<double>(start - s.last_step_end).count();
  const double scale = s.scaler ? s.scaler->scale() : 1.0;
  at::Tensor detached = loss.detach().to(at::kFloat).reshape({});
  s.loss_sum = s.loss_sum.defined() ? s.loss_sum + detached : detached;
  ++s.loss_count;

  s.sharded->begin_backward(is_gradient_accumulation_boundary());
  try {
    (loss * (scale / static_cast<double>(s.gas))).backward();
  } catch (...) {
    s.sharded->end_backward();
    throw;
  }
  const auto reduce_start = Clock::now();
  s.sharded->end_backward();
  s.t_backward += std::chrono::duration<double>(reduce_start - start).count();
  s.t_reduce += seconds_since(reduce_start);
  s.last_step_end = Clock::now();
}

void Engine::step() {
  Impl& s = *impl_;
  ++s.steps.micro_steps;
  if (s.steps.micro_steps % s.gas != 0) return;
  const auto start = Clock::now();
  s.take_step();
  s.t_step += seconds_since(start);
  s.last_step_end = Clock::now();
  s.log_progress();
}

void Engine::Impl::take_step() {
  sharded->attach_master_grads();
  const double scale = scaler ? scaler->scale() : 1.0;
  // One sum of squares serves the overflow check and the global L2 norm
  // (Note [Gradient norm]); stage 0 holds the whole gradient on each rank.
  at::Tensor sq = torch::tensor({sharded->grad_squares()}, torch::kDouble);
  if (sharded->owners() > 1) pg->all_reduce(sq, comm::ReduceOp::Sum);
  if (scaler && !std::isfinite(sq.item<double>())) {  // overflow on any rank makes every rank skip the step
    scaler->update(true);  // logs the new scale; throws at min_loss_scale
    ++steps.skipped_steps;
    ++steps.global_steps;
    sharded->detach_master_grads();
    sharded->zero_grads();
    return;
  }
  last_norm = std::sqrt(sq.item<double>()) / scale;
  double factor = 1.0 / scale;
  const double clip = config.gradient_clipping;
  if (clip > 0) {
    const double coef = clip / (last_norm + 1e-6);  // as torch::nn::utils::clip_grad_norm_
    if (coef < 1.0) factor *= coef;
  }

  const int64_t taken = steps.scheduler_steps();  // optimizer steps the schedule has seen
  steps.lr = schedule->lr_at(taken);
  optimizer->set_hyperparameters(steps.lr, schedule->momentum_at(taken));
  optimizer->step(factor);  // a host optimizer starts each bucket's way to the parameters as it updates it
  sharded->detach_master_grads();
  const auto gather_start = Clock::now();
  sharded->publish();
  t_gather += seconds_since(gather_start);
  sharded->zero_grads();
  ++steps.global_steps;
  if (scaler) scaler->update(false);
}

void Engine::Impl::log_progress() {
  ++window_steps;
  const int64_t every = config.steps_per_print;
  if (every <= 0 || steps.global_steps % every != 0) return;
  at::Tensor mean = (loss_sum.defined() ? loss_sum / static_cast<double>(std::max<int64_t>(loss_count, 1))
                                        : torch::zeros({}))
                        .reshape({1})
                        .to(at::kCPU)
                        .to(at::kDouble);
  pg->all_reduce(mean, comm::ReduceOp::Avg);
  const double elapsed = seconds_since(window_start);
  const double samples = static_cast<double>(*config.batch.train_batch_size) * window_steps;
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(4);
  line << "step " << steps.global_steps << " loss " << mean.item<double>();
  line.precision(3);
  line << " lr " << std::scientific << steps.lr << std::fixed << " loss_scale " << (scaler ? scaler->scale() : 1.0)
       << " skipped " << steps.skipped_steps << " grad_norm " << last_norm;
  line.precision(1);
  line << " samples/s " << samples / elapsed;
  line.precision(3);
  line << " step_time " << elapsed / window_steps << "s | " << memory().describe();
  if (config.wall_clock_breakdown) {
    line.precision(1);
    const double per = 1000.0 / window_steps;
    line << " | ms/step forward " << t_forward * per << " backward " << t_backward * per << " reduce "
         << t_reduce * per << " step " << (t_step - t_gather) * per << " gather " << t_gather * per;
    if (auto* host = optimizer->host()) {
      const auto timing = host->take_timing();
      line << " (host step " << timing.compute_s * per << ", nvme wait " << timing.nvme_wait_s * per << ")";
    }
  }
  log::info("engine", line.str());
  loss_sum = at::Tensor();
  loss_count = 0;
  window_steps = 0;
  window_start = Clock::now();
  t_forward = t_backward = t_reduce = t_step = t_gather = 0;
}

void Engine::train(bool on) { impl_->module->train(on); }
double Engine::lr() const { return impl_->steps.lr; }
double Engine::loss_scale() const { return impl_->scaler ? impl_->scaler->scale() : 1.0; }
int64_t Engine::global_steps() const { return impl_->steps.global_steps; }
int64_t Engine::skipped_steps() const { return impl_->steps.skipped_steps; }
int64_t Engine::micro_steps() const { return impl_->steps.micro_steps; }
double Engine::last_grad_norm() const { return impl_->last_norm; }
torch::nn::Module& Engine::module() { return *impl_->module; }
std::shared_ptr<torch::nn::Module> Engine::module_ptr() { return impl_->module; }
comm::ProcessGroup& Engine::group() { return *impl_->pg; }
const Config& Engine::config() const { return impl_->config; }

MemoryReport Engine::Impl::memory() const {
  MemoryReport r;
  r.params = sharded->param_bytes() + frozen_bytes;
  r.gradients = sharded->grad_bytes();
  r.fp32_master = sharded->master_bytes();
  r.optimizer_states = optimizer->state_bytes();
  r.host_offloaded = sharded->offloaded_param_bytes(/*nvme=*/false);
  r.nvme_offloaded = sharded->offloaded_param_bytes(/*nvme=*/true);
  if (sharded->options().offload_optimizer) {
    // Of the master weights and states, those of the buckets on the host
    // (all of them unless partial, Note [Partial offload]). A host master is
    // always apart from the parameters, so master_bytes() counts it, fp32 too.
    r.offload_buffers = sharded->offload_buffer_bytes();
    r.host_offloaded += r.offload_buffers;
    if (nvme) {  // only the offloaded share is in the store
      r.nvme_offloaded += nvme->nvme_bytes();
      r.host_offloaded += nvme->resident_bytes();
      r.nvme_host_peak = nvme->peak_resident_bytes();
    } else {
      for (size_t k = 0; k < sharded->num_buckets(); ++k) {
        if (!sharded->master_on_host(k)) continue;
        const at::Tensor& m = sharded->master_tensors()[k];
        r.host_offloaded += m.nbytes();
        for (const auto& name : optimizer->state_names()) {
          const at::Tensor state = optimizer->state(m, name, false);
          if (state.defined()) r.host_offloaded += state.nbytes();
        }
      }
    }
  }
  for (const auto& b : module->buffers()) r.buffers += b.nbytes();
  return r;
}

MemoryReport Engine::memory_report() const { return impl_->memory(); }

StepTimes Engine::take_step_times() {
  Impl& s = *impl_;
  StepTimes t;
  t.steps = s.window_steps;
  t.forward = s.t_forward, t.backward = s.t_backward, t.reduce = s.t_reduce;
  t.step = s.t_step - s.t_gather, t.gather = s.t_gather;
  if (auto* host = s.optimizer->host()) {
    const auto timing = host->take_timing();
    t.host_step = timing.compute_s, t.nvme_wait = timing.nvme_wait_s;
  }
  s.window_steps = 0;
  s.window_start = Clock::now();
  s.t_forward = s.t_backward = s.t_reduce = s.t_step = s.t_gather = 0;
  return t;
}

engine::TrainingState Engine::Impl::training_state() {
  return {config, dtype, gas, *module, *pg, *sharded, *optimizer, nvme.get(), *schedule, scaler.get(), steps};
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag, const std::string& client_state) {
  engine::TrainingState state = impl_->training_state();
  engine::save_checkpoint(state, dir, tag, client_state);
}

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag, const LoadOptions& options) {
  engine::TrainingState state = impl_->training_state();
  return engine::load_checkpoint(state, dir, tag, options);
}

GatheredParameters Engine::gather_parameters(torch::nn::Module& module) {
  partition::ShardedParams* sharded = impl_->sharded.get();
  std::vector<int> buckets = sharded->gather_buckets_of(module.parameters());
  if (buckets.empty()) return GatheredParameters();
  return GatheredParameters([sharded, buckets] { sharded->release_buckets(buckets); });
}

std::vector<std::pair<std::string, at::Tensor>> Engine::gathered_state_dict() {
  auto scope = gather_parameters(*impl_->module);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : impl_->module->named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  for (const auto& b : impl_->module->named_buffers()) out.emplace_back(b.key(), b.value().detach().clone());
  return out;
}

Engine initialize(const Config& config, std::shared_ptr<torch::nn::Module> model, InitOptions options) {
  return Engine(config, std::move(model), std::move(options));
}

}  // namespace zero
