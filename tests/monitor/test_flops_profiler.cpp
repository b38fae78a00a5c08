// The FLOPs profiler on the example GPT (one process). Its forward count is
// within 5% of the analytic 2 * N * tokens (N: the parameters that multiply,
// that is all but the position embedding; the attention products,
// 4 * depth * T * width per token, and the per-element counts make the
// rest), and training's 3 x forward within 5% of 6 * N * tokens. Every
// module's own operators sum to the model's total and to each parent's
// count; the blocks, being alike, count alike. Through the engine with
// "flops_profiler" in the config, the report of the profile step carries
// the same forward count, the progress line gains TFLOP/s from then on,
// and a pipeline-free run without the section pays nothing. With a peak
// (peak_tflops, or a GPU the table knows) it also shows the MFU, the
// achieved rate over that peak.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "gpt/gpt.h"
#include "profile/device_peak.h"
#include "profile/flops_profiler.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
using zero_examples::GPT;
using zero_examples::GPTOptions;

GPTOptions options() {
  GPTOptions o;
  o.vocab_size = 96;
  o.context = 16;
  o.depth = 2;
  o.width = 128;
  o.heads = 4;
  return o;
}

constexpr int64_t kBatch = 4, kTokens = 16;

// Parameters that multiply: everything but the position embedding.
double multiplying_params(GPT& model) {
  return static_cast<double>(model->num_parameters() - model->wpe->weight.numel());
}

at::Tensor tokens() {
  torch::manual_seed(3);
  return torch::randint(0, options().vocab_size, {kBatch, kTokens}, torch::kLong);
}

TEST(FlopsProfiler, ForwardIsTwiceParamsTimesTokensAndModulesSumToTheTotal) {
  torch::manual_seed(0);
  GPT model(options());
  zero::profile::FlopsProfiler profiler(*model);
  profiler.start();
  model->forward(tokens());
  profiler.stop();
  const double formula = 2 * multiplying_params(model) * kBatch * kTokens;
  EXPECT_NEAR(profiler.flops(), formula, 0.05 * formula);
  EXPECT_GT(profiler.flops(), formula) << "the attention products add to 2 N T";
  EXPECT_NEAR(profiler.macs() * 2, formula, 0.05 * formula);

  const auto modules = profiler.modules();
  double own = 0;
  std::map<std::string, double> by_name;
  for (const auto& m : modules) own += m.own_flops, by_name[m.name] = m.flops;
  EXPECT_NEAR(own, profiler.flops(), 1e-9 * own);
  EXPECT_NEAR(modules.at(0).flops, profiler.flops(), 1e-9 * own) << "the model is the sum of its modules";
  EXPECT_EQ(modules.at(0).params, model->num_parameters());
  // A parent counts its children: blocks.0 = ln1 + attn + ln2 + mlp + its own (residual adds: not counted).
  const double children = by_name.at("blocks.0.ln1") + by_name.at("blocks.0.attn") + by_name.at("blocks.0.ln2") +
                          by_name.at("blocks.0.mlp");
  EXPECT_NEAR(by_name.at("blocks.0"), children, 1e-9 * children);
  EXPECT_NEAR(by_name.at("blocks.0"), by_name.at("blocks.1"), 1e-9 * children) << "alike blocks count alike";
  // The MLP's two products: 2 * (width * 4 width) * 2 MACs per token, plus biases and GELU.
  const double mlp = 2.0 * 2 * 128 * 512 * kBatch * kTokens;
  EXPECT_NEAR(by_name.at("blocks.0.mlp"), mlp, 0.01 * mlp);
  // Attention's own products (q k^T and the weighted sum) land in attn, not in qkv.
  const double products = 2.0 * 2 * kTokens * 128 * kBatch * kTokens;
  EXPECT_GT(by_name.at("blocks.0.attn") - by_name.at("blocks.0.attn.qkv") - by_name.at("blocks.0.attn.proj"), products);
}

TEST(FlopsProfiler, TheBackwardPassIsNotCountedWhilePaused) {
  torch::manual_seed(0);
  GPT model(options());
  zero::profile::FlopsProfiler profiler(*model);
  profiler.start();
  at::Tensor loss = model->loss(tokens(), tokens());
  const double forward = profiler.flops();
  profiler.pause();
  loss.backward();
  EXPECT_EQ(profiler.flops(), forward);
  profiler.resume();
  model->forward(tokens());
  profiler.stop();
  EXPECT_GT(profiler.flops(), 1.9 * forward);
}

std::string run_engine(const std::string& flops_section) {
  torch::manual_seed(0);
  GPT model(options());
  testing::internal::CaptureStdout();
  {
    auto engine = zero::initialize(
        zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
            "steps_per_print": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
            "zero_optimization": {"stage": 2})" + flops_section + "}"),
        model);
    for (int step = 0; step < 3; ++step) {
      for (int micro = 0; micro < 2; ++micro) {
        engine.backward(model->loss(tokens(), tokens()));
        engine.step();
      }
    }
  }
  return testing::internal::GetCapturedStdout();
}

// "fwd flops per rank:  1.23 G" -> 1.23e9
double read_si(const std::string& text, const std::string& label) {
  const std::regex value(label + R"(:\s+([0-9.]+)( [KMGTP])?)");
  std::smatch m;
  if (!std::regex_search(text, m, value)) return -1;
  const std::string prefixes = " KMGTP";
  const double scale = m[2].matched ? std::pow(1000.0, static_cast<double>(prefixes.find(m[2].str()[1]))) : 1.0;
  return std::stod(m[1]) * scale;
}

