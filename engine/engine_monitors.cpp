// The engine's monitors (monitor/monitor.h): DeepSpeed's csv_monitor and
// tensorboard, fed with each optimizer step's scalars.
#include <torch/torch.h>

#include "engine/engine_impl.h"
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
// micro-batches and the data-parallel ranks (one all-reduce per step).
void Engine::Impl::record_step(std::optional<double> agreed_loss) {
  if (!monitoring()) return;
  double loss = 0;
  if (agreed_loss) {
    loss = *agreed_loss;
  } else {
    at::Tensor mean = (step_loss_sum.defined() ? step_loss_sum / static_cast<double>(std::max<int64_t>(step_loss_count, 1))
                                               : torch::zeros({}))
                          .reshape({1})
                          .to(at::kCPU)
                          .to(at::kDouble);
    pg->all_reduce(mean, comm::ReduceOp::Avg);
    loss = mean.item<double>();
  }
  step_loss_sum = at::Tensor();
  step_loss_count = 0;
  const double step_s = std::chrono::duration<double>(Clock::now() - recorded_at).count();
  recorded_at = Clock::now();
  if (!monitors) return;
  const int64_t samples = steps.global_steps * *config.batch.train_batch_size;
  std::vector<monitor::Event> events{{"Train/Samples/train_loss", loss, samples},
                                     {"Train/Samples/lr", steps.lr, samples}};
  if (scaler) events.push_back({"Train/Samples/loss_scale", scaler->scale(), samples});
  events.push_back({"Train/Samples/grad_norm", last_norm, samples});
  events.push_back({"Train/Samples/skipped_steps", static_cast<double>(steps.skipped_steps), samples});
  events.push_back({"Train/Samples/samples_per_sec", *config.batch.train_batch_size / step_s, samples});
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
  monitors->write(std::move(events));
}

}  // namespace zero
