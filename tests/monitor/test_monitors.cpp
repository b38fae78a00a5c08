// csv_monitor and tensorboard on 2 gloo ranks: rank 0 writes one CSV per
// scalar under <output_path>/<job_name>/ as DeepSpeed does ("step,<name>"
// header, the sample count as the step) and an event file beside them.
// Each step's train_loss equals the mean the test computes itself over
// micro-batches and ranks, and the progress line's loss, lr and grad_norm;
// the files are flushed by a checkpoint (what a crash after it would
// leave); a folder that cannot be made is a clear error on every rank.
// With ZERO_MONITOR_KEEP=DIR the first run's files stay in DIR for the
// independent event reader (read_events.py, run by CTest after this test),
// which checks every event against these CSV files.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "world_main.h"
#include "monitor/monitor.h"  // tensorboard_available
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
constexpr int kSteps = 5, kGas = 2;
constexpr int64_t kMicro = 3;

std::string shared_dir(const std::string& name) {
  at::Tensor pid = torch::tensor({static_cast<int64_t>(getpid())});
  g_world->broadcast(pid, 0);
  return (fs::temp_directory_path() / ("zero_csv_" + std::to_string(pid.item<int64_t>()) + "_" + name)).string();
}

std::string config_of(const std::string& output_path) {
  const std::string monitor = R"({"enabled": true, "output_path": ")" + output_path + R"(", "job_name": "run"})";
  return R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2, "steps_per_print": 1,
    "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 4}},
    "zero_optimization": {"stage": 1}, "csv_monitor": )" +
         monitor + (zero::monitor::tensorboard_available() ? R"(, "tensorboard": )" + monitor : "") + "}";
}

// (step, value) rows of one CSV file, after checking its header.
std::vector<std::pair<int64_t, double>> read_csv(const std::string& path, const std::string& header) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "step," + header) << path;
  std::vector<std::pair<int64_t, double>> rows;
  while (std::getline(in, line)) {
    const auto comma = line.find(',');
    rows.emplace_back(std::stoll(line.substr(0, comma)), std::stod(line.substr(comma + 1)));
  }
  return rows;
}

struct Trained {
  std::vector<double> losses;  // per step, the mean over micro-batches and ranks, computed here
  std::string log;             // rank 0's output (the progress lines)
};

Trained train(const std::string& dir, int steps, const std::string& checkpoint_dir = "", int save_at = -1) {
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  zero::InitOptions init;
  init.group = g_world;
  Trained out;
  testing::internal::CaptureStdout();
  {
    auto engine = zero::initialize(zero::Config::from_json(config_of(dir)), model, init);
    for (int step = 0; step < steps; ++step) {
      double sum = 0;
      for (int m = 0; m < kGas; ++m) {
        torch::manual_seed(100 + step * kGas + m + 1000 * g_world->rank());
        at::Tensor x = torch::randn({kMicro, 8}), y = torch::randn({kMicro, 1});
        at::Tensor loss = torch::mse_loss(model(x), y);
        sum += loss.item<double>();
        engine.backward(loss);
        engine.step();
      }
      at::Tensor mean = torch::tensor({sum / kGas}, torch::kDouble);
      g_world->all_reduce(mean, zero::comm::ReduceOp::Avg);
      out.losses.push_back(mean.item<double>());
      if (step + 1 == save_at) engine.save_checkpoint(checkpoint_dir);
      if (step + 1 == save_at && g_world->rank() == 0) {
        // Flushed by the checkpoint: the rows so far are on disk now.
        EXPECT_EQ(read_csv(dir + "/run/Train_Samples_train_loss.csv", "train_loss").size(), static_cast<size_t>(save_at));
      }
    }
  }
  out.log = testing::internal::GetCapturedStdout();
  return out;
}

