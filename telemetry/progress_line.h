#pragma once
// The line the engine logs every steps_per_print optimizer steps: the
// window's loss (its micro-batches' mean, which the engine averages over the
// ranks), lr, loss scale, grad norm, samples/s and step time, the profiled
// TFLOP/s and MFU, memory, and with wall_clock_breakdown the split of a step;
// then the comms summary.
#include <torch/torch.h>

#include <cstdint>

#include "telemetry/profile_step.h"
#include "telemetry/step_timer.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero::telemetry {

class ProgressLine {
 public:
  ProgressLine(const Config& config, bool pipelined) : config_(config), pipelined_(pipelined) {}

  // Each micro-batch's loss (a pipeline's batch: its agreed loss), on any device.
  void add_loss(const at::Tensor& loss);
  // Whether the step just done prints a line.
  bool due(int64_t global_steps) const;
  // This rank's mean loss over the window: one fp64 element on the host (0 without losses).
  at::Tensor window_loss() const;
  // Logs the line with `loss`, the window's mean over the ranks, and starts a new window.
  void write(const StepRecord& r, double loss, const Totals& total, const Throughput& throughput,
             const MemoryReport& memory);

 private:
  const Config& config_;
  bool pipelined_;
  at::Tensor loss_sum_;
  int64_t loss_count_ = 0;
  Clock::time_point window_start_ = Clock::now();
  Totals mark_;
};

// A loss sum's mean as a 1-element fp64 host tensor (zero without losses).
at::Tensor mean_loss(const at::Tensor& sum, int64_t count);

}  // namespace zero::telemetry
