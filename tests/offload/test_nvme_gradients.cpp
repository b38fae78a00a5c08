// offload_optimizer.nvme_gradients (Note [Gradients on NVMe] in
// partition/host_grads.h): the reduced gradients live in files between
// backward and the step. The reference is the same run with the gradients
// in host memory: every parameter and every reported norm must be equal bit
// for bit, fp32 and bf16, with accumulation, clipping, super_offload and
// parameters on NVMe, on 1-3 ranks. The host gradient partition is gone
// from the memory report and is on NVMe instead, byte for byte; a
// checkpoint taken mid-accumulation resumes to the same weights.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "world_main.h"
#include "tests/engine/elementwise_model.h"
#include "tests/offload/two_unit_mlp.h"
#include "zero/zero.h"

namespace {

using zero_test::kHidden;
using zero_test::kIn;
using zero_test::kOut;
using Mlp = zero_test::TwoUnitMlp;

struct Case {
  std::string dtype = "fp32";
  int64_t gas = 1;
  bool overlap = true;
  double clip = 0.0;
  bool super_offload = false;
  bool params_on_nvme = false;
  std::string name() const {
    return dtype + " gas " + std::to_string(gas) + (overlap ? " overlap" : "") + (clip > 0 ? " clip" : "") +
           (super_offload ? " super_offload" : "") + (params_on_nvme ? " params on nvme" : "");
  }
};

std::string nvme_dir(const std::string& run) {
  const auto d = std::filesystem::temp_directory_path() /
                 ("zero_test_nvme_gradients_" + std::to_string(g_world->size()) + "_" + run);
  std::filesystem::create_directories(d);
  return d.string();
}

zero::Config config(const Case& c, bool nvme_gradients) {
  const std::string run = nvme_gradients ? "files" : "memory";
  std::string json = R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000,
    "gradient_accumulation_steps": )" + std::to_string(c.gas) +
                     R"(, "gradient_clipping": )" + std::to_string(c.clip) +
                     R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 300, "stage3_param_persistence_threshold": 0,
      "sub_group_size": 700, "overlap_comm": )" + (c.overlap ? "true" : "false") +
                     R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme_dir(run) +
                     R"(", "super_offload": )" + (c.super_offload ? "true" : "false") +
                     R"(, "nvme_gradients": )" + (nvme_gradients ? "true" : "false") + "}";
  if (c.params_on_nvme) json += R"(, "offload_param": {"device": "nvme", "nvme_path": ")" + nvme_dir(run + "_param") + R"("})";
  json += R"(}, "aio": {"block_size": 8192, "queue_depth": 4})";
  if (c.dtype == "bf16") json += R"(, "bf16": {"enabled": true})";
  return zero::Config::from_json(json + "}");
}

torch::Tensor loss_of(Mlp& model, int64_t k, at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(91 + 10 * k + g_world->rank());
  auto x = torch::randn({4, kIn}, gen).to(dtype);
  auto y = torch::randint(0, kOut, {4}, gen);
  return torch::nn::functional::cross_entropy(model->forward(x).to(at::kFloat), y);
}

struct Trained {
  std::map<std::string, torch::Tensor> params;
  std::vector<double> norms;
  zero::MemoryReport memory;
};

Trained train(const Case& c, bool nvme_gradients) {
  torch::manual_seed(13);
  Mlp model;
  zero::InitOptions options;
  options.group = g_world;
  auto engine = zero::initialize(config(c, nvme_gradients), model, options);
  const auto dtype = c.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  Trained t;
  for (int64_t k = 0; k < 4 * c.gas; ++k) {
    engine.backward(loss_of(model, k, dtype));
    engine.step();
    if ((k + 1) % c.gas == 0) t.norms.push_back(engine.last_grad_norm());
  }
  t.memory = engine.memory_report();
  for (auto& [name, p] : engine.gathered_state_dict()) t.params[name] = p.to(at::kFloat);
  return t;
}

void expect_bitwise_equal(const Case& c) {
  const Trained memory = train(c, false);
  const Trained files = train(c, true);
  ASSERT_EQ(memory.params.size(), files.params.size()) << c.name();
  for (const auto& [name, p] : memory.params) {
    EXPECT_TRUE(torch::equal(p, files.params.at(name)))
        << c.name() << ": " << name << " differs by " << (p - files.params.at(name)).abs().max().item<double>();
  }
  EXPECT_EQ(memory.norms, files.norms) << c.name() << ": the reported gradient norms";
  torch::manual_seed(13);
  Mlp initial;
  EXPECT_FALSE(torch::equal(initial->out->weight.to(at::kFloat), memory.params.at("out.weight"))) << c.name();

  // The gradient partition left host memory for the files, byte for byte:
  // at least this rank's share of the model's parameters in the training
  // dtype (the shards are padded to equal sizes).
  const int64_t moved = memory.memory.gradients - files.memory.gradients;
  EXPECT_EQ(moved, files.memory.nvme_offloaded - memory.memory.nvme_offloaded) << c.name();
  int64_t numel = 0;
  for (const auto& p : initial->parameters()) numel += p.numel();
  const int64_t element = c.dtype == "bf16" ? 2 : 4;
  EXPECT_GE(moved, numel / g_world->size() * element) << c.name();
  EXPECT_LT(moved, (numel / g_world->size() + 3 * 300) * element) << c.name();
}

