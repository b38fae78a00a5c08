// The settings core/ reads from the environment outside the engine's checks:
// the log's ZERO_LOG_RANKS and ZERO_LOG_LEVEL, and the ZERO_FAULT test
// hook's count, all parsed by core/env.h's one parser of numbers. A value
// they cannot use is said on stderr, naming the variable, and the default
// stands. Each case runs in a child process, since the log reads its
// settings once per process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "core/env.h"
#include "core/fault.h"
#include "zero/log.h"

namespace {

struct Output {
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `body` in a child with NAME=VALUE set; its stdout and stderr.
Output in_child(const char* name, const char* value, const std::function<void()>& body) {
  const std::string base = ::testing::TempDir() + "/zero_env_settings_" + std::to_string(::getpid());
  const std::string out = base + ".out", err = base + ".err";
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr)) ::_exit(3);
    ::setenv(name, value, 1);
    body();
    std::fflush(nullptr);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child failed";
  Output o{slurp(out), slurp(err)};
  std::remove(out.c_str());
  std::remove(err.c_str());
  return o;
}

// Rank `rank` logs one info line.
std::function<void()> log_as(int rank) {
  return [rank] {
    zero::log::set_rank(rank);
    zero::log::info("test", "line of rank " + std::to_string(rank));
  };
}

TEST(LogRanks, AListOfRanksChoosesWhoLogs) {
  EXPECT_NE(in_child("ZERO_LOG_RANKS", "0,3", log_as(3)).out.find("line of rank 3"), std::string::npos);
  const Output two = in_child("ZERO_LOG_RANKS", "0,3", log_as(2));
  EXPECT_EQ(two.out.find("line of rank 2"), std::string::npos) << two.out;
  EXPECT_TRUE(two.err.empty()) << two.err;
  EXPECT_NE(in_child("ZERO_LOG_RANKS", "all", log_as(7)).out.find("line of rank 7"), std::string::npos);
}

TEST(LogRanks, AnythingButRanksIsSaidAndRankZeroLogs) {
  for (const char* bad : {"abc", "1,x", "-1", "0,,", "99999999999999999999", "65536", "3 "}) {
    const Output three = in_child("ZERO_LOG_RANKS", bad, log_as(3));
    EXPECT_NE(three.err.find(std::string("zero: ZERO_LOG_RANKS=") + bad + ": expected all or ranks separated by commas"),
              std::string::npos)
        << bad << ": " << three.err;
    EXPECT_NE(three.err.find("rank 0 logs"), std::string::npos) << three.err;
    EXPECT_EQ(three.out.find("line of rank 3"), std::string::npos) << bad << ": " << three.out;
    EXPECT_NE(in_child("ZERO_LOG_RANKS", bad, log_as(0)).out.find("line of rank 0"), std::string::npos) << bad;
  }
}

TEST(LogLevel, AnUnknownLevelIsSaidAndInfoStands) {
  const Output o = in_child("ZERO_LOG_LEVEL", "verbose", [] {
    zero::log::set_rank(0);
    zero::log::debug("test", "a debug line");
    zero::log::info("test", "an info line");
  });
  EXPECT_NE(o.err.find("zero: ZERO_LOG_LEVEL=verbose: expected debug, info, warn or error; logging at info"),
            std::string::npos)
      << o.err;
  EXPECT_NE(o.out.find("an info line"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("a debug line"), std::string::npos) << o.out;
  EXPECT_TRUE(in_child("ZERO_LOG_LEVEL", "warn", [] { zero::log::set_rank(0); }).err.empty());
}

TEST(FaultHook, TheCountIsAWholeNumberOrTheHookNeverFires) {
  // The third time rank 1 reaches the point.
  const Output third = in_child("ZERO_FAULT", "test.point:1:3", [] {
    for (int i = 1; i <= 4; ++i)
      if (zero::fault::fires("test.point", 1)) std::printf("fired at %d\n", i);
  });
  EXPECT_EQ(third.out, "fired at 3\n");
  for (const char* bad : {"test.point:1:x", "test.point:1:0", "test.point:1:3x", "test.point:1:"}) {
    const Output o = in_child("ZERO_FAULT", bad, [] {
      for (int i = 1; i <= 4; ++i)
        if (zero::fault::fires("test.point", 1)) std::printf("fired at %d\n", i);
    });
    EXPECT_TRUE(o.out.empty()) << bad << ": " << o.out;
    EXPECT_NE(o.err.find(std::string("zero: ZERO_FAULT=") + bad + ": the count after the rank must be a whole number"),
              std::string::npos)
        << bad << ": " << o.err;
  }
}

}  // namespace

namespace {

// Yes/no settings take DeepSpeed's and torch's spellings, in any case; any
// other value is an error naming the variable, never a quiet "off".
TEST(EnvFlags, EverySpellingOfYesAndNoAndNothingElse) {
  const char* name = "ZERO_CHECK_COLLECTIVES";
  const char* had = std::getenv(name);
  const std::string saved = had ? had : "";
  for (const char* yes : {"1", "true", "True", "TRUE", "yes", "on", "On"}) {
    ::setenv(name, yes, 1);
    const zero::env::Flag f = zero::env::check_collectives();
    EXPECT_TRUE(f.error.empty()) << yes << ": " << f.error;
    EXPECT_TRUE(f.value) << yes;
  }
  for (const char* no : {"0", "false", "False", "no", "off", "OFF"}) {
    ::setenv(name, no, 1);
    const zero::env::Flag f = zero::env::check_collectives();
    EXPECT_TRUE(f.error.empty()) << no << ": " << f.error;
    EXPECT_FALSE(f.value) << no;
  }
  ::setenv(name, "", 1);
  EXPECT_FALSE(zero::env::check_collectives().value);  // empty: the fallback
  EXPECT_TRUE(zero::env::progress_shown().value || std::getenv("ZERO_PROGRESS"));
  for (const char* bad : {"2", "y", "enable", " 1", "truthy"}) {
    ::setenv(name, bad, 1);
    const zero::env::Flag f = zero::env::check_collectives();
    EXPECT_NE(f.error.find(std::string("ZERO_CHECK_COLLECTIVES=") + bad + ": "), std::string::npos) << f.error;
    EXPECT_NE(f.error.find("1, true, yes or on, or 0, false, no or off (unset: off)"), std::string::npos) << f.error;
  }
  if (had) ::setenv(name, saved.c_str(), 1);
  else ::unsetenv(name);
}

}  // namespace
