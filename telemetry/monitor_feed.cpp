// The monitors' feed (monitor_feed.h).
#include "telemetry/monitor_feed.h"

#include <utility>

#include "activations/activation_memory.h"
#include "telemetry/progress_line.h"
#include "zero/log.h"

namespace zero::telemetry {

const char* const kLossTag = "Train/Samples/train_loss";

namespace {
// <output_path>/<job_name>, or <job_name> in the working directory. (DeepSpeed's
// tensorboard falls back to ~/tensorboard/; zero keeps both monitors alike.)
std::string monitor_dir(const MonitorConfig& m) {
  return m.output_path.empty() ? m.job_name : m.output_path + "/" + m.job_name;
}
}  // namespace

bool monitoring(const Config& config) { return config.csv_monitor.enabled || config.tensorboard.enabled; }

std::unique_ptr<monitor::Monitors> open_monitors(const Config& config) {
  std::vector<std::unique_ptr<monitor::Sink>> sinks;
  if (config.csv_monitor.enabled) {
    sinks.push_back(monitor::csv_sink(monitor_dir(config.csv_monitor)));
    log::info("monitor", "csv_monitor writes each step's scalars to " + monitor_dir(config.csv_monitor) + "/");
  }
  if (config.tensorboard.enabled) {
    sinks.push_back(monitor::tensorboard_sink(monitor_dir(config.tensorboard)));
    log::info("monitor", "tensorboard writes each step's scalars to " + monitor_dir(config.tensorboard) + "/");
  }
  return std::make_unique<monitor::Monitors>(std::move(sinks));
}

MonitorFeed::MonitorFeed(const Config& config, at::Device model_device, std::unique_ptr<monitor::Monitors> monitors)
    : config_(config), model_device_(model_device), on_(monitoring(config)), monitors_(std::move(monitors)) {}

void MonitorFeed::add_loss(const at::Tensor& loss) {
  if (!on_) return;
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss;
  ++loss_count_;
}

at::Tensor MonitorFeed::record(const StepRecord& r, const Totals& total, const Throughput& throughput,
                               const std::function<MemoryReport()>& memory) {
  at::Tensor loss = mean_loss(loss_sum_, loss_count_);
  loss_sum_ = at::Tensor();
  loss_count_ = 0;
  const double step_s = seconds_since(recorded_at_);
  recorded_at_ = Clock::now();
  const Totals d = total.since(mark_);
  mark_ = total;
  pending_.clear();
  if (!monitors_) return loss;
  const int64_t batch = *config_.batch.train_batch_size;
  const int64_t samples = r.global_steps * batch;
  pending_samples_ = samples;
  std::vector<monitor::Event> events{{"Train/Samples/lr", r.lr, samples}};
  if (config_.fp16.enabled) events.push_back({"Train/Samples/loss_scale", r.loss_scale, samples});
  events.push_back({"Train/Samples/grad_norm", r.grad_norm, samples});
  events.push_back({"Train/Samples/skipped_steps", static_cast<double>(r.skipped_steps), samples});
  events.push_back({"Train/Samples/samples_per_sec", batch / step_s, samples});
  if (throughput.flops_per_step > 0) {  // after the profile step
    events.push_back({"Train/Samples/tflops", throughput.flops_per_step / step_s / 1e12, samples});
    if (throughput.peak_flops > 0) {
      events.push_back({"Train/Samples/mfu", throughput.flops_per_step / step_s / throughput.peak_flops, samples});
    }
  }
  if (config_.wall_clock_breakdown) {  // DeepSpeed's timer tags, this step's
    events.push_back({"Train/Samples/elapsed_time_ms_forward", d.forward * 1e3, samples});
    events.push_back({"Train/Samples/elapsed_time_ms_backward", d.backward * 1e3, samples});
    events.push_back({"Train/Samples/elapsed_time_ms_step", d.step * 1e3, samples});
  }
  const MemoryReport m = memory();
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
    for (const auto& [op, sum] : now) {
      const comm::CommOpSummary& before = comms_[op];
      const double calls = static_cast<double>(sum.count - before.count);
      if (calls == 0) continue;
      events.push_back({"Comms/" + op + "/sent_MB", (sum.sent_bytes - before.sent_bytes) / 1e6, samples});
      events.push_back({"Comms/" + op + "/latency_ms", (sum.latency_s - before.latency_s) * 1e3, samples});
      events.push_back({"Comms/" + op + "/busbw_avg_Gbps", (sum.busbw_gbps_sum - before.busbw_gbps_sum) / calls, samples});
    }
    comms_ = std::move(now);
  }
  pending_ = std::move(events);
  return loss;
}

void MonitorFeed::write(double loss) {
  if (!monitors_ || pending_.empty()) return;
  std::vector<monitor::Event> events;
  events.reserve(pending_.size() + 1);
  events.push_back({kLossTag, loss, pending_samples_});  // first, as DeepSpeed writes it
  for (auto& e : pending_) events.push_back(std::move(e));
  pending_.clear();
  monitors_->write(std::move(events));
}

void MonitorFeed::flush() {
  if (monitors_) monitors_->flush();
}

}  // namespace zero::telemetry
