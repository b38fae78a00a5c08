#pragma once
// zero::Accelerator: Hugging Face Accelerate's workflow on the zero engine.
//
//   zero::Accelerator acc;                        // launch env + launch config (ZERO_LAUNCH_CONFIG)
//   auto loader = acc.prepare(dataset, {.batch_size = 8});
//   auto& engine = acc.prepare(model);            // ZeRO from the launch config or a ds_config
//   for (int64_t epoch = loader.epoch(); epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);
//     for (const auto& batch : loader) {          // this rank's share, on acc.device()
//       acc.accumulate([&] {
//         acc.backward(loss_fn(model->forward(batch[0]), batch[1]));
//       });                                        // the optimizer steps at the accumulation boundary
//     }
//   }
//   acc.save_state("checkpoints");                 // model, optimizer, scheduler, scaler, RNG, data position
//
// Launch with `zero-run --config-file launch.yaml PROGRAM` (the YAML of
// zero/launch_config.h; `zero-run config` writes one), or any launcher zero
// supports (torchrun, mpirun, srun) with ZERO_LAUNCH_CONFIG naming the file.
// The optimizer and the LR scheduler are the ds_config's (DeepSpeed's rule
// under Accelerate): give them to prepare() when no ds_config file has them.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/config.h"
#include "zero/data.h"
#include "zero/engine.h"
#include "zero/launch_config.h"

namespace zero {

struct AcceleratorOptions {
  // "no" | "fp16" | "bf16"; unset: the launch config's, else what the ds_config
  // sets, else "no". Given here or in the launch config and also set
  // differently in a ds_config file: a ConfigError naming both.
  std::optional<std::string> mixed_precision;
  // Unset: the launch config's, else the ds_config's, else 1.
  std::optional<int64_t> gradient_accumulation_steps;
  // A ds_config file; replaces the launch config's deepspeed_config block.
  std::string ds_config;
  // A launch config file; "": $ZERO_LAUNCH_CONFIG (zero-run --config-file
  // sets it), else none (one process or the launcher's world, stage 0).
  std::string launch_config;
  // Accelerate's split_batches: DataLoaderOptions::batch_size is the global
  // batch, split over the data-parallel ranks (it must divide evenly).
  bool split_batches = false;
  uint64_t seed = 0;  // the data order's default seed
  // Empty: zero::comm::init_process_group() from the launch environment.
  std::shared_ptr<comm::ProcessGroup> group;
};

class Accelerator {
 public:
  explicit Accelerator(AcceleratorOptions options = {});
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // The data loader over `dataset` for this rank. Prepare it before the
  // model when the ds_config leaves train_micro_batch_size_per_gpu to it.
  DataLoader prepare(std::shared_ptr<Dataset> dataset, const DataLoaderOptions& options = {});
  // Builds the engine: the model moves to device(), ZeRO partitions it.
  // `optimizer` / `scheduler`: zero::OptimizerConfig / zero::SchedulerConfig
  // (zero/config.h; e.g. {"AdamW", params} with params.lr set), the
  // ds_config's "optimizer" and "scheduler" sections as structs, for a
  // ds_config without those sections (giving them when it has its own is
  // an error). Not a torch::optim object: the optimizer runs on each rank's
  // partition, so zero builds it.
  Engine& prepare(std::shared_ptr<torch::nn::Module> model, const std::optional<OptimizerConfig>& optimizer = {},
                  const std::optional<SchedulerConfig>& scheduler = {});
  template <typename M>
  Engine& prepare(torch::nn::ModuleHolder<M>& model, const std::optional<OptimizerConfig>& optimizer = {},
                  const std::optional<SchedulerConfig>& scheduler = {}) {
    return prepare(std::static_pointer_cast<torch::nn::Module>(model.ptr()), optimizer, scheduler);
  }

  // The loss of one micro-batch (scaled for fp16 and accumulation inside).
  void backward(const at::Tensor& loss);
  // One micro-step: runs `micro_step` (forward and backward()), then the
  // engine's step(), which updates at the accumulation boundary.
  void accumulate(const std::function<void()>& micro_step);
  // The engine's step() for loops that call backward() themselves.
  void step();
  // True when the current micro-step ends with an optimizer update.
  bool sync_gradients() const;
  // Clips the global gradient norm to `max_norm` in this step's update (call
  // between backward() and the end of the micro-step), as the ds_config's
  // gradient_clipping would. Returns the norm of the previous update.
  double clip_grad_norm(double max_norm);

  // Every rank's rows of `t` (first dimension) concatenated in rank order,
  // without the duplicates that filled up the loader's last batch.
  at::Tensor gather_for_metrics(const at::Tensor& t);
  // Every rank's `t`, concatenated along the first dimension.
  at::Tensor gather(const at::Tensor& t);

  // Writes on the main process only.
  void print(const std::string& line) const;
  bool is_main_process() const;        // global rank 0
  bool is_local_main_process() const;  // local rank 0
  int process_index() const;
  int local_process_index() const;
  int num_processes() const;
  at::Device device() const;
  const std::string& mixed_precision() const;
  int64_t gradient_accumulation_steps() const;
  void wait_for_everyone();

  // A sharded checkpoint in `dir` (the engine's, tag "global_step<N>" or
  // `tag`): model, optimizer, scheduler and loss scaler, plus every rank's
  // random generators and the prepared loaders' positions. A collective.
  void save_state(const std::string& dir, const std::string& tag = "");
  // Loads what save_state wrote, at this or another world size: the loaders
  // continue where they were (the rest of the epoch in its order); the
  // random generators are restored when the world size is the same.
  void load_state(const std::string& dir, const std::string& tag = "");

  // Accelerate's save_model: the whole model's weights in the training
  // dtype as <dir>/model.safetensors (Engine::save_16bit_model). A collective.
  void save_model(const std::string& dir);

  torch::nn::Module& unwrap_model();
  Engine& engine();
  // Full copies of the parameters and buffers by name (stage 3 gathers). A collective.
  std::vector<std::pair<std::string, at::Tensor>> get_state_dict();
  // The launch config read, if any.
  const std::optional<LaunchConfig>& launch_config() const;
  // The ds_config the engine was (or will be) built from.
  const Config& ds_config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Seeds torch's CPU and CUDA generators (accelerate.utils.set_seed).
void set_seed(uint64_t seed);

}  // namespace zero
