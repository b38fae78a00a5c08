// The telemetry's pieces on their own (telemetry/): the step clock's split
// against the records it was given, the progress line's window mean
// against the losses' mean, and the monitors' feed read back from the CSV
// files it wrote. None of them runs a collective: one process, no group.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>

#include "telemetry/monitor_feed.h"
#include "telemetry/profile_step.h"
#include "telemetry/progress_line.h"
#include "telemetry/step_timer.h"
#include "zero/config.h"

namespace {

using namespace zero::telemetry;

zero::Config config_of(const std::string& extra = "") {
  zero::Config c = zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 3)" +
                                           (extra.empty() ? std::string() : ", " + extra) + "}");
  c.resolve(1);
  return c;
}

StepRecord record_of(int64_t step) {
  StepRecord r;
  r.global_steps = step;
  r.lr = 0.01 * static_cast<double>(step);
  r.grad_norm = 2.5;
  r.step_s = 0.5, r.publish_s = 0.125, r.host_step_s = 0.25, r.nvme_wait_s = 0.0625;
  return r;
}

// The last value of a csv_monitor file ("step,<name>" then "samples,value" rows).
std::pair<int64_t, double> last_row(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string line, last;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) last = line;
  const auto comma = last.find(',');
  if (comma == std::string::npos) return {-1, 0};
  return {std::stoll(last.substr(0, comma)), std::stod(last.substr(comma + 1))};
}

size_t rows(const std::filesystem::path& file) {
  std::ifstream in(file);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n == 0 ? 0 : n - 1;
}

TEST(StepTimer, SplitsTheStepAsTheRecordsSay) {
  StepTimer timer(at::Device(at::kCPU));
  const auto start = Clock::now();
  for (int64_t step = 1; step <= 2; ++step) {
    timer.forward_starts(/*gathered=*/0);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    timer.backward_starts(/*gathered=*/0);
    const auto reduce_start = Clock::now();
    timer.backward_ends(reduce_start);
    timer.step_done(record_of(step));
  }
  const double wall = seconds_since(start);
  const zero::StepTimes t = timer.take_step_times(/*gather_wait_total=*/0.75);
  EXPECT_EQ(t.steps, 2);
  EXPECT_DOUBLE_EQ(t.step, 2 * (0.5 - 0.125));  // the step without publishing
  EXPECT_DOUBLE_EQ(t.gather, 2 * 0.125);
  EXPECT_DOUBLE_EQ(t.host_step, 2 * 0.25);
  EXPECT_DOUBLE_EQ(t.nvme_wait, 2 * 0.0625);
  EXPECT_DOUBLE_EQ(t.gather_wait, 0.75);
  EXPECT_GE(t.forward, 2 * 0.002);
  EXPECT_LE(t.forward + t.backward + t.reduce, wall);
  // The next split starts from here.
  const zero::StepTimes next = timer.take_step_times(1.0);
  EXPECT_EQ(next.steps, 0);
  EXPECT_DOUBLE_EQ(next.step, 0.0);
  EXPECT_DOUBLE_EQ(next.gather_wait, 0.25);
}

TEST(StepTimer, APipelinesBatchAddsItsTimesAndActivations) {
  StepTimer timer(at::Device(at::kCPU));
  PipelineTimes p;
  p.forward_s = 0.25, p.backward_s = 0.5, p.wait_s = 0.125, p.activations = 4096;
  timer.pipeline_batch_done(p);
  timer.step_done(record_of(1));
  const zero::StepTimes t = timer.take_step_times(0);
  EXPECT_DOUBLE_EQ(t.forward, 0.25);
  EXPECT_DOUBLE_EQ(t.backward, 0.5);
  EXPECT_DOUBLE_EQ(t.pipeline_wait, 0.125);
  EXPECT_EQ(timer.activations_peak(), 4096);
}

TEST(ProgressLine, IsDueEveryStepsPerPrintAndAveragesItsWindow) {
  const zero::Config c = config_of();
  ProgressLine line(c, /*pipelined=*/false);
  EXPECT_FALSE(line.due(1));
  EXPECT_FALSE(line.due(2));
  EXPECT_TRUE(line.due(3));
  EXPECT_TRUE(line.due(6));
  EXPECT_DOUBLE_EQ(line.window_loss().item<double>(), 0.0);  // no losses yet
  for (float loss : {1.0f, 2.0f, 4.5f}) line.add_loss(torch::tensor(loss));
  const at::Tensor mean = line.window_loss();
  EXPECT_EQ(mean.numel(), 1);
  EXPECT_EQ(mean.scalar_type(), at::kDouble);
  EXPECT_NEAR(mean.item<double>(), (1.0 + 2.0 + 4.5) / 3, 1e-6);
  StepTimer timer(at::Device(at::kCPU));
  timer.step_done(record_of(3));
  line.write(record_of(3), mean.item<double>(), timer.total(), Throughput{}, zero::MemoryReport{});
  EXPECT_DOUBLE_EQ(line.window_loss().item<double>(), 0.0);  // a new window
}

class MonitorFeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("zero_monitor_feed_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  zero::Config config() const {
    return config_of(R"("csv_monitor": {"enabled": true, "output_path": ")" + dir_.string() + R"(", "job_name": "run"})");
  }
  std::filesystem::path file(const std::string& name) const { return dir_ / "run" / (name + ".csv"); }
  std::filesystem::path dir_;
};

TEST_F(MonitorFeedTest, WritesAStepWithTheLossItIsGiven) {
  const zero::Config c = config();
  ASSERT_TRUE(monitoring(c));
  MonitorFeed feed(c, at::Device(at::kCPU), open_monitors(c));
  ASSERT_TRUE(feed.on());
  feed.add_loss(torch::tensor(3.0f));
  feed.add_loss(torch::tensor(5.0f));
  StepTimer timer(at::Device(at::kCPU));
  timer.step_done(record_of(2));
  const at::Tensor local = feed.record(record_of(2), timer.total(), Throughput{}, [] { return zero::MemoryReport{}; });
  EXPECT_NEAR(local.item<double>(), 4.0, 1e-6);  // this rank's mean, for the engine to average
  feed.write(3.75);                              // the loss the ranks agreed on
  feed.flush();
  const int64_t samples = 2 * 4;                 // global_steps x train_batch_size
  EXPECT_EQ(last_row(file("Train_Samples_train_loss")), std::make_pair(samples, 3.75));
  EXPECT_EQ(last_row(file("Train_Samples_lr")), std::make_pair(samples, 0.02));
  EXPECT_EQ(last_row(file("Train_Samples_grad_norm")), std::make_pair(samples, 2.5));
}

TEST_F(MonitorFeedTest, ADroppedStepIsNotWritten) {
  const zero::Config c = config();
  MonitorFeed feed(c, at::Device(at::kCPU), open_monitors(c));
  StepTimer timer(at::Device(at::kCPU));
  timer.step_done(record_of(1));
  feed.record(record_of(1), timer.total(), Throughput{}, [] { return zero::MemoryReport{}; });
  feed.write(1.0);
  timer.step_done(record_of(2));
  feed.record(record_of(2), timer.total(), Throughput{}, [] { return zero::MemoryReport{}; });
  feed.drop();      // a write failed somewhere: the step stops training instead
  feed.write(2.0);  // nothing held any more
  feed.flush();
  EXPECT_EQ(rows(file("Train_Samples_train_loss")), 1u);
  EXPECT_EQ(last_row(file("Train_Samples_train_loss")), std::make_pair(int64_t{4}, 1.0));
}

TEST_F(MonitorFeedTest, ARankWithoutMonitorsStillGivesItsLoss) {
  const zero::Config c = config();
  MonitorFeed feed(c, at::Device(at::kCPU), nullptr);  // not rank 0
  feed.add_loss(torch::tensor(6.0f));
  StepTimer timer(at::Device(at::kCPU));
  const at::Tensor local = feed.record(record_of(1), timer.total(), Throughput{}, [] {
    ADD_FAILURE() << "only rank 0 reads the memory report";
    return zero::MemoryReport{};
  });
  EXPECT_NEAR(local.item<double>(), 6.0, 1e-6);
  feed.write(6.0);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run"));
}

TEST(ProfileStep, OffUnlessEnabled) {
  const zero::Config c = config_of();
  torch::nn::Linear model(4, 4);
  ProfileStep profile(c, *model, at::Device(at::kCPU), at::kFloat, false, 0);
  StepTimer timer(at::Device(at::kCPU));
  profile.forward_starts(c.flops_profiler.profile_step, timer.total());
  model(torch::ones({2, 4}));
  profile.backward_starts();
  profile.step_done(timer.total());
  EXPECT_DOUBLE_EQ(profile.throughput().flops_per_step, 0.0);
}

TEST(ProfileStep, CountsTheProfiledStepsForwardThreeTimes) {
  const zero::Config c = config_of(R"("flops_profiler": {"enabled": true, "profile_step": 1})");
  torch::nn::Linear model(8, 16);
  ProfileStep profile(c, *model, at::Device(at::kCPU), at::kFloat, false, /*rank=*/1);  // no report printed
  StepTimer timer(at::Device(at::kCPU));
  profile.forward_starts(1, timer.total());
  model(torch::ones({4, 8}));
  profile.backward_starts();
  profile.step_done(timer.total());
  // A linear layer's forward: 2 x batch x in x out for the matmul, plus the bias add.
  const double forward = 2.0 * 4 * 8 * 16;
  EXPECT_GE(profile.throughput().flops_per_step, 3 * forward);
  EXPECT_LE(profile.throughput().flops_per_step, 3 * (forward + 4 * 16));
}

}  // namespace
