// Telemetry (telemetry.h): the step's timers, the progress line, DeepSpeed's
// csv_monitor and tensorboard (monitor/monitor.h) fed with each optimizer
// step's scalars, the flops_profiler's report and the comms summary.
#include "engine/telemetry.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "activations/activation_memory.h"
#include "core/byte_units.h"
#include "core/write_failure.h"
#include "profile/device_peak.h"
#include "zero/activation_checkpointing.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::engine {

namespace {

// The step's loss, DeepSpeed's tag: its value arrives after the other events are made.
const std::string kLossTag = "Train/Samples/train_loss";

// <output_path>/<job_name>, or <job_name> in the working directory. (DeepSpeed's
// tensorboard falls back to ~/tensorboard/; zero keeps both monitors alike.)
std::string monitor_dir(const MonitorConfig& m) {
  return m.output_path.empty() ? m.job_name : m.output_path + "/" + m.job_name;
}

// A loss sum's mean as a 1-element fp64 host tensor (zero without losses).
at::Tensor mean_of(const at::Tensor& sum, int64_t count) {
  return (sum.defined() ? sum / static_cast<double>(std::max<int64_t>(count, 1)) : torch::zeros({}))
      .reshape({1})
      .to(at::kCPU)
      .to(at::kDouble);
}

// `value` (1 element, fp64) and this rank's "a write failed" flag, for a
// step boundary's collective to carry (Note [Failed writes] in core/write_failure.h).
at::Tensor with_write_flag(const at::Tensor& value) {
  return torch::cat({value, torch::tensor({write_failure::pending() ? 1.0 : 0.0}, torch::kDouble)});
}

}  // namespace

Telemetry::Totals Telemetry::Totals::since(const Totals& mark) const {
  Totals d;
  d.steps = steps - mark.steps;
  d.forward = forward - mark.forward, d.backward = backward - mark.backward, d.reduce = reduce - mark.reduce;
  d.step = step - mark.step, d.gather = gather - mark.gather, d.pipeline_wait = pipeline_wait - mark.pipeline_wait;
  d.host_step = host_step - mark.host_step, d.nvme_wait = nvme_wait - mark.nvme_wait;
  return d;
}

Telemetry::Telemetry(const Config& config, std::shared_ptr<comm::ProcessGroup> world, torch::nn::Module& module,
                     at::Device model_device, at::ScalarType dtype, bool pipelined, std::function<MemoryReport()> memory)
    : config_(config),
      pg_(std::move(world)),
      module_(module),
      model_device_(model_device),
      dtype_(dtype),
      pipelined_(pipelined),
      memory_(std::move(memory)) {
  setup_monitors();
}

