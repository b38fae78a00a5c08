// flops_profiler's step (profile_step.h).
#include "telemetry/profile_step.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "profile/device_peak.h"
#include "zero/log.h"

namespace zero::telemetry {

ProfileStep::ProfileStep(const Config& config, torch::nn::Module& module, at::Device model_device, at::ScalarType dtype,
                         bool pipelined, int rank)
    : config_(config), model_device_(model_device), dtype_(dtype), rank_(rank) {
  if (!config.flops_profiler.enabled) return;
  if (pipelined) {
    log::warn("flops_profiler", "not available with pipeline stages (the pipeline runs forward itself); ignored");
    return;
  }
  profiler_ = std::make_unique<profile::FlopsProfiler>(module);
}

void ProfileStep::forward_starts(int64_t global_steps, const Totals& total) {
  if (!profiler_ || global_steps != config_.flops_profiler.profile_step) return;
  if (counting_) {
    profiler_->resume();  // the next micro-batch's forward
    return;
  }
  profiler_->start();
  counting_ = true;
  mark_ = total;
}

void ProfileStep::backward_starts() {
  if (counting_) profiler_->pause();  // forward only
}

// After the profiled step: DeepSpeed's report on rank 0, the step's FLOPs kept.
void ProfileStep::step_done(const Totals& total) {
  if (!counting_) return;
  profiler_->stop();
  counting_ = false;
  const FlopsProfilerConfig& c = config_.flops_profiler;
  throughput_.flops_per_step = (3.0 + c.recompute_fwd_factor) * profiler_->flops();
  throughput_.peak_flops = profile::training_peak_flops_per_s(model_device_, dtype_, c.peak_tflops);
  if (rank_ == 0) {
    const Totals d = total.since(mark_);
    profile::ProfileReport r;
    r.step = c.profile_step;
    r.world_size = config_.world_size();
    r.data_parallel_size = config_.data_parallel_size();
    r.model_parallel_size = config_.world_size() / std::max(1, config_.data_parallel_size());
    r.micro_batch = *config_.batch.train_micro_batch_size_per_gpu;
    r.micro_batches = *config_.batch.gradient_accumulation_steps;
    r.forward_s = d.forward;
    r.backward_s = d.backward + d.reduce;
    r.step_s = d.step;
    r.iteration_s = r.forward_s + r.backward_s + r.step_s;
    r.recompute_fwd_factor = c.recompute_fwd_factor;
    r.module_depth = static_cast<int>(c.module_depth);
    r.top_modules = static_cast<int>(c.top_modules);
    r.detailed = c.detailed;
    const std::string report = profile::format_report(*profiler_, r);
    if (c.output_file.empty()) {
      log::info("flops_profiler", report);
    } else if (std::FILE* f = std::fopen(c.output_file.c_str(), "w"); f && std::fputs(report.c_str(), f) >= 0 && std::fclose(f) == 0) {
      log::info("flops_profiler", "profile of step " + std::to_string(c.profile_step) + " written to " + c.output_file);
    } else {
      log::warn("flops_profiler", "cannot write " + c.output_file + " (" + std::strerror(errno) + "); the profile follows" + report);
    }
  }
  profiler_.reset();  // counted once, as DeepSpeed does
}

}  // namespace zero::telemetry
