// The Engine's training core: DeepSpeed's training loop over ShardedParams
// (partition/). backward() and step(), or a pipeline's train_batch(), with
// gradient accumulation, the fp16 loss scale and clipping; the step itself
// is the partition's (Note [The step] in partition/step.cpp). Construction is in
// engine_build.cpp, what is measured in telemetry/ (what the ranks agree on
// for it in step_boundary.cpp), its checkpoint calls in engine_checkpoints.cpp.
#include "zero/engine.h"

#include <torch/torch.h>

#include <chrono>

#include <tbb/task_arena.h>
#include <xxhash.h>

#include "core/blas_kernels.h"
#include "core/heap.h"
#include "engine/engine_impl.h"
#include "engine/model_params.h"
#include "engine/rank_agreement.h"
#include "zero/error.h"
#include "zero/log.h"

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


}  // namespace

Engine::Engine(const Config& config, std::shared_ptr<torch::nn::Module> module, InitOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.config = config;
  s.module = std::move(module);
  if (!s.module) throw EngineError("zero::initialize got no model");
  s.client = engine::ClientOptimizer::take(s.config, options);  // fills the config's "optimizer"
  // A model partitioned as it was built (zero::Init) continues on the group it was built over.
  const std::shared_ptr<partition::ConstructionParts> parts = engine::construction_parts_of(*s.module);
  s.pg = options.mesh    ? options.mesh->world()
         : options.group ? options.group
         : parts         ? parts->group()
                         : engine::join(config);
  if (!s.config.resolved() || s.config.world_size() != s.pg->size()) s.config.resolve(s.pg->size());
  s.config.check_trainable();  // Note [One validator]: zero-config refuses what this refuses
  for (const auto& w : s.config.warnings()) log::warn_once("config:" + w, "config", w);
  const auto& sizes = s.config.parallelism;
  s.mesh = options.mesh ? options.mesh
                        : std::make_shared<Mesh>(s.pg, static_cast<int>(sizes.tensor_parallel()),
                                                 static_cast<int>(sizes.pipeline_parallel()),
                                                 static_cast<int>(sizes.sequence_parallel()));
  if (s.mesh->shape().tp != sizes.tensor_parallel() || s.mesh->shape().pp != sizes.pipeline_parallel() ||
      s.mesh->shape().sp != sizes.sequence_parallel()) {
    const bool sp = s.mesh->shape().sp > 1 || sizes.sequence_parallel() > 1;
    auto sp_text = [sp](int64_t n) { return sp ? " x sp " + std::to_string(n) : std::string(); };
    throw ConfigError("zero::initialize: the mesh the model was built on is tp " + std::to_string(s.mesh->shape().tp) +
                      " x pp " + std::to_string(s.mesh->shape().pp) + sp_text(s.mesh->shape().sp) +
                      " but the config asks for tp " + std::to_string(sizes.tensor_parallel()) + " x pp " +
                      std::to_string(sizes.pipeline_parallel()) + sp_text(sizes.sequence_parallel()) +
                      "; set tensor_parallel.autotp_size, pipeline.stages and sequence_parallel_size to the mesh's sizes");
  }
  if (s.mesh->shape().tp > 1 && tp::tensor_parallel_splits(*s.module).empty()) {
    // DeepSpeed's AutoTP: the config's size alone splits the model.
    const int split = tp::auto_tensor_parallel(*s.module, s.mesh->tp_group());
    log::info("tensor_parallel", "AutoTP split " + std::to_string(split) + " Linear module(s) over tp groups of " +
                                     std::to_string(s.mesh->shape().tp) + " rank(s)");
  }
  s.splits = tp::tensor_parallel_splits(*s.module);
  s.pipeline = engine::PipelineDriver::of(*s.module, *s.mesh);
  if (s.pipeline) s.written_elsewhere = s.pipeline->written_elsewhere(*s.module);

  const auto& z = s.config.zero_optimization;
  s.dtype = training_dtype(s.config);
  s.gas = *s.config.batch.gradient_accumulation_steps;
  s.build_params(options, parts);
  s.broadcast_buffers = options.broadcast_buffers;
  s.setup_activation_checkpointing();
  s.telemetry = std::make_unique<telemetry::Telemetry>(s.config, s.pg->rank(), *s.module, s.model_device, s.dtype,
                                                       s.pipeline && s.pipeline->has_links(), [&s] { return s.memory(); },
                                                       engine::open_monitors(s.config, *s.pg));
  s.boundary = std::make_unique<engine::StepBoundary>(s.pg, *s.telemetry);
  if (const int64_t k = s.config.checkpoint.in_memory_interval; k > 0) {
    s.memory_copies = std::make_unique<engine::MemoryCopies>(s.pg, k);  // a collective across nodes
  }

  const auto& opt = s.config.optimizer;
  s.schedule = std::make_unique<LrSchedule>(LrSchedule::from_config(s.config.scheduler, opt));
  if (s.config.fp16.enabled) s.scaler = std::make_unique<LossScaler>(s.config.fp16);
  s.steps.lr = s.next_lr();
  s.choose_updates_in_backward();

  const MeshShape& shape = s.mesh->shape();
  const std::string layout = shape.tp * shape.pp * shape.sp > 1
                                 ? " (tp " + std::to_string(shape.tp) + " x sp " + std::to_string(shape.sp) + " x dp " +
                                       std::to_string(shape.dp) + " x pp " + std::to_string(shape.pp) + ")"
                                 : "";
  log::info("engine", "stage " + std::to_string(z.stage) + ", " + c10::toString(s.dtype) + ", " +
                          std::to_string(s.pg->size()) + " rank(s)" + layout + ", " + std::to_string(s.sharded->numel()) +
                          " trainable parameters in " + std::to_string(s.sharded->num_buckets()) +
                          " bucket(s); this rank holds " + memory_report().describe() +
                          (s.optimizer->state_names().empty() ? "" : "; the optimizer's states come at its first step"));
  if (const std::string advice = heap::advice(); !advice.empty()) log::info("engine", advice);
  if (const std::string advice = blas::advice(); !advice.empty()) log::warn("engine", advice);
  s.telemetry->forward_starts(s.steps.global_steps, s.sharded->gathered_param_bytes());
}

Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

