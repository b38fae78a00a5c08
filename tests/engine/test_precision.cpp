// fp16 loss scaling and overflow skipping across ranks, the learning-rate
// schedule as the engine applies it, and bf16 against fp32. Runs on 1 and 2
// ranks through zero-run; on a GPU with ZERO_TEST_DEVICE=cuda
// (tests/engine/test_device.h).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "tests/engine/elementwise_model.h"
#include "tests/engine/test_device.h"
#include "zero/zero.h"

namespace {

std::shared_ptr<zero::comm::ProcessGroup> g_world;

using zero_test::Elementwise;
using zero_test::kN;

torch::Tensor batch_x(int64_t step, at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(500 + step * 7 + g_world->rank());
  return torch::randn({4, kN}, gen).to(zero_test::test_device(), dtype);
}

zero::Engine make_engine(Elementwise& model, const std::string& fp16, const std::string& scheduler = "") {
  const std::string json = R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000,
    "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 16},
    "fp16": )" + fp16 + (scheduler.empty() ? "" : ", \"scheduler\": " + scheduler) + "}";
  model->to(zero_test::test_device());
  zero::InitOptions options;
  options.group = g_world;
  return zero::initialize(zero::Config::from_json(json), model, options);
}

// One micro-step; `poison` puts an inf into this rank's input.
void train_step(zero::Engine& engine, Elementwise& model, int64_t step, bool poison) {
  auto x = batch_x(step, at::kHalf);
  if (poison) x[0][0] = std::numeric_limits<float>::infinity();
  auto loss = (model->forward(x).to(at::kFloat) - 1.0).pow(2).mean();
  engine.backward(loss);
  engine.step();
}

torch::Tensor snapshot(Elementwise& model) { return torch::cat({model->w.detach(), model->b.detach()}).clone(); }

TEST(Fp16, OverflowOnOneRankSkipsOnEveryRankAndFollowsHysteresis) {
  Elementwise model;
  // Dynamic: 2^8, hysteresis 2, doubling after 3 clean steps.
  auto engine = make_engine(model, R"({"enabled": true, "initial_scale_power": 8, "hysteresis": 2,
                                       "loss_scale_window": 3, "min_loss_scale": 1})");
  const int last = g_world->size() - 1;  // only the last rank overflows
  EXPECT_EQ(engine.loss_scale(), 256);
  train_step(engine, model, 0, false);
  EXPECT_EQ(engine.skipped_steps(), 0);

  auto before = snapshot(model);
  train_step(engine, model, 1, g_world->rank() == last);  // overflow: hysteresis 2 -> 1, scale kept
  EXPECT_EQ(engine.skipped_steps(), 1);
  EXPECT_EQ(engine.global_steps(), 2);
  EXPECT_EQ(engine.loss_scale(), 256);
  EXPECT_TRUE(snapshot(model).equal(before)) << "a skipped step must not change the weights";

  train_step(engine, model, 2, g_world->rank() == last);  // hysteresis used up: halve
  EXPECT_EQ(engine.skipped_steps(), 2);
  EXPECT_EQ(engine.loss_scale(), 128);

  // The window counts clean iterations since the last overflow (iteration
  // 2): the scale doubles when (iteration - 2) % 3 == 0, i.e. at iteration 5.
  train_step(engine, model, 3, false);
  train_step(engine, model, 4, false);
  EXPECT_EQ(engine.loss_scale(), 128);
  train_step(engine, model, 5, false);
  EXPECT_EQ(engine.loss_scale(), 256);
  EXPECT_FALSE(snapshot(model).equal(before));

  // Every rank holds the same weights.
  auto mine = snapshot(model).to(at::kFloat);
  auto max = mine.clone(), min = mine.neg();
  g_world->all_reduce(max, zero::comm::ReduceOp::Max);
  g_world->all_reduce(min, zero::comm::ReduceOp::Max);
  EXPECT_TRUE(max.equal(min.neg()));
}

TEST(Fp16, StaticScaleSkipsWithoutChangingTheScale) {
  Elementwise model;
  auto engine = make_engine(model, R"({"enabled": true, "loss_scale": 64})");
  train_step(engine, model, 0, g_world->rank() == 0);
  EXPECT_EQ(engine.skipped_steps(), 1);
  EXPECT_EQ(engine.loss_scale(), 64);
  train_step(engine, model, 1, false);
  EXPECT_EQ(engine.skipped_steps(), 1);
  EXPECT_EQ(engine.loss_scale(), 64);
}

TEST(Fp16, OverflowAtMinimumScaleIsAnError) {
  Elementwise model;
  auto engine = make_engine(model, R"({"enabled": true, "initial_scale_power": 4, "hysteresis": 1,
                                       "min_loss_scale": 16})");
  EXPECT_THROW(train_step(engine, model, 0, g_world->rank() == 0), zero::EngineError);
}

TEST(Fp16, SkippedStepsDoNotAdvanceTheSchedule) {
  Elementwise model;
  // Linear warmup 0 -> 0.1 over 10 steps. DeepSpeed's order: the k-th
  // applied optimizer step (k = 1, 2, ...) uses min for k <= 2, then
  // min + (max - min) * (k - 2) / 10.
  auto engine = make_engine(model, R"({"enabled": true, "initial_scale_power": 8, "hysteresis": 1})",
                            R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.1,
                                "warmup_num_steps": 10, "warmup_type": "linear"}})");
  auto expected = [](int applied) { return applied <= 2 ? 0.0 : 0.1 * (applied - 2) / 10.0; };
  int applied = 0;
  EXPECT_NEAR(engine.get_lr(), expected(1), 1e-12) << "before the first step: the first step's rate";
  for (int step = 0; step < 8; ++step) {
    const bool overflow = step == 3 || step == 4;
    train_step(engine, model, step, overflow && g_world->rank() == 0);
    if (!overflow) {
      ++applied;
      EXPECT_NEAR(engine.lr(), expected(applied), 1e-12) << "step " << step;
    }
    // DeepSpeed's get_lr(): the rate of the next applied step.
    EXPECT_NEAR(engine.get_lr(), expected(applied + 1), 1e-12) << "step " << step;
  }
  EXPECT_EQ(engine.skipped_steps(), 2);
}

