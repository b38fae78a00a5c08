#pragma once
// Engine::Impl: the engine's parts and counters (engine.cpp).
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "engine/loss_scaler.h"
#include "engine/lr_schedule.h"
#include "engine/optimizer.h"
#include "engine/training_state.h"
#include "monitor/monitor.h"
#include "offload/swapped_tensors.h"
#include "profile/flops_profiler.h"
#include "zero/engine.h"
#include "parallel/pipe_links.h"
#include "zero/internal/partition.h"
#include "zero/pipeline.h"
#include "zero/tensor_parallel.h"

namespace zero {

using Clock = std::chrono::steady_clock;

// Shared by the engine's files: seconds since `t`; bytes as "1.50 GB".
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline std::string human_bytes(int64_t bytes) {
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

struct Engine::Impl {
  Config config;
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<comm::ProcessGroup> pg;  // the world
  std::shared_ptr<Mesh> mesh;              // its tp x dp x pp layout; ZeRO works over mesh->dp_group()
  std::map<std::string, tp::Split> splits; // the model's tensor-parallel parameters (after AutoTP)
  // Pipeline parallelism: the module as a pipeline (null for other models),
  // the links to the neighbouring stages, and the buckets of tied
  // parameters whose reduced gradients are summed over their tie's group.
  pipe::PipelineModule* pipeline = nullptr;
  std::unique_ptr<pipe::PipeLinks> links;
  std::vector<std::pair<size_t, std::shared_ptr<comm::ProcessGroup>>> tied_buckets;
  at::ScalarType dtype = at::kFloat;
  int64_t gas = 1;
  std::unique_ptr<partition::ShardedParams> sharded;
  std::unique_ptr<engine::MasterOptimizer> optimizer;
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<LossScaler> scaler;  // fp16 only
  // offload_optimizer "nvme": the master weights and optimizer states, on disk between steps.
  std::unique_ptr<offload::SwappedTensors> nvme;
  int64_t frozen_bytes = 0;
  std::vector<UnitBase*> units;  // stage 3

  engine::StepCounters steps;
  double last_norm = 0.0;

  // csv_monitor and tensorboard (rank 0 writes; every rank takes part in
  // the step's loss): the loss of the step so far, and the step times at
  // the last record.
  std::unique_ptr<monitor::Monitors> monitors;
  bool monitoring() const { return config.csv_monitor.enabled || config.tensorboard.enabled; }
  at::Tensor step_loss_sum;
  int64_t step_loss_count = 0;
  double recorded_forward = 0, recorded_backward = 0, recorded_step = 0;
  Clock::time_point recorded_at = Clock::now();
  void setup_monitors();
  void record_step(std::optional<double> agreed_loss = std::nullopt);
  // The last recorded step: its loss all-reduce and its events (rank 0).
  comm::WorkHandle pending_loss;
  at::Tensor pending_loss_value;
  std::vector<monitor::Event> pending_events;
  void write_pending_step();
  void flush_monitors();  // the pending step, then the files
  // comms_logger: its summary (rank 0, at each progress line and at the
  // end), and each collective kind's totals at the last record.
  void log_comms_summary(const std::string& when);
  std::map<std::string, comm::CommOpSummary> comms_recorded;
  ~Impl();

  // flops_profiler: counts forward during the step where global_steps ==
  // profile_step (paused in backward), reports after it; from then on the
  // progress line shows TFLOP/s from the step's FLOPs (3 x forward, plus
  // what activation checkpointing recomputes).
  std::unique_ptr<profile::FlopsProfiler> flops_profiler;
  bool profiling = false;
  double flops_per_step = 0;
  double peak_flops = 0;  // per device, for the MFU; 0: unknown (profile/device_peak.h)
  double profile_t0_forward = 0, profile_t0_backward = 0, profile_t0_step = 0;
  void profile_forward_starts();
  void finish_profile();
  void after_progress_log() { recorded_forward = t_forward, recorded_backward = t_backward, recorded_step = t_step; }

  // Progress log (steps_per_print) and wall_clock_breakdown.
  at::Tensor loss_sum;
  int64_t loss_count = 0;
  Clock::time_point window_start = Clock::now(), last_step_end = Clock::now();
  int64_t window_steps = 0;
  double gather_wait_at_window = 0;  // sharded->gather_wait_seconds() when the window began
  double t_forward = 0, t_backward = 0, t_reduce = 0, t_step = 0, t_gather = 0;
  double t_pipeline_wait = 0;  // of t_forward and t_backward: receiving from the neighbouring stages

  // Activation memory, measured (activations/activation_memory.h): the bytes
  // allocated on the model's device when forward started, and the most any
  // forward left alive for its backward.
  at::Device model_device = at::Device(at::kCPU);
  int64_t allocated_at_forward = -1;
  int64_t activations_peak = 0;
  void forward_starts();

  void build_params(InitOptions& options);
  void setup_activation_checkpointing();
  engine::TrainingState training_state();
  MemoryReport memory() const;
  void take_step();
  void step_on_rank_threads();  // take_step's body, inside the rank's thread arena
  void log_progress();
  // Pipeline parallelism (pipeline_engine.cpp).
  void setup_pipeline();
  void find_tied_buckets();
  void reduce_tied_grads();
  double pipeline_batch(const std::function<Engine::Batch()>& next_batch, bool train);
};


}  // namespace zero
