// offload_optimizer's super_offload (Note [Updates in backward] in
// partition/step.cpp): the boundary's backward updates each bucket as its
// reduction completes. The reference is the same run without it, where the
// step updates after backward: every parameter must be equal bit for bit,
// at stages 2 and 3, offload cpu and nvme, fp32 and bf16, with and without
// accumulation and overlap_comm, on 1-3 ranks. That the update did run
// inside backward is checked directly: right after a boundary's backward,
// before step(), a stage 2 parameter has moved with super_offload and not
// without it. What cannot run early (clipping) waits for step(), and
// what would break the step (a second backward, a checkpoint in between, a
// config that cannot do it) is refused by name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "world_main.h"
#include "zero/zero.h"

namespace {

constexpr int64_t kIn = 24, kHidden = 40, kOut = 10;

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", zero::Unit<torch::nn::Linear>(torch::nn::Linear(kIn, kHidden)));
    fc2 = register_module("fc2", zero::Unit<torch::nn::Linear>(torch::nn::Linear(kHidden, kHidden)));
    fc3 = register_module("fc3", zero::Unit<torch::nn::Linear>(torch::nn::Linear(kHidden, kHidden)));
    out = register_module("out", torch::nn::Linear(kHidden, kOut));
  }
  torch::Tensor forward(torch::Tensor x) {
    return out(torch::gelu(fc3(torch::gelu(fc2(torch::gelu(fc1(x)))))));
  }
  zero::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(Mlp);

struct Case {
  int stage = 2;
  std::string offload = "cpu";  // cpu | nvme (the optimizer) | all_nvme (and the parameters)
  std::string dtype = "fp32";
  int64_t gas = 1;
  bool overlap = true;
  double clip = 0.0;
  std::string name() const {
    return "stage " + std::to_string(stage) + " " + offload + " " + dtype + " gas " + std::to_string(gas) +
           (overlap ? " overlap" : " no overlap") + (clip > 0 ? " clip" : "");
  }
};

std::string nvme_dir(const std::string& run) {
  const auto d = std::filesystem::temp_directory_path() /
                 ("zero_test_updates_in_backward_" + std::to_string(g_world->size()) + "_" + run);
  std::filesystem::create_directories(d);
  return d.string();
}

std::string config_json(const Case& c, bool super_offload) {
  const std::string run = super_offload ? "early" : "serial";
  std::string json = R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000,
    "gradient_accumulation_steps": )" + std::to_string(c.gas) +
                     R"(, "gradient_clipping": )" + std::to_string(c.clip) +
                     R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
    "zero_optimization": {"stage": )" + std::to_string(c.stage) +
                     R"(, "reduce_bucket_size": 300, "stage3_param_persistence_threshold": 0, "sub_group_size": 700,
      "overlap_comm": )" + (c.overlap ? "true" : "false") +
                     R"(, "offload_optimizer": {"device": ")" + (c.offload == "cpu" ? "cpu" : "nvme") +
                     R"(", "nvme_path": ")" + nvme_dir(run + "_opt") +
                     R"(", "super_offload": )" + (super_offload ? "true" : "false") + "}";
  if (c.offload == "all_nvme") {
    json += R"(, "offload_param": {"device": "nvme", "nvme_path": ")" + nvme_dir(run + "_param") + R"("})";
  }
  json += "}";
  if (c.offload != "cpu") json += R"(, "aio": {"block_size": 8192, "queue_depth": 4})";
  if (c.dtype == "bf16") json += R"(, "bf16": {"enabled": true})";
  return json + "}";
}

torch::Tensor loss_of(Mlp& model, int64_t k, at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(77 + 10 * k + g_world->rank());
  auto x = torch::randn({4, kIn}, gen).to(dtype);
  auto y = torch::randint(0, kOut, {4}, gen);
  return torch::nn::functional::cross_entropy(model->forward(x).to(at::kFloat), y);
}

struct Trained {
  std::map<std::string, torch::Tensor> params;
  std::vector<double> norms;
};

Trained train(const Case& c, bool super_offload) {
  torch::manual_seed(11);
  Mlp model;
  zero::InitOptions options;
  options.group = g_world;
  auto engine = zero::initialize(zero::Config::from_json(config_json(c, super_offload)), model, options);
  const auto dtype = c.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  Trained t;
  for (int64_t k = 0; k < 4 * c.gas; ++k) {
    engine.backward(loss_of(model, k, dtype));
    engine.step();
    if ((k + 1) % c.gas == 0) t.norms.push_back(engine.last_grad_norm());
  }
  for (auto& [name, p] : engine.gathered_state_dict()) t.params[name] = p.to(at::kFloat);
  return t;
}

