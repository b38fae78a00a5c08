// The monitors' writer thread on its own (monitor/monitor.h), one process:
// a file on a full disk (/dev/full) is reported, naming the monitor, the
// file and ENOSPC's text (Note [Failed writes]); a disk that stalls (a FIFO
// nobody reads: open() blocks) never blocks write(), flush() or the
// destructor beyond their bound, and drops rows past the queue's capacity
// with one warning (Note [A stalled monitor disk]). Rows read back from the
// FIFO once it is opened are exactly the steps that were not dropped.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/write_failure.h"
#include "monitor/monitor.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("zero_monitor_writer_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::vector<zero::monitor::Event> step(int64_t n) { return {{"Train/Samples/train_loss", 0.5, n}}; }

TEST(MonitorWriter, AFullDiskIsReportedNamingTheMonitorAndTheFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const std::string dir = fresh_dir("full");
  const std::string file = dir + "/Train_Samples_train_loss.csv";
  fs::create_symlink("/dev/full", file);
  zero::write_failure::take();
  {
    std::vector<std::unique_ptr<zero::monitor::Sink>> sinks;
    sinks.push_back(zero::monitor::csv_sink(dir));
    zero::monitor::Monitors monitors(std::move(sinks));
    const auto start = Clock::now();
    monitors.write(step(1));  // the writer hands each batch to the kernel: it fails on the first
    while (!zero::write_failure::pending() && since(start) < 30) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_LT(since(start), 30) << "the failure was never reported";
    const auto before = Clock::now();
    monitors.write(step(2));  // dropped: the writer has failed
    EXPECT_TRUE(monitors.flush());
    EXPECT_LT(since(before), 5);
  }
  const std::string error = zero::write_failure::take();
  EXPECT_EQ(error, "csv_monitor: writing " + file + " failed: " + std::strerror(ENOSPC));
  EXPECT_FALSE(zero::write_failure::pending());
  fs::remove_all(dir);
}

TEST(MonitorWriter, AStalledDiskDropsRowsWithOneWarningAndNeverBlocks) {
  std::signal(SIGPIPE, SIG_IGN);
  const std::string dir = fresh_dir("stalled");
  const std::string fifo = dir + "/Train_Samples_train_loss.csv";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  constexpr size_t kQueue = 4;
  constexpr int kSteps = 20;
  testing::internal::CaptureStderr();
  const auto start = Clock::now();
  int64_t dropped = 0;
  {
    std::vector<std::unique_ptr<zero::monitor::Sink>> sinks;
    sinks.push_back(zero::monitor::csv_sink(dir));
    zero::monitor::Monitors monitors(std::move(sinks), kQueue, std::chrono::milliseconds(500));
    monitors.write(step(1));
    std::this_thread::sleep_for(std::chrono::seconds(1));  // the writer takes step 1 and blocks opening the FIFO
    for (int s = 2; s <= kSteps; ++s) monitors.write(step(s));
    EXPECT_LT(since(start), 3) << "write() waited for the stalled writer";
    EXPECT_FALSE(monitors.flush()) << "a stalled writer reported its files flushed";
    dropped = monitors.dropped();
  }  // the destructor leaves the stalled writer behind after 0.5 s
  EXPECT_LT(since(start), 10) << "the destructor waited for the stalled writer";
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(dropped, kSteps - 1 - static_cast<int64_t>(kQueue));
  size_t shown = 0;
  for (size_t at = warnings.find("dropping monitor rows"); at != std::string::npos;
       at = warnings.find("dropping monitor rows", at + 1)) {
    ++shown;
  }
  EXPECT_EQ(shown, 1u) << warnings;
  EXPECT_NE(warnings.find("not flushed"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("leaving it behind"), std::string::npos) << warnings;
  EXPECT_FALSE(zero::write_failure::pending()) << "a stall is not a failed write";

  // The disk comes back: the writer left behind writes what it had queued and ends.
  const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  std::string rows;
  const auto reading = Clock::now();
  while (since(reading) < 30) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0 && !rows.empty()) break;  // the writer closed its end: it has ended
    if (n > 0) rows.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  std::string expected;  // no header: a FIFO has no position to say it is new
  for (int s = 1; s <= 1 + static_cast<int>(kQueue); ++s) expected += std::to_string(s) + ",0.5\n";
  EXPECT_EQ(rows, expected);
  fs::remove_all(dir);
}

}  // namespace