bool Engine::is_gradient_accumulation_boundary() const { return (impl_->steps.micro_steps + 1) % impl_->gas == 0; }

void Engine::Impl::check_stopped(const char* what) const {
  if (stopped.empty()) return;
  throw EngineError(std::string(what) + ": this engine stopped at " + stopped +
                    "; its parameters and optimizer states are partly updated: create a new engine "
                    "(zero::initialize) and load the last checkpoint into it");
}

void Engine::Impl::check_loaded(const char* what) const {
  check_stopped(what);
  if (partly_loaded.empty()) return;
  throw EngineError(std::string(what) + ": the parameters are partly loaded (" + partly_loaded +
                    "); load the weights or a checkpoint again before training or saving");
}

// Note [Call order]
// DeepSpeed's loop is backward(), step() per micro-step; step() counts the
// micro-step and updates at every gradient_accumulation_steps-th. A step()
// with no backward() before it would count a micro-step that has no
// gradients (and update on too few): it is refused by name, before anything
// changes. A second backward() before step() is DeepSpeed's way to add
// losses within one micro-step (e.g. two heads); it is kept, with one
// warning, since it is also what a loop that forgot step() does. Likewise the engine is one rank's side of
// collectives that must come in the same order on every rank: calls from a
// second thread would interleave them. The first thread that trains owns
// the engine; another thread's call is refused rather than left to fail
// later with an unrelated message.
void Engine::Impl::check_thread(const char* what, bool binds) {
  const std::thread::id me = std::this_thread::get_id();
  if (!training_thread) {
    if (!binds) return;
    training_thread = me;
  }
  if (*training_thread != me) {
    throw EngineError(std::string(what) + " was called from another thread than the one training with this engine; "
                      "the engine is not thread-safe: call backward, step and the checkpoint calls from one thread");
  }
}

