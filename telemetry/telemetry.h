#pragma once
// What the engine measures and reports, apart from what it trains: the
// step's clocks (step_timer.h), the flops_profiler's step (profile_step.h),
// the progress line (progress_line.h), the monitors' feed
// (monitor_feed.h) and the comms_logger's summary. The training core feeds
// it events in the order they happen. It only observes: no class here runs
// a collective or throws. The losses the ranks must agree on, and a failed
// write that stops them all, are the engine's step boundary's
// (engine/step_boundary.h), which hands the agreed values back.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>

#include "monitor/monitor.h"
#include "telemetry/monitor_feed.h"
#include "telemetry/profile_step.h"
#include "telemetry/progress_line.h"
#include "telemetry/step_timer.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero::telemetry {

class Telemetry {
 public:
  // `memory`: the engine's memory report, read for the progress line and
  // the monitors. `pipelined`: the model runs as pipeline stages (no
  // flops_profiler; the progress line shows the pipeline's wait).
  // `monitors`: rank 0's (open_monitors), or null.
  Telemetry(const Config& config, int rank, torch::nn::Module& module, at::Device model_device, at::ScalarType dtype,
            bool pipelined, std::function<MemoryReport()> memory, std::unique_ptr<monitor::Monitors> monitors);
  ~Telemetry();  // the comms summary at the end
  Telemetry(const Telemetry&) = delete;
  Telemetry& operator=(const Telemetry&) = delete;

  // The core's events, in order: forward_starts (at initialize, after a
  // backward that is not at the boundary, after each step), backward_starts
  // and backward_ends around each backward, step_done after each optimizer
  // step; a pipeline's batch instead of the backwards. `gathered`: the
  // bytes of stage 3's units gathered at that moment (StepTimer).
  void forward_starts(int64_t global_steps, int64_t gathered);
  void backward_starts(const at::Tensor& loss, int64_t gathered);
  void backward_ends(Clock::time_point reduce_start);
  // `agreed_loss`: the batch's loss, already the same on every rank.
  void pipeline_batch_done(const PipelineTimes& times, double agreed_loss);
  void step_done(const StepRecord& record);

  // The step boundary's side (engine/step_boundary.h): the monitors' step
  // held until its loss is agreed, and the progress line's window.
  MonitorFeed& monitors() { return monitors_; }
  bool progress_due(int64_t global_steps) const { return progress_.due(global_steps); }
  at::Tensor progress_loss() const { return progress_.window_loss(); }
  // The line, with the window's loss agreed over the ranks, then the comms summary.
  void write_progress(const StepRecord& record, double loss);
  // The monitors' scalars of the step just done; returns this rank's loss of it.
  at::Tensor record_step(const StepRecord& record);

  // The split since the last call; `gather_wait_total`: the partition's
  // stage-3 gather wait since construction.
  StepTimes take_step_times(double gather_wait_total) { return timer_.take_step_times(gather_wait_total); }
  // The most any forward left alive for its backward (never measured: 0).
  int64_t activations_peak() const { return timer_.activations_peak(); }

 private:
  void log_comms_summary(const std::string& when);

  const Config& config_;
  int rank_;
  std::function<MemoryReport()> memory_;
  StepTimer timer_;
  ProfileStep profile_;
  ProgressLine progress_;
  MonitorFeed monitors_;
};

}  // namespace zero::telemetry
