#pragma once
// Engine::Impl, the training core: the parts it trains with and the
// counters of training (engine.cpp, engine_build.cpp). What it measures is
// the Telemetry's (telemetry.h), a pipeline's schedule the PipelineDriver's
// (pipeline_driver.h).
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "engine/loss_scaler.h"
#include "engine/lr_schedule.h"
#include "engine/optimizer.h"
#include "engine/pipeline_driver.h"
#include "engine/telemetry.h"
#include "engine/training_state.h"
#include "zero/engine.h"
#include "partition/partition.h"
#include "zero/tensor_parallel.h"

namespace zero {

struct Engine::Impl {
  Config config;
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<comm::ProcessGroup> pg;  // the world
  std::shared_ptr<Mesh> mesh;              // its tp x dp x pp layout; ZeRO works over mesh->dp_group()
  std::map<std::string, tp::Split> splits; // the model's tensor-parallel parameters (after AutoTP)
  std::unique_ptr<engine::PipelineDriver> pipeline;  // null unless the model is a pipe::PipelineModule
  at::ScalarType dtype = at::kFloat;
  int64_t gas = 1;
  at::Device model_device = at::Device(at::kCPU);
  std::unique_ptr<partition::ShardedParams> sharded;
  std::unique_ptr<engine::MasterOptimizer> optimizer;
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<LossScaler> scaler;  // fp16 only
  int64_t frozen_bytes = 0;
  std::vector<UnitBase*> units;  // stage 3
  engine::StepCounters steps;
  double last_norm = 0.0;
  std::string partly_loaded;  // TrainingState::partly_loaded
  std::unique_ptr<engine::Telemetry> telemetry;
  ~Impl();

  // Construction (engine_build.cpp).
  // `parts`: the model's units partitioned as they were built (zero::Init), or none.
  void build_params(InitOptions& options, const std::shared_ptr<partition::ConstructionParts>& parts);
  void setup_activation_checkpointing();
  MemoryReport memory() const;
  engine::TrainingState training_state();
  // The optimizer step and its bookkeeping, shared by step() and
  // train_batch(): `agreed_loss` is a pipeline's loss.
  void optimizer_step(std::optional<double> agreed_loss);
  double loss_scale() const { return scaler ? scaler->scale() : 1.0; }
  // Throws EngineError naming `what` while a failed load left the parameters partly loaded.
  void check_loaded(const char* what) const;
};

}  // namespace zero