TEST(NvmeGradients, Fp32) { expect_bitwise_equal({"fp32", 1, true}); }
TEST(NvmeGradients, Bf16Accumulation) { expect_bitwise_equal({"bf16", 3, true}); }
TEST(NvmeGradients, ClippingWithoutOverlap) { expect_bitwise_equal({"fp32", 2, false, 0.05}); }
// The update in backward takes the boundary's gradients from memory; the
// earlier micro-steps' go to the files.
TEST(NvmeGradients, SuperOffload) { expect_bitwise_equal({"fp32", 1, true, 0.0, true}); }
TEST(NvmeGradients, SuperOffloadBf16Accumulation) { expect_bitwise_equal({"bf16", 2, true, 0.0, true}); }
TEST(NvmeGradients, ParametersOnNvmeToo) { expect_bitwise_equal({"fp32", 2, false, 0.0, false, true}); }

// fp16 with overflows: a skipped step lets the gradients go unread (they
// are forgotten, not written), and the next backward starts afresh. Two
// steps overflow on the last rank; the runs stay equal bit for bit.
TEST(NvmeGradients, Fp16SkippedStepsForgetTheGradients) {
  auto run = [&](bool nvme_gradients) {
    zero_test::Elementwise model;  // fp16 on CPU ranks: element-wise only
    const std::string json = R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000,
      "gradient_accumulation_steps": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "fp16": {"enabled": true, "initial_scale_power": 8},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": 16, "sub_group_size": 20,
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme_dir(nvme_gradients ? "fp16_files" : "fp16_memory") +
                             R"(", "nvme_gradients": )" + (nvme_gradients ? "true" : "false") + R"(}},
      "aio": {"block_size": 8192, "queue_depth": 4}})";
    zero::InitOptions options;
    options.group = g_world;
    auto engine = zero::initialize(zero::Config::from_json(json), model, options);
    for (int micro = 0; micro < 14; ++micro) {
      auto gen = at::detail::createCPUGenerator(500 + micro * 7 + g_world->rank());
      auto x = torch::randn({4, zero_test::kN}, gen).to(at::kHalf);
      const bool last = g_world->rank() == g_world->size() - 1;
      if ((micro == 4 || micro == 9) && last) x[micro % 4][micro] = INFINITY;  // steps 2 and 4 overflow
      engine.backward((model->forward(x).to(at::kFloat) - 1.0).pow(2).mean());
      engine.step();
    }
    EXPECT_EQ(engine.skipped_steps(), 2);
    return torch::cat({model->w.detach().to(at::kFloat), model->b.detach().to(at::kFloat)});
  };
  const at::Tensor memory = run(false), files = run(true);
  EXPECT_TRUE(torch::equal(memory, files)) << "differs by " << (memory - files).abs().max().item<double>();
}

// A checkpoint between the micro-steps of an accumulation holds the
// gradients summed so far (read back from the files); a new engine that
// loads it ends where the uninterrupted run ends.
TEST(NvmeGradients, ACheckpointMidAccumulationResumes) {
  const Case c{"fp32", 2, true, 0.05};
  const Trained whole = train(c, true);
  const std::string ckpt = nvme_dir("ckpt");
  zero::InitOptions options;
  options.group = g_world;
  {
    torch::manual_seed(13);
    Mlp model;
    auto engine = zero::initialize(config(c, true), model, options);
    for (int64_t k = 0; k < 3; ++k) {  // one step, then half of the next
      engine.backward(loss_of(model, k, at::kFloat));
      engine.step();
    }
    engine.save_checkpoint(ckpt, "mid");
  }
  torch::manual_seed(99);  // other initial weights: the checkpoint must bring them
  Mlp model;
  auto engine = zero::initialize(config(c, true), model, options);
  engine.load_checkpoint(ckpt, "mid");
  for (int64_t k = 3; k < 4 * c.gas; ++k) {
    engine.backward(loss_of(model, k, at::kFloat));
    engine.step();
  }
  for (auto& [name, p] : engine.gathered_state_dict()) {
    EXPECT_TRUE(torch::equal(p.to(at::kFloat), whole.params.at(name))) << name;
  }
  g_world->barrier();
  if (g_world->rank() == 0) std::filesystem::remove_all(ckpt);
}

TEST(NvmeGradients, NeedsTheOptimizerOnNvme) {
  try {
    zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {}},
      "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "nvme_gradients": true}}})");
    ADD_FAILURE() << "accepted";
  } catch (const zero::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("offload_optimizer.device is \"cpu\"; set it to \"nvme\""), std::string::npos)
        << e.what();
  }
}

}  // namespace
