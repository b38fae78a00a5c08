// zero::Accelerator (zero/accelerate.h): the launch config and a ds_config
// merged into one Config, the engine built from it, the data loaders'
// shards, and save_state / load_state on the engine's sharded checkpoints.
// One concept over 400 lines: the Accelerator's whole life (its config, its
// engine, its loaders and its saved state), which share one merged Config.
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/env.h"
#include "data/data_loader.h"
#include "zero/accelerate.h"
#include "zero/error.h"
#include "zero/log.h"
#include "zero/launch_info.h"

namespace zero {
namespace {

using Json = nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// What a ds_config file itself says about precision and accumulation
// (Config cannot tell a value given from a default).
struct DsFileSettings {
  std::optional<std::string> precision;  // set when fp16 or bf16 is enabled: true
  std::optional<int64_t> gradient_accumulation_steps;
  bool has_optimizer = false;
  bool has_scheduler = false;
};

DsFileSettings read_ds_file_settings(const std::string& path) {
  DsFileSettings s;
  Json root = Json::parse(read_text(path), nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (!root.is_object()) return s;  // Config::from_file already said what is wrong
  auto enabled = [&](const char* section) {
    auto it = root.find(section);
    if (it == root.end() || !it->is_object()) return false;
    auto e = it->find("enabled");
    return e != it->end() && e->is_boolean() && e->get<bool>();
  };
  if (enabled("fp16")) s.precision = "fp16";
  if (enabled("bf16") || enabled("bfloat16")) s.precision = "bf16";
  auto gas = root.find("gradient_accumulation_steps");
  if (gas != root.end() && gas->is_number_integer()) s.gradient_accumulation_steps = gas->get<int64_t>();
  s.has_optimizer = root.contains("optimizer") && !root["optimizer"].is_null();
  s.has_scheduler = root.contains("scheduler") && !root["scheduler"].is_null();
  return s;
}

std::string to_hex(const at::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  const auto* p = bytes.data_ptr<uint8_t>();
  std::string out;
  out.reserve(static_cast<size_t>(bytes.numel()) * 2);
  for (int64_t i = 0; i < bytes.numel(); ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

at::Tensor from_hex(const std::string& text) {
  if (text.size() % 2) throw CheckpointError("load_state: a random generator state in the checkpoint is damaged");
  at::Tensor out = torch::empty({static_cast<int64_t>(text.size() / 2)}, torch::kUInt8);
  auto* p = out.data_ptr<uint8_t>();
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw CheckpointError("load_state: a random generator state in the checkpoint is damaged");
  };
  for (size_t i = 0; i < text.size() / 2; ++i) p[i] = static_cast<uint8_t>(value(text[2 * i]) * 16 + value(text[2 * i + 1]));
  return out;
}

}  // namespace

struct Accelerator::Impl {
  AcceleratorOptions options;
  std::optional<LaunchConfig> launch;
  std::shared_ptr<comm::ProcessGroup> world;
  int local_rank = 0;
  at::Device device = at::kCPU;
  Config config;
  std::string precision = "no";
  int64_t gas = 1;
  std::optional<Engine> engine;
  std::vector<std::shared_ptr<DataLoader::State>> loaders;
  bool file_has_optimizer = false;
  bool file_has_scheduler = false;
  double configured_clip = 0;
  bool clip_overridden = false;

  Engine& need_engine(const char* what) {
    if (!engine) throw EngineError(std::string("Accelerator::") + what + " needs the model: call prepare(model) first");
    return *engine;
  }

  // The loader that handed out the latest batch.
  DataLoader::State* active_loader() const {
    DataLoader::State* best = nullptr;
    for (const auto& l : loaders) {
      if (l->handed_out > 0 && (!best || l->handed_out > best->handed_out)) best = l.get();
    }
    return best;
  }

  void build_config();
  // Every rank's CPU (and CUDA) generator states, as rank 0's JSON list.
  Json gather_random_states();
  void restore_random_state(const Json& states);
};

void Accelerator::Impl::build_config() {
  const bool deepspeed = launch && launch->distributed_type == "DEEPSPEED";
  std::string ds_path = options.ds_config;
  std::string ds_origin = "AcceleratorOptions::ds_config";
  if (ds_path.empty() && deepspeed && !launch->deepspeed.config_file.empty()) {
    ds_path = launch->deepspeed.config_file;
    ds_origin = "deepspeed_config_file of " + launch->source;
  }
  DsFileSettings file;
  if (!ds_path.empty()) {
    config = Config::from_file(ds_path);
    file = read_ds_file_settings(ds_path);
  } else if (deepspeed) {
    const auto& ds = launch->deepspeed;
    config.zero_optimization.stage = ds.zero_stage.value_or(2);  // Accelerate's default
    if (ds.offload_optimizer_device) config.zero_optimization.offload_optimizer.device = *ds.offload_optimizer_device;
    if (ds.offload_param_device) config.zero_optimization.offload_param.device = *ds.offload_param_device;
    config.zero_optimization.offload_optimizer.nvme_path = ds.offload_optimizer_nvme_path;
    config.zero_optimization.offload_param.nvme_path = ds.offload_param_nvme_path;
    if (ds.gradient_clipping) config.gradient_clipping = *ds.gradient_clipping;
  } else {
    config.zero_optimization.stage = 0;  // NO / MULTI_CPU / MULTI_GPU: plain data parallelism
  }

  // Mixed precision: one place decides; a ds_config file that says otherwise is an error.
  std::optional<std::string> chosen = options.mixed_precision;
  std::string chosen_origin = "AcceleratorOptions::mixed_precision";
  if (!chosen && launch && launch->mixed_precision) {
    chosen = launch->mixed_precision;
    chosen_origin = "mixed_precision of " + launch->source;
  }
  if (chosen && *chosen != "no" && *chosen != "fp16" && *chosen != "bf16") {
    throw ConfigError(chosen_origin + " is '" + *chosen + "'; expected 'no', 'fp16' or 'bf16'");
  }
  if (chosen && file.precision && *chosen != *file.precision) {
    throw ConfigError(chosen_origin + " is '" + *chosen + "' but the ds_config " + ds_path + " (" + ds_origin +
                      ") enables " + *file.precision + "; remove one of them or make them agree");
  }
  precision = file.precision ? *file.precision : chosen.value_or("no");
  config.fp16.enabled = precision == "fp16";
  config.bf16.enabled = precision == "bf16";

  // Gradient accumulation likewise.
  std::optional<int64_t> steps = options.gradient_accumulation_steps;
  std::string steps_origin = "AcceleratorOptions::gradient_accumulation_steps";
  if (!steps && launch) {
    steps = launch->gradient_accumulation_steps ? launch->gradient_accumulation_steps
                                                : launch->deepspeed.gradient_accumulation_steps;
    steps_origin = "gradient_accumulation_steps of " + launch->source;
  }
  if (steps && file.gradient_accumulation_steps && *steps != *file.gradient_accumulation_steps) {
    throw ConfigError(steps_origin + " is " + std::to_string(*steps) + " but the ds_config " + ds_path + " sets " +
                      std::to_string(*file.gradient_accumulation_steps) + "; remove one of them or make them agree");
  }
  if (steps && *steps < 1) throw ConfigError(steps_origin + " must be >= 1, got " + std::to_string(*steps));
  gas = file.gradient_accumulation_steps ? *file.gradient_accumulation_steps : steps.value_or(1);
  config.batch.gradient_accumulation_steps = gas;
  if (config.parallelism.tensor_parallel() > 1 || config.parallelism.pipeline_parallel() > 1) {
    throw ConfigError("the Accelerator trains with data parallelism and ZeRO; a ds_config with tensor or pipeline "
                      "parallelism needs zero::initialize directly (include/zero/tensor_parallel.h, pipeline.h)");
  }
  file_has_optimizer = file.has_optimizer;
  file_has_scheduler = file.has_scheduler;
}

Json Accelerator::Impl::gather_random_states() {
  std::vector<at::Tensor> parts{at::detail::getDefaultCPUGenerator().get_state()};
  if (device.is_cuda()) parts.push_back(at::globalContext().defaultGenerator(device).get_state());
  at::Tensor mine = torch::cat(parts).contiguous();
  at::Tensor all = torch::empty({world->size() * mine.numel()}, torch::kUInt8);
  world->all_gather(all, mine);
  Json states = Json::array();
  for (int r = 0; r < world->size(); ++r) states.push_back(to_hex(all.narrow(0, r * mine.numel(), mine.numel())));
  return states;
}

void Accelerator::Impl::restore_random_state(const Json& states) {
  if (!states.is_array() || static_cast<int>(states.size()) != world->size()) {
    log::warn("accelerate", "load_state: the random generators were saved by " +
                                std::to_string(states.is_array() ? states.size() : 0) + " rank(s) and this run has " +
                                std::to_string(world->size()) +
                                ": they keep their current state (dropout masks differ from the saved run's)");
    return;
  }
  at::Tensor bytes = from_hex(states[static_cast<size_t>(world->rank())].get<std::string>());
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  const int64_t cpu_bytes = cpu.get_state().numel();
  if (bytes.numel() < cpu_bytes) throw CheckpointError("load_state: a random generator state in the checkpoint is damaged");
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(bytes.narrow(0, 0, cpu_bytes).clone());
  }
  if (device.is_cuda() && bytes.numel() > cpu_bytes) {
    at::Generator cuda = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(cuda.mutex());
    cuda.set_state(bytes.narrow(0, cpu_bytes, bytes.numel() - cpu_bytes).clone());
  }
}

Accelerator::Accelerator(AcceleratorOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.options = std::move(options);
  std::string launch_path = s.options.launch_config;
  if (launch_path.empty()) launch_path = env::get("ZERO_LAUNCH_CONFIG");
  if (!launch_path.empty()) {
    s.launch = LaunchConfig::from_file(launch_path);
    for (const auto& w : s.launch->warnings) log::warn("accelerate", w);
  }
  s.world = s.options.group ? s.options.group : comm::init_process_group();
  const auto info = comm::LaunchInfo::from_env();
  s.local_rank = info.local_rank;
  if (s.launch && s.launch->num_processes != s.world->size()) {
    throw ConfigError("launch config " + s.launch->source + " says num_processes " +
                      std::to_string(s.launch->num_processes) + " but this job has " +
                      std::to_string(s.world->size()) + " rank(s) (launched by " + info.source +
                      "); start it with `zero-run --config-file " + s.launch->source +
                      " PROGRAM` or change num_processes");
  }
  const bool cpu_only = s.launch && (s.launch->use_cpu || s.launch->distributed_type == "MULTI_CPU");
  if (torch::cuda::is_available() && !cpu_only) {
    s.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(s.local_rank % torch::cuda::device_count()));
  }
  s.build_config();
}

Accelerator::~Accelerator() = default;

DataLoader Accelerator::prepare(std::shared_ptr<Dataset> dataset, const DataLoaderOptions& options) {
  Impl& s = *impl_;
  if (!dataset) throw EngineError("Accelerator::prepare got no dataset");
  const int64_t batch_size = options.batch_size.value_or(1);
  if (batch_size < 1) {
    throw ConfigError("DataLoaderOptions::batch_size must be >= 1, got " + std::to_string(batch_size));
  }
  auto state = std::make_shared<DataLoader::State>();
  state->dataset = std::move(dataset);
  state->options = options;
  state->seed = options.seed.value_or(s.options.seed);
  state->dp_rank = s.world->rank();
  state->dp_size = s.world->size();
  state->device = s.device;
  if (s.options.split_batches) {
    if (batch_size % state->dp_size != 0) {
      throw ConfigError("split_batches: the global batch_size " + std::to_string(batch_size) +
                        " does not divide over " + std::to_string(state->dp_size) + " ranks");
    }
    state->per_rank = batch_size / state->dp_size;
  } else {
    state->per_rank = batch_size;
  }
  if (state->num_samples() < 1) throw EngineError("Accelerator::prepare: the dataset is empty");
  // The first loader decides the micro batch the ds_config leaves open.
  auto& micro = s.config.batch.train_micro_batch_size_per_gpu;
  if (!micro) {
    if (!s.engine) micro = state->per_rank;
  } else if (*micro != state->per_rank && s.loaders.empty()) {
    throw ConfigError("the ds_config's train_micro_batch_size_per_gpu is " + std::to_string(*micro) +
                      " but the data loader gives " + std::to_string(state->per_rank) +
                      " rows per rank; set it to \"auto\" or make them agree");
  }
  s.loaders.push_back(state);
  return DataLoader(state);
}

Engine& Accelerator::prepare(std::shared_ptr<torch::nn::Module> model, const std::optional<OptimizerConfig>& optimizer,
                             const std::optional<SchedulerConfig>& scheduler) {
  Impl& s = *impl_;
  if (s.engine) throw EngineError("Accelerator::prepare: a model is already prepared (one model per Accelerator)");
  if (!model) throw EngineError("Accelerator::prepare got no model");
  if (optimizer) {
    if (s.file_has_optimizer) {
      throw ConfigError("an optimizer was given to prepare() and the ds_config has one too; keep one of them");
    }
    s.config.optimizer = *optimizer;
  } else if (s.config.optimizer.type.empty()) {
    throw ConfigError("no optimizer: give one to prepare(model, zero::OptimizerConfig{...}) or an \"optimizer\" "
                      "section in the ds_config");
  }
  if (scheduler) {
    if (s.file_has_scheduler) {
      throw ConfigError("a scheduler was given to prepare() and the ds_config has one too; keep one of them");
    }
    s.config.scheduler = *scheduler;
  }
  if (!s.config.batch.train_micro_batch_size_per_gpu && !s.config.batch.train_batch_size) {
    throw ConfigError("no micro batch size: prepare the data loader before the model, or set "
                      "train_micro_batch_size_per_gpu in the ds_config");
  }
  model->to(s.device);
  InitOptions init;
  init.group = s.world;
  s.engine.emplace(initialize(s.config, std::move(model), init));
  s.configured_clip = s.engine->config().gradient_clipping;
  return *s.engine;
}

void Accelerator::backward(const at::Tensor& loss) { impl_->need_engine("backward").backward(loss); }

void Accelerator::step() {
  Impl& s = *impl_;
  Engine& e = s.need_engine("step");
  const bool boundary = e.is_gradient_accumulation_boundary();
  e.step();
  if (boundary && s.clip_overridden) {
    e.set_gradient_clipping(s.configured_clip);
    s.clip_overridden = false;
  }
}

void Accelerator::accumulate(const std::function<void()>& micro_step) {
  micro_step();
  step();
}

bool Accelerator::sync_gradients() const {
  return impl_->engine ? impl_->engine->is_gradient_accumulation_boundary() : true;
}

double Accelerator::clip_grad_norm(double max_norm) {
  Impl& s = *impl_;
  Engine& e = s.need_engine("clip_grad_norm");
  e.set_gradient_clipping(max_norm);
  s.clip_overridden = true;
  return e.last_grad_norm();
}

at::Tensor Accelerator::gather(const at::Tensor& t) {
  Impl& s = *impl_;
  at::Tensor in = t.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  if (shape.empty()) {
    in = in.reshape({1});
    shape = {1};
  }
  shape[0] *= s.world->size();
  at::Tensor out = torch::empty(shape, in.options());
  s.world->all_gather(out, in);
  return out;
}

at::Tensor Accelerator::gather_for_metrics(const at::Tensor& t) {
  at::Tensor all = gather(t);
  const DataLoader::State* loader = impl_->active_loader();
  if (loader && loader->last_real_rows < loader->global_batch() && all.size(0) == loader->global_batch()) {
    return all.narrow(0, 0, loader->last_real_rows);
  }
  return all;
}

void Accelerator::print(const std::string& line) const {
  if (is_main_process()) std::cout << line << std::endl;
}
bool Accelerator::is_main_process() const { return impl_->world->rank() == 0; }
bool Accelerator::is_local_main_process() const { return impl_->local_rank == 0; }
int Accelerator::process_index() const { return impl_->world->rank(); }
int Accelerator::local_process_index() const { return impl_->local_rank; }
int Accelerator::num_processes() const { return impl_->world->size(); }
at::Device Accelerator::device() const { return impl_->device; }
const std::string& Accelerator::mixed_precision() const { return impl_->precision; }
int64_t Accelerator::gradient_accumulation_steps() const { return impl_->gas; }
void Accelerator::wait_for_everyone() { impl_->world->barrier(); }

void Accelerator::save_state(const std::string& dir, const std::string& tag) {
  Impl& s = *impl_;
  Engine& e = s.need_engine("save_state");
  Json loaders = Json::array();
  for (const auto& l : s.loaders) {
    loaders.push_back({{"epoch", l->position.epoch},
                       {"samples", l->position.samples},
                       {"dataset_size", l->num_samples()},
                       {"global_batch", l->global_batch()},
                       {"seed", l->seed},
                       {"shuffle", l->options.shuffle}});
  }
  Json client = {{"accelerator",
                  {{"world_size", s.world->size()}, {"loaders", loaders}, {"random_states", s.gather_random_states()}}}};
  e.save_checkpoint(dir, tag, client.dump());
}

void Accelerator::load_state(const std::string& dir, const std::string& tag) {
  Impl& s = *impl_;
  Engine& e = s.need_engine("load_state");
  const Json client = Json::parse(e.load_checkpoint(dir, tag), nullptr, /*allow_exceptions=*/false);
  if (!client.is_object() || !client.contains("accelerator")) {
    log::warn("accelerate", "load_state: " + dir + " was not saved by save_state; the data loaders and random "
                            "generators keep their current state");
    return;
  }
  const Json& saved = client["accelerator"];
  const Json& loaders = saved.value("loaders", Json::array());
  if (loaders.size() != s.loaders.size()) {
    throw CheckpointError("load_state: " + dir + " holds the positions of " + std::to_string(loaders.size()) +
                          " data loader(s) but this program prepared " + std::to_string(s.loaders.size()) +
                          "; prepare the same loaders, in the same order, before load_state");
  }
  for (size_t i = 0; i < loaders.size(); ++i) {
    DataLoader::State& l = *s.loaders[i];
    const int64_t size = loaders[i].value("dataset_size", int64_t{-1});
    if (size != l.num_samples() || loaders[i].value("seed", l.seed) != l.seed ||
        loaders[i].value("shuffle", l.options.shuffle) != l.options.shuffle) {
      throw CheckpointError("load_state: data loader " + std::to_string(i) + " was saved over " +
                            std::to_string(size) + " samples (seed " + loaders[i].value("seed", Json()).dump() +
                            ") and this one has " + std::to_string(l.num_samples()) + " (seed " +
                            std::to_string(l.seed) + "); its position cannot carry over");
    }
    l.position = DataLoader::Position{loaders[i].value("epoch", int64_t{0}), loaders[i].value("samples", int64_t{0})};
  }
  s.restore_random_state(saved.value("random_states", Json::array()));
}

torch::nn::Module& Accelerator::unwrap_model() { return impl_->need_engine("unwrap_model").module(); }
Engine& Accelerator::engine() { return impl_->need_engine("engine"); }
void Accelerator::save_model(const std::string& dir) {
  if (!impl_->need_engine("save_model").save_16bit_model(dir)) {
    throw ConfigError("save_model at ZeRO stage 3 needs zero_optimization.stage3_gather_16bit_weights_on_model_save: "
                      "true in the ds_config, as in Accelerate");
  }
}

std::vector<std::pair<std::string, at::Tensor>> Accelerator::get_state_dict() {
  return impl_->need_engine("get_state_dict").gathered_state_dict();
}
const std::optional<LaunchConfig>& Accelerator::launch_config() const { return impl_->launch; }
const Config& Accelerator::ds_config() const { return impl_->engine ? impl_->engine->config() : impl_->config; }

void set_seed(uint64_t seed) {
  torch::manual_seed(seed);
  if (torch::cuda::is_available()) torch::cuda::manual_seed_all(seed);
}

}  // namespace zero
