#pragma once
// What the ranks agree on after an optimizer step, for the telemetry: the
// loss the progress line and the monitors show, averaged over the ranks,
// and in the same collective each rank's "a write failed" flag (Note
// [Failed writes] in core/write_failure.h), so that a failed write on any
// rank stops every rank at the same step. The telemetry only observes; its
// collectives and the reason to stop are here.
#include <torch/torch.h>

#include <memory>
#include <optional>

#include "monitor/monitor.h"
#include "telemetry/telemetry.h"
#include "zero/comm.h"
#include "zero/config.h"

namespace zero::engine {

// Rank 0's monitors (null elsewhere and without csv_monitor or tensorboard).
// A collective when they are on: every rank stops when rank 0 cannot open them.
std::unique_ptr<monitor::Monitors> open_monitors(const Config& config, comm::ProcessGroup& world);

class StepBoundary {
 public:
  StepBoundary(std::shared_ptr<comm::ProcessGroup> world, telemetry::Telemetry& telemetry)
      : pg_(std::move(world)), telemetry_(telemetry) {}
  StepBoundary(const StepBoundary&) = delete;
  StepBoundary& operator=(const StepBoundary&) = delete;

  // After each optimizer step, once the telemetry has its record: the
  // monitors' previous step written with its loss, this step's loss
  // all-reduce started (left running while the next step trains), and the
  // progress line with its window's loss when it is due. `agreed_loss`: a
  // pipeline's, the same on every rank already.
  void after_step(const telemetry::StepRecord& record, std::optional<double> agreed_loss);
  // Before a checkpoint: the monitors' pending step written and flushed,
  // and every rank's failed writes agreed on (throws on every rank).
  void flush();
  // At the end: the last step's loss written; what fails is logged.
  // (Engine::Impl's destructor then drops what failed as the engine went away.)
  void finish() noexcept;

 private:
  // Waits for the monitors' step in flight; writes it, or stops every rank.
  void write_pending();
  [[noreturn]] void stop_for_failed_write(int64_t step);

  std::shared_ptr<comm::ProcessGroup> pg_;
  telemetry::Telemetry& telemetry_;
  comm::WorkHandle pending_;
  at::Tensor pending_value_;                   // the step's loss and the flag, averaged
  std::optional<double> pending_agreed_loss_;  // a pipeline's
  int64_t pending_step_ = 0;
};

}  // namespace zero::engine
