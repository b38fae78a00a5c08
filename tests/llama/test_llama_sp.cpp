// Ulysses sequence parallelism for the Llama family (zero/sequence_parallel.h),
// run on 2 and 4 ranks:
// - each rank's slice of the logits equals transformers' logits of the
//   whole sequence (the fixtures' logits.safetensors), with grouped-query
//   attention split (4 key/value heads) and repeated (2 heads over 4 ranks);
// - training at sp 2 and 4 (and sp 2 x dp 2) follows, step by step, one
//   process training the same global batch of whole sequences: losses and
//   gradient norms within 1e-6 relative over 20 fp32 steps at ZeRO stages
//   1-3, and the parameters at the end;
// - the same with ALST's tiled MLPs and loss and blockwise attention,
//   inside activation checkpoints;
// - the all-to-all bytes of a forward equal the formula;
// - bad layouts are refused with the numbers.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/llama/llama_reference.h"
#include "world_main.h"
#include "zero/llama.h"
#include "zero/sequence_parallel.h"
#include "zero/zero.h"

namespace {

using zero::llama::LlamaConfig;
using zero::llama::LlamaForCausalLM;
using llama_reference::kFixtures;

LlamaConfig fixture(const std::string& name) { return LlamaConfig::from_file(kFixtures / name / "config.json"); }

// AdamW as the Llama tests train; SGD, whose update is the gradient itself,
// for comparing parameters: Adam's update divides each gradient element by
// its own running scale, so that a difference of 1e-7 in an element near
// zero moves its parameter by up to a step.
const char* const kAdamW = R"({"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}})";
const char* const kSgd = R"({"type": "SGD", "params": {"lr": 0.05}})";

std::string ds_config(int stage, int64_t micro, int sp, const std::string& optimizer = kAdamW,
                      const std::string& extra = "") {
  const std::string stage3 = stage == 3 ? R"(, "stage3_param_persistence_threshold": 0)" : "";
  return R"({"train_micro_batch_size_per_gpu": )" + std::to_string(micro) + R"(, "sequence_parallel_size": )" +
         std::to_string(sp) + R"(, "zero_optimization": {"stage": )" + std::to_string(stage) + stage3 +
         R"(}, "optimizer": )" + optimizer + extra + "}";
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

TEST(Ulysses, LogitsOfEachRanksTokensEqualTransformers) {
  const int W = g_world->size();
  for (const std::string name : {"gqa_untied", "tied_llama3"}) {
    SCOPED_TRACE(name);
    const LlamaConfig config = fixture(name);
    LlamaForCausalLM model(config);
    zero::Engine engine = zero::initialize(zero::Config::from_json(ds_config(0, 1, W)), model);
    ASSERT_EQ(engine.mesh().sp_group()->size(), W);
    model->sequence_parallel(engine.mesh().sp_group());
    engine.load_weights(kFixtures / name);
    model->eval();
    const at::Tensor want = llama_reference::transformers_logits(name);
    const int64_t T = want.size(0);
    torch::NoGradGuard no_grad;
    at::Tensor ids = torch::tensor(llama_reference::first_sequence(T)).unsqueeze(0);
    const auto before = engine.mesh().sp_group()->stats().all_to_all_bytes;
    at::Tensor got = model->forward(zero::sp::own_tokens(ids, engine.mesh().sp_group()))[0];
    const int64_t sent = engine.mesh().sp_group()->stats().all_to_all_bytes - before;
    at::Tensor mine = zero::sp::own_tokens(want.unsqueeze(0), engine.mesh().sp_group())[0];
    ASSERT_EQ(got.sizes(), mine.sizes());
    const double error = llama_reference::relative_error(got, mine);
    EXPECT_LT(error, 1e-5) << "largest difference, relative to the largest logit";
    // Per layer: q (H heads), k and v (max(kv, W) heads each, repeated
    // when fewer than the ranks) to heads, the output (H heads) back; each
    // all-to-all sends (W-1)/W of this rank's T/W tokens x heads x head_dim floats.
    const int64_t H = config.num_attention_heads, kv = std::max<int64_t>(config.num_key_value_heads, W);
    const int64_t elements = (T / W) * (2 * H + 2 * kv) * config.head_dim * config.num_hidden_layers;
    EXPECT_EQ(sent, elements * 4 * (W - 1) / W) << "all-to-all bytes of one forward";
    if (g_world->rank() == 0) {
      std::printf("%s at sp %d: logits within %.2e of transformers', %lld all-to-all bytes a forward\n", name.c_str(),
                  W, error, static_cast<long long>(sent));
    }
  }
}

struct Curve {
  std::vector<double> losses, norms;
  std::vector<std::pair<std::string, at::Tensor>> params;
};

// 20 steps on batches of `rows` random sequences of T + 1 tokens, two
// batches in turn so that the model can learn them (the same on every rank:
// each data-parallel replica takes its rows, each sp rank its tokens of them).
constexpr int kSteps = 20;
constexpr int64_t kRows = 2, kTime = 32;

at::Tensor batch_at(int step, int64_t vocab) {
  torch::manual_seed(1000 + step % 2);
  return torch::randint(vocab, {kRows, kTime + 1}, torch::kLong);
}

Curve train_whole_sequences(const LlamaConfig& config, int stage, const std::string& optimizer) {
  torch::manual_seed(0);
  LlamaForCausalLM model(config);
  zero::InitOptions init;
  init.group = alone();
  zero::Engine engine = zero::initialize(zero::Config::from_json(ds_config(stage, kRows, 1, optimizer)), model, init);
  Curve c;
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor rows = batch_at(step, config.vocab_size);
    at::Tensor loss = model->loss(rows.narrow(1, 0, kTime), rows.narrow(1, 1, kTime));
    engine.backward(loss);
    engine.step();
    c.losses.push_back(loss.item<double>());
    c.norms.push_back(engine.last_grad_norm());
  }
  c.params = engine.gathered_state_dict();
  return c;
}