void Telemetry::setup_monitors() {
  if (config_.comms_logger.enabled) {  // process-wide, as deepspeed.comm's logger
    const CommsLoggerConfig& c = config_.comms_logger;
    comm::configure_comms_logger({true, c.verbose, c.prof_all, c.prof_ops});
  }
  if (config_.flops_profiler.enabled) {
    if (pipelined_) {
      log::warn("flops_profiler", "not available with pipeline stages (the pipeline runs forward itself); ignored");
    } else {
      flops_profiler_ = std::make_unique<profile::FlopsProfiler>(module_);
    }
  }
  if (!monitoring()) return;
  std::string error;
  if (pg_->rank() == 0) {
    try {
      std::vector<std::unique_ptr<monitor::Sink>> sinks;
      if (config_.csv_monitor.enabled) {
        sinks.push_back(monitor::csv_sink(monitor_dir(config_.csv_monitor)));
        log::info("monitor", "csv_monitor writes each step's scalars to " + monitor_dir(config_.csv_monitor) + "/");
      }
      if (config_.tensorboard.enabled) {
        sinks.push_back(monitor::tensorboard_sink(monitor_dir(config_.tensorboard)));
        log::info("monitor", "tensorboard writes each step's scalars to " + monitor_dir(config_.tensorboard) + "/");
      }
      monitors_ = std::make_unique<monitor::Monitors>(std::move(sinks));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = comm::agreed_error(*pg_, error, "monitors");  // every rank stops, not rank 0 alone
  if (!error.empty()) throw EngineError(error);
}

Telemetry::~Telemetry() {
  try {
    write_pending_step();  // every rank waits for its part of the last loss
  } catch (const std::exception& e) {
    log::warn("monitor", std::string("the last step's loss was not written: ") + e.what());
  }
  monitors_.reset();
  // What failed as the engine went away was logged; the next engine in this process starts clean.
  write_failure::take();
  if (!config_.comms_logger.enabled) return;
  log_comms_summary("at the end");
  comm::configure_comms_logger({});  // this engine turned it on
}

void Telemetry::forward_starts(int64_t global_steps) {
  last_end_ = Clock::now();
  allocated_at_forward_ = activations::allocated_bytes(model_device_);
  if (!flops_profiler_ || global_steps != config_.flops_profiler.profile_step) return;
  if (profiling_) {
    flops_profiler_->resume();  // the next micro-batch's forward
    return;
  }
  flops_profiler_->start();
  profiling_ = true;
  profile_mark_ = total_;
}

void Telemetry::backward_starts(const at::Tensor& loss) {
  backward_start_ = Clock::now();
  total_.forward += std::chrono::duration<double>(backward_start_ - last_end_).count();
  if (profiling_) flops_profiler_->pause();  // forward only
  if (const int64_t now = activations::allocated_bytes(model_device_); now >= 0 && allocated_at_forward_ >= 0) {
    activations_peak_ = std::max(activations_peak_, now - allocated_at_forward_);
  }
  at::Tensor detached = loss.detach().to(at::kFloat).reshape({});
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + detached : detached;
  ++loss_count_;
  if (monitoring()) {
    step_loss_sum_ = step_loss_sum_.defined() ? step_loss_sum_ + detached : detached;
    ++step_loss_count_;
  }
}

void Telemetry::backward_ends(Clock::time_point reduce_start) {
  total_.backward += std::chrono::duration<double>(reduce_start - backward_start_).count();
  total_.reduce += seconds_since(reduce_start);
  last_end_ = Clock::now();
}

void Telemetry::pipeline_batch_done(const PipelineTimes& times, double agreed_loss) {
  total_.forward += times.forward_s;
  total_.backward += times.backward_s;
  total_.pipeline_wait += times.wait_s;
  activations_peak_ = std::max(activations_peak_, times.activations);
  at::Tensor loss = torch::tensor(agreed_loss, at::kFloat);
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss;
  ++loss_count_;
}

void Telemetry::step_done(const StepRecord& record, std::optional<double> agreed_loss) {
  ++total_.steps;
  total_.step += record.step_s;
  total_.gather += record.publish_s;
  total_.host_step += record.host_step_s;
  total_.nvme_wait += record.nvme_wait_s;
  finish_profile();
  record_step(record, agreed_loss);
  log_progress(record);
  forward_starts(record.global_steps);
}

StepTimes Telemetry::take_step_times(double gather_wait_total) {
  const Totals d = total_.since(times_mark_);
  times_mark_ = total_;
  StepTimes t;
  t.steps = d.steps;
  t.forward = d.forward, t.backward = d.backward, t.reduce = d.reduce;
  t.step = d.step - d.gather, t.gather = d.gather;
  t.pipeline_wait = d.pipeline_wait;
  t.host_step = d.host_step, t.nvme_wait = d.nvme_wait;
  t.gather_wait = gather_wait_total - gather_wait_mark_;
  gather_wait_mark_ = gather_wait_total;
  return t;
}

// The step's scalars under DeepSpeed's tags (and ours), the number of
// samples trained as the x axis. The loss is the step's mean over its
// micro-batches and the data-parallel ranks: one all-reduce per step, left
// running while the next step trains; the step's events are written when it
// is done (at the next record, a checkpoint or the end).
void Telemetry::record_step(const StepRecord& r, std::optional<double> agreed_loss) {
  if (!monitoring()) return;
  write_pending_step();
  // With the flag of Note [Failed writes]; a pipeline's loss is agreed already and kept as it is.
  pending_agreed_loss_ = agreed_loss;
  pending_loss_value_ = with_write_flag(agreed_loss ? torch::tensor({*agreed_loss}, torch::kDouble)
                                                    : mean_of(step_loss_sum_, step_loss_count_));
  pending_loss_ = pg_->all_reduce_async(pending_loss_value_, comm::ReduceOp::Avg);
  pending_step_ = r.global_steps;
  step_loss_sum_ = at::Tensor();
  step_loss_count_ = 0;
  const double step_s = seconds_since(recorded_at_);
  recorded_at_ = Clock::now();
  const Totals d = total_.since(record_mark_);
  record_mark_ = total_;
  if (!monitors_) return;
  const double loss = 0;  // filled in by write_pending_step, which finds it by its tag
  const int64_t samples = r.global_steps * *config_.batch.train_batch_size;
  std::vector<monitor::Event> events{{kLossTag, loss, samples}, {"Train/Samples/lr", r.lr, samples}};
  if (config_.fp16.enabled) events.push_back({"Train/Samples/loss_scale", r.loss_scale, samples});
  events.push_back({"Train/Samples/grad_norm", r.grad_norm, samples});
  events.push_back({"Train/Samples/skipped_steps", static_cast<double>(r.skipped_steps), samples});
  events.push_back({"Train/Samples/samples_per_sec", *config_.batch.train_batch_size / step_s, samples});
  if (flops_per_step_ > 0) {  // after the profile step
    events.push_back({"Train/Samples/tflops", flops_per_step_ / step_s / 1e12, samples});
    if (peak_flops_ > 0) events.push_back({"Train/Samples/mfu", flops_per_step_ / step_s / peak_flops_, samples});
  }
  if (config_.wall_clock_breakdown) {  // DeepSpeed's timer tags, this step's
    events.push_back({"Train/Samples/elapsed_time_ms_forward", d.forward * 1e3, samples});
    events.push_back({"Train/Samples/elapsed_time_ms_backward", d.backward * 1e3, samples});
    events.push_back({"Train/Samples/elapsed_time_ms_step", d.step * 1e3, samples});
  }
  const MemoryReport m = memory_();
  events.push_back({"Train/Memory/params_MB", m.params / 1e6, samples});
  events.push_back({"Train/Memory/gradients_MB", m.gradients / 1e6, samples});
  events.push_back({"Train/Memory/fp32_master_MB", m.fp32_master / 1e6, samples});
  events.push_back({"Train/Memory/optimizer_states_MB", m.optimizer_states / 1e6, samples});
  if (m.activations_peak > 0) events.push_back({"Train/Memory/activations_peak_MB", m.activations_peak / 1e6, samples});
  if (const int64_t peak = activations::peak_allocated_bytes(model_device_); peak >= 0) {  // the accelerator allocator's
    events.push_back({"Train/Memory/device_allocated_peak_MB", peak / 1e6, samples});
  }
  if (config_.comms_logger.enabled) {  // this step's traffic by collective kind
    std::map<std::string, comm::CommOpSummary> now;
    for (const comm::CommOpSummary& c : comm::comms_log()) {
      comm::CommOpSummary& sum = now[c.op];
      sum.count += c.count, sum.sent_bytes += c.sent_bytes, sum.latency_s += c.latency_s;
      sum.busbw_gbps_sum += c.busbw_gbps_sum;
    }
    for (const auto& [op, total] : now) {
      const comm::CommOpSummary& before = comms_recorded_[op];
      const double calls = static_cast<double>(total.count - before.count);
      if (calls == 0) continue;
      events.push_back({"Comms/" + op + "/sent_MB", (total.sent_bytes - before.sent_bytes) / 1e6, samples});
      events.push_back({"Comms/" + op + "/latency_ms", (total.latency_s - before.latency_s) * 1e3, samples});
      events.push_back({"Comms/" + op + "/busbw_avg_Gbps", (total.busbw_gbps_sum - before.busbw_gbps_sum) / calls, samples});
    }
    comms_recorded_ = std::move(now);
  }
  pending_events_ = std::move(events);
}

void Telemetry::write_pending_step() {
  if (!pending_loss_) return;
  pending_loss_->wait();
  pending_loss_.reset();
  const bool failed = pending_loss_value_[1].item<double>() > 0;
  if (monitors_ && !pending_events_.empty() && !failed) {
    const double loss = pending_agreed_loss_ ? *pending_agreed_loss_ : pending_loss_value_[0].item<double>();
    for (auto& event : pending_events_) {
      if (event.tag == kLossTag) event.value = loss;
    }
    monitors_->write(std::move(pending_events_));
  }
  pending_events_.clear();
  if (failed) stop_for_failed_write(pending_step_);
}

// Every rank is here together: the flag came in the same collective.
void Telemetry::stop_for_failed_write(int64_t step) {
  const std::string error = comm::agreed_error(*pg_, write_failure::take(), "a write failed on another rank");
  throw EngineError((error.empty() ? std::string("a write failed on another rank") : error) +
                    "\nevery rank stops at step " + std::to_string(step) +
                    ": free space (or point that output elsewhere) and resume from the last checkpoint");
}

void Telemetry::flush() {
  if (!monitoring()) return;
  write_pending_step();
  if (monitors_) monitors_->flush();
  // A collective every save pays anyway: the checkpoint must not go ahead on some ranks only.
  const std::string error = comm::agreed_error(*pg_, write_failure::take(), "a write failed on another rank");
  if (!error.empty()) throw EngineError(error + "\nthe checkpoint was not saved; free space (or point that output elsewhere)");
}

void Telemetry::log_comms_summary(const std::string& when) {
  if (!config_.comms_logger.enabled || pg_->rank() != 0) return;
  log::info("comms", "collectives of this rank so far (" + when + "):\n" + comm::comms_summary());
}

// After the profiled step: DeepSpeed's report on rank 0, the step's FLOPs kept.
void Telemetry::finish_profile() {
  if (!profiling_) return;
  flops_profiler_->stop();
  profiling_ = false;
  const FlopsProfilerConfig& c = config_.flops_profiler;
  flops_per_step_ = (3.0 + c.recompute_fwd_factor) * flops_profiler_->flops();
  peak_flops_ = profile::training_peak_flops_per_s(model_device_, dtype_, c.peak_tflops);
  if (pg_->rank() == 0) {
    const Totals d = total_.since(profile_mark_);
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
    const std::string report = profile::format_report(*flops_profiler_, r);
    if (c.output_file.empty()) {
      log::info("flops_profiler", report);
    } else if (std::FILE* f = std::fopen(c.output_file.c_str(), "w"); f && std::fputs(report.c_str(), f) >= 0 && std::fclose(f) == 0) {
      log::info("flops_profiler", "profile of step " + std::to_string(c.profile_step) + " written to " + c.output_file);
    } else {
      log::warn("flops_profiler", "cannot write " + c.output_file + " (" + std::strerror(errno) + "); the profile follows" + report);
    }
  }
  flops_profiler_.reset();  // counted once, as DeepSpeed does
}

void Telemetry::log_progress(const StepRecord& r) {
  const int64_t every = config_.steps_per_print;
  if (every <= 0 || r.global_steps % every != 0) return;
  at::Tensor mean = with_write_flag(mean_of(loss_sum_, loss_count_));
  pg_->all_reduce(mean, comm::ReduceOp::Avg);
  if (mean[1].item<double>() > 0) stop_for_failed_write(r.global_steps);
  const double elapsed = seconds_since(window_start_);
  const Totals d = total_.since(progress_mark_);
  const double steps = static_cast<double>(std::max<int64_t>(d.steps, 1));
  const double samples = static_cast<double>(*config_.batch.train_batch_size) * steps;
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(4);
  line << "step " << r.global_steps << " loss " << mean[0].item<double>();
  line.precision(3);
  line << " lr " << std::scientific << r.lr << std::fixed << " loss_scale " << r.loss_scale << " skipped "
       << r.skipped_steps << " grad_norm " << r.grad_norm;
  line.precision(1);
  line << " samples/s " << samples / elapsed;
  line.precision(3);
  line << " step_time " << elapsed / steps << "s";
  if (flops_per_step_ > 0) {  // flops_profiler's count
    const double achieved = flops_per_step_ * steps / elapsed;
    line << " TFLOP/s " << achieved / 1e12;
    if (peak_flops_ > 0) line << " MFU " << 100.0 * achieved / peak_flops_ << "%";
  }
  line << " | " << memory_().describe();
  if (config_.wall_clock_breakdown) {
    line.precision(1);
    const double per = 1000.0 / steps;
    line << " | ms/step forward " << d.forward * per << " backward " << d.backward * per << " reduce " << d.reduce * per
         << " step " << (d.step - d.gather) * per << " gather " << d.gather * per;
    if (pipelined_) line << " (pipeline wait " << d.pipeline_wait * per << ")";
    if (d.host_step > 0 || d.nvme_wait > 0) {
      line << " (host step " << d.host_step * per << ", nvme wait " << d.nvme_wait * per << ")";
    }
  }
  if (config_.activation_checkpointing.profile) {  // DeepSpeed's checkpointing timers
    const ActivationCheckpointStats c = take_activation_checkpoint_stats();
    line.precision(1);
    line << " | checkpoints/step " << c.forwards / steps << ", ms/step checkpointed forward "
         << c.forward_s * 1000.0 / steps << " recompute " << c.recompute_s * 1000.0 / steps << ", inputs kept "
         << core::human_bytes(static_cast<double>(c.saved_bytes / steps)) << "/step";
  }
  log::info("engine", line.str());
  log_comms_summary("at step " + std::to_string(r.global_steps));
  loss_sum_ = at::Tensor();
  loss_count_ = 0;
  window_start_ = Clock::now();
  progress_mark_ = total_;
}

}  // namespace zero::engine
