// Tensor parallelism composed with ZeRO through the engine, against one
// process: a model of tensor-parallel layers (tp_model.h), and the example
// GPT split by AutoTP from the config's autotp_size alone, trained at tp 2
// x dp (world / 2) on the same global batches as the same model trained
// alone (a group of one, tp 1, the whole batch), 20 steps with clipping.
// Per step the mean loss (relative error below 1e-5) and the clipping
// norm, at the end every parameter (this rank's slice of the reference's),
// must agree.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "gpt/gpt.h"
#include "tp_model.h"
#include "world_main.h"
#include "zero/zero.h"

namespace {

using tp_test::kContext;
using tp_test::kVocab;
using tp_test::TpNet;

constexpr int64_t kMicro = 2;
constexpr int kSteps = 20;

std::string config_of(int stage, int64_t micro, int gas, int tp, const std::string& extra = "", double lr = 0.01) {
  std::ostringstream c;
  c << R"({"train_micro_batch_size_per_gpu": )" << micro << R"(, "gradient_accumulation_steps": )" << gas
    << R"(, "steps_per_print": 1000, "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": )" << lr << R"(, "weight_decay": 0.01}},
        "tensor_parallel": {"autotp_size": )"
    << tp << R"(},
        "zero_optimization": {"stage": )"
    << stage << R"(, "reduce_bucket_size": 600, "stage3_param_persistence_threshold": 0})" << extra << "}";
  return c.str();
}

struct Outcome {
  std::vector<double> losses;  // per optimizer step: the mean over the global batch
  std::vector<double> norms;   // per optimizer step: the clipping norm
  std::map<std::string, at::Tensor> params;
};

// The global batch of micro-step `micro`: dp_size * kMicro sequences; data
// rank d trains on rows [d * kMicro, (d + 1) * kMicro).
at::Tensor global_batch(int64_t micro, int dp_size) {
  torch::manual_seed(1000 + micro);
  return torch::randint(kVocab, {dp_size * kMicro, kContext + 1}, torch::kLong);
}

// Trains `model` with `engine` for kSteps steps of `gas` micro-steps, on
// rows [first, first + rows) of each global batch.
using LossFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;

Outcome train(zero::Engine& engine, const LossFn& loss_of, int gas, int dp_size, int64_t first, int64_t rows,
              const std::shared_ptr<zero::comm::ProcessGroup>& dp) {
  Outcome out;
  for (int step = 0; step < kSteps; ++step) {
    double sum = 0;
    for (int m = 0; m < gas; ++m) {
      const at::Tensor batch = global_batch(step * gas + m, dp_size).slice(0, first, first + rows);
      at::Tensor loss = loss_of(batch.slice(1, 0, kContext), batch.slice(1, 1, kContext + 1));
      engine.backward(loss);
      engine.step();
      sum += loss.item<double>();
    }
    at::Tensor mean = torch::tensor({sum / gas}, torch::kDouble);
    if (dp) dp->all_reduce(mean, zero::comm::ReduceOp::Avg);
    out.losses.push_back(mean.item<double>());
    out.norms.push_back(engine.last_grad_norm());
  }
  for (auto& [name, t] : engine.gathered_state_dict()) out.params[name] = t;
  return out;
}

LossFn loss_of(TpNet model) {
  return [model](const at::Tensor& x, const at::Tensor& y) mutable { return model->loss(x, y); };
}

// The same model alone on this rank, on the whole global batch.
Outcome reference(int stage, int gas, int dp_size, const std::shared_ptr<zero::comm::ProcessGroup>& alone) {
  torch::manual_seed(0);
  TpNet model(alone, 2);
  zero::InitOptions init;
  init.group = alone;
  auto engine = zero::initialize(zero::Config::from_json(config_of(stage, dp_size * kMicro, gas, 1)), model, init);
  return train(engine, loss_of(model), gas, dp_size, 0, dp_size * kMicro, nullptr);
}

Outcome tensor_parallel(int stage, int gas, const std::string& extra = "") {
  auto mesh = std::make_shared<zero::Mesh>(g_world, 2, 1);
  torch::manual_seed(0);
  TpNet model(mesh->tp_group(), 2);
  zero::InitOptions init;
  init.mesh = mesh;
  auto engine = zero::initialize(zero::Config::from_json(config_of(stage, kMicro, gas, 2, extra)), model, init);
  EXPECT_EQ(&engine.mesh(), mesh.get());
  const int dp_size = mesh->shape().dp;
  return train(engine, loss_of(model), gas, dp_size, mesh->coordinates().dp * kMicro, kMicro, mesh->dp_group());
}

zero_examples::GPT gpt(double dropout = 0.0) {
  zero_examples::GPTOptions o;
  o.vocab_size = kVocab;
  o.context = kContext;
  o.depth = 2;
  o.width = 32;
  o.heads = 4;
  o.dropout = dropout;
  torch::manual_seed(0);
  return zero_examples::GPT(o);
}

LossFn loss_of(zero_examples::GPT model) {
  return [model](const at::Tensor& x, const at::Tensor& y) mutable { return model->loss(x, y); };
}

void expect_parity(const Outcome& ref, const Outcome& tp, const torch::nn::Module& tp_model_layout,
                   const std::string& what, double param_tolerance = 1e-5) {
  ASSERT_EQ(ref.losses.size(), tp.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(tp.losses[i], ref.losses[i], 1e-5 * std::abs(ref.losses[i])) << what << ", step " << i;
    EXPECT_NEAR(tp.norms[i], ref.norms[i], 1e-5 * ref.norms[i]) << what << ", clipping norm at step " << i;
  }
  const auto splits = zero::tp::tensor_parallel_splits(tp_model_layout);
  ASSERT_EQ(ref.params.size(), tp.params.size());
  for (const auto& [name, full] : ref.params) {
    at::Tensor want = full;
    if (auto it = splits.find(name); it != splits.end()) want = zero::tp::slice_of(full, it->second);
    at::Tensor got = tp.params.at(name);
    ASSERT_EQ(got.sizes(), want.sizes()) << what << ", " << name;
    if (name.find("attn.qkv.bias") != std::string::npos) {
      // The key bias has no gradient (q.b_k is the same for every key, and
      // softmax ignores a constant), so what moves it is rounding noise that
      // Adam scales to lr-sized steps; compare the query and value biases.
      const auto q_k_v = got.chunk(3);
      const auto want_q_k_v = want.chunk(3);
      got = torch::cat({q_k_v[0], q_k_v[2]});
      want = torch::cat({want_q_k_v[0], want_q_k_v[2]});
    }
    // Relative to the tensor's largest element, or absolute for tensors
    // below 1 (biases start at 0): 1e-5 is 1/200 of one Adam step here.
    const double scale = std::max(want.abs().max().item<double>(), 1.0);
    EXPECT_LE((got - want).abs().max().item<double>(), param_tolerance * scale) << what << ", " << name;
  }
}

TEST(TensorParallelTraining, EveryStageMatchesOneProcess) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "tp 2 needs an even world";
  const int dp_size = g_world->size() / 2;
  TpNet layout(zero::Mesh(g_world, 2, 1).tp_group(), 2);  // for the splits' names
  for (int stage : {0, 1, 2, 3}) {
    for (int gas : {1, 2}) {
      if (gas == 2 && stage % 2 == 1) continue;  // accumulation at stages 0 and 2 suffices
      const std::string what = "stage " + std::to_string(stage) + " gas " + std::to_string(gas) + " tp 2 x dp " +
                               std::to_string(dp_size);
      SCOPED_TRACE(what);
      const Outcome ref = reference(stage, gas, dp_size, alone());
      const Outcome tp = tensor_parallel(stage, gas);
      expect_parity(ref, tp, *layout, what);
      // Clipping was active: the norm crossed the threshold.
      EXPECT_GT(*std::max_element(ref.norms.begin(), ref.norms.end()), 0.5) << what;
    }
  }
}

