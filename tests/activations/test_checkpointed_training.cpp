// Training with activation checkpointing against the same training without
// it, through the engine on 1-2 ranks: the example GPT with dropout on at
// stages 0-3, fp32 and bf16 (fp16 with loss scaling on an element-wise
// model), gradient accumulation, cpu_checkpointing, only
// every second unit, a unit used twice at stage 3, and exact resume from a
// checkpoint saved with checkpointing on. Losses and final parameters must
// agree (within 1e-6 relative; the tests report when they are bitwise
// equal), and the measured activation memory must fall.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "gpt/gpt.h"
#include "world_main.h"
#include "zero/zero.h"

namespace {

using zero_examples::GPT;
using zero_examples::GPTOptions;

constexpr int64_t kVocab = 29, kContext = 16, kMicro = 2;

// A block with dropout, and a model that runs one unit twice (stage 3 must
// gather it twice in forward and in backward).
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc = register_module("fc", torch::nn::Linear(16, 32));
    proj = register_module("proj", torch::nn::Linear(32, 16));
    drop = register_module("drop", torch::nn::Dropout(0.2));
  }
  at::Tensor forward(const at::Tensor& x) { return x + proj(drop(torch::gelu(fc(x)))); }
  torch::nn::Linear fc{nullptr}, proj{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Mlp);

struct TwiceImpl : torch::nn::Module {
  TwiceImpl() {
    emb = register_module("emb", torch::nn::Embedding(kVocab, 16));
    a = register_module("a", zero::Unit<Mlp>(Mlp()));
    b = register_module("b", zero::Unit<Mlp>(Mlp()));
    head = register_module("head", torch::nn::Linear(16, kVocab));
  }
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) {
    at::Tensor x = a(b(a(emb(tokens))));
    return torch::nn::functional::cross_entropy(head(x).reshape({-1, kVocab}), targets.reshape({-1}));
  }
  torch::nn::Embedding emb{nullptr};
  zero::Unit<Mlp> a{nullptr}, b{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Twice);

struct TrainingCase {
  int stage = 0;
  std::string dtype = "fp32";  // or "bf16"
  int gas = 1;
  std::string checkpointing;   // the "activation_checkpointing" object, "" for none
  bool twice = false;          // the model with a unit used twice, else the GPT
  int steps = 3;
};

std::string config_of(const TrainingCase& s) {
  std::ostringstream c;
  c << R"({"train_micro_batch_size_per_gpu": )" << kMicro << R"(, "gradient_accumulation_steps": )" << s.gas
    << R"(, "steps_per_print": 1000, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.01}},
        "zero_optimization": {"stage": )"
    << s.stage << R"(, "reduce_bucket_size": 4000, "stage3_param_persistence_threshold": 0})";
  if (s.dtype == "bf16") c << R"(, "bf16": {"enabled": true})";
  if (!s.checkpointing.empty()) c << R"(, "activation_checkpointing": )" << s.checkpointing;
  c << "}";
  return c.str();
}

struct Outcome {
  std::vector<double> losses;
  std::vector<std::pair<std::string, at::Tensor>> params;
  int64_t activations_peak = 0;
};

struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss;
};

Model build(const TrainingCase& s) {
  torch::manual_seed(0);
  if (s.twice) {
    Twice m;
    return {m.ptr(), [m](const at::Tensor& x, const at::Tensor& y) mutable { return m->loss(x, y); }};
  }
  GPTOptions o;
  o.vocab_size = kVocab;
  o.context = kContext;
  o.depth = 4;
  o.width = 32;
  o.heads = 2;
  o.dropout = 0.1;
  GPT m(o);
  return {m.ptr(), [m](const at::Tensor& x, const at::Tensor& y) mutable { return m->loss(x, y); }};
}

// Runs micro-steps [from, to) of the setup on `engine`; the data of a
// micro-step depends only on its number and the rank.
void train(zero::Engine& engine, Model& model, int64_t from, int64_t to, Outcome& out) {
  for (int64_t micro = from; micro < to; ++micro) {
    torch::manual_seed(1000 * micro + g_world->rank());
    at::Tensor tokens = torch::randint(kVocab, {kMicro, kContext + 1}, torch::kLong);
    at::Tensor loss = model.loss(tokens.slice(1, 0, kContext), tokens.slice(1, 1, kContext + 1));
    engine.backward(loss);
    engine.step();
    out.losses.push_back(loss.item<double>());
  }
}

