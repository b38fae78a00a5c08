#pragma once
// What the engine measures and reports, apart from what it trains: the
// step's timers (wall_clock_breakdown, Engine::take_step_times), the loss
// windows of the progress line and of the monitors, DeepSpeed's csv_monitor
// and tensorboard, the flops_profiler, the comms_logger's summary and the
// activation memory measured around forward. The training core feeds it
// events in the order they happen (telemetry.cpp); it never changes the
// training.
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/optimizer.h"
#include "monitor/monitor.h"
#include "profile/flops_profiler.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero::engine {

using Clock = std::chrono::steady_clock;

// Seconds since `t`.
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What the core tells after each optimizer step.
struct StepRecord {
  int64_t global_steps = 0, skipped_steps = 0;
  double lr = 0, loss_scale = 1, grad_norm = 0;
  double step_s = 0;     // the whole step, publish included
  double publish_s = 0;  // of it, sending the updated parameters on
  double host_step_s = 0;  // of it, the host kernels (offload, CPU ranks)
  double nvme_wait_s = 0;  // of it, waiting for NVMe (offload_optimizer "nvme")
};

// What a pipeline's train_batch took (PipelineDriver::run).
struct PipelineTimes {
  double forward_s = 0, backward_s = 0, wait_s = 0;
  int64_t activations = -1;  // the most bytes the forwards in flight kept allocated; -1: unknown
};

class Telemetry {
 public:
  // `memory`: the engine's memory report, read for the progress line and
  // the monitors. `pipelined`: the model runs as pipeline stages (no
  // flops_profiler; the progress line shows the pipeline's wait).
  // A collective: every rank stops when rank 0 cannot open the monitors.
  Telemetry(const Config& config, std::shared_ptr<comm::ProcessGroup> world, torch::nn::Module& module,
            at::Device model_device, at::ScalarType dtype, bool pipelined, std::function<MemoryReport()> memory);
  ~Telemetry();  // the last step's loss written, the comms summary at the end
  Telemetry(const Telemetry&) = delete;
  Telemetry& operator=(const Telemetry&) = delete;

  // The core's events, in order: forward_starts (at initialize, after a
  // backward that is not at the boundary, after each step), backward_starts
  // and backward_ends around each backward, step_done after each optimizer
  // step; a pipeline's batch instead of the backwards.
  void forward_starts(int64_t global_steps);
  void backward_starts(const at::Tensor& loss);
  void backward_ends(Clock::time_point reduce_start);
  void pipeline_batch_done(const PipelineTimes& times, double agreed_loss);
  // `agreed_loss`: a pipeline's loss, already the same on every rank.
  void step_done(const StepRecord& record, std::optional<double> agreed_loss = std::nullopt);

  // The monitors' pending step and files, before a checkpoint.
  void flush();
  // The split since the last call; `gather_wait_total`: the partition's
  // stage-3 gather wait since construction.
  StepTimes take_step_times(double gather_wait_total);
  // The most any forward left alive for its backward (-1 never measured: 0).
  int64_t activations_peak() const { return activations_peak_; }

 private:
  // Seconds since construction, by kind; each reader keeps its own mark.
  struct Totals {
    int64_t steps = 0;
    double forward = 0, backward = 0, reduce = 0, step = 0, gather = 0, pipeline_wait = 0;
    double host_step = 0, nvme_wait = 0;
    Totals since(const Totals& mark) const;
  };
  bool monitoring() const { return config_.csv_monitor.enabled || config_.tensorboard.enabled; }
  void setup_monitors();
  void record_step(const StepRecord& r, std::optional<double> agreed_loss);
  void write_pending_step();
  // Raises on every rank the write failure one of them reported (Note [Failed writes]).
  [[noreturn]] void stop_for_failed_write(int64_t step);
  void log_progress(const StepRecord& r);
  void log_comms_summary(const std::string& when);
  void finish_profile();

  const Config& config_;
  std::shared_ptr<comm::ProcessGroup> pg_;
  torch::nn::Module& module_;
  at::Device model_device_;
  at::ScalarType dtype_;
  bool pipelined_;
  std::function<MemoryReport()> memory_;

  Totals total_;
  Totals times_mark_, progress_mark_, record_mark_, profile_mark_;
  Clock::time_point last_end_ = Clock::now();  // forward_starts or the last backward's end: forward runs from here
  Clock::time_point backward_start_ = Clock::now();
  double gather_wait_mark_ = 0;

  // Progress line (steps_per_print): the window's losses and start.
  at::Tensor loss_sum_;
  int64_t loss_count_ = 0;
  Clock::time_point window_start_ = Clock::now();

  // csv_monitor and tensorboard (rank 0 writes; every rank takes part in
  // the step's loss): the loss of the step so far, the last recorded
  // step's loss all-reduce and its events.
  std::unique_ptr<monitor::Monitors> monitors_;
  at::Tensor step_loss_sum_;
  int64_t step_loss_count_ = 0;
  Clock::time_point recorded_at_ = Clock::now();
  comm::WorkHandle pending_loss_;
  at::Tensor pending_loss_value_;  // the step's loss and the flag of Note [Failed writes], averaged
  std::optional<double> pending_agreed_loss_;  // a pipeline's
  int64_t pending_step_ = 0;
  std::vector<monitor::Event> pending_events_;
  std::map<std::string, comm::CommOpSummary> comms_recorded_;  // each kind's totals at the last record

  // flops_profiler: counts forward during the step where global_steps ==
  // profile_step (paused in backward), reports after it; from then on the
  // progress line shows TFLOP/s from the step's FLOPs (3 x forward, plus
  // what activation checkpointing recomputes).
  std::unique_ptr<profile::FlopsProfiler> flops_profiler_;
  bool profiling_ = false;
  double flops_per_step_ = 0;
  double peak_flops_ = 0;  // per device, for the MFU; 0: unknown (profile/device_peak.h)

  // Activation memory (activations/activation_memory.h): the bytes
  // allocated on the model's device when forward started, and the most any
  // forward left alive for its backward.
  int64_t allocated_at_forward_ = -1;
  int64_t activations_peak_ = 0;
};

}  // namespace zero::engine
