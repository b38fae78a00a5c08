#pragma once
// Engine::Impl, the training core: the parts it trains with and the
// counters of training (engine::TrainingParts, which checkpointing
// borrows), and its per-step bookkeeping (engine.cpp, engine_build.cpp).
// What it measures is the Telemetry's (telemetry/telemetry.h), what the
// ranks agree on for it the StepBoundary's (step_boundary.h), a
// pipeline's schedule the PipelineDriver's (pipeline_driver.h).
#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "engine/memory_copies.h"
#include "engine/pipeline_driver.h"
#include "engine/step_boundary.h"
#include "engine/training_parts.h"
#include "zero/engine.h"
#include "partition/partition.h"
#include "telemetry/telemetry.h"
#include "zero/tensor_parallel.h"

namespace zero {

struct Engine::Impl : engine::TrainingParts {
  std::unique_ptr<engine::PipelineDriver> pipeline;  // null unless the model is a pipe::PipelineModule
  at::Device model_device = at::Device(at::kCPU);
  int64_t frozen_bytes = 0;
  std::vector<UnitBase*> units;  // stage 3
  double last_norm = 0.0;
  std::unique_ptr<telemetry::Telemetry> telemetry;
  std::unique_ptr<engine::StepBoundary> boundary;  // over `telemetry`
  std::unique_ptr<engine::MemoryCopies> memory_copies;  // checkpoint.in_memory (Note [In-memory copies])
  // Note [Call order]: a backward() whose step() has not come yet; the
  // thread that trains (the first to call backward, step or train_batch).
  bool backward_pending = false;
  std::optional<std::thread::id> training_thread;
  bool broadcast_buffers = true;  // InitOptions::broadcast_buffers
  // Note [Updates in backward] (partition/step.cpp): super_offload, and
  // nothing that always needs the global norm before the update (fp16's
  // overflow check); gradient_clipping, which set_gradient_clipping may
  // change, is asked at each boundary.
  bool updates_in_backward = false;
  ~Impl();

  // Construction (engine_build.cpp).
  // `parts`: the model's units partitioned as they were built (zero::Init), or none.
  void build_params(InitOptions& options, const std::shared_ptr<partition::ConstructionParts>& parts);
  void setup_activation_checkpointing();
  MemoryReport memory() const;
  // The optimizer step and its bookkeeping, shared by step() and
  // train_batch(): `agreed_loss` is a pipeline's loss.
  void optimizer_step(std::optional<double> agreed_loss);
  // The optimizer's rate and momentum for the next step, from the schedule
  // (or the client's own).
  void set_step_hyperparameters();
  // super_offload: whether the update can run in backward, or why not.
  void choose_updates_in_backward();
  double loss_scale() const { return scaler ? scaler->scale() : 1.0; }
  // Throws EngineError naming `what` while a failed load left the parameters partly loaded.
  void check_loaded(const char* what) const;
  // Throws EngineError naming `what` once a failed step stopped the engine.
  void check_stopped(const char* what) const;
  // Throws EngineError when `what` is called from another thread than the
  // one training (Note [Call order]); `binds`: a call that makes its thread
  // the training one when none is yet.
  void check_thread(const char* what, bool binds = true);
  // The buffers that differ between the data-parallel ranks, broadcast
  // from the group's rank 0 (DDP's broadcast_buffers).
  void sync_buffers();
  // gather_parameters' modifier rank: its values of `touched` (whole,
  // gathered) into every rank's masters and shards (gathered_parameters.cpp).
  void write_back_gathered(const std::vector<at::Tensor>& touched, int modifier_rank);
};

}  // namespace zero
