// Note [One validator] (config/config.cpp): every config that
// zero::initialize refuses on 3 ranks for a reason in the config alone,
// `zero-config FILE --world-size 3` refuses too, with the same words; and
// a config one accepts, the other accepts. Each row is tried both ways:
// Config::from_file then initialize on every rank of this job, and the
// tool on rank 0.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <fstream>
#include <sstream>
#include <string>

#include "world_main.h"
#include "zero/zero.h"

namespace {

struct Case {
  const char* name;
  const char* extra;    // keys after train_micro_batch_size_per_gpu 1
  const char* refusal;  // what both say, or nullptr: both accept
};

const char* const kAdamW = R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-3}})";

std::string config_text(const Case& c) {
  std::string text = R"({"train_micro_batch_size_per_gpu": 1)";
  if (*c.extra) text += std::string(", ") + c.extra;
  return text + "}";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct ToolRun {
  int status;
  std::string err;
};

ToolRun zero_config(const std::string& file) {
  const std::string err = file + ".err";
  const std::string command = "'" + std::string(ZERO_CONFIG_TOOL) + "' '" + file + "' --world-size 3 >/dev/null 2>'" + err + "'";
  const int raw = std::system(command.c_str());
  ToolRun run{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(err)};
  std::remove(err.c_str());
  return run;
}

// What initialize says of `file` on this job's ranks: empty when it trains.
std::string engine_verdict(const std::string& file) {
  try {
    zero::Config config = zero::Config::from_file(file);
    auto model = std::make_shared<torch::nn::LinearImpl>(8, 8);
    zero::InitOptions init;
    init.group = g_world;
    zero::Engine engine = zero::initialize(config, model, init);
    engine.backward(model->forward(torch::ones({1, 8})).sum());
    engine.step();
  } catch (const zero::ConfigError& e) {
    return e.what();
  }
  return "";
}

class OneValidator : public ::testing::TestWithParam<Case> {};

TEST_P(OneValidator, TheToolAndTheEngineGiveOneVerdict) {
  ASSERT_EQ(g_world->size(), 3) << "the table's world sizes are 3";
  const Case& c = GetParam();
  const std::string file = ::testing::TempDir() + "/one_validator_" + c.name + "_rank" + std::to_string(g_world->rank()) + ".json";
  std::ofstream(file) << config_text(c);
  const std::string engine = engine_verdict(file);
  if (c.refusal) {
    EXPECT_NE(engine.find(c.refusal), std::string::npos) << "initialize said: " << (engine.empty() ? "(trained)" : engine);
  } else {
    EXPECT_EQ(engine, "") << "initialize refused a config the table accepts";
  }
  if (g_world->rank() == 0) {
    const ToolRun tool = zero_config(file);
    if (c.refusal) {
      EXPECT_NE(tool.status, 0) << "zero-config accepted it: " << tool.err;
      if (!engine.empty()) EXPECT_NE(tool.err.find(engine), std::string::npos) << "zero-config said: " << tool.err;
    } else {
      EXPECT_EQ(tool.status, 0) << tool.err;
    }
  }
  std::remove(file.c_str());
  g_world->barrier();
}

std::string with_optimizer(const char* rest) { return std::string(kAdamW) + ", " + rest; }

// The rows' texts live as long as the test program.
const std::string kHpz4 = with_optimizer(R"("zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4})");
const std::string kHpz2 = with_optimizer(R"("zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2})");
const std::string kHpz3 = with_optimizer(R"("zero_optimization": {"stage": 3, "zero_hpz_partition_size": 3})");
const std::string kPipeline = with_optimizer(R"("pipeline": {"stages": 2})");
const std::string kTensorParallel = with_optimizer(R"("tensor_parallel": {"autotp_size": 2})");
const std::string kBatch = with_optimizer(R"("train_batch_size": 4)");

INSTANTIATE_TEST_SUITE_P(
    Table, OneValidator,
    ::testing::Values(
        Case{"hpz_4", kHpz4.c_str(), "zero_optimization.zero_hpz_partition_size 4 does not divide the data-parallel size 3"},
        Case{"hpz_2", kHpz2.c_str(), "zero_optimization.zero_hpz_partition_size 2 does not divide the data-parallel size 3"},
        Case{"offload_amsgrad",
             R"("optimizer": {"type": "Adam", "params": {"lr": 1e-3, "amsgrad": true}},
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})",
             "zero_optimization.offload_optimizer does not support amsgrad"},
        Case{"offload_sgd",
             R"("optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})",
             "runs Adam, AdamW or Adagrad on the CPU; optimizer.type \"SGD\""},
        Case{"offload_lamb",
             R"("optimizer": {"type": "Lamb", "params": {"lr": 1e-3}},
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})",
             "runs Adam, AdamW or Adagrad on the CPU; optimizer.type \"Lamb\""},
        Case{"no_optimizer", R"("zero_optimization": {"stage": 2})", "the config has no \"optimizer\" section"},
        Case{"pipeline_2", kPipeline.c_str(), "does not divide into tensor parallel 1 x pipeline 2"},
        Case{"tensor_parallel_2", kTensorParallel.c_str(), "does not divide into tensor parallel 2 x pipeline 1"},
        Case{"batch_4", kBatch.c_str(), "train_batch_size"},
        // Accepted by both: hpZ over the 3 ranks of this node, offload with Adagrad.
        Case{"hpz_3", kHpz3.c_str(), nullptr},
        Case{"offload_adagrad",
             R"("optimizer": {"type": "Adagrad", "params": {"lr": 1e-3}},
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}})",
             nullptr}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
