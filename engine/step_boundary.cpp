// The step boundary's agreement (step_boundary.h).
#include "engine/step_boundary.h"

#include <exception>
#include <string>

#include "core/write_failure.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::engine {

namespace {
// `value` (1 element, fp64) and this rank's "a write failed" flag, for the
// boundary's collective to carry.
at::Tensor with_write_flag(const at::Tensor& value) {
  return torch::cat({value, torch::tensor({write_failure::pending() ? 1.0 : 0.0}, torch::kDouble)});
}
}  // namespace

std::unique_ptr<monitor::Monitors> open_monitors(const Config& config, comm::ProcessGroup& world) {
  if (!telemetry::monitoring(config)) return nullptr;
  std::unique_ptr<monitor::Monitors> monitors;
  std::string error;
  if (world.rank() == 0) {
    try {
      monitors = telemetry::open_monitors(config);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = comm::agreed_error(world, error, "monitors");  // every rank stops, not rank 0 alone
  if (!error.empty()) throw EngineError(error);
  return monitors;
}

void StepBoundary::after_step(const telemetry::StepRecord& record, std::optional<double> agreed_loss) {
  telemetry::MonitorFeed& feed = telemetry_.monitors();
  if (feed.on()) {
    write_pending();
    const at::Tensor loss = telemetry_.record_step(record);
    pending_agreed_loss_ = agreed_loss;
    pending_value_ = with_write_flag(agreed_loss ? torch::tensor({*agreed_loss}, torch::kDouble) : loss);
    pending_ = pg_->all_reduce_async(pending_value_, comm::ReduceOp::Avg);
    pending_step_ = record.global_steps;
  }
  if (telemetry_.progress_due(record.global_steps)) {
    at::Tensor mean = with_write_flag(telemetry_.progress_loss());
    pg_->all_reduce(mean, comm::ReduceOp::Avg);
    if (mean[1].item<double>() > 0) stop_for_failed_write(record.global_steps);
    telemetry_.write_progress(record, mean[0].item<double>());
  }
}

void StepBoundary::write_pending() {
  if (!pending_) return;
  pending_->wait();
  pending_.reset();
  if (pending_value_[1].item<double>() > 0) {
    telemetry_.monitors().drop();
    stop_for_failed_write(pending_step_);
  }
  telemetry_.monitors().write(pending_agreed_loss_ ? *pending_agreed_loss_ : pending_value_[0].item<double>());
}

// Every rank is here together: the flag came in the same collective.
void StepBoundary::stop_for_failed_write(int64_t step) {
  const std::string error = comm::agreed_error(*pg_, write_failure::take(), "a write failed on another rank");
  throw EngineError((error.empty() ? std::string("a write failed on another rank") : error) +
                    "\nevery rank stops at step " + std::to_string(step) +
                    ": free space (or point that output elsewhere) and resume from the last checkpoint");
}

void StepBoundary::flush() {
  if (!telemetry_.monitors().on()) return;
  write_pending();
  telemetry_.monitors().flush();
  // A collective every save pays anyway: the checkpoint must not go ahead on some ranks only.
  const std::string error = comm::agreed_error(*pg_, write_failure::take(), "a write failed on another rank");
  if (!error.empty()) throw EngineError(error + "\nthe checkpoint was not saved; free space (or point that output elsewhere)");
}

void StepBoundary::finish() noexcept {
  try {
    write_pending();  // every rank waits for its part of the last loss
  } catch (const std::exception& e) {
    log::warn("monitor", std::string("the last step's loss was not written: ") + e.what());
  }
}

}  // namespace zero::engine
