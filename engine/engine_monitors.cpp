// The engine's monitors (monitor/monitor.h): DeepSpeed's csv_monitor and
// tensorboard, fed with each optimizer step's scalars.
#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "activations/activation_memory.h"
#include "engine/engine_impl.h"
#include "engine/host_optimizer.h"
#include "profile/device_peak.h"
#include "zero/activation_checkpointing.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero {

namespace {

// <output_path>/<job_name>, or <job_name> in the working directory. (DeepSpeed's
// tensorboard falls back to ~/tensorboard/; zero keeps both monitors alike.)
std::string monitor_dir(const MonitorConfig& m) {
  return m.output_path.empty() ? m.job_name : m.output_path + "/" + m.job_name;
}

}  // namespace

void Engine::Impl::setup_monitors() {
  if (config.comms_logger.enabled) {  // process-wide, as deepspeed.comm's logger
    const CommsLoggerConfig& c = config.comms_logger;
    comm::configure_comms_logger({true, c.verbose, c.prof_all, c.prof_ops});
  }
  if (config.flops_profiler.enabled) {
    if (links) {
      log::warn("flops_profiler", "not available with pipeline stages (the pipeline runs forward itself); ignored");
    } else {
      flops_profiler = std::make_unique<profile::FlopsProfiler>(*module);
    }
  }
  if (!monitoring()) return;
  std::string error;
  if (pg->rank() == 0) {
    try {
      std::vector<std::unique_ptr<monitor::Sink>> sinks;
      if (config.csv_monitor.enabled) {
        sinks.push_back(monitor::csv_sink(monitor_dir(config.csv_monitor)));
        log::info("monitor", "csv_monitor writes each step's scalars to " + monitor_dir(config.csv_monitor) + "/");
      }
      if (config.tensorboard.enabled) {
        sinks.push_back(monitor::tensorboard_sink(monitor_dir(config.tensorboard)));
        log::info("monitor", "tensorboard writes each step's scalars to " + monitor_dir(config.tensorboard) + "/");
      }
      monitors = std::make_unique<monitor::Monitors>(std::move(sinks));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = comm::agreed_error(*pg, error, "monitors");  // every rank stops, not rank 0 alone
  if (!error.empty()) throw EngineError(error);
}

// The step's scalars under DeepSpeed's tags (and ours), the number of
// samples trained as the x axis. The loss is the step's mean over its
// micro-batches and the data-parallel ranks: one all-reduce per step, left
// running while the next step trains; the step's events are written when it
// is done (at the next record, a checkpoint or the end).
void Engine::Impl::record_step(std::optional<double> agreed_loss) {
  if (!monitoring()) return;
  write_pending_step();
  if (agreed_loss) {
    pending_loss_value = torch::tensor({*agreed_loss}, torch::kDouble);
  } else {
    pending_loss_value = (step_loss_sum.defined() ? step_loss_sum / static_cast<double>(std::max<int64_t>(step_loss_count, 1))
                                                  : torch::zeros({}))
                             .reshape({1})
                             .to(at::kCPU)
                             .to(at::kDouble);
    pending_loss = pg->all_reduce_async(pending_loss_value, comm::ReduceOp::Avg);
  }
  step_loss_sum = at::Tensor();
  step_loss_count = 0;
  const double step_s = std::chrono::duration<double>(Clock::now() - recorded_at).count();
  recorded_at = Clock::now();
  if (!monitors) return;
  const double loss = 0;  // filled in by write_pending_step
  const int64_t samples = steps.global_steps * *config.batch.train_batch_size;
  std::vector<monitor::Event> events{{"Train/Samples/train_loss", loss, samples},
                                     {"Train/Samples/lr", steps.lr, samples}};
  if (scaler) events.push_back({"Train/Samples/loss_scale", scaler->scale(), samples});
  events.push_back({"Train/Samples/grad_norm", last_norm, samples});
  events.push_back({"Train/Samples/skipped_steps", static_cast<double>(steps.skipped_steps), samples});
  events.push_back({"Train/Samples/samples_per_sec", *config.batch.train_batch_size / step_s, samples});
  if (flops_per_step > 0) {  // after the profile step
    events.push_back({"Train/Samples/tflops", flops_per_step / step_s / 1e12, samples});
    if (peak_flops > 0) events.push_back({"Train/Samples/mfu", flops_per_step / step_s / peak_flops, samples});
  }
  if (config.wall_clock_breakdown) {  // DeepSpeed's timer tags, this step's
    events.push_back({"Train/Samples/elapsed_time_ms_forward", (t_forward - recorded_forward) * 1e3, samples});
    events.push_back({"Train/Samples/elapsed_time_ms_backward", (t_backward - recorded_backward) * 1e3, samples});
    events.push_back({"Train/Samples/elapsed_time_ms_step", (t_step - recorded_step) * 1e3, samples});
    recorded_forward = t_forward, recorded_backward = t_backward, recorded_step = t_step;
  }
  const MemoryReport m = memory();
  events.push_back({"Train/Memory/params_MB", m.params / 1e6, samples});
  events.push_back({"Train/Memory/gradients_MB", m.gradients / 1e6, samples});
  events.push_back({"Train/Memory/fp32_master_MB", m.fp32_master / 1e6, samples});
  events.push_back({"Train/Memory/optimizer_states_MB", m.optimizer_states / 1e6, samples});
  if (m.activations_peak > 0) events.push_back({"Train/Memory/activations_peak_MB", m.activations_peak / 1e6, samples});
  if (const int64_t peak = activations::peak_allocated_bytes(model_device); peak >= 0) {  // the accelerator allocator's
    events.push_back({"Train/Memory/device_allocated_peak_MB", peak / 1e6, samples});
  }
  if (config.comms_logger.enabled) {  // this step's traffic by collective kind
    std::map<std::string, comm::CommOpSummary> now;
    for (const comm::CommOpSummary& c : comm::comms_log()) {
      comm::CommOpSummary& sum = now[c.op];
      sum.count += c.count, sum.sent_bytes += c.sent_bytes, sum.latency_s += c.latency_s;
      sum.busbw_gbps_sum += c.busbw_gbps_sum;
    }
    for (const auto& [op, total] : now) {
      const comm::CommOpSummary& before = comms_recorded[op];
      const double calls = static_cast<double>(total.count - before.count);
      if (calls == 0) continue;
      events.push_back({"Comms/" + op + "/sent_MB", (total.sent_bytes - before.sent_bytes) / 1e6, samples});
      events.push_back({"Comms/" + op + "/latency_ms", (total.latency_s - before.latency_s) * 1e3, samples});
      events.push_back({"Comms/" + op + "/busbw_avg_Gbps", (total.busbw_gbps_sum - before.busbw_gbps_sum) / calls, samples});
    }
    comms_recorded = std::move(now);
  }
  pending_events = std::move(events);
}

void Engine::Impl::write_pending_step() {
  if (pending_loss) pending_loss->wait();
  pending_loss.reset();
  if (monitors && !pending_events.empty()) {
    pending_events.front().value = pending_loss_value.item<double>();  // train_loss comes first
    monitors->write(std::move(pending_events));
  }
  pending_events.clear();
}

void Engine::Impl::flush_monitors() {
  if (!monitoring()) return;
  write_pending_step();
  if (monitors) monitors->flush();
}

void Engine::Impl::log_comms_summary(const std::string& when) {
  if (!config.comms_logger.enabled || pg->rank() != 0) return;
  log::info("comms", "collectives of this rank so far (" + when + "):\n" + comm::comms_summary());
}

void Engine::Impl::profile_forward_starts() {
  if (steps.global_steps != config.flops_profiler.profile_step) return;
  if (profiling) {
    flops_profiler->resume();  // the next micro-batch's forward
    return;
  }
  flops_profiler->start();
  profiling = true;
  profile_t0_forward = t_forward, profile_t0_backward = t_backward + t_reduce, profile_t0_step = t_step;
}

// After the profiled step: DeepSpeed's report on rank 0, the step's FLOPs kept.
void Engine::Impl::finish_profile() {
  if (!profiling) return;
  flops_profiler->stop();
  profiling = false;
  const FlopsProfilerConfig& c = config.flops_profiler;
  flops_per_step = (3.0 + c.recompute_fwd_factor) * flops_profiler->flops();
  peak_flops = profile::training_peak_flops_per_s(model_device, dtype, c.peak_tflops);
  if (pg->rank() == 0) {
    profile::ProfileReport r;
    r.step = c.profile_step;
    r.world_size = config.world_size();
    r.data_parallel_size = config.data_parallel_size();
    r.model_parallel_size = config.world_size() / std::max(1, config.data_parallel_size());
    r.micro_batch = *config.batch.train_micro_batch_size_per_gpu;
    r.micro_batches = gas;
    r.forward_s = t_forward - profile_t0_forward;
    r.backward_s = t_backward + t_reduce - profile_t0_backward;
    r.step_s = t_step - profile_t0_step;
    r.iteration_s = r.forward_s + r.backward_s + r.step_s;
    r.recompute_fwd_factor = c.recompute_fwd_factor;
    r.module_depth = static_cast<int>(c.module_depth);
    r.top_modules = static_cast<int>(c.top_modules);
    r.detailed = c.detailed;
    const std::string report = profile::format_report(*flops_profiler, r);
    if (c.output_file.empty()) {
      log::info("flops_profiler", report);
    } else if (std::FILE* f = std::fopen(c.output_file.c_str(), "w"); f && std::fputs(report.c_str(), f) >= 0 && std::fclose(f) == 0) {
      log::info("flops_profiler", "profile of step " + std::to_string(c.profile_step) + " written to " + c.output_file);
    } else {
      log::warn("flops_profiler", "cannot write " + c.output_file + " (" + std::strerror(errno) + "); the profile follows" + report);
    }
  }
  flops_profiler.reset();  // counted once, as DeepSpeed does
}

Engine::Impl::~Impl() {
  try {
    write_pending_step();  // every rank waits for its part of the last loss
  } catch (const std::exception& e) {
    log::warn("monitor", std::string("the last step's loss was not written: ") + e.what());
  }
  if (ActivationCheckpointOptions a = activation_checkpointing_options(); a.partition) {
    a.partition = nullptr;  // this engine's group: checkpoints after it keep whole inputs
    configure_activation_checkpointing(a);
  }
  if (!config.comms_logger.enabled) return;
  log_comms_summary("at the end");
  comm::configure_comms_logger({});  // this engine turned it on
}

void Engine::Impl::log_progress() {
  ++window_steps;
  const int64_t every = config.steps_per_print;
  if (every <= 0 || steps.global_steps % every != 0) return;
  at::Tensor mean = (loss_sum.defined() ? loss_sum / static_cast<double>(std::max<int64_t>(loss_count, 1))
                                        : torch::zeros({}))
                        .reshape({1})
                        .to(at::kCPU)
                        .to(at::kDouble);
  pg->all_reduce(mean, comm::ReduceOp::Avg);
  const double elapsed = seconds_since(window_start);
  const double samples = static_cast<double>(*config.batch.train_batch_size) * window_steps;
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(4);
  line << "step " << steps.global_steps << " loss " << mean.item<double>();
  line.precision(3);
  line << " lr " << std::scientific << steps.lr << std::fixed << " loss_scale " << (scaler ? scaler->scale() : 1.0)
       << " skipped " << steps.skipped_steps << " grad_norm " << last_norm;
  line.precision(1);
  line << " samples/s " << samples / elapsed;
  line.precision(3);
  line << " step_time " << elapsed / window_steps << "s";
  if (flops_per_step > 0) {  // flops_profiler's count
    const double achieved = flops_per_step * window_steps / elapsed;
    line << " TFLOP/s " << achieved / 1e12;
    if (peak_flops > 0) line << " MFU " << 100.0 * achieved / peak_flops << "%";
  }
  line << " | " << memory().describe();
  if (config.wall_clock_breakdown) {
    line.precision(1);
    const double per = 1000.0 / window_steps;
    line << " | ms/step forward " << t_forward * per << " backward " << t_backward * per << " reduce "
         << t_reduce * per << " step " << (t_step - t_gather) * per << " gather " << t_gather * per;
    if (links) line << " (pipeline wait " << t_pipeline_wait * per << ")";
    if (auto* host = optimizer->host()) {
      const auto timing = host->take_timing();
      line << " (host step " << timing.compute_s * per << ", nvme wait " << timing.nvme_wait_s * per << ")";
    }
  }
  if (config.activation_checkpointing.profile) {  // DeepSpeed's checkpointing timers
    const ActivationCheckpointStats c = take_activation_checkpoint_stats();
    line.precision(1);
    line << " | checkpoints/step " << c.forwards / static_cast<double>(window_steps) << ", ms/step checkpointed forward "
         << c.forward_s * 1000.0 / window_steps << " recompute " << c.recompute_s * 1000.0 / window_steps
         << ", inputs kept " << human_bytes(c.saved_bytes / window_steps) << "/step";
  }
  log::info("engine", line.str());
  log_comms_summary("at step " + std::to_string(steps.global_steps));
  loss_sum = at::Tensor();
  loss_count = 0;
  window_steps = 0;
  window_start = Clock::now();
  t_forward = t_backward = t_reduce = t_step = t_gather = t_pipeline_wait = 0;
  after_progress_log();
}

}  // namespace zero
