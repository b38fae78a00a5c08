#include "zero/log.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>

#include "core/env.h"
#include "core/write_failure.h"
#include "zero/launch_info.h"

namespace zero::log {
namespace {

struct State {
  std::mutex mu;
  int rank = 0;
  Level level = Level::Info;
  bool all_ranks = false;
  std::set<int> ranks{0};
  std::set<std::string> warned;
};

// A setting the log cannot use is said once on stderr, naming the variable,
// and the default stands: the log is set up on its first line, where
// nothing can be thrown (core/ throws nothing), and a typo in a log setting
// should not stop a run.
void bad_setting(const std::string& name, const std::string& value, const std::string& expected,
                 const std::string& instead) {
  std::fprintf(stderr, "zero: %s=%s: expected %s; %s\n", name.c_str(), value.c_str(), expected.c_str(), instead.c_str());
}

Level parse_level(const std::string& s) {
  if (s == "debug") return Level::Debug;
  if (s == "warn" || s == "warning") return Level::Warn;
  if (s == "error") return Level::Error;
  if (s != "info") bad_setting("ZERO_LOG_LEVEL", s, "debug, info, warn or error", "logging at info");
  return Level::Info;
}

State& state() {
  static State* s = [] {
    auto* st = new State();
    st->level = parse_level(env::log_level());
    const std::string ranks = env::log_ranks();
    if (ranks == "all") {
      st->all_ranks = true;
    } else if (!ranks.empty()) {
      std::set<int> listed;
      std::stringstream ss(ranks);
      bool ok = true;
      for (std::string item; ok && std::getline(ss, item, ',');) {
        const auto r = env::parse_whole_number(item, 0, comm::LaunchInfo::kMaxWorldSize - 1);
        if (r) listed.insert(static_cast<int>(*r));
        ok = r.has_value();
      }
      if (ok && !listed.empty()) {
        st->ranks = listed;
      } else {
        bad_setting("ZERO_LOG_RANKS", ranks,
                    "all or ranks separated by commas (whole numbers from 0 to " +
                        std::to_string(comm::LaunchInfo::kMaxWorldSize - 1) + ")",
                    "rank 0 logs");
      }
    }
    return st;
  }();
  return *s;
}

const char* level_name(Level l) {
  switch (l) {
    case Level::Debug: return "debug";
    case Level::Info: return "info";
    case Level::Warn: return "warning";
    case Level::Error: return "error";
  }
  return "";
}

}  // namespace

void set_rank(int r) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().rank = r;
}

int rank() { return state().rank; }

void set_level(Level level) {
  std::lock_guard<std::mutex> lock(state().mu);
  state().level = level;
}

bool enabled(Level level) {
  State& s = state();
  if (level < s.level) return false;
  if (level == Level::Error) return true;
  return s.all_ranks || s.ranks.count(s.rank) > 0;
}

void write(Level level, const std::string& subsystem, const std::string& message) {
  if (!enabled(level)) return;
  State& s = state();
  std::ostringstream line;
  if (s.rank != 0) line << "[rank " << s.rank << "] ";
  line << "zero";
  if (!subsystem.empty()) line << "." << subsystem;
  if (level != Level::Info) line << " " << level_name(level);
  line << ": " << message << "\n";
  const std::string text = line.str();
  FILE* out = level >= Level::Warn ? stderr : stdout;
  int failed = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    errno = 0;
    if (std::fwrite(text.data(), 1, text.size(), out) != text.size() || std::fflush(out) != 0) {
      failed = errno;
      std::clearerr(out);
    }
  }
  // A log on a full disk stops training like any writer (Note [Failed writes]
  // in core/write_failure.h); outside the lock, as the report logs too.
  if (write_failure::is_disk_error(failed)) write_failure::report("log", out == stderr ? "stderr" : "stdout", failed);
}

void warn_once(const std::string& key, const std::string& subsystem, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (!state().warned.insert(key).second) return;
  }
  write(Level::Warn, subsystem, message);
}

}  // namespace zero::log
