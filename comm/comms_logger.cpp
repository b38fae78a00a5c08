// The comms logger (include/zero/comm.h): DeepSpeed's comms_logger, kept
// for the whole process under one mutex (a collective's record is a map
// update, next to a collective that takes microseconds at least).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>

#include "comm/internal.h"
#include "core/byte_units.h"
#include "zero/comm.h"
#include "zero/log.h"

namespace zero::comm {
namespace {

struct Log {
  std::mutex mu;
  CommsLoggerOptions options;
  std::map<std::pair<std::string, int64_t>, CommOpSummary> ops;
};
Log& the_log() {
  static Log log;
  return log;
}
std::atomic<bool> g_enabled{false};

// Gbit/s for `bytes` in `seconds`.
double gbps(double bytes, double seconds) { return seconds > 0 ? bytes * 8 / seconds / 1e9 : 0; }

// nccl-tests' bus-bandwidth factor for a group of n.
double bus_factor(const std::string& op, int n) {
  if (n <= 1) return 0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return static_cast<double>(n - 1) / n;
  return 1.0;
}

}  // namespace

void configure_comms_logger(const CommsLoggerOptions& options) {
  Log& log = the_log();
  std::lock_guard<std::mutex> lock(log.mu);
  log.options = options;
  g_enabled = options.enabled;
}

LoggedOp log_op(const char* op, int64_t message_bytes, int64_t sent_bytes, int group_size, int global_rank) {
  LoggedOp logged;
  if (!g_enabled.load(std::memory_order_relaxed)) return logged;
  Log& log = the_log();
  std::lock_guard<std::mutex> lock(log.mu);
  const auto& only = log.options.prof_ops;
  if (!log.options.prof_all && std::find(only.begin(), only.end(), op) == only.end()) return logged;
  logged.op = op;
  logged.message_bytes = message_bytes;
  logged.sent_bytes = sent_bytes;
  logged.group_size = group_size;
  logged.verbose = log.options.verbose && global_rank == 0;
  return logged;
}

void LoggedOp::record(double seconds) const {
  const double algbw = gbps(static_cast<double>(message_bytes), seconds);
  const double busbw = algbw * bus_factor(op, group_size);
  {
    Log& log = the_log();
    std::lock_guard<std::mutex> lock(log.mu);
    CommOpSummary& s = log.ops[{op, message_bytes}];
    s.op = op;
    s.message_bytes = message_bytes;
    ++s.count;
    s.sent_bytes += sent_bytes;
    s.latency_s += seconds;
    s.algbw_gbps_sum += algbw;
    s.busbw_gbps_sum += busbw;
  }
  if (verbose) {
    char line[256];
    std::snprintf(line, sizeof(line), "comm op: %s | time (ms): %.3f | msg size: %s | algbw (Gbps): %.2f | busbw (Gbps): %.2f",
                  op, seconds * 1e3, core::deepspeed_size(static_cast<double>(message_bytes)).c_str(), algbw, busbw);
    log::info("comms", line);
  }
}

std::vector<CommOpSummary> comms_log() {
  Log& log = the_log();
  std::lock_guard<std::mutex> lock(log.mu);
  std::vector<CommOpSummary> out;
  for (const auto& [key, s] : log.ops) out.push_back(s);
  return out;
}

void reset_comms_log() {
  Log& log = the_log();
  std::lock_guard<std::mutex> lock(log.mu);
  log.ops.clear();
}

std::string comms_summary() {
  const std::vector<CommOpSummary> ops = comms_log();
  std::string out;
  char row[256];
  std::snprintf(row, sizeof(row), "%-16s%-14s%-8s%-16s%-18s%-16s%-16s%-16s\n", "Comm. Op", "Message Size", "Count",
                "Sent per rank", "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)", "busbw_avg (Gbps)");
  out += row;
  std::string last_op;
  for (const CommOpSummary& s : ops) {
    if (s.op != last_op) out += s.op + "\n";
    last_op = s.op;
    const double n = static_cast<double>(std::max<int64_t>(s.count, 1));
    std::snprintf(row, sizeof(row), "%-16s%-14s%-8lld%-16s%-18.2f%-16.3f%-16.2f%-16.2f\n", "",
                  core::deepspeed_size(static_cast<double>(s.message_bytes)).c_str(), static_cast<long long>(s.count),
                  core::deepspeed_size(static_cast<double>(s.sent_bytes)).c_str(), s.latency_s * 1e3, s.latency_s * 1e3 / n,
                  s.algbw_gbps_sum / n, s.busbw_gbps_sum / n);
    out += row;
  }
  return out;
}

}  // namespace zero::comm