void expect_bitwise_equal(const Case& c) {
  const Trained serial = train(c, false);
  const Trained early = train(c, true);
  ASSERT_EQ(serial.params.size(), early.params.size()) << c.name();
  for (const auto& [name, p] : serial.params) {
    EXPECT_TRUE(torch::equal(p, early.params.at(name)))
        << c.name() << ": " << name << " differs by " << (p - early.params.at(name)).abs().max().item<double>();
  }
  EXPECT_EQ(serial.norms, early.norms) << c.name() << ": the reported gradient norms";
  // The run trained: a parameter moved from its initial value.
  torch::manual_seed(11);
  Mlp initial;
  EXPECT_FALSE(torch::equal(initial->out->weight.to(at::kFloat), serial.params.at("out.weight"))) << c.name();
}

TEST(UpdatesInBackward, Stage2CpuFp32) { expect_bitwise_equal({2, "cpu", "fp32", 1, true}); }
TEST(UpdatesInBackward, Stage2CpuBf16Accumulation) { expect_bitwise_equal({2, "cpu", "bf16", 3, true}); }
TEST(UpdatesInBackward, Stage2CpuNoOverlap) { expect_bitwise_equal({2, "cpu", "fp32", 2, false}); }
TEST(UpdatesInBackward, Stage3CpuFp32Accumulation) { expect_bitwise_equal({3, "cpu", "fp32", 2, true}); }
TEST(UpdatesInBackward, Stage3CpuBf16NoOverlap) { expect_bitwise_equal({3, "cpu", "bf16", 1, false}); }
TEST(UpdatesInBackward, Stage3NvmeFp32) { expect_bitwise_equal({3, "nvme", "fp32", 1, true}); }
TEST(UpdatesInBackward, Stage3NvmeBf16Accumulation) { expect_bitwise_equal({3, "nvme", "bf16", 2, true}); }
TEST(UpdatesInBackward, Stage3NvmeParamsToo) { expect_bitwise_equal({3, "all_nvme", "fp32", 2, false}); }
// With clipping the update needs the global norm first: it waits for step().
TEST(UpdatesInBackward, Stage2ClippingWaitsForTheStep) { expect_bitwise_equal({2, "cpu", "fp32", 1, true, 0.05}); }

// The update runs inside backward: right after a boundary's backward, before
// step(), the output layer's weight (whose gradient comes first) has moved
// with super_offload, and has not without it. Clipping makes it wait.
TEST(UpdatesInBackward, TheUpdateRunsInsideBackward) {
  for (const double clip : {0.0, 0.05}) {
    for (const bool super_offload : {false, true}) {
      Case c;
      c.clip = clip;
      torch::manual_seed(11);
      Mlp model;
      zero::InitOptions options;
      options.group = g_world;
      auto engine = zero::initialize(zero::Config::from_json(config_json(c, super_offload)), model, options);
      const torch::Tensor before = model->out->weight.detach().clone();
      engine.backward(loss_of(model, 0, at::kFloat));
      const bool moved = !torch::equal(before, model->out->weight.detach());
      EXPECT_EQ(moved, super_offload && clip == 0.0) << "super_offload " << super_offload << ", clip " << clip;
      engine.step();
      EXPECT_FALSE(torch::equal(before, model->out->weight.detach()));
    }
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(UpdatesInBackward, WhatWouldBreakTheStepIsRefused) {
  Case c;
  torch::manual_seed(11);
  Mlp model;
  zero::InitOptions options;
  options.group = g_world;
  auto engine = zero::initialize(zero::Config::from_json(config_json(c, true)), model, options);
  engine.backward(loss_of(model, 0, at::kFloat));
  const std::string twice = error_of([&] { engine.backward(loss_of(model, 1, at::kFloat)); });
  EXPECT_NE(twice.find("called twice before engine.step()"), std::string::npos) << twice;
  const std::string dir = nvme_dir("ckpt");
  const std::string save = error_of([&] { engine.save_checkpoint(dir, "t"); });
  EXPECT_NE(save.find("call engine.step() first"), std::string::npos) << save;
  engine.step();  // the step completes after both refusals
  EXPECT_EQ(error_of([&] { engine.save_checkpoint(dir, "t"); }), "(no error)");
  g_world->barrier();
  if (g_world->rank() == 0) std::filesystem::remove_all(dir);
}

TEST(UpdatesInBackward, ConfigsThatCannotAreRefusedByName) {
  auto refused = [](const std::string& zero_optimization) {
    return error_of([&] {
      zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {}},
        "zero_optimization": )" + zero_optimization + "}");
    });
  };
  EXPECT_NE(refused(R"({"stage": 2, "offload_optimizer": {"device": "none", "super_offload": true}})")
                .find("offload_optimizer.device is \"none\""),
            std::string::npos);
  EXPECT_NE(refused(R"({"stage": 1, "offload_optimizer": {"device": "cpu", "super_offload": true}})")
                .find("set stage 2 or 3"),
            std::string::npos);
  EXPECT_NE(refused(R"({"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5, "super_offload": true}})")
                .find("set ratio 1"),
            std::string::npos);
}

}  // namespace
