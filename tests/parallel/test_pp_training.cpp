// Pipeline parallelism through the engine against one process: a model of
// layers (a tied embedding and LM head around tensor-parallel blocks,
// tp_model.h) split into pipeline stages, trained with train_batch (1F1B,
// gradient_accumulation_steps micro-batches) at pp x tp x dp on the same
// global batches as the same model on one rank alone (pp 1, tp 1, the
// whole batch), 20 steps with clipping. Per step the mean loss (relative
// error below 1e-5) and the clipping norm, at the end every parameter
// (this stage's, this rank's slice), must agree.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "pp_model.h"
#include "world_main.h"
#include "zero/zero.h"

namespace {

using pp_test::g_alive;
using pp_test::g_most_alive;
using pp_test::kContext;
using pp_test::kVocab;
using pp_test::pipe_net;

constexpr int64_t kMicro = 2;
constexpr int kSteps = 20;

std::string config_of(int stage, int64_t micro, int gas, int tp, int pp) {
  std::ostringstream c;
  c << R"({"train_micro_batch_size_per_gpu": )" << micro << R"(, "gradient_accumulation_steps": )" << gas
    << R"(, "steps_per_print": 1000, "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "tensor_parallel": {"autotp_size": )" << tp << R"(}, "pipeline": {"stages": )" << pp << R"(},
        "zero_optimization": {"stage": )" << stage << R"(, "reduce_bucket_size": 600}})";
  return c.str();
}

at::Tensor global_batch(int64_t micro, int dp_size) {
  torch::manual_seed(1000 + micro);
  return torch::randint(kVocab, {dp_size * kMicro, kContext + 1}, torch::kLong);
}

struct Outcome {
  std::vector<double> losses, norms;
  std::map<std::string, at::Tensor> params;
  double eval_loss = 0;
};

// kSteps train_batch calls on rows [first, first + rows) of each global batch.
Outcome train(zero::Engine& engine, int gas, int dp_size, int64_t first, int64_t rows) {
  Outcome out;
  int64_t micro = 0;
  auto next = [&]() -> zero::Engine::Batch {
    const at::Tensor b = global_batch(micro++, dp_size).slice(0, first, first + rows);
    return {b.slice(1, 0, kContext), b.slice(1, 1, kContext + 1)};
  };
  for (int step = 0; step < kSteps; ++step) {
    micro = step * gas;
    out.losses.push_back(engine.train_batch(next));
    out.norms.push_back(engine.last_grad_norm());
  }
  micro = 10000;
  out.eval_loss = engine.eval_batch(next);
  for (auto& [name, t] : engine.gathered_state_dict()) out.params[name] = t;
  return out;
}

Outcome reference(int stage, int gas, int dp_size) {
  auto mesh = std::make_shared<zero::Mesh>(alone(), 1, 1);
  auto model = pipe_net(mesh);
  zero::InitOptions init;
  init.mesh = mesh;
  auto engine = zero::initialize(zero::Config::from_json(config_of(stage, dp_size * kMicro, gas, 1, 1)), model, init);
  return train(engine, gas, dp_size, 0, dp_size * kMicro);
}

struct PipeRun {
  Outcome outcome;
  std::map<std::string, zero::tp::Split> splits;
  int most_alive = 0;
};

PipeRun pipelined(int stage, int gas, int tp, int pp, const std::string& partition = "parameters") {
  auto mesh = std::make_shared<zero::Mesh>(g_world, tp, pp);
  auto model = pipe_net(mesh, partition);
  EXPECT_EQ(model->num_stages(), pp);
  zero::InitOptions init;
  init.mesh = mesh;
  auto engine = zero::initialize(zero::Config::from_json(config_of(stage, kMicro, gas, tp, pp)), model, init);
  g_alive = 0;
  g_most_alive = 0;
  PipeRun run;
  run.outcome = train(engine, gas, mesh->shape().dp, mesh->coordinates().dp * kMicro, kMicro);
  run.splits = zero::tp::tensor_parallel_splits(*model);
  run.most_alive = g_most_alive;
  return run;
}

void expect_parity(const Outcome& ref, const PipeRun& run, const std::string& what) {
  const Outcome& got = run.outcome;
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << what << ", step " << i;
    EXPECT_NEAR(got.norms[i], ref.norms[i], 1e-5 * ref.norms[i]) << what << ", clipping norm at step " << i;
  }
  EXPECT_GT(*std::max_element(ref.norms.begin(), ref.norms.end()), 0.5) << what << ": clipping never acted";
  EXPECT_NEAR(got.eval_loss, ref.eval_loss, 1e-5 * ref.eval_loss) << what << ", eval_batch";
  ASSERT_FALSE(got.params.empty());
  for (const auto& [name, t] : got.params) {
    ASSERT_TRUE(ref.params.count(name)) << what << ": " << name << " is not a parameter of the model at pp 1";
    at::Tensor want = ref.params.at(name);
    if (auto it = run.splits.find(name); it != run.splits.end()) want = zero::tp::slice_of(want, it->second);
    ASSERT_EQ(t.sizes(), want.sizes()) << what << ", " << name;
    const double scale = std::max(want.abs().max().item<double>(), 1.0);
    EXPECT_LE((t - want).abs().max().item<double>(), 1e-5 * scale) << what << ", " << name;
  }
}

