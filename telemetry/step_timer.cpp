// The step's clocks (step_timer.h).
#include "telemetry/step_timer.h"

#include <algorithm>

#include "activations/activation_memory.h"

namespace zero::telemetry {

Totals Totals::since(const Totals& mark) const {
  Totals d;
  d.steps = steps - mark.steps;
  d.forward = forward - mark.forward, d.backward = backward - mark.backward, d.reduce = reduce - mark.reduce;
  d.step = step - mark.step, d.gather = gather - mark.gather, d.pipeline_wait = pipeline_wait - mark.pipeline_wait;
  d.host_step = host_step - mark.host_step, d.nvme_wait = nvme_wait - mark.nvme_wait;
  return d;
}

void StepTimer::forward_starts(int64_t gathered) {
  last_end_ = Clock::now();
  allocated_at_forward_ = activations::allocated_bytes(model_device_);
  gathered_at_forward_ = gathered;
}

void StepTimer::backward_starts(int64_t gathered) {
  backward_start_ = Clock::now();
  total_.forward += std::chrono::duration<double>(backward_start_ - last_end_).count();
  if (const int64_t now = activations::allocated_bytes(model_device_); now >= 0 && allocated_at_forward_ >= 0) {
    // Units forward left gathered (stage3_max_reuse_distance) are not activations.
    activations_peak_ = std::max(activations_peak_, now - allocated_at_forward_ - (gathered - gathered_at_forward_));
  }
}

void StepTimer::backward_ends(Clock::time_point reduce_start) {
  total_.backward += std::chrono::duration<double>(reduce_start - backward_start_).count();
  total_.reduce += seconds_since(reduce_start);
  last_end_ = Clock::now();
}

void StepTimer::pipeline_batch_done(const PipelineTimes& times) {
  total_.forward += times.forward_s;
  total_.backward += times.backward_s;
  total_.pipeline_wait += times.wait_s;
  activations_peak_ = std::max(activations_peak_, times.activations);
}

void StepTimer::step_done(const StepRecord& record) {
  ++total_.steps;
  total_.step += record.step_s;
  total_.gather += record.publish_s;
  total_.host_step += record.host_step_s;
  total_.nvme_wait += record.nvme_wait_s;
}

StepTimes StepTimer::take_step_times(double gather_wait_total) {
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

}  // namespace zero::telemetry