Outcome run(const TrainingCase& s) {
  Model model = build(s);
  zero::InitOptions init;
  init.group = g_world;
  zero::Engine engine = zero::initialize(zero::Config::from_json(config_of(s)), model.module, init);
  torch::manual_seed(77 + g_world->rank());  // the dropout streams, per rank
  Outcome out;
  train(engine, model, 0, static_cast<int64_t>(s.steps) * s.gas, out);
  out.params = engine.gathered_state_dict();
  out.activations_peak = engine.memory_report().activations_peak;
  return out;
}

// Same losses and parameters; returns whether they are bitwise equal.
bool expect_agree(const Outcome& plain, const Outcome& other, const std::string& what) {
  bool bitwise = plain.losses == other.losses;
  EXPECT_EQ(plain.losses.size(), other.losses.size()) << what;
  for (size_t i = 0; i < std::min(plain.losses.size(), other.losses.size()); ++i) {
    EXPECT_NEAR(plain.losses[i], other.losses[i], 1e-6 * std::abs(plain.losses[i])) << what << ", micro-step " << i;
  }
  EXPECT_EQ(plain.params.size(), other.params.size()) << what;
  for (size_t i = 0; i < std::min(plain.params.size(), other.params.size()); ++i) {
    const at::Tensor a = plain.params[i].second.to(at::kDouble), b = other.params[i].second.to(at::kDouble);
    bitwise = bitwise && torch::equal(plain.params[i].second, other.params[i].second);
    const double scale = a.abs().max().item<double>() + 1e-12;
    EXPECT_LE((a - b).abs().max().item<double>(), 1e-6 * scale) << what << ", " << plain.params[i].first;
  }
  return bitwise;
}

std::string describe(const TrainingCase& s) {
  return "stage " + std::to_string(s.stage) + " " + s.dtype + " gas " + std::to_string(s.gas) +
         (s.twice ? " (unit used twice)" : "") + " with " + s.checkpointing;
}

TEST(CheckpointedTraining, EveryStageAndDtypeAgreesAndKeepsLessActivationMemory) {
  for (int stage : {0, 1, 2, 3}) {
    for (const std::string dtype : {"fp32", "bf16"}) {
      TrainingCase s;
      s.stage = stage;
      s.dtype = dtype;
      const Outcome plain = run(s);
      s.checkpointing = R"({"checkpoint_every": 1})";
      const Outcome checkpointed = run(s);
      const bool bitwise = expect_agree(plain, checkpointed, describe(s));
      if (g_world->rank() == 0) std::printf("%s: %s\n", describe(s).c_str(), bitwise ? "bitwise equal" : "within 1e-6");
      EXPECT_GT(plain.activations_peak, 0) << "the allocator could not be read";
      EXPECT_LT(checkpointed.activations_peak, plain.activations_peak) << describe(s);
    }
  }
}

TEST(CheckpointedTraining, AccumulationHostInputsEverySecondUnitAndAUnitUsedTwice) {
  struct Case {
    int stage, gas;
    bool twice;
    std::string checkpointing;
  };
  const std::vector<Case> cases = {
      {2, 2, false, R"({"checkpoint_every": 1})"},
      {3, 2, false, R"({"checkpoint_every": 2})"},
      {3, 1, false, R"({"number_checkpoints": 2, "cpu_checkpointing": true, "profile": true})"},
      {1, 1, false, R"({"checkpoint_every": 1, "cpu_checkpointing": true})"},
      {3, 1, true, R"({"checkpoint_every": 1})"},
      {3, 2, true, R"({"checkpoint_every": 2})"},
      {0, 1, true, R"({"checkpoint_every": 1})"},
  };
  for (const Case& c : cases) {
    TrainingCase s;
    s.stage = c.stage;
    s.gas = c.gas;
    s.twice = c.twice;
    const Outcome plain = run(s);
    s.checkpointing = c.checkpointing;
    const Outcome checkpointed = run(s);
    const bool bitwise = expect_agree(plain, checkpointed, describe(s));
    if (g_world->rank() == 0) std::printf("%s: %s\n", describe(s).c_str(), bitwise ? "bitwise equal" : "within 1e-6");
  }
}