// bf16 reaches the same loss band as fp32 on a small regression task.
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    torch::manual_seed(11);
    l1 = register_module("l1", torch::nn::Linear(16, 64));
    l2 = register_module("l2", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return l2(torch::gelu(l1(x))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr};
};
TORCH_MODULE(Mlp);

// Mean loss over the first and the last 20 steps.
std::pair<double, double> losses(bool bf16) {
  Mlp model;
  const at::Device device = zero_test::test_device();
  model->to(device);
  const std::string json = std::string(R"({"train_micro_batch_size_per_gpu": 32, "steps_per_print": 1000000,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 2},
    "bf16": {"enabled": )") + (bf16 ? "true" : "false") + "}}";
  zero::InitOptions options;
  options.group = g_world;
  auto engine = zero::initialize(zero::Config::from_json(json), model, options);
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    auto gen = at::detail::createCPUGenerator(9000 + step * 13 + g_world->rank());
    auto x = torch::randn({32, 16}, gen).to(device);
    auto y = torch::tanh(x.narrow(1, 0, 2).sum(1, true));
    auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
    auto loss = (model->forward(x.to(dtype)).to(at::kFloat) - y).pow(2).mean();
    engine.backward(loss);
    engine.step();
    if (step < 20) first += loss.item<double>() / 20;
    if (step >= 180) last += loss.item<double>() / 20;
  }
  // The same figures on every rank: averaged over the ranks' data.
  at::Tensor both = torch::tensor({first, last}, torch::kDouble);
  g_world->all_reduce(both, zero::comm::ReduceOp::Avg);
  return {both[0].item<double>(), both[1].item<double>()};
}

// An op whose backward raises a LibTorch error (as a kernel missing for a
// dtype does).
struct FailingBackward : torch::autograd::Function<FailingBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, torch::Tensor x) { return x * 2; }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    TORCH_CHECK(false, "no backward for this op here");
    return g;
  }
};

// It reaches the user as one line in a zero::EngineError, without C++
// frames, and the engine trains on after it.
TEST(Errors, ALibTorchErrorInBackwardIsOneEngineErrorLine) {
  Elementwise model;
  auto engine = make_engine(model, R"({"enabled": false})");
  auto x = batch_x(0, at::kFloat);
  auto loss = FailingBackward::apply(model->forward(x)).pow(2).mean();
  std::string message;
  try {
    engine.backward(loss);
  } catch (const zero::EngineError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("engine.backward: LibTorch raised: no backward for this op here"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(message.find("Exception raised from"), std::string::npos) << message;
  const auto before = snapshot(model);
  engine.backward((model->forward(x) - 1.0).pow(2).mean());
  engine.step();
  EXPECT_FALSE(torch::equal(before, snapshot(model)));
}

// A rank started with another learning rate, or another model, stops every
// rank at initialize with the key that differs and the ranks on each side.
std::string initialize_error(const std::string& lr, torch::nn::Linear model) {
  const std::string json = R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000,
    "optimizer": {"type": "SGD", "params": {"lr": )" + lr + R"(}}, "zero_optimization": {"stage": 2}})";
  zero::InitOptions options;
  options.group = g_world;
  try {
    zero::initialize(zero::Config::from_json(json), model, options);
  } catch (const zero::EngineError& e) {
    return e.what();
  }
  return "";
}

TEST(Agreement, RanksThatDisagreeStopNamingTheKeyAndTheRanks) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const bool last = g_world->rank() == g_world->size() - 1;
  const std::string last_rank = "rank " + std::to_string(g_world->size() - 1);
  std::string others = g_world->size() == 2 ? "rank 0" : "ranks 0";
  for (int r = 1; r + 1 < g_world->size(); ++r) others += ", " + std::to_string(r);
  std::string message = initialize_error(last ? "0.02" : "0.01", torch::nn::Linear(4, 4));
  EXPECT_NE(message.find("disagree on config.optimizer.params.lr"), std::string::npos) << message;
  EXPECT_NE(message.find("0.02 on " + last_rank), std::string::npos) << message;
  EXPECT_NE(message.find("0.01 on " + others), std::string::npos) << message;
  message = initialize_error("0.01", torch::nn::Linear(4, last ? 5 : 4));
  EXPECT_NE(message.find("disagree on parameter weight"), std::string::npos) << message;
  EXPECT_NE(message.find("[5, 4]"), std::string::npos) << message;
  EXPECT_NE(message.find("(and 1 more key(s) differ)"), std::string::npos) << message;  // the bias
  EXPECT_EQ(initialize_error("0.01", torch::nn::Linear(4, 4)), "");
}

TEST(Bf16, TrainsToTheSameLossBandAsFp32) {
  const auto [start, fp32] = losses(false);
  const double bf16 = losses(true).second;
  EXPECT_LT(fp32, 0.3 * start) << "the task itself must be learnt";
  EXPECT_LT(std::abs(bf16 - fp32), 0.25 * fp32 + 0.01) << "fp32 " << fp32 << " bf16 " << bf16;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_world = zero::comm::init_process_group();
  const int rc = RUN_ALL_TESTS();
  g_world->barrier();
  g_world.reset();
  return rc;
}