// `tiles` > 1: the MLPs and the loss tiled (ALST) and blockwise attention;
// `extra`: more ds_config keys.
Curve train_sequence_parallel(const LlamaConfig& config, int stage, int sp, const std::string& optimizer,
                              int64_t tiles = 1, const std::string& extra = "") {
  torch::manual_seed(0);
  LlamaForCausalLM model(config);
  const int dp = g_world->size() / sp;
  zero::Engine engine =
      zero::initialize(zero::Config::from_json(ds_config(stage, kRows / dp, sp, optimizer, extra)), model);
  const auto& group = engine.mesh().sp_group();
  model->sequence_parallel(group);
  model->tiled(tiles, tiles);
  if (tiles > 1) model->blockwise_attention(5);  // 5 query rows a block: uneven over 32 tokens
  const auto& data = engine.mesh().dp_group();
  Curve c;
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor rows = batch_at(step, config.vocab_size).chunk(dp, 0)[data->rank()];
    at::Tensor loss = model->loss(zero::sp::own_tokens(rows.narrow(1, 0, kTime), group),
                                  zero::sp::own_tokens(rows.narrow(1, 1, kTime), group));
    engine.backward(loss);
    engine.step();
    at::Tensor mean = loss.detach().clone();
    data->all_reduce(mean, zero::comm::ReduceOp::Avg);  // the replicas' rows weigh the same
    c.losses.push_back(mean.item<double>());
    c.norms.push_back(engine.last_grad_norm());
  }
  c.params = engine.gathered_state_dict();
  return c;
}

TEST(Ulysses, TrainingFollowsOneProcessOnWholeSequences) {
  const int W = g_world->size();
  std::vector<int> sizes{W};
  if (W == 4) sizes.push_back(2);  // sp 2 x dp 2
  for (const std::string name : {"gqa_untied", "tied_llama3"}) {
    const LlamaConfig config = fixture(name);
    for (int stage : {1, 2, 3}) {
     for (const std::string optimizer : {kAdamW, kSgd}) {
      const bool sgd = optimizer == kSgd;
      const Curve want = train_whole_sequences(config, stage, optimizer);
      for (int sp : sizes) {
        SCOPED_TRACE(name + ", stage " + std::to_string(stage) + ", sp " + std::to_string(sp) + (sgd ? ", SGD" : ", AdamW"));
        const Curve got = train_sequence_parallel(config, stage, sp, optimizer);
        double worst_loss = 0, worst_norm = 0;
        for (int step = 0; step < kSteps; ++step) {
          worst_loss = std::max(worst_loss, relative(got.losses[step], want.losses[step]));
          worst_norm = std::max(worst_norm, relative(got.norms[step], want.norms[step]));
        }
        EXPECT_LT(worst_loss, 1e-6) << "loss " << got.losses.back() << " vs " << want.losses.back();
        EXPECT_LT(worst_norm, 1e-6) << "gradient norm";
        EXPECT_LT(want.losses.back(), want.losses.front() * 0.95) << "the reference learns";
        ASSERT_EQ(got.params.size(), want.params.size());
        double worst_param = 0;
        std::string worst_name;
        for (size_t i = 0; i < want.params.size(); ++i) {
          ASSERT_EQ(got.params[i].first, want.params[i].first);
          const double e = llama_reference::relative_error(got.params[i].second, want.params[i].second);
          if (e > worst_param) worst_name = want.params[i].first;
          worst_param = std::max(worst_param, e);
        }
        // SGD: the parameters carry every step's gradients, element by element.
        if (sgd) EXPECT_LT(worst_param, 1e-6) << "parameters after " << kSteps << " steps, worst " << worst_name;
        if (g_world->rank() == 0) {
          std::printf("%s stage %d sp %d dp %d %s: %d steps, loss %.6f -> %.6f, worst relative loss %.1e, norm %.1e, "
                      "param %.1e\n",
                      name.c_str(), stage, sp, W / sp, sgd ? "SGD" : "AdamW", kSteps, got.losses.front(),
                      got.losses.back(), worst_loss, worst_norm, worst_param);
        }
      }
     }
    }
  }
}