// Attention's softmax amplifies rounding more than the MLP model does: at
// lr 0.01 one process and tp 2 drift apart past 1e-5 after ~10 steps (a
// rounding difference, not a wrong gradient: the first steps agree to 1e-7).
constexpr double kGptLr = 0.002;
// At lr 0.002 the weights still drift by rounding to about 1e-5 over the 20
// steps (1.08e-5 in one element on LibTorch 2.15 with the blocks' present
// initialisation): the parameters are compared to 2e-5, 1/100 of one Adam
// step, where a wrong gradient moves them by whole steps.
constexpr double kGptParamTolerance = 2e-5;

// AutoTP: the engine splits the example GPT's zero::tp::Linear modules by
// gpt_rules() from tensor_parallel.autotp_size alone (no mesh given).
TEST(TensorParallelTraining, AutoTpGptMatchesOneProcess) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "tp 2 needs an even world";
  const int dp_size = g_world->size() / 2;
  for (int stage : {1, 3}) {
    const std::string what = "AutoTP GPT stage " + std::to_string(stage);
    SCOPED_TRACE(what);
    zero_examples::GPT ref_model = gpt();
    zero::InitOptions alone_init;
    alone_init.group = alone();
    auto ref_engine =
        zero::initialize(zero::Config::from_json(config_of(stage, dp_size * kMicro, 1, 1, "", kGptLr)), ref_model, alone_init);
    const Outcome ref = train(ref_engine, loss_of(ref_model), 1, dp_size, 0, dp_size * kMicro, nullptr);

    zero_examples::GPT model = gpt();
    zero::InitOptions init;
    init.group = g_world;
    auto engine = zero::initialize(zero::Config::from_json(config_of(stage, kMicro, 1, 2, "", kGptLr)), model, init);
    const auto& mesh = engine.mesh();
    EXPECT_EQ(mesh.shape().tp, 2);
    // Split: 4 Linear modules per block, each holding half its weight.
    const auto splits = zero::tp::tensor_parallel_splits(*model);
    EXPECT_EQ(splits.size(), 2u * (2 + 1 + 2 + 1));  // per block: qkv w+b, attn.proj w, fc w+b, mlp.proj w
    EXPECT_EQ(splits.at("blocks.0.attn.qkv.weight").parts, 3);
    const Outcome tp = train(engine, loss_of(model), 1, dp_size, mesh.coordinates().dp * kMicro, kMicro,
                             mesh.dp_group());
    expect_parity(ref, tp, *model, what, kGptParamTolerance);
  }
}

