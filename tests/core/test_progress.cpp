// The progress report (core/progress.h) written to a file: plain lines when
// the output is not a terminal (the share, the amounts, the rate and the
// time left, computed from what advance() was told), a bar redrawn with
// '\r' when it is, silence for a quick operation, and a closing line.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <regex>
#include <string>
#include <thread>

#include "core/progress.h"
#include "core/write_failure.h"

namespace {

// What `body` wrote through a Progress into a temporary file.
template <typename Body>
std::string written(Body body) {
  std::FILE* f = std::tmpfile();
  body(f);
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), f)) > 0;) text.append(buffer, n);
  std::fclose(f);
  return text;
}

TEST(Progress, PlainLinesCarryTheShareTheAmountsAndTheTimeLeft) {
  const std::string text = written([](std::FILE* f) {
    zero::ProgressOptions o;
    o.out = f, o.terminal = 0, o.line_every_s = 0.05;
    zero::Progress p("consolidate", 4'000'000, true, o);
    p.advance(1'000'000);  // before the first line is due: nothing
    std::this_thread::sleep_for(std::chrono::milliseconds(80));
    p.advance(1'000'000);  // 50%, a line
    p.advance(1'000'000);  // too soon for another
    p.advance(1'000'000);
    p.finish();
  });
  const std::regex line(R"(consolidate: (\d+)% \(([0-9.]+ [kMG]B) of 4\.0 MB\), [0-9.]+ [kMG]B/s, (ETA|in) \d+:\d\d\n)");
  std::vector<std::smatch> lines;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it) lines.push_back(*it);
  ASSERT_EQ(lines.size(), 2u) << text;
  EXPECT_EQ(lines[0][1], "50");
  EXPECT_EQ(lines[0][2], "2.0 MB");
  EXPECT_EQ(lines[0][3], "ETA");
  EXPECT_EQ(lines[1][1], "100");
  EXPECT_EQ(lines[1][3], "in") << "the last line says how long it took";
}

TEST(Progress, AQuickOperationStaysSilent) {
  const std::string text = written([](std::FILE* f) {
    zero::ProgressOptions o;
    o.out = f, o.terminal = 0;
    zero::Progress p("load", 100, true, o);
    p.advance(100);
  });
  EXPECT_TRUE(text.empty()) << text;
}

TEST(Progress, OnATerminalTheBarIsRedrawnInPlace) {
  const std::string text = written([](std::FILE* f) {
    zero::ProgressOptions o;
    o.out = f, o.terminal = 1, o.bar_after_s = 0, o.bytes = false;
    zero::Progress p("preallocate", 10, true, o);
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    p.advance(3);
  });
  EXPECT_NE(text.find("\rpreallocate [#########.....................]  30% 3/10"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n') << "finishing ends the bar's line";
}

TEST(Progress, ARankThatDoesNotReportWritesNothing) {
  const std::string text = written([](std::FILE* f) {
    zero::ProgressOptions o;
    o.out = f, o.terminal = 1, o.bar_after_s = 0;
    zero::Progress p("load", 10, /*show=*/false, o);
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    p.advance(5);
  });
  EXPECT_TRUE(text.empty());
}

// Its output on a full disk (/dev/full) is a failed write reported as
// Note [Failed writes] says (core/write_failure.h), naming the report, its
// output and ENOSPC's text; a closed pipe would not be (not the disk's fault).
TEST(Progress, AFullDiskIsAFailedWrite) {
  std::FILE* full = std::fopen("/dev/full", "w");
  if (!full) GTEST_SKIP() << "no /dev/full here";
  zero::write_failure::take();
  zero::ProgressOptions options;
  options.out = full;
  options.terminal = 0;
  options.line_every_s = 0;
  {
    zero::Progress progress("saving", 100, true, options);
    progress.advance(50);
  }
  std::fclose(full);
  EXPECT_EQ(zero::write_failure::take(), std::string("progress report: writing its file failed: ") + std::strerror(ENOSPC));
  EXPECT_TRUE(zero::write_failure::is_disk_error(ENOSPC));
  EXPECT_FALSE(zero::write_failure::is_disk_error(EPIPE));
}

}  // namespace
