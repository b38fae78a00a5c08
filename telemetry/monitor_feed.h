#pragma once
// DeepSpeed's csv_monitor and tensorboard fed with each optimizer step's
// scalars under DeepSpeed's tags (and ours), the number of samples trained
// as the x axis. A step's events wait until its loss, the mean over its
// micro-batches and the data-parallel ranks, comes back from the engine's
// all-reduce (left running while the next step trains); then they are
// queued to rank 0's writer thread (monitor/monitor.h).
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "monitor/monitor.h"
#include "telemetry/profile_step.h"
#include "telemetry/step_timer.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero::telemetry {

// The step's loss, DeepSpeed's tag.
extern const char* const kLossTag;

// Whether the config asks for csv_monitor or tensorboard.
bool monitoring(const Config& config);
// Rank 0's monitors, their folders made (throws what monitor/ throws: the
// engine agrees on it across the ranks before training).
std::unique_ptr<monitor::Monitors> open_monitors(const Config& config);

class MonitorFeed {
 public:
  // `monitors`: rank 0's (open_monitors); null on the other ranks, which
  // still take part in each step's loss.
  MonitorFeed(const Config& config, at::Device model_device, std::unique_ptr<monitor::Monitors> monitors);
  bool on() const { return on_; }

  // Each micro-batch's loss, on any device.
  void add_loss(const at::Tensor& loss);
  // The step's events, held until `write`; returns this rank's mean loss of
  // the step (one fp64 element on the host) for the engine to average.
  // `memory` is read on rank 0 only.
  at::Tensor record(const StepRecord& r, const Totals& total, const Throughput& throughput,
                    const std::function<MemoryReport()>& memory);
  // The held step's events with its agreed loss, queued (rank 0).
  void write(double loss);
  // The held step's events dropped (a write failed: training stops).
  void drop() { pending_.clear(); }
  // Waits until what was queued is written.
  void flush();

 private:
  const Config& config_;
  at::Device model_device_;
  bool on_;
  std::unique_ptr<monitor::Monitors> monitors_;
  at::Tensor loss_sum_;
  int64_t loss_count_ = 0;
  Clock::time_point recorded_at_ = Clock::now();
  Totals mark_;
  int64_t pending_samples_ = 0;
  std::vector<monitor::Event> pending_;                  // the held step's, its loss aside
  std::map<std::string, comm::CommOpSummary> comms_;     // each collective kind's totals at the last record
};

}  // namespace zero::telemetry
