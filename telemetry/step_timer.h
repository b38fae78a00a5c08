#pragma once
// The step's clocks: seconds by kind since the engine was built, each
// reader taking the split since a mark of its own (wall_clock_breakdown,
// Engine::take_step_times, the progress line, the monitors, the profile),
// and the bytes a forward leaves alive for its backward (activation
// memory, measured as forward starts and backward starts).
#include <torch/torch.h>

#include <chrono>
#include <cstdint>

#include "zero/engine.h"

namespace zero::telemetry {

using Clock = std::chrono::steady_clock;

// Seconds since `t`.
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What the core tells after each optimizer step.
struct StepRecord {
  int64_t global_steps = 0, skipped_steps = 0;
  double lr = 0, loss_scale = 1, grad_norm = 0;
  double step_s = 0;       // the whole step, publish included
  double publish_s = 0;    // of it, sending the updated parameters on
  double host_step_s = 0;  // of it, the host kernels (offload, CPU ranks)
  double nvme_wait_s = 0;  // of it, waiting for NVMe (offload_optimizer "nvme")
};

// What a pipeline's train_batch took (engine/pipeline_driver.h).
struct PipelineTimes {
  double forward_s = 0, backward_s = 0, wait_s = 0;
  int64_t activations = -1;  // the most bytes the forwards in flight kept allocated; -1: unknown
};

// Seconds since construction, by kind.
struct Totals {
  int64_t steps = 0;
  double forward = 0, backward = 0, reduce = 0, step = 0, gather = 0, pipeline_wait = 0;
  double host_step = 0, nvme_wait = 0;
  Totals since(const Totals& mark) const;  // what came after `mark`
};

class StepTimer {
 public:
  explicit StepTimer(at::Device model_device) : model_device_(model_device) {}

  // The core's events, in order: forward_starts, then backward_starts and
  // backward_ends around each backward (or a pipeline's batch), then
  // step_done after each optimizer step. `gathered`: the bytes of stage 3's
  // units gathered now, which a forward leaves allocated but are parameters,
  // not activations (MemoryReport::gathered_params_peak counts them).
  void forward_starts(int64_t gathered);
  void backward_starts(int64_t gathered);
  void backward_ends(Clock::time_point reduce_start);
  void pipeline_batch_done(const PipelineTimes& times);
  void step_done(const StepRecord& record);

  const Totals& total() const { return total_; }
  // The split since the last call; `gather_wait_total`: the partition's
  // stage-3 gather wait since construction.
  StepTimes take_step_times(double gather_wait_total);
  // The most any forward left alive for its backward (never measured: 0).
  int64_t activations_peak() const { return activations_peak_; }

 private:
  at::Device model_device_;
  Totals total_, times_mark_;
  Clock::time_point last_end_ = Clock::now();  // forward_starts or the last backward's end: forward runs from here
  Clock::time_point backward_start_ = Clock::now();
  double gather_wait_mark_ = 0;
  int64_t allocated_at_forward_ = -1;  // bytes allocated on the model's device as forward started; -1: unknown
  int64_t gathered_at_forward_ = 0;    // of them, stage 3's gathered units
  int64_t activations_peak_ = 0;
};

}  // namespace zero::telemetry
