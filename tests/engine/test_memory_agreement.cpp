// The memory numbers agree: what `zero-config --estimate` predicts for the
// example GPT (its shape given, so it knows the blocks are units) and what
// the engine's memory_report() holds, at initialize and after training,
// item by item within 10%, at stages 0-3 in fp32 and bf16, with a reduce
// bucket larger than the model and with small ones and overlap_comm. And
// stage 3's units kept gathered between forward and backward count as
// gathered units, not as activations. On 2 ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "gpt/gpt.h"
#include "world_main.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
using zero_examples::GPT;
using zero_examples::GPTOptions;

constexpr int64_t kVocab = 512, kContext = 32, kWidth = 128, kDepth = 4, kHeads = 4, kMicro = 2;

std::string config_json(int stage, const std::string& dtype, const std::string& zero_extra) {
  std::ostringstream c;
  c << R"({"train_micro_batch_size_per_gpu": )" << kMicro << R"(, "steps_per_print": 1000,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, )"
    << (dtype == "bf16" ? R"("bf16": {"enabled": true}, )" : "") << R"("zero_optimization": {"stage": )" << stage
    << zero_extra << "}}";
  return c.str();
}

// zero-config's estimate of `stage` for the config, as JSON bytes where the
// parameters live (host memory: CPU ranks).
nlohmann::json estimate(const std::string& json, int stage) {
  const fs::path dir = fs::temp_directory_path() / ("zero_memory_agreement_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "ds.json", out = dir / "estimate.json";
  std::ofstream(file) << json;
  const std::string command = "'" + std::string(ZERO_CONFIG_TOOL) + "' '" + file.string() +
                              "' --estimate --json --cpu-ranks --world-size " + std::to_string(g_world->size()) +
                              " --micro " + std::to_string(kMicro) + " --context " + std::to_string(kContext) +
                              " --width " + std::to_string(kWidth) + " --depth " + std::to_string(kDepth) +
                              " --heads " + std::to_string(kHeads) + " --vocab " + std::to_string(kVocab) + " > '" +
                              out.string() + "'";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::ifstream in(out);
  const nlohmann::json doc = nlohmann::json::parse(in);
  fs::remove_all(dir);
  return doc["stages"][stage];
}

GPT make_gpt() {
  torch::manual_seed(3);
  GPTOptions o;
  o.vocab_size = kVocab, o.context = kContext, o.width = kWidth, o.depth = kDepth, o.heads = kHeads;
  return GPT(o);
}

std::pair<at::Tensor, at::Tensor> batch(int step) {
  auto gen = at::detail::createCPUGenerator(77 + step * 10 + g_world->rank());
  at::Tensor tokens = torch::randint(0, kVocab, {kMicro, kContext + 1}, gen, torch::kLong);
  return {tokens.slice(1, 0, kContext), tokens.slice(1, 1, kContext + 1)};
}

// Each item within 10% of the estimate (both 0 where it predicts none).
// The optimizer's states are made at its first step: `stepped` says whether
// it has taken one.
void expect_agree(const zero::MemoryReport& held, const nlohmann::json& est, const std::string& what, bool stepped) {
  std::vector<std::pair<const char*, int64_t>> items = {
      {"params", held.params}, {"gradients", held.gradients}, {"fp32_master", held.fp32_master}};
  if (stepped) items.emplace_back("optimizer_states", held.optimizer_states);
  for (const auto& [name, bytes] : items) {
    const int64_t predicted = est["host"][name].get<int64_t>();
    if (predicted == 0) {
      EXPECT_EQ(bytes, 0) << what << ": " << name << " held where none is estimated";
      continue;
    }
    const double ratio = static_cast<double>(bytes) / static_cast<double>(predicted);
    EXPECT_NEAR(ratio, 1.0, 0.10) << what << ": " << name << " held " << bytes << " B, estimated " << predicted << " B";
    if (g_world->rank() == 0) std::printf("%s: %s held/estimated %.3f\n", what.c_str(), name, ratio);
  }
}

struct Held {
  zero::MemoryReport at_initialize, after_training;
};

Held train(const std::string& json) {
  GPT model = make_gpt();
  zero::InitOptions options;
  options.group = g_world;
  auto engine = zero::initialize(zero::Config::from_json(json), model, options);
  Held held;
  held.at_initialize = engine.memory_report();
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(step);
    engine.backward(model->loss(x, y));
    engine.step();
  }
  held.after_training = engine.memory_report();
  return held;
}

TEST(MemoryAgreement, EstimateAndMemoryReportAgreeAtEveryStage) {
  const std::pair<std::string, std::string> buckets[] = {
      {"a bucket larger than the model, overlap_comm", R"(, "overlap_comm": true)"},
      {"small buckets with overlap_comm", R"(, "reduce_bucket_size": 60000, "overlap_comm": true)"}};
  for (const std::string dtype : {"fp32", "bf16"}) {
    for (const auto& [bucket_name, zero_extra] : buckets) {
      for (int stage = 0; stage <= 3; ++stage) {
        const std::string json = config_json(stage, dtype, zero_extra);
        const std::string what = "stage " + std::to_string(stage) + " " + dtype + ", " + bucket_name;
        const nlohmann::json est = estimate(json, stage);
        const Held held = train(json);
        expect_agree(held.at_initialize, est, what + ", at initialize", false);
        expect_agree(held.after_training, est, what + ", after 3 steps", true);
        if (stage == 3) {
          EXPECT_LE(held.after_training.gathered_params_peak, est["gathered_params_max"].get<int64_t>()) << what;
        }
      }
    }
  }
}

// Stage 3 keeps the last units of forward gathered into backward (DeepSpeed's
// default stage3_max_reuse_distance): those bytes are parameters, reported as
// gathered units, so the activations stage 3 measures are stage 2's.
TEST(MemoryAgreement, GatheredUnitsAreNotActivations) {
  const zero::MemoryReport s2 = train(config_json(2, "fp32", "")).after_training;
  const zero::MemoryReport s3 = train(config_json(3, "fp32", "")).after_training;
  ASSERT_GT(s2.activations_peak, 0) << "the allocator could not be read";
  EXPECT_GT(s3.gathered_params_peak, 0);
  EXPECT_NEAR(static_cast<double>(s3.activations_peak) / static_cast<double>(s2.activations_peak), 1.0, 0.10)
      << "stage 3 measured " << s3.activations_peak << " B of activations, stage 2 " << s2.activations_peak
      << " B; gathered units peak " << s3.gathered_params_peak << " B";
}

}  // namespace
