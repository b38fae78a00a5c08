// The Engine: DeepSpeed's training loop over ShardedParams (zero/).
#include "zero/engine.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <tbb/task_arena.h>

#include "activations/activation_memory.h"
#include "activations/estimate.h"
#include "core/blas_kernels.h"
#include "core/env.h"
#include "core/fault.h"
#include "core/heap.h"
#include "engine/engine_impl.h"
#include "engine/engine_setup.h"
#include "engine/host_optimizer.h"
#include "engine/optimizer.h"
#include "zero/activation_checkpointing.h"
#include "zero/error.h"
#include "zero/log.h"
#include "zero/internal/partition.h"
#include "zero/tensor_parallel.h"

namespace zero {
namespace {

at::ScalarType training_dtype(const Config& c) {
  if (c.fp16.enabled) return at::kHalf;
  if (c.bf16.enabled) return at::kBFloat16;
  return at::kFloat;
}

// A LibTorch error raised in backward, as one line (no C++ frames), with
// what to do when it is an fp16 kernel the CPU lacks.
std::string torch_message(const c10::Error& e, at::ScalarType dtype) {
  std::string text = e.what_without_backtrace();
  for (char& c : text) c = c == '\n' ? ' ' : c;
  if (dtype == at::kHalf && text.find("'Half'") != std::string::npos) {
    text += " (LibTorch's CPU kernels lack some fp16 ops: train in bf16 on CPU ranks, \"bf16\": {\"enabled\": true}, "
            "and in fp16 on a GPU)";
  }
  return text;
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
  if (activations_peak > 0) out << "; activations (measured peak) " << human_bytes(activations_peak);
  return out.str();
}

void Engine::Impl::build_params(InitOptions& options) {
  engine::ModelParams model_params = engine::model_params(*module, std::move(options.param_groups), config, dtype);
  frozen_bytes = model_params.frozen_bytes;
  units = model_params.units;
  // A pipeline's tied parameters count once over the stages holding them,
  // each in a group (so a bucket) of its own (find_tied_buckets).
  std::map<std::string, int> copies;
  if (pipeline) {
    for (const auto& tie : pipeline->shared_ties()) {
      for (const auto& name : tie.names) copies[name] = tie.group->size();
    }
    engine::isolate_params(model_params, copies);
  }
  engine::set_norm_weights(model_params, *module, splits, mesh->shape(), config.zero_optimization.stage, copies);
  const auto& dp = mesh->dp_group();
  // Before the first collective that assumes it: every rank holds the same
  // config and model, or every rank stops naming what differs (tp slices
  // have equal shapes; pipeline stages hold different layers, so the model
  // is compared over the data-parallel group there).
  std::string differs;
  if (mesh->shape().pp > 1) {
    differs = comm::disagreement(*pg, engine::config_facts(config));
    if (differs.empty()) differs = comm::disagreement(*dp, engine::model_facts(*module, model_params));
  } else {
    comm::Facts facts = engine::config_facts(config);
    for (auto& f : engine::model_facts(*module, model_params)) facts.push_back(std::move(f));
    differs = comm::disagreement(*pg, facts);
  }
  if (!differs.empty()) {
    throw EngineError("zero::initialize: " + differs +
                      "; every rank must start with the same config and the same model");
  }
  // Every rank starts from the weights and buffers of its data-parallel
  // group's rank 0, as DeepSpeed does (tp ranks hold different slices).
  {
    torch::NoGradGuard no_grad;
    for (auto& p : module->parameters()) dp->broadcast(p.data(), 0);
    for (auto& b : module->buffers()) dp->broadcast(b, 0);
  }
  bool params_on_host = true;
  for (const auto& g : model_params.groups) {
    for (const auto& p : g.params) params_on_host = params_on_host && p.is_cpu();
  }
  sharded = std::make_unique<partition::ShardedParams>(
      std::move(model_params.groups), dp, engine::partition_options(config, dtype, pg->rank(), params_on_host));
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
  auto parts = engine::master_optimizer(config, *sharded, model_params.weight_decays, dp, pg->rank());
  optimizer = std::move(parts.optimizer);
  nvme = std::move(parts.nvme);
  find_tied_buckets();
}

Engine::Engine(const Config& config, std::shared_ptr<torch::nn::Module> module, InitOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.config = config;
  s.module = std::move(module);
  if (!s.module) throw EngineError("zero::initialize got no model");
  s.pg = options.mesh ? options.mesh->world() : options.group ? options.group : join(config);
  if (!s.config.resolved() || s.config.world_size() != s.pg->size()) s.config.resolve(s.pg->size());
  for (const auto& w : s.config.warnings()) log::warn_once("config:" + w, "config", w);
  const auto& sizes = s.config.parallelism;
  s.mesh = options.mesh ? options.mesh
                        : std::make_shared<Mesh>(s.pg, static_cast<int>(sizes.tensor_parallel()),
                                                 static_cast<int>(sizes.pipeline_parallel()));
  if (s.mesh->shape().tp != sizes.tensor_parallel() || s.mesh->shape().pp != sizes.pipeline_parallel()) {
    throw ConfigError("zero::initialize: the mesh the model was built on is tp " + std::to_string(s.mesh->shape().tp) +
                      " x pp " + std::to_string(s.mesh->shape().pp) + " but the config asks for tp " +
                      std::to_string(sizes.tensor_parallel()) + " x pp " + std::to_string(sizes.pipeline_parallel()) +
                      "; set tensor_parallel.autotp_size and pipeline.stages to the mesh's sizes");
  }
  if (s.mesh->shape().tp > 1 && tp::tensor_parallel_splits(*s.module).empty()) {
    // DeepSpeed's AutoTP: the config's size alone splits the model.
    const int split = tp::auto_tensor_parallel(*s.module, s.mesh->tp_group());
    log::info("tensor_parallel", "AutoTP split " + std::to_string(split) + " Linear module(s) over tp groups of " +
                                     std::to_string(s.mesh->shape().tp) + " rank(s)");
  }
  s.splits = tp::tensor_parallel_splits(*s.module);
  s.setup_pipeline();

  const auto& z = s.config.zero_optimization;
  s.dtype = training_dtype(s.config);
  s.gas = *s.config.batch.gradient_accumulation_steps;
  s.build_params(options);
  s.setup_activation_checkpointing();
  s.setup_monitors();

  const auto& opt = s.config.optimizer;
  s.schedule = std::make_unique<LrSchedule>(LrSchedule::from_config(s.config.scheduler, opt));
  if (s.config.fp16.enabled) s.scaler = std::make_unique<LossScaler>(s.config.fp16);
  s.steps.lr = s.schedule->lr_at(0);

  const MeshShape& shape = s.mesh->shape();
  const std::string layout = shape.tp * shape.pp > 1 ? " (tp " + std::to_string(shape.tp) + " x dp " +
                                                            std::to_string(shape.dp) + " x pp " +
                                                            std::to_string(shape.pp) + ")"
                                                      : "";
  log::info("engine", "stage " + std::to_string(z.stage) + ", " + c10::toString(s.dtype) + ", " +
                          std::to_string(s.pg->size()) + " rank(s)" + layout + ", " + std::to_string(s.sharded->numel()) +
                          " trainable parameters in " + std::to_string(s.sharded->num_buckets()) +
                          " bucket(s); this rank holds " + memory_report().describe());
  if (const std::string advice = heap::advice(); !advice.empty()) log::info("engine", advice);
  if (const std::string advice = blas::advice(); !advice.empty()) log::warn("engine", advice);
  s.forward_starts();
}

// The config's activation_checkpointing section: the process-wide settings
// of zero::checkpoint, and which of the model's units recompute.
void Engine::Impl::setup_activation_checkpointing() {
  for (const auto& p : module->parameters()) {
    model_device = p.device();
    break;
  }
  const auto& a = config.activation_checkpointing;
  ActivationCheckpointOptions options;
  options.cpu_checkpointing = a.cpu_checkpointing;
  options.synchronize_boundary = a.synchronize_checkpoint_boundary;
  options.profile = a.profile;
  options.contiguous_memory = a.contiguous_memory_optimization;
  const std::shared_ptr<comm::ProcessGroup>& tp = mesh->tp_group();
  if (a.partition_activations && tp->size() > 1) {
    auto partition = std::make_shared<ActivationPartition>();
    partition->rank = tp->rank();
    partition->size = tp->size();
    partition->all_gather = [tp](at::Tensor full, const at::Tensor& shard) { tp->all_gather(full, shard); };
    options.partition = partition;
    log::info("activations", "activation_checkpointing.partition_activations: each of the " +
                                 std::to_string(tp->size()) + " tensor-parallel ranks keeps 1/" +
                                 std::to_string(tp->size()) + " of the checkpoints' inputs and gathers them back to recompute");
  } else if (a.partition_activations) {
    log::info("activations", "activation_checkpointing.partition_activations: there is no tensor-parallel group to "
                             "split the saved inputs over, so they stay whole on each rank");
  }
  configure_activation_checkpointing(options);
  const std::vector<UnitBase*> all = engine::units_of(*module);
  const int64_t n = static_cast<int64_t>(all.size());
  const bool chosen = a.checkpoint_every || a.number_checkpoints;
  if (chosen && n == 0) {
    log::warn("activations", "activation_checkpointing selects units, but the model has no zero::Unit; wrap its blocks "
                             "in zero::Unit or call zero::checkpoint in its forward (include/zero/activation_checkpointing.h)");
  }
  int64_t on = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (chosen) {
      all[i]->set_config_checkpointing(
          checkpointed_unit(i, n, a.checkpoint_every.value_or(0), a.number_checkpoints.value_or(0)));
    }
    on += all[i]->checkpoints_activations() ? 1 : 0;
  }
  if (on > 0) {
    log::info("activations", std::to_string(on) + " of " + std::to_string(n) +
                                 " unit(s) recompute their activations in backward" +
                                 (a.cpu_checkpointing ? "; their inputs wait in host memory" : ""));
  }
}

void Engine::Impl::forward_starts() {
  allocated_at_forward = activations::allocated_bytes(model_device);
  if (flops_profiler) profile_forward_starts();
}

Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

bool Engine::is_gradient_accumulation_boundary() const { return (impl_->steps.micro_steps + 1) % impl_->gas == 0; }

void Engine::backward(const at::Tensor& loss) {
  Impl& s = *impl_;
  if (s.links) throw EngineError("engine.backward: a pipeline of stages trains with engine.train_batch(next_batch)");
  if (!loss.requires_grad()) throw EngineError("engine.backward: the loss does not require grad (was it computed under no_grad or eval?)");
  const auto start = Clock::now();
  s.t_forward += std::chrono::duration<double>(start - s.last_step_end).count();
  if (s.profiling) s.flops_profiler->pause();  // forward only
  if (const int64_t now = activations::allocated_bytes(s.model_device); now >= 0 && s.allocated_at_forward >= 0) {
    s.activations_peak = std::max(s.activations_peak, now - s.allocated_at_forward);
  }
  const double scale = s.scaler ? s.scaler->scale() : 1.0;
  at::Tensor detached = loss.detach().to(at::kFloat).reshape({});
  s.loss_sum = s.loss_sum.defined() ? s.loss_sum + detached : detached;
  ++s.loss_count;
  if (s.monitoring()) {
    s.step_loss_sum = s.step_loss_sum.defined() ? s.step_loss_sum + detached : detached;
    ++s.step_loss_count;
  }

  const bool boundary = is_gradient_accumulation_boundary();
  s.sharded->begin_backward(boundary);
  try {
    (loss * (scale / static_cast<double>(s.gas))).backward();
  } catch (const c10::Error& e) {
    s.sharded->end_backward();
    throw EngineError("engine.backward: LibTorch raised: " + torch_message(e, s.dtype));
  } catch (...) {
    s.sharded->end_backward();
    throw;
  }
  const auto reduce_start = Clock::now();
  s.sharded->end_backward();
  s.t_backward += std::chrono::duration<double>(reduce_start - start).count();
  s.t_reduce += seconds_since(reduce_start);
  if (!boundary) s.forward_starts();  // the next micro-step's; at the boundary step() reads it after its update
  s.last_step_end = Clock::now();
}

void Engine::step() {
  Impl& s = *impl_;
  if (s.links) throw EngineError("engine.step: a pipeline of stages trains with engine.train_batch(next_batch)");
  ++s.steps.micro_steps;
  if (s.steps.micro_steps % s.gas != 0) return;
  const auto start = Clock::now();
  s.take_step();
  s.t_step += seconds_since(start);
  s.finish_profile();
  s.record_step();
  s.log_progress();
  s.forward_starts();
  s.last_step_end = Clock::now();
}

void Engine::Impl::take_step() {
  // The step's host kernels (offload/cpu_optimizer.h: sums of squares, the
  // fused optimizer) run on oneTBB. They get the rank's intra-op threads, as
  // torch's own kernels do (OMP_NUM_THREADS: cores / ranks under zero-run),
  // not every core of the machine the ranks share.
  tbb::task_arena rank_threads(std::max(1, at::get_num_threads()));
  rank_threads.execute([this] { step_on_rank_threads(); });
}

void Engine::Impl::step_on_rank_threads() {
  reduce_tied_grads();
  sharded->attach_master_grads();
  const double scale = scaler ? scaler->scale() : 1.0;
  // One sum of squares serves the overflow check and the global L2 norm
  // (Note [Gradient norm]); stage 0 holds the whole gradient on each rank.
  at::Tensor sq = torch::tensor({sharded->grad_squares()}, torch::kDouble);
  if (engine::norm_needs_world(mesh->shape(), sharded->owners())) pg->all_reduce(sq, comm::ReduceOp::Sum);
  fault::reached("step.reduced", pg->rank());
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
  sharded->masters().publish();
  t_gather += seconds_since(gather_start);
  sharded->zero_grads();
  ++steps.global_steps;
  if (scaler) scaler->update(false);
}

void Engine::train(bool on) { impl_->module->train(on); }
double Engine::lr() const { return impl_->steps.lr; }
double Engine::loss_scale() const { return impl_->scaler ? impl_->scaler->scale() : 1.0; }
int64_t Engine::global_steps() const { return impl_->steps.global_steps; }
int64_t Engine::skipped_steps() const { return impl_->steps.skipped_steps; }
int64_t Engine::micro_steps() const { return impl_->steps.micro_steps; }
double Engine::last_grad_norm() const { return impl_->last_norm; }
void Engine::set_gradient_clipping(double max_norm) {
  if (!(max_norm >= 0)) throw EngineError("set_gradient_clipping: max_norm must be >= 0, got " + std::to_string(max_norm));
  impl_->config.gradient_clipping = max_norm;
}
torch::nn::Module& Engine::module() { return *impl_->module; }
std::shared_ptr<torch::nn::Module> Engine::module_ptr() { return impl_->module; }
comm::ProcessGroup& Engine::group() { return *impl_->pg; }
const Mesh& Engine::mesh() const { return *impl_->mesh; }
const Config& Engine::config() const { return impl_->config; }

MemoryReport Engine::Impl::memory() const {
  MemoryReport r;
  r.params = sharded->param_bytes() + frozen_bytes;
  r.gradients = sharded->grad_bytes();
  r.fp32_master = sharded->masters().bytes();
  r.optimizer_states = optimizer->state_bytes();
  r.host_offloaded = sharded->offloaded_param_bytes(/*nvme=*/false);
  r.nvme_offloaded = sharded->offloaded_param_bytes(/*nvme=*/true);
  r.gathered_params_peak = sharded->gathered_param_peak();
  r.activations_peak = activations_peak;
  if (sharded->options().offload_optimizer) {
    // Of the master weights and states, those of the buckets on the host
    // (all of them unless partial, Note [Partial offload]). A host master is
    // always apart from the parameters, so masters().bytes() counts it, fp32 too.
    r.offload_buffers = sharded->offload_buffer_bytes();
    r.host_offloaded += r.offload_buffers;
    if (nvme) {  // only the offloaded share is in the store
      r.nvme_offloaded += nvme->nvme_bytes();
      r.host_offloaded += nvme->resident_bytes();
      r.nvme_host_peak = nvme->peak_resident_bytes();
    } else {
      for (size_t k = 0; k < sharded->num_buckets(); ++k) {
        if (!sharded->masters().on_host(k)) continue;
        const at::Tensor& m = sharded->masters().tensors()[k];
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
  t.pipeline_wait = s.t_pipeline_wait;
  t.gather_wait = s.sharded->gather_wait_seconds() - s.gather_wait_at_window;
  s.gather_wait_at_window = s.sharded->gather_wait_seconds();
  if (auto* host = s.optimizer->host()) {
    const auto timing = host->take_timing();
    t.host_step = timing.compute_s, t.nvme_wait = timing.nvme_wait_s;
  }
  s.window_steps = 0;
  s.window_start = Clock::now();
  s.t_forward = s.t_backward = s.t_reduce = s.t_step = s.t_gather = s.t_pipeline_wait = 0;
  s.after_progress_log();
  return t;
}

engine::TrainingState Engine::Impl::training_state() {
  engine::TrainingState state{config,   dtype,      gas,        *module,   *pg,          *mesh, splits,
                              *sharded, *optimizer, nvme.get(), *schedule, scaler.get(), steps};
  if (pipeline) {
    for (const auto& tie : pipeline->shared_ties()) {
      if (tie.group->rank() == 0) continue;  // the first stage holding it writes it
      const std::string prefix = "tied_" + tie.key + ".";
      for (const auto& p : module->named_parameters()) {
        if (p.key().rfind(prefix, 0) == 0) state.written_elsewhere.insert(p.key());
      }
      for (const auto& b : module->named_buffers()) {
        if (b.key().rfind(prefix, 0) == 0) state.written_elsewhere.insert(b.key());
      }
    }
  }
  return state;
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag, const std::string& client_state) {
  impl_->flush_monitors();  // the curves reach at least the checkpoint
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
