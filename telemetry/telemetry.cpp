// Telemetry (telemetry.h): the core's events handed to the pieces that
// measure and report.
#include "telemetry/telemetry.h"

#include <utility>

#include "zero/comm.h"
#include "zero/log.h"

namespace zero::telemetry {

Telemetry::Telemetry(const Config& config, int rank, torch::nn::Module& module, at::Device model_device,
                     at::ScalarType dtype, bool pipelined, std::function<MemoryReport()> memory,
                     std::unique_ptr<monitor::Monitors> monitors)
    : config_(config),
      rank_(rank),
      memory_(std::move(memory)),
      timer_(model_device),
      profile_(config, module, model_device, dtype, pipelined, rank),
      progress_(config, pipelined),
      monitors_(config, model_device, std::move(monitors)) {
  if (config.comms_logger.enabled) {  // process-wide, as deepspeed.comm's logger
    const CommsLoggerConfig& c = config.comms_logger;
    comm::configure_comms_logger({true, c.verbose, c.prof_all, c.prof_ops});
  }
}

Telemetry::~Telemetry() {
  if (!config_.comms_logger.enabled) return;
  log_comms_summary("at the end");
  comm::configure_comms_logger({});  // this engine turned it on
}

void Telemetry::forward_starts(int64_t global_steps, int64_t gathered) {
  timer_.forward_starts(gathered);
  profile_.forward_starts(global_steps, timer_.total());
}

void Telemetry::backward_starts(const at::Tensor& loss, int64_t gathered) {
  timer_.backward_starts(gathered);
  profile_.backward_starts();
  const at::Tensor detached = loss.detach().to(at::kFloat).reshape({});
  progress_.add_loss(detached);
  monitors_.add_loss(detached);
}

void Telemetry::backward_ends(Clock::time_point reduce_start) { timer_.backward_ends(reduce_start); }

void Telemetry::pipeline_batch_done(const PipelineTimes& times, double agreed_loss) {
  timer_.pipeline_batch_done(times);
  progress_.add_loss(torch::tensor(agreed_loss, at::kFloat));
}

void Telemetry::step_done(const StepRecord& record) {
  timer_.step_done(record);
  profile_.step_done(timer_.total());
}

at::Tensor Telemetry::record_step(const StepRecord& record) {
  return monitors_.record(record, timer_.total(), profile_.throughput(), memory_);
}

void Telemetry::write_progress(const StepRecord& record, double loss) {
  progress_.write(record, loss, timer_.total(), profile_.throughput(), memory_());
  log_comms_summary("at step " + std::to_string(record.global_steps));
}

void Telemetry::log_comms_summary(const std::string& when) {
  if (!config_.comms_logger.enabled || rank_ != 0) return;
  log::info("comms", "collectives of this rank so far (" + when + "):\n" + comm::comms_summary());
}

}  // namespace zero::telemetry