void Engine::backward(const at::Tensor& loss) {
  Impl& s = *impl_;
  s.check_thread("engine.backward");
  s.check_loaded("engine.backward");
  if (s.pipeline && s.pipeline->has_links()) {
    throw EngineError("engine.backward: a pipeline of stages trains with engine.train_batch(next_batch)");
  }
  if (s.backward_pending) {
    log::warn_once("engine.backward twice", "engine",
                   "engine.backward was called again before engine.step(): the gradients add up within the same "
                   "micro-step, as in DeepSpeed, and count as one of the gradient_accumulation_steps; call "
                   "engine.step() after each backward to count each as a micro-step (warned once)");
  }
  if (!loss.requires_grad()) throw EngineError("engine.backward: the loss does not require grad (was it computed under no_grad or eval?)");
  if (s.sharded->step_in_progress()) {
    throw EngineError("engine.backward was called twice before engine.step() at an accumulation boundary with "
                      "super_offload: the first backward has already updated the parameters whose gradients it "
                      "completed (Note [Updates in backward]), so a second cannot add to them; call engine.step() "
                      "after each backward, or drop offload_optimizer.super_offload to sum losses this way");
  }
  s.telemetry->backward_starts(loss, s.sharded->gathered_param_bytes());
  const bool boundary = is_gradient_accumulation_boundary();
  s.sharded->begin_backward(boundary);
  auto failed = [&s] {
    s.sharded->end_backward();
    s.sharded->abandon_update_in_backward();
  };
  try {
    if (boundary && s.updates_in_backward && s.config.gradient_clipping == 0) {  // set_gradient_clipping may change it
      s.set_step_hyperparameters();
      auto arena = std::make_shared<tbb::task_arena>(std::max(1, at::get_num_threads()));
      s.sharded->update_in_backward(*s.optimizer, 1.0 / s.loss_scale(),
                                    [arena](const std::function<void()>& f) { arena->execute(f); });
    }
    (loss * (s.loss_scale() / static_cast<double>(s.gas))).backward();
  } catch (const c10::Error& e) {
    failed();
    throw EngineError("engine.backward: LibTorch raised: " + torch_message(e, s.dtype));
  } catch (...) {
    failed();
    throw;
  }
  const auto reduce_start = telemetry::Clock::now();
  s.sharded->end_backward();
  s.backward_pending = true;
  s.telemetry->backward_ends(reduce_start);
  // The next micro-step's forward; at the boundary it starts after the step.
  if (!boundary) s.telemetry->forward_starts(s.steps.global_steps, s.sharded->gathered_param_bytes());
}

void Engine::step() {
  Impl& s = *impl_;
  s.check_thread("engine.step");
  s.check_loaded("engine.step");
  if (s.pipeline && s.pipeline->has_links()) {
    throw EngineError("engine.step: a pipeline of stages trains with engine.train_batch(next_batch)");
  }
  if (!s.backward_pending) {
    throw EngineError("engine.step was called without an engine.backward(loss) before it (micro step " +
                      std::to_string(s.steps.micro_steps) + "): call backward on each micro-batch's loss, then step");
  }
  s.backward_pending = false;
  ++s.steps.micro_steps;
  if (s.steps.micro_steps % s.gas != 0) return;
  s.optimizer_step(std::nullopt);
}