// fp16 on CPU ranks: LibTorch's CPU kernels have fp16 multiply and add but
// no fp16 matmul, activation or dropout, so this model is element-wise, its
// dropout a mask drawn in fp32 from the CPU generator (which the recompute
// must restore), and its nonlinearity a square.
struct HalfBlockImpl : torch::nn::Module {
  explicit HalfBlockImpl(int64_t width) {
    w1 = register_parameter("w1", torch::randn({width}) * 0.5);
    b1 = register_parameter("b1", torch::randn({width}) * 0.1);
    w2 = register_parameter("w2", torch::randn({width}) * 0.5);
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x * w1 + b1;
    h = h * h * 0.5;
    const at::Tensor keep = (torch::rand(h.sizes()) > 0.2).to(h.scalar_type()) * 1.25;
    return x + h * keep * w2;
  }
  at::Tensor w1, b1, w2;
};
TORCH_MODULE(HalfBlock);

struct HalfNetImpl : torch::nn::Module {
  HalfNetImpl() {
    for (int i = 0; i < 3; ++i) blocks.push_back(register_module("block" + std::to_string(i), zero::Unit<HalfBlock>(HalfBlock(24))));
  }
  at::Tensor loss(const at::Tensor& x) {
    at::Tensor h = x;
    for (auto& b : blocks) h = b(h);
    return (h.to(at::kFloat).sum(1) - 1.0).pow(2).mean();
  }
  std::vector<zero::Unit<HalfBlock>> blocks;
};
TORCH_MODULE(HalfNet);

TEST(CheckpointedTraining, Fp16WithDynamicLossScalingAgrees) {
  for (int stage : {2, 3}) {
    auto run = [&](const std::string& checkpointing) {
      torch::manual_seed(0);
      HalfNet model;
      std::string config = R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 4},
          "zero_optimization": {"stage": )" + std::to_string(stage) +
                           R"(, "reduce_bucket_size": 16, "stage3_param_persistence_threshold": 0})";
      if (!checkpointing.empty()) config += R"(, "activation_checkpointing": )" + checkpointing;
      zero::InitOptions init;
      init.group = g_world;
      zero::Engine engine = zero::initialize(zero::Config::from_json(config + "}"), model, init);
      Outcome out;
      for (int64_t step = 0; step < 6; ++step) {
        torch::manual_seed(500 + 7 * step + g_world->rank());
        at::Tensor x = torch::randn({4, 24}).to(at::kHalf);
        at::Tensor loss = model->loss(x);
        engine.backward(loss);
        engine.step();
        out.losses.push_back(loss.item<double>());
      }
      out.losses.push_back(engine.loss_scale());
      out.params = engine.gathered_state_dict();
      return out;
    };
    const Outcome plain = run("");
    const Outcome checkpointed = run(R"({"checkpoint_every": 1})");
    const std::string what = "fp16 stage " + std::to_string(stage);
    const bool bitwise = expect_agree(plain, checkpointed, what);
    if (g_world->rank() == 0) std::printf("%s: %s\n", what.c_str(), bitwise ? "bitwise equal" : "within 1e-6");
  }
}

TEST(CheckpointedTraining, ResumesExactlyFromACheckpointSavedWithCheckpointingOn) {
  const std::string dir = ::testing::TempDir() + "zero_act_ckpt_resume_" + std::to_string(g_world->size());
  if (g_world->rank() == 0) std::filesystem::remove_all(dir);
  g_world->barrier();
  TrainingCase s;
  s.stage = 3;
  s.checkpointing = R"({"checkpoint_every": 1})";
  // Straight through: 4 steps.
  Outcome straight;
  {
    Model model = build(s);
    zero::InitOptions init;
    init.group = g_world;
    zero::Engine engine = zero::initialize(zero::Config::from_json(config_of(s)), model.module, init);
    torch::manual_seed(77 + g_world->rank());
    train(engine, model, 0, 2, straight);
    engine.save_checkpoint(dir, "half");
    train(engine, model, 2, 4, straight);
    straight.params = engine.gathered_state_dict();
  }
  // From the checkpoint: the last 2 steps, in a fresh model and engine.
  Outcome resumed;
  {
    Model model = build(s);
    zero::InitOptions init;
    init.group = g_world;
    zero::Engine engine = zero::initialize(zero::Config::from_json(config_of(s)), model.module, init);
    torch::manual_seed(12345);  // overwritten by the checkpoint's generator states
    engine.load_checkpoint(dir, "half");
    train(engine, model, 2, 4, resumed);
    resumed.params = engine.gathered_state_dict();
  }
  straight.losses.erase(straight.losses.begin(), straight.losses.begin() + 2);
  EXPECT_TRUE(expect_agree(straight, resumed, "resume")) << "a resumed run must be bitwise equal";
  g_world->barrier();
  if (g_world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