// At most `stages - stage` micro-batches of activations alive (1F1B), the
// whole accumulation when fewer.
void expect_one_forward_one_backward(const PipeRun& run, int gas, int pp, const std::string& what) {
  const int s = g_world->rank() / (g_world->size() / pp);  // Megatron's order: pp varies slowest
  EXPECT_EQ(run.most_alive, std::min(pp - s, gas)) << what << ": micro-batches alive at once on stage " << s;
}

TEST(PipelineTraining, StagesZeroAndOneMatchOneProcess) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "pp 2 needs an even world";
  const int dp_size = g_world->size() / 2;
  for (int stage : {0, 1}) {
    const std::string what = "pp 2 x dp " + std::to_string(dp_size) + " stage " + std::to_string(stage) + " gas 4";
    SCOPED_TRACE(what);
    const Outcome ref = reference(stage, 4, dp_size);
    const PipeRun run = pipelined(stage, 4, 1, 2);
    expect_parity(ref, run, what);
    expect_one_forward_one_backward(run, 4, 2, what);
  }
}

TEST(PipelineTraining, TensorTimesPipelineMatchesOneProcess) {
  if (g_world->size() % 4 != 0) GTEST_SKIP() << "tp 2 x pp 2 needs a multiple of 4 ranks";
  const int dp_size = g_world->size() / 4;
  const std::string what = "tp 2 x pp 2 x dp " + std::to_string(dp_size) + " stage 1 gas 4";
  const Outcome ref = reference(1, 4, dp_size);
  const PipeRun run = pipelined(1, 4, 2, 2);
  expect_parity(ref, run, what);
  expect_one_forward_one_backward(run, 4, 2, what);
}

TEST(PipelineTraining, FourStagesUniformMatchOneProcess) {
  if (g_world->size() != 4) GTEST_SKIP() << "pp 4 runs on 4 ranks";
  const std::string what = "pp 4 stage 1 gas 3, uniform partition";
  const Outcome ref = reference(1, 3, 1);
  const PipeRun run = pipelined(1, 3, 1, 4, "uniform");
  expect_parity(ref, run, what);
  expect_one_forward_one_backward(run, 3, 4, what);
}

TEST(PipelineTraining, ClearErrors) {
  if (g_world->size() % 2 != 0) GTEST_SKIP();
  auto mesh = std::make_shared<zero::Mesh>(g_world, 1, 2);
  // A model that is not a pipeline, at pipeline.stages 2.
  auto plain = std::make_shared<torch::nn::Module>();
  plain->register_parameter("w", torch::ones({4}));
  zero::InitOptions init;
  init.mesh = mesh;
  try {
    zero::initialize(zero::Config::from_json(config_of(1, kMicro, 2, 1, 2)), plain, init);
    ADD_FAILURE() << "a plain module at pipeline.stages 2 was accepted";
  } catch (const zero::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("not a zero::pipe::PipelineModule"), std::string::npos) << e.what();
  }
  // backward() and step() name train_batch.
  auto engine = zero::initialize(zero::Config::from_json(config_of(1, kMicro, 2, 1, 2)), pipe_net(mesh), init);
  try {
    engine.backward(torch::ones({}, torch::requires_grad()));
    ADD_FAILURE() << "backward on a pipeline was accepted";
  } catch (const zero::EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("train_batch"), std::string::npos) << e.what();
  }
  // More stages than layers.
  auto wide = std::make_shared<zero::Mesh>(g_world, 1, g_world->size());
  if (g_world->size() > 1) {
    std::vector<zero::pipe::Layer> one;
    one.emplace_back([] { return torch::nn::AnyModule(torch::nn::Linear(2, 2)); });
    try {
      zero::pipe::PipelineModule m(std::move(one), wide, {});
      ADD_FAILURE() << "one layer split into " << g_world->size() << " stages";
    } catch (const zero::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot split 1 layer(s) into"), std::string::npos) << e.what();
    }
  }
}

// The partition, against sums worked by hand.
TEST(PipelinePartition, BalancesTheLargestPart) {
  EXPECT_EQ(zero::pipe::partition_balanced({1, 1, 1, 1}, 2), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(zero::pipe::partition_balanced({10, 1, 1, 1, 1, 10}, 3), (std::vector<int>{0, 1, 5, 6}));
  EXPECT_EQ(zero::pipe::partition_balanced({5, 1, 1, 1, 1, 1}, 2), (std::vector<int>{0, 1, 6}));
  EXPECT_EQ(zero::pipe::partition_balanced({3}, 1), (std::vector<int>{0, 1}));
  EXPECT_THROW(zero::pipe::partition_balanced({1, 1}, 3), zero::ConfigError);
}

}  // namespace