TEST(CsvMonitor, ValuesMatchTheStepsAndTheProgressLine) {
  const char* keep = std::getenv("ZERO_MONITOR_KEEP");
  const std::string dir = keep ? keep : shared_dir("values");
  if (keep && g_world->rank() == 0) fs::remove_all(dir);
  g_world->barrier();
  const Trained t = train(dir, kSteps);
  if (g_world->rank() == 0) {
    const int64_t batch = kMicro * kGas * g_world->size();
    const auto loss = read_csv(dir + "/run/Train_Samples_train_loss.csv", "train_loss");
    const auto lr = read_csv(dir + "/run/Train_Samples_lr.csv", "lr");
    const auto norm = read_csv(dir + "/run/Train_Samples_grad_norm.csv", "grad_norm");
    ASSERT_EQ(loss.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(lr.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(norm.size(), static_cast<size_t>(kSteps));
    // The progress line of each step: "step N loss L lr R ... grad_norm G".
    const std::regex line(R"(step (\d+) loss ([0-9.]+) lr ([0-9.e+-]+) .* grad_norm ([0-9.]+))");
    std::vector<std::smatch> lines;
    for (auto it = std::sregex_iterator(t.log.begin(), t.log.end(), line); it != std::sregex_iterator(); ++it) {
      lines.push_back(*it);
    }
    ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps)) << t.log;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(loss[s].first, (s + 1) * batch) << "the x axis counts samples";
      EXPECT_NEAR(loss[s].second, t.losses[s], 1e-6 * t.losses[s]) << "step " << s + 1;
      EXPECT_EQ(std::stoi(lines[s][1]), s + 1);
      EXPECT_NEAR(loss[s].second, std::stod(lines[s][2]), 5e-5) << "step " << s + 1;
      EXPECT_NEAR(lr[s].second, std::stod(lines[s][3]), 1e-3 * lr[s].second + 1e-12) << "step " << s + 1;
      EXPECT_NEAR(norm[s].second, std::stod(lines[s][4]), 5e-4) << "step " << s + 1;
    }
    EXPECT_LT(lr[0].second, lr[3].second) << "warm-up: the lr rises";
    EXPECT_FALSE(fs::exists(dir + "/run/Train_Samples_loss_scale.csv")) << "loss_scale is fp16's";
    EXPECT_TRUE(fs::exists(dir + "/run/Train_Memory_optimizer_states_MB.csv"));
  }
  g_world->barrier();
  if (g_world->rank() == 0 && !keep) fs::remove_all(dir);
}

TEST(CsvMonitor, ACheckpointFlushesTheFiles) {
  const std::string dir = shared_dir("flush");
  train(dir, 4, dir + "/ckpt", /*save_at=*/3);
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

TEST(CsvMonitor, AFolderThatCannotBeMadeIsAClearErrorOnEveryRank) {
  const std::string file = shared_dir("not_a_folder");
  if (g_world->rank() == 0) std::ofstream(file) << "x";
  g_world->barrier();
  torch::nn::Linear model(8, 1);
  zero::InitOptions init;
  init.group = g_world;
  try {
    zero::initialize(zero::Config::from_json(config_of(file)), model, init);
    ADD_FAILURE() << "csv_monitor under a file was accepted";
  } catch (const zero::EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("csv_monitor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove(file);
  EXPECT_THROW(zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 1, "csv_monitor": {"job_name": "a/b"}})"),
               zero::ConfigError);
}

TEST(Monitors, WandbAndCometAreAWarningNamingWhatToUseInstead) {
  const std::string batch = R"("train_micro_batch_size_per_gpu": 1)";
  for (const std::string name : {"wandb", "comet"}) {
    const zero::Config on = zero::Config::from_json("{" + batch + R"(, ")" + name + R"(": {"enabled": true, "project": "p"}})");
    ASSERT_EQ(on.warnings().size(), 1u) << name;
    const std::string& w = on.warnings()[0];
    for (const char* word : {"not available", "csv_monitor", "tensorboard"}) {
      EXPECT_NE(w.find(word), std::string::npos) << w;
    }
    EXPECT_NE(w.find(name + ".enabled"), std::string::npos) << w;
    const zero::Config off = zero::Config::from_json("{" + batch + R"(, ")" + name + R"(": {"enabled": false, "project": "p"}})");
    EXPECT_TRUE(off.warnings().empty()) << name;
    EXPECT_THROW(zero::Config::from_json("{" + batch + R"(, ")" + name + R"(": {"enabeld": true}})"), zero::ConfigError)
        << "a typo in " << name << " is still an unknown key";
  }
}

TEST(Monitors, TensorboardWithoutProtobufIsAClearError) {
  if (zero::monitor::tensorboard_available()) GTEST_SKIP() << "this build writes event files";
  torch::nn::Linear model(8, 1);
  zero::InitOptions init;
  init.group = g_world;
  try {
    zero::initialize(zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 1, "tensorboard": {"enabled": true}})"), model, init);
    ADD_FAILURE() << "tensorboard was accepted by a build without it";
  } catch (const zero::EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("libprotobuf-dev"), std::string::npos) << e.what();
  }
}

}  // namespace
