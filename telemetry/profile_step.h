#pragma once
// DeepSpeed's flops_profiler over one step: forward's FLOPs are counted
// during the step where global_steps == profile_step (paused in backward),
// rank 0 reports after it, and from then on the step's FLOPs (3 x forward,
// plus what activation checkpointing recomputes) give the TFLOP/s and MFU
// that the progress line and the monitors show.
#include <torch/torch.h>

#include <memory>

#include "profile/flops_profiler.h"
#include "telemetry/step_timer.h"
#include "zero/config.h"

namespace zero::telemetry {

// The step's work, once profiled.
struct Throughput {
  double flops_per_step = 0;  // 0: not profiled (yet)
  double peak_flops = 0;      // per device, for the MFU; 0: unknown (profile/device_peak.h)
};

class ProfileStep {
 public:
  // Off unless the config's flops_profiler is enabled; `pipelined`: the
  // pipeline runs forward itself, so there is nothing to count (a warning).
  ProfileStep(const Config& config, torch::nn::Module& module, at::Device model_device, at::ScalarType dtype,
              bool pipelined, int rank);
  ProfileStep(const ProfileStep&) = delete;
  ProfileStep& operator=(const ProfileStep&) = delete;

  void forward_starts(int64_t global_steps, const Totals& total);
  void backward_starts();
  // After each optimizer step: the profiled one's report (rank 0).
  void step_done(const Totals& total);
  const Throughput& throughput() const { return throughput_; }

 private:
  const Config& config_;
  at::Device model_device_;
  at::ScalarType dtype_;
  int rank_;
  std::unique_ptr<profile::FlopsProfiler> profiler_;
  bool counting_ = false;
  Totals mark_;
  Throughput throughput_;
};

}  // namespace zero::telemetry