// partition_activations: the AutoTP GPT (dropout on) with every block
// checkpointed, each tensor-parallel rank keeping half of each block's
// input, trains as without checkpointing; the kept bytes are half of what
// whole inputs take, and the recomputes gather them all back.
TEST(TensorParallelTraining, PartitionedActivationCheckpointsTrainAsWithout) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "tp 2 needs an even world";
  const int dp_size = g_world->size() / 2;
  for (int stage : {1, 3}) {
    auto run = [&](const std::string& checkpointing, zero::ActivationCheckpointStats& stats) {
      zero_examples::GPT model = gpt(0.1);
      zero::InitOptions init;
      init.group = g_world;
      const std::string extra = checkpointing.empty() ? "" : R"(, "activation_checkpointing": )" + checkpointing;
      auto engine = zero::initialize(zero::Config::from_json(config_of(stage, kMicro, 1, 2, extra, kGptLr)), model, init);
      const auto& mesh = engine.mesh();
      zero::take_activation_checkpoint_stats();
      Outcome out = train(engine, loss_of(model), 1, dp_size, mesh.coordinates().dp * kMicro, kMicro, mesh.dp_group());
      stats = zero::take_activation_checkpoint_stats();
      return out;
    };
    const std::string what = "stage " + std::to_string(stage);
    zero::ActivationCheckpointStats none, whole, split;
    const Outcome plain = run("", none);
    const Outcome kept_whole = run(R"({"checkpoint_every": 1})", whole);
    const Outcome partitioned = run(
        R"({"checkpoint_every": 1, "partition_activations": true, "contiguous_memory_optimization": true})", split);
    ASSERT_EQ(plain.losses.size(), partitioned.losses.size());
    for (size_t i = 0; i < plain.losses.size(); ++i) {
      EXPECT_NEAR(kept_whole.losses[i], plain.losses[i], 1e-6 * plain.losses[i]) << what << ", step " << i;
      EXPECT_NEAR(partitioned.losses[i], plain.losses[i], 1e-6 * plain.losses[i]) << what << ", step " << i;
    }
    for (const auto& [name, t] : plain.params) {
      const double scale = std::max(t.abs().max().item<double>(), 1.0);
      EXPECT_LE((partitioned.params.at(name) - t).abs().max().item<double>(), 1e-6 * scale) << what << ", " << name;
    }
    EXPECT_EQ(none.forwards, 0);
    EXPECT_EQ(whole.forwards, 2 * kSteps) << "2 blocks per step";
    EXPECT_EQ(split.recomputes, 2 * kSteps);
    EXPECT_GT(whole.saved_bytes, 0);
    EXPECT_EQ(2 * split.saved_bytes, whole.saved_bytes) << what << ": each tp rank keeps half";
    EXPECT_EQ(split.gathered_bytes, whole.saved_bytes) << what << ": the recomputes gather the whole inputs";
    if (stage == 1) {  // the process's first contiguous buffer
      EXPECT_EQ(split.buffers_made, 1) << what << ": the second step sizes the buffer, the rest reuse it";
      EXPECT_EQ(split.buffer_misses, 2) << what << ": only the first step's two inputs miss";
    } else {
      EXPECT_EQ(split.buffers_made, 0) << what << ": the buffer of the run before fits";
      EXPECT_EQ(split.buffer_misses, 0) << what;
    }
  }
}

TEST(TensorParallelTraining, AutoTpNamesWhatItCannotSplit) {
  struct Plain : torch::nn::Module {
    Plain() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
    torch::nn::Linear fc{nullptr};
  };
  auto group = zero::Mesh(g_world, g_world->size(), 1).tp_group();
  Plain plain;
  try {
    zero::tp::auto_tensor_parallel(plain, group, {{"fc", zero::tp::LinearImpl::Kind::Column, 1}});
    FAIL() << "a torch::nn::Linear was accepted";
  } catch (const zero::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fc matches the rule \"fc\" but is a torch::nn::Linear"), std::string::npos)
        << e.what();
  }
  try {
    zero::tp::auto_tensor_parallel(plain, group);
    FAIL() << "a model no rule matches was accepted";
  } catch (const zero::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no zero::tp::Linear of the model matches the rules"), std::string::npos)
        << e.what();
  }
}