// ALST: Ulysses with the MLPs and the loss over 3 uneven tiles (16 or 8
// tokens a rank) and blockwise attention, inside activation checkpoints kept
// on the host, at stage 3.
TEST(Ulysses, TiledMlpAndLossInsideCheckpointsFollowOneProcess) {
  const int W = g_world->size();
  const LlamaConfig config = fixture("gqa_untied");
  const std::string checkpoints = R"(, "activation_checkpointing": {"checkpoint_every": 1, "cpu_checkpointing": true})";
  for (const std::string optimizer : {kAdamW, kSgd}) {
    const Curve want = train_whole_sequences(config, 3, optimizer);
    const Curve got = train_sequence_parallel(config, 3, W, optimizer, /*tiles=*/3, checkpoints);
    double worst_loss = 0, worst_norm = 0, worst_param = 0;
    for (int step = 0; step < kSteps; ++step) {
      worst_loss = std::max(worst_loss, relative(got.losses[step], want.losses[step]));
      worst_norm = std::max(worst_norm, relative(got.norms[step], want.norms[step]));
    }
    for (size_t i = 0; i < want.params.size(); ++i)
      worst_param = std::max(worst_param, llama_reference::relative_error(got.params[i].second, want.params[i].second));
    EXPECT_LT(worst_loss, 1e-6);
    EXPECT_LT(worst_norm, 1e-6);
    if (optimizer == kSgd) EXPECT_LT(worst_param, 1e-6);
    if (g_world->rank() == 0) {
      std::printf("tiled x3, blockwise attention, checkpointed, stage 3, sp %d %s: worst relative loss %.1e, norm %.1e, param %.1e\n", W,
                  optimizer == kSgd ? "SGD" : "AdamW", worst_loss, worst_norm, worst_param);
    }
  }
}

TEST(Ulysses, HeadsThatDoNotSplitAreRefusedWithTheNumbers) {
  const int W = g_world->size();
  if (W == 1) GTEST_SKIP() << "one rank splits nothing";
  LlamaConfig config = fixture("tied_llama3");
  LlamaForCausalLM model(config);
  zero::Engine engine = zero::initialize(zero::Config::from_json(ds_config(0, 1, W)), model);
  // 6 heads over 4 ranks; over 2, 3 key/value heads neither divide nor are divided by them.
  config.num_attention_heads = 6;
  config.num_key_value_heads = W == 4 ? 6 : 3;
  config.hidden_size = 48;
  config.head_dim = 8;
  LlamaForCausalLM odd(config);
  try {
    odd->sequence_parallel(engine.mesh().sp_group());
    FAIL() << "expected a ConfigError";
  } catch (const zero::ConfigError& e) {
    const std::string what = e.what();
    const std::string heads = W == 4 ? "num_attention_heads 6" : "num_key_value_heads 3";
    EXPECT_NE(what.find(heads), std::string::npos) << what;
    EXPECT_NE(what.find("sequence_parallel_size " + std::to_string(W)), std::string::npos) << what;
  }
  try {
    zero::sp::own_tokens(torch::zeros({1, 4 * W + 1}, torch::kLong), engine.mesh().sp_group());
    FAIL() << "expected an EngineError";
  } catch (const zero::EngineError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(4 * W + 1) + " tokens"), std::string::npos) << e.what();
  }
  // Rows that differ on the last rank: every rank refuses, naming it.
  at::Tensor rows = torch::arange(8 * W, torch::kLong).view({2, 4 * W});
  if (g_world->rank() == W - 1) rows[1][3] = 0;
  try {
    zero::sp::own_tokens(rows, engine.mesh().sp_group());
    FAIL() << "expected an EngineError";
  } catch (const zero::EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("different rows"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(W - 1)), std::string::npos) << e.what();
  }
}

TEST(Ulysses, ConfigRefusesLayoutsItCannotBuild) {
  const int W = g_world->size();
  auto refused = [&](const std::string& json, const std::string& words) {
    try {
      zero::Config c = zero::Config::from_json(json);
      c.resolve(W);
      ADD_FAILURE() << "expected a ConfigError for " << json;
    } catch (const zero::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 3})", "sequence parallel 3");
  // sp x tp x pp = 8 ranks, more than the world (2 or 4).
  refused(R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2, "pipeline": {"stages": 2},
             "tensor_parallel": {"autotp_size": 2}})",
          "sequence_parallel_size");
  refused(R"({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 0})", "sequence_parallel_size");
  // The batch counts data-parallel replicas: sp ranks share one.
  zero::Config c = zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 3, "sequence_parallel_size": 2})");
  c.resolve(4);
  EXPECT_EQ(c.data_parallel_size(), 2);
  EXPECT_EQ(*c.batch.train_batch_size, 6);
}

}  // namespace