TEST(FlopsProfiler, TheEngineReportsTheProfileStepAndTheProgressLineGainsTflops) {
  const std::string file = (fs::temp_directory_path() / ("zero_flops_" + std::to_string(getpid()) + ".txt")).string();
  const std::string log = run_engine(R"(, "flops_profiler": {"enabled": true, "profile_step": 1, "module_depth": 3,
      "output_file": ")" + file + R"("})");
  std::ifstream in(file);
  ASSERT_TRUE(in.good()) << log;
  std::stringstream report;
  report << in.rdbuf();
  fs::remove(file);
  EXPECT_NE(report.str().find("Profile Summary at step 1"), std::string::npos) << report.str();
  torch::manual_seed(0);
  GPT model(options());
  const double forward = 2 * multiplying_params(model) * kBatch * kTokens * 2;  // 2 micro-batches
  EXPECT_NEAR(read_si(report.str(), "fwd flops per rank"), forward, 0.05 * forward) << report.str();
  EXPECT_NE(report.str().find("blocks.0.attn:"), std::string::npos) << "depth 3 is listed";
  EXPECT_EQ(report.str().find("blocks.0.attn.qkv:"), std::string::npos) << "depth 4 is not";
  // Step 2 (global_steps 1 while it ran) is the profiled one: its progress
  // line and the later ones carry TFLOP/s, the first does not.
  const auto second = log.find("step 2 loss");
  ASSERT_NE(second, std::string::npos) << log;
  EXPECT_EQ(log.substr(0, second).find("TFLOP/s"), std::string::npos) << "no count before the profile step ends";
  EXPECT_NE(log.substr(second).find("TFLOP/s"), std::string::npos) << log;
  EXPECT_NE(log.substr(log.find("step 3 loss")).find("TFLOP/s"), std::string::npos) << log;

  const std::string off = run_engine("");
  EXPECT_EQ(off.find("TFLOP/s"), std::string::npos);
}

TEST(FlopsProfiler, TheProgressLineShowsTheMfuAgainstTheGivenPeak) {
  const fs::path dir = fs::temp_directory_path() / ("zero_mfu_" + std::to_string(getpid()));
  const std::string log = run_engine(R"(, "flops_profiler": {"enabled": true, "profile_step": 1, "peak_tflops": 0.5,
      "output_file": "/dev/null"}, "csv_monitor": {"enabled": true, "output_path": ")" + dir.string() +
                                     R"(", "job_name": "mfu"})");
  // "... TFLOP/s 0.012 MFU 2.4% ..." on every line after the profile step.
  const std::regex rates(R"(TFLOP/s ([0-9.]+) MFU ([0-9.]+)%)");
  int lines = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), rates); it != std::sregex_iterator(); ++it, ++lines) {
    const double tflops = std::stod((*it)[1]), mfu = std::stod((*it)[2]);
    EXPECT_GT(tflops, 0);
    // Both printed to 3 decimals: the MFU within the rounding of TFLOP/s.
    EXPECT_NEAR(mfu, 100.0 * tflops / 0.5, 100.0 * 0.0005 / 0.5 + 0.0005) << it->str();
  }
  EXPECT_EQ(lines, 2) << log;  // steps 2 and 3
  // The monitors get the same pair per step: Train/Samples/tflops and /mfu.
  const auto column = [&](const std::string& tag) {
    std::ifstream in(dir / "mfu" / ("Train_Samples_" + tag + ".csv"));
    std::string row;
    std::getline(in, row);  // header
    std::vector<double> values;
    while (std::getline(in, row)) values.push_back(std::stod(row.substr(row.find(',') + 1)));
    return values;
  };
  const std::vector<double> tflops = column("tflops"), mfu = column("mfu");
  ASSERT_EQ(tflops.size(), 2u) << "the steps after the profile step";
  ASSERT_EQ(mfu.size(), 2u);
  for (size_t i = 0; i < mfu.size(); ++i) EXPECT_NEAR(mfu[i], tflops[i] / 0.5, 1e-6 * mfu[i]);
  fs::remove_all(dir);
  EXPECT_EQ(run_engine(R"(, "flops_profiler": {"enabled": true, "output_file": "/dev/null"})").find("MFU"),
            std::string::npos)
      << "no peak is known for a CPU";
}

TEST(DevicePeak, KnownGpusByTheNameCudaReports) {
  // Dense datasheet peaks, TFLOP/s: the variant named in the device name wins.
  EXPECT_DOUBLE_EQ(zero::profile::peak_flops_per_s("NVIDIA H200", c10::kBFloat16, false), 989.4e12);
  EXPECT_DOUBLE_EQ(zero::profile::peak_flops_per_s("NVIDIA H100 PCIe", c10::kBFloat16, false), 756e12);
  EXPECT_DOUBLE_EQ(zero::profile::peak_flops_per_s("NVIDIA H100 80GB HBM3", c10::kHalf, false), 989.4e12);
  EXPECT_DOUBLE_EQ(zero::profile::peak_flops_per_s("NVIDIA A100-SXM4-80GB", c10::kFloat, false), 19.5e12);
  EXPECT_DOUBLE_EQ(zero::profile::peak_flops_per_s("NVIDIA A100-SXM4-80GB", c10::kFloat, true), 156e12);
  EXPECT_EQ(zero::profile::peak_flops_per_s("Tesla V100-SXM2-32GB", c10::kBFloat16, false), 0) << "no bf16 on V100";
  EXPECT_EQ(zero::profile::peak_flops_per_s("Some Future GPU", c10::kBFloat16, false), 0);
  EXPECT_DOUBLE_EQ(zero::profile::training_peak_flops_per_s(c10::Device(c10::kCPU), c10::kFloat, 1.5), 1.5e12);
  EXPECT_EQ(zero::profile::training_peak_flops_per_s(c10::Device(c10::kCPU), c10::kFloat, 0), 0);
}

}  // namespace
