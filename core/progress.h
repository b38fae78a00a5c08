#pragma once
// A progress report for long operations that are not training steps
// (consolidating a checkpoint, loading one, preallocating NVMe swap files,
// the benchmarks' long runs). On a terminal: one bar redrawn in place with
// the share done, the rate and the time left; otherwise (a log file, CI) a
// plain line every `line_every_s` seconds and one at the end, and nothing
// at all for an operation done before the first line was due. Set
// ZERO_PROGRESS=0 to silence it. advance() may be called from any thread.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace zero {

struct ProgressOptions {
  std::FILE* out = stderr;
  double line_every_s = 10;     // plain lines, when `out` is not a terminal
  double bar_after_s = 0.5;     // the bar shows once the operation takes this long
  bool bytes = true;            // amounts are bytes ("1.20 GB"); else counts
  int terminal = -1;            // -1: ask isatty(out); 0 or 1 forces it (tests)
};

class Progress {
 public:
  // `show` false (a rank that is not the one reporting) makes it silent.
  Progress(std::string what, int64_t total, bool show = true, ProgressOptions options = {});
  ~Progress();  // finish()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t amount);
  void finish();

 private:
  void report(bool final);  // with mu_ held
  std::string amount(double v) const;
  std::string what_;
  int64_t total_ = 0, done_ = 0;
  bool show_ = true, terminal_ = false, finished_ = false, reported_ = false;
  ProgressOptions options_;
  std::chrono::steady_clock::time_point start_, last_;
  std::mutex mu_;
};

}  // namespace zero
