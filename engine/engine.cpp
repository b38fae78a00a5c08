// The Engine's training core: DeepSpeed's training loop over ShardedParams
// (partition/). backward() and step(), or a pipeline's train_batch(), with
// gradient accumulation, the fp16 loss scale and clipping; the step itself
// is the partition's (Note [The step] in partition/step.cpp). Construction is in
// engine_build.cpp, what is measured in telemetry.cpp.
#include "zero/engine.h"

#include <torch/torch.h>

#include <chrono>
#include <filesystem>

#include <tbb/task_arena.h>

#include "ckpt/checkpoint.h"
#include "core/blas_kernels.h"
#include "core/heap.h"
#include "engine/engine_impl.h"
#include "engine/checkpoint_io.h"
#include "engine/engine_setup.h"
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
  // A model partitioned as it was built (zero::Init) continues on the group it was built over.
  const std::shared_ptr<partition::ConstructionParts> parts = engine::construction_parts_of(*s.module);
  s.pg = options.mesh    ? options.mesh->world()
         : options.group ? options.group
         : parts         ? parts->group()
                         : engine::join(config);
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
  s.pipeline = engine::PipelineDriver::of(*s.module, *s.mesh);

  const auto& z = s.config.zero_optimization;
  s.dtype = training_dtype(s.config);
  s.gas = *s.config.batch.gradient_accumulation_steps;
  s.build_params(options, parts);
  s.setup_activation_checkpointing();
  s.telemetry = std::make_unique<engine::Telemetry>(s.config, s.pg, *s.module, s.model_device, s.dtype,
                                                    s.pipeline && s.pipeline->has_links(), [&s] { return s.memory(); });

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
  s.telemetry->forward_starts(s.steps.global_steps);
}

Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

bool Engine::is_gradient_accumulation_boundary() const { return (impl_->steps.micro_steps + 1) % impl_->gas == 0; }

void Engine::Impl::check_loaded(const char* what) const {
  if (partly_loaded.empty()) return;
  throw EngineError(std::string(what) + ": the parameters are partly loaded (" + partly_loaded +
                    "); load the weights or a checkpoint again before training or saving");
}

void Engine::backward(const at::Tensor& loss) {
  Impl& s = *impl_;
  s.check_loaded("engine.backward");
  if (s.pipeline && s.pipeline->has_links()) {
    throw EngineError("engine.backward: a pipeline of stages trains with engine.train_batch(next_batch)");
  }
  if (!loss.requires_grad()) throw EngineError("engine.backward: the loss does not require grad (was it computed under no_grad or eval?)");
  s.telemetry->backward_starts(loss);
  const bool boundary = is_gradient_accumulation_boundary();
  s.sharded->begin_backward(boundary);
  try {
    (loss * (s.loss_scale() / static_cast<double>(s.gas))).backward();
  } catch (const c10::Error& e) {
    s.sharded->end_backward();
    throw EngineError("engine.backward: LibTorch raised: " + torch_message(e, s.dtype));
  } catch (...) {
    s.sharded->end_backward();
    throw;
  }
  const auto reduce_start = engine::Clock::now();
  s.sharded->end_backward();
  s.telemetry->backward_ends(reduce_start);
  if (!boundary) s.telemetry->forward_starts(s.steps.global_steps);  // the next micro-step's; at the boundary after the step
}

void Engine::step() {
  Impl& s = *impl_;
  s.check_loaded("engine.step");
  if (s.pipeline && s.pipeline->has_links()) {
    throw EngineError("engine.step: a pipeline of stages trains with engine.train_batch(next_batch)");
  }
  ++s.steps.micro_steps;
  if (s.steps.micro_steps % s.gas != 0) return;
  s.optimizer_step(std::nullopt);
}