TEST(TensorParallelTraining, Bf16MatchesOneProcessInBf16) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "tp 2 needs an even world";
  const int dp_size = g_world->size() / 2;
  TpNet layout(zero::Mesh(g_world, 2, 1).tp_group(), 2);
  // bf16 rounds the partial sums of row-parallel layers differently from
  // one matmul, so the comparison is looser: 1e-2 relative on the loss.
  torch::manual_seed(0);
  TpNet ref_model(alone(), 2);
  zero::InitOptions alone_init;
  alone_init.group = alone();
  const std::string bf16 = R"(, "bf16": {"enabled": true})";
  auto ref_engine = zero::initialize(
      zero::Config::from_json(config_of(2, dp_size * kMicro, 1, 1, bf16)), ref_model, alone_init);
  const Outcome ref = train(ref_engine, loss_of(ref_model), 1, dp_size, 0, dp_size * kMicro, nullptr);
  const Outcome tp = tensor_parallel(2, 1, bf16);
  ASSERT_EQ(ref.losses.size(), tp.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_NEAR(tp.losses[i], ref.losses[i], 1e-2 * ref.losses[i]) << i;
}

TEST(TensorParallelTraining, AMeshThatDisagreesWithTheConfigIsAClearError) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "tp 2 needs an even world";
  auto mesh = std::make_shared<zero::Mesh>(g_world, 2, 1);
  TpNet model(mesh->tp_group(), 1);
  zero::InitOptions init;
  init.mesh = mesh;
  try {
    zero::initialize(zero::Config::from_json(config_of(1, kMicro, 1, 1)), model, init);
    FAIL() << "a tp 2 mesh was accepted for a tp 1 config";
  } catch (const zero::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("the mesh the model was built on is tp 2 x pp 1 but the config asks for tp 1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace

// fp16: an overflow in one tensor-parallel rank's gradients skips the step
// on every rank (the sum of squares is agreed over the world before the
// check), and the loss scale halves everywhere. Elementwise ops only: the
// CPU lacks fp16 matmul kernels.
struct ScaledImpl : torch::nn::Module, zero::tp::SplitModule {
  explicit ScaledImpl(zero::tp::Group g) : group_(std::move(g)) {
    w = register_parameter("w", torch::ones({4}));  // this rank's half of a weight of 8
  }
  std::optional<zero::tp::Split> split(const std::string& name) const override {
    if (name != "w") return std::nullopt;
    return zero::tp::Split{0, group_->rank(), group_->size(), {4 * group_->size()}, 1};
  }
  const zero::tp::Group& group() const override { return group_; }
  at::Tensor w;
  zero::tp::Group group_;
};
TORCH_MODULE(Scaled);

TEST(TensorParallelTraining, Fp16OverflowOnOneTensorParallelRankSkipsEverywhere) {
  if (g_world->size() % 2 != 0) GTEST_SKIP() << "tp 2 needs an even world";
  auto mesh = std::make_shared<zero::Mesh>(g_world, 2, 1);
  Scaled model(mesh->tp_group());
  zero::InitOptions init;
  init.mesh = mesh;
  auto engine = zero::initialize(
      zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 1, "steps_per_print": 1000,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "tensor_parallel": {"autotp_size": 2},
        "fp16": {"enabled": true, "initial_scale_power": 4, "hysteresis": 1}, "zero_optimization": {"stage": 1}})"),
      model, init);
  const bool overflows_here = mesh->coordinates().tp == 1 && mesh->coordinates().dp == 0;
  // 60000 * scale 16 is past fp16's 65504 on one rank only.
  at::Tensor x = torch::full({4}, overflows_here ? 60000.0 : 1.0, torch::kHalf);
  engine.backward((model->w * x).sum());
  engine.step();
  EXPECT_EQ(engine.skipped_steps(), 1) << "rank " << g_world->rank();
  EXPECT_EQ(engine.loss_scale(), 8.0);
  EXPECT_TRUE(torch::equal(model->w.to(at::kFloat), torch::ones({4}))) << "a skipped step moved the weights";
  // A finite step then updates every rank: w -= lr * x.
  engine.backward((model->w * torch::ones({4}, torch::kHalf)).sum());
  engine.step();
  EXPECT_EQ(engine.skipped_steps(), 1);
  EXPECT_TRUE(torch::allclose(model->w.to(at::kFloat), torch::full({4}, 0.9), 1e-3, 1e-3)) << model->w;
}