// The ranks compare one XXH3-64 digest per buffer (an all-gather of 8
// bytes each) and broadcast only those that differ: a causal mask that no
// forward changes costs a hash, a BatchNorm's running statistics a
// broadcast. (Version counters would not do: LibTorch's batch_norm kernel
// writes running_mean without bumping its version.)
void Engine::Impl::sync_buffers() {
  if (!broadcast_buffers) return;
  comm::ProcessGroup& dp = *mesh->zero_group();
  if (dp.size() == 1) return;
  std::vector<at::Tensor> buffers = module->buffers();
  if (buffers.empty()) return;
  const int64_t n = static_cast<int64_t>(buffers.size());
  at::Tensor mine = torch::empty({n}, torch::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor host = buffers[static_cast<size_t>(i)].to(at::kCPU).contiguous();
    mine[i] = static_cast<int64_t>(XXH3_64bits(host.data_ptr(), host.nbytes()));
  }
  at::Tensor all = torch::empty({dp.size(), n}, torch::kLong);
  dp.all_gather(all, mine);
  const at::Tensor differs = (all != all[0]).any(0);
  torch::NoGradGuard no_grad;
  for (int64_t i = 0; i < n; ++i) {
    if (differs[i].item<bool>()) dp.broadcast(buffers[static_cast<size_t>(i)], 0);
  }
}

// The step's host kernels (offload/cpu_optimizer.h: sums of squares, the
// fused optimizer) run on oneTBB. They get the rank's intra-op threads, as
// torch's own kernels do (OMP_NUM_THREADS: cores / ranks under zero-run),
// not every core of the machine the ranks share.
void Engine::Impl::optimizer_step(std::optional<double> agreed_loss) {
  const auto start = telemetry::Clock::now();
  if (pipeline) pipeline->reduce_tied_grads(*sharded);
  const double lr = next_lr();
  set_step_hyperparameters();
  partition::StepRequest request;
  request.loss_scale = loss_scale();
  request.skip_if_not_finite = scaler != nullptr;
  request.clip = config.gradient_clipping;
  partition::StepResult result;
  tbb::task_arena rank_threads(std::max(1, at::get_num_threads()));
  try {
    rank_threads.execute([&] { result = sharded->step(*optimizer, request); });
  } catch (const OffloadError& e) {  // every rank raises it (Note [A failed transfer in the step])
    stopped = "optimizer step " + std::to_string(steps.global_steps + 1) + " (" + e.what() + ")";
    throw;
  }
  if (result.skipped) {  // fp16 overflow on some rank: every rank skipped it
    scaler->update(true);  // logs the new scale; throws at min_loss_scale
    ++steps.skipped_steps;
    ++steps.global_steps;
  } else {
    steps.lr = lr;
    last_norm = result.norm;
    ++steps.global_steps;
    if (scaler) scaler->update(false);
    if (client) client->stepped();  // its lr_scheduler, as DeepSpeed steps a client's
  }
  telemetry::StepRecord record;
  record.global_steps = steps.global_steps, record.skipped_steps = steps.skipped_steps;
  record.lr = steps.lr, record.loss_scale = loss_scale(), record.grad_norm = last_norm;
  record.step_s = telemetry::seconds_since(start), record.publish_s = result.publish_seconds;
  record.host_step_s = result.host_update_seconds, record.nvme_wait_s = result.nvme_wait_seconds;
  sync_buffers();
  telemetry->step_done(record);
  boundary->after_step(record, agreed_loss);
  if (memory_copies) memory_copies->after_step(*this);
  telemetry->forward_starts(steps.global_steps, sharded->gathered_param_bytes());
}

void Engine::Impl::set_step_hyperparameters() {
  const int64_t taken = steps.scheduler_steps();  // optimizer steps the schedule has seen
  if (!client || client->engine_schedules()) optimizer->set_hyperparameters(next_lr(), schedule->momentum_at(taken));
}