// The step's host kernels (offload/cpu_optimizer.h: sums of squares, the
// fused optimizer) run on oneTBB. They get the rank's intra-op threads, as
// torch's own kernels do (OMP_NUM_THREADS: cores / ranks under zero-run),
// not every core of the machine the ranks share.
void Engine::Impl::optimizer_step(std::optional<double> agreed_loss) {
  const auto start = engine::Clock::now();
  if (pipeline) pipeline->reduce_tied_grads(*sharded);
  const int64_t taken = steps.scheduler_steps();  // optimizer steps the schedule has seen
  const double lr = schedule->lr_at(taken);
  optimizer->set_hyperparameters(lr, schedule->momentum_at(taken));
  partition::StepRequest request;
  request.loss_scale = loss_scale();
  request.skip_if_not_finite = scaler != nullptr;
  request.clip = config.gradient_clipping;
  partition::StepResult result;
  tbb::task_arena rank_threads(std::max(1, at::get_num_threads()));
  rank_threads.execute([&] { result = sharded->step(*optimizer, request); });
  if (result.skipped) {  // fp16 overflow on some rank: every rank skipped it
    scaler->update(true);  // logs the new scale; throws at min_loss_scale
    ++steps.skipped_steps;
    ++steps.global_steps;
  } else {
    steps.lr = lr;
    last_norm = result.norm;
    ++steps.global_steps;
    if (scaler) scaler->update(false);
  }
  engine::StepRecord record;
  record.global_steps = steps.global_steps, record.skipped_steps = steps.skipped_steps;
  record.lr = steps.lr, record.loss_scale = loss_scale(), record.grad_norm = last_norm;
  record.step_s = engine::seconds_since(start), record.publish_s = result.publish_seconds;
  record.host = optimizer->take_timing();
  telemetry->step_done(record, agreed_loss);
}

double Engine::train_batch(const std::function<Batch()>& next_batch) {
  Impl& s = *impl_;
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
double Engine::lr() const { return impl_->steps.lr; }
double Engine::loss_scale() const { return impl_->loss_scale(); }
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
MemoryReport Engine::memory_report() const { return impl_->memory(); }
StepTimes Engine::take_step_times() { return impl_->telemetry->take_step_times(impl_->sharded->gather_wait_seconds()); }

void Engine::save_checkpoint(const std::string& dir, const std::string& tag, const std::string& client_state) {
  impl_->check_loaded("engine.save_checkpoint");
  impl_->telemetry->flush();  // the curves reach at least the checkpoint
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

void Engine::save_16bit_model(const std::string& dir, const std::string& filename) {
  const auto shape = impl_->mesh->shape();
  if (shape.tp > 1 || shape.pp > 1) {
    throw EngineError("save_16bit_model: with tp " + std::to_string(shape.tp) + " x pp " + std::to_string(shape.pp) +
                      " no rank holds the whole model; save_checkpoint, then write one file with zero-ckpt export --to hf");
  }
  const auto state = gathered_state_dict();  // a collective
  std::string error;
  if (impl_->pg->rank() == 0) {
    try {
      std::filesystem::create_directories(dir);
      std::vector<ckpt::TensorData> tensors;
      std::vector<at::Tensor> kept;
      for (const auto& [name, t] : state) {
        kept.push_back(t.contiguous().cpu());
        ckpt::TensorData d;
        d.name = name;
        d.dtype = engine::to_ckpt(kept.back().scalar_type());
        d.shape = kept.back().sizes().vec();
        d.data = kept.back().data_ptr();
        d.bytes = kept.back().nbytes();
        tensors.push_back(d);
      }
      ckpt::write_safetensors((std::filesystem::path(dir) / filename).string(), tensors, {{"format", "pt"}});
    } catch (const std::exception& e) {
      error = std::string("save_16bit_model: ") + e.what();
    }
  }
  error = comm::agreed_error(*impl_->pg, error, "save_16bit_model");
  if (!error.empty()) throw CheckpointError(error);
}

Engine initialize(const Config& config, std::shared_ptr<torch::nn::Module> model, InitOptions options) {
  return Engine(config, std::move(model), std::move(options));
}

}  // namespace zero
