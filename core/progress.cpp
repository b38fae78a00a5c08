// Progress (core/progress.h).
#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <mutex>

#include "core/env.h"
#include "core/write_failure.h"

namespace zero {
namespace {

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string clock_text(double s) {
  const long t = static_cast<long>(s + 0.5);
  char text[32];
  if (t >= 3600) {
    std::snprintf(text, sizeof(text), "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  } else {
    std::snprintf(text, sizeof(text), "%ld:%02ld", t / 60, t % 60);
  }
  return text;
}

}  // namespace

Progress::Progress(std::string what, int64_t total, bool show, ProgressOptions options)
    : what_(std::move(what)), total_(std::max<int64_t>(total, 0)), options_(options) {
  const env::Flag shown = env::progress_shown();
  static std::once_flag said;  // a bad setting is said once, not at every report
  if (!shown.error.empty()) std::call_once(said, [&] { std::fprintf(stderr, "zero: %s; showing progress\n", shown.error.c_str()); });
  show_ = show && (shown.value || !shown.error.empty());
  terminal_ = options_.terminal >= 0 ? options_.terminal == 1 : ::isatty(::fileno(options_.out)) == 1;
  start_ = last_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

void Progress::advance(int64_t amount) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = std::min(total_, done_ + amount);
  if (!show_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double since_start = seconds(now - start_), since_last = seconds(now - last_);
  const bool due = terminal_ ? since_start >= options_.bar_after_s && since_last >= 0.1
                             : since_last >= options_.line_every_s;
  if (!due) return;
  last_ = now;
  report(false);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (show_ && reported_) report(true);  // close what was shown; a quick one stays silent
}

std::string Progress::amount(double v) const {
  char text[32];
  if (!options_.bytes) {
    std::snprintf(text, sizeof(text), "%.0f", v);
  } else if (v >= 1e9) {
    std::snprintf(text, sizeof(text), "%.2f GB", v / 1e9);
  } else if (v >= 1e6) {
    std::snprintf(text, sizeof(text), "%.1f MB", v / 1e6);
  } else {
    std::snprintf(text, sizeof(text), "%.0f kB", v / 1e3);
  }
  return text;
}

void Progress::report(bool final) {
  reported_ = true;
  const double elapsed = seconds(std::chrono::steady_clock::now() - start_);
  const double share = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0;
  const std::string speed = amount(rate) + (options_.bytes ? "/s" : " per s");
  const std::string eta = final ? "in " + clock_text(elapsed)
                                : (rate > 0 ? "ETA " + clock_text(static_cast<double>(total_ - done_) / rate) : "ETA ?");
  errno = 0;
  if (terminal_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(share * kWidth);
    std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    std::fprintf(options_.out, "\r%s [%s] %3.0f%% %s/%s %s %s\033[K%s", what_.c_str(), bar.c_str(), share * 100,
                 amount(static_cast<double>(done_)).c_str(), amount(static_cast<double>(total_)).c_str(), speed.c_str(),
                 eta.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(options_.out, "%s: %.0f%% (%s of %s), %s, %s\n", what_.c_str(), share * 100,
                 amount(static_cast<double>(done_)).c_str(), amount(static_cast<double>(total_)).c_str(), speed.c_str(),
                 eta.c_str());
  }
  if (std::ferror(options_.out) || std::fflush(options_.out) != 0) {
    const int failed = errno;
    std::clearerr(options_.out);
    // Stops training like any writer on a full disk (Note [Failed writes] in core/write_failure.h).
    if (write_failure::is_disk_error(failed)) {
      write_failure::report("progress report", options_.out == stderr ? "stderr" : options_.out == stdout ? "stdout" : "its file",
                            failed);
    }
  }
}

}  // namespace zero