double Engine::train_batch(const std::function<Batch()>& next_batch) {
  Impl& s = *impl_;
  s.check_thread("engine.train_batch");
  s.check_loaded("engine.train_batch");
  if (!s.pipeline) {
    throw EngineError("engine.train_batch runs a zero::pipe::PipelineModule; for other models call "
                      "engine.backward(loss) and engine.step() per micro-batch");
  }
  const auto batch = s.pipeline->run(next_batch, /*train=*/true, s.gas, s.loss_scale(), *s.sharded, *s.mesh, *s.pg,
                                     s.model_device);
  s.telemetry->pipeline_batch_done(batch.times, batch.loss);
  s.steps.micro_steps += s.gas;
  s.optimizer_step(batch.loss);
  return batch.loss;
}

double Engine::eval_batch(const std::function<Batch()>& next_batch) {
  Impl& s = *impl_;
  if (!s.pipeline) throw EngineError("engine.eval_batch runs a zero::pipe::PipelineModule; call the model for others");
  const bool was_training = s.module->is_training();
  s.module->eval();
  double loss = 0;
  try {
    loss = s.pipeline->run(next_batch, /*train=*/false, s.gas, s.loss_scale(), *s.sharded, *s.mesh, *s.pg,
                           s.model_device).loss;
  } catch (...) {
    s.module->train(was_training);
    throw;
  }
  s.module->train(was_training);
  return loss;
}

int64_t Engine::pipeline_bytes_sent() const { return impl_->pipeline ? impl_->pipeline->bytes_sent() : 0; }

void Engine::train(bool on) { impl_->module->train(on); }
at::ScalarType Engine::dtype() const { return impl_->dtype; }

at::Tensor Engine::cast_tensor(const at::Tensor& t) const {
  const Impl& s = *impl_;
  if (s.config.fp16.enabled && s.config.fp16.auto_cast && t.defined() && at::isFloatingType(t.scalar_type())) {
    return t.to(at::kHalf);
  }
  return t;
}

void Engine::rethrow_forward_error(const c10::Error& e) const {
  const std::string text = e.what_without_backtrace();
  const at::ScalarType dtype = impl_->dtype;
  // "expected scalar type BFloat16 but found Float", "... must have the same dtype"
  const bool mismatch = text.find("scalar type") != std::string::npos || text.find("dtype") != std::string::npos;
  if (!mismatch || dtype == at::kFloat) return;
  const std::string name = c10::toString(dtype);
  throw EngineError(std::string("engine.forward: the model's weights are ") + name + " (" +
                    (dtype == at::kHalf ? "fp16" : "bf16") + ".enabled) and an input is not: cast floating-point inputs " +
                    "with x.to(engine.dtype())" + (dtype == at::kHalf ? ", or set fp16.auto_cast: true" : "") +
                    ". LibTorch said: " + text.substr(0, text.find('\n')));
}
double Engine::lr() const { return impl_->steps.lr; }
double Engine::get_lr() const { return impl_->next_lr(); }

double engine::TrainingParts::next_lr() const {
  if (client && !client->engine_schedules()) return client->lr();
  return schedule->lr_at(steps.scheduler_steps());
}
double Engine::loss_scale() const { return impl_->loss_scale(); }
int64_t Engine::global_steps() const { return impl_->steps.global_steps; }
int64_t Engine::skipped_steps() const { return impl_->steps.skipped_steps; }
int64_t Engine::micro_steps() const { return impl_->steps.micro_steps; }
int64_t Engine::train_batch_size() const { return *impl_->config.batch.train_batch_size; }
int64_t Engine::train_micro_batch_size_per_gpu() const { return *impl_->config.batch.train_micro_batch_size_per_gpu; }
int64_t Engine::gradient_accumulation_steps() const { return impl_->gas; }
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
MemoryReport Engine::memory_report() const { return impl_->memory(); }
StepTimes Engine::take_step_times() { return impl_->telemetry->take_step_times(impl_->sharded->gather_wait_seconds()); }

Engine initialize(const Config& config, std::shared_ptr<torch::nn::Module> model, InitOptions options) {
  return Engine(config, std::move(model), std::move(options));
}

}  // namespace zero
