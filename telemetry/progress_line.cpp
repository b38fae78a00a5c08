// The progress line (progress_line.h).
#include "telemetry/progress_line.h"

#include <algorithm>
#include <sstream>
#include <string>

#include "core/byte_units.h"
#include "zero/activation_checkpointing.h"
#include "zero/comm.h"
#include "zero/log.h"

namespace zero::telemetry {

at::Tensor mean_loss(const at::Tensor& sum, int64_t count) {
  return (sum.defined() ? sum / static_cast<double>(std::max<int64_t>(count, 1)) : torch::zeros({}))
      .reshape({1})
      .to(at::kCPU)
      .to(at::kDouble);
}

void ProgressLine::add_loss(const at::Tensor& loss) {
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss;
  ++loss_count_;
}

bool ProgressLine::due(int64_t global_steps) const {
  const int64_t every = config_.steps_per_print;
  return every > 0 && global_steps % every == 0;
}

at::Tensor ProgressLine::window_loss() const { return mean_loss(loss_sum_, loss_count_); }

void ProgressLine::write(const StepRecord& r, double loss, const Totals& total, const Throughput& throughput,
                         const MemoryReport& memory) {
  const double elapsed = seconds_since(window_start_);
  const Totals d = total.since(mark_);
  const double steps = static_cast<double>(std::max<int64_t>(d.steps, 1));
  const double samples = static_cast<double>(*config_.batch.train_batch_size) * steps;
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(4);
  line << "step " << r.global_steps << " loss " << loss;
  line.precision(3);
  line << " lr " << std::scientific << r.lr << std::fixed << " loss_scale " << r.loss_scale << " skipped "
       << r.skipped_steps << " grad_norm " << r.grad_norm;
  line.precision(1);
  line << " samples/s " << samples / elapsed;
  line.precision(3);
  line << " step_time " << elapsed / steps << "s";
  if (throughput.flops_per_step > 0) {  // flops_profiler's count
    const double achieved = throughput.flops_per_step * steps / elapsed;
    line << " TFLOP/s " << achieved / 1e12;
    if (throughput.peak_flops > 0) line << " MFU " << 100.0 * achieved / throughput.peak_flops << "%";
  }
  line << " | " << memory.describe();
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
  loss_sum_ = at::Tensor();
  loss_count_ = 0;
  window_start_ = Clock::now();
  mark_ = total;
}

}  // namespace zero::telemetry
