// Checkpoints across rank meshes on 4 gloo ranks: a model of
// tensor-parallel layers (tp_model.h) saved at tp 2 x dp 2 loads at the
// same layout (and resumes exactly: the same losses, bit for bit), at tp 1
// x dp 4 and at tp 4 x dp 1 (and resumes to within 1e-5 of the run that
// went on), with no conversion step; zero::ckpt::consolidate of it gives
// the full model, equal to what the tp 1 engine loaded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "tp_model.h"
#include "world_main.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
using tp_test::kContext;
using tp_test::kVocab;
using tp_test::TpNet;

constexpr int64_t kGlobal = 4;  // sequences per micro-step, whatever the layout
constexpr int kSaveAt = 4, kMore = 4;

std::string config_of(int stage, int tp) {
  const int dp = g_world->size() / tp;
  std::ostringstream c;
  c << R"({"train_micro_batch_size_per_gpu": )" << kGlobal / dp
    << R"(, "gradient_accumulation_steps": 1, "steps_per_print": 1000, "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "tensor_parallel": {"autotp_size": )"
    << tp << R"(}, "zero_optimization": {"stage": )" << stage
    << R"(, "reduce_bucket_size": 600, "stage3_param_persistence_threshold": 0}})";
  return c.str();
}

struct Trained {
  std::shared_ptr<zero::Mesh> mesh;
  TpNet model{nullptr};
  std::unique_ptr<zero::Engine> engine;
};

Trained make_run(int stage, int tp, uint64_t seed) {
  Trained r;
  r.mesh = std::make_shared<zero::Mesh>(g_world, tp, 1);
  torch::manual_seed(seed);
  r.model = TpNet(r.mesh->tp_group(), 2);
  zero::InitOptions init;
  init.mesh = r.mesh;
  r.engine = std::make_unique<zero::Engine>(zero::initialize(zero::Config::from_json(config_of(stage, tp)), r.model, init));
  return r;
}

// Steps [from, to): the mean loss over the global batch, per step.
std::vector<double> train(Trained& r, int from, int to) {
  std::vector<double> losses;
  const int dp = r.mesh->shape().dp, d = r.mesh->coordinates().dp;
  for (int step = from; step < to; ++step) {
    torch::manual_seed(500 + step);
    const at::Tensor all = torch::randint(kVocab, {kGlobal, kContext + 1}, torch::kLong);
    const at::Tensor mine = all.slice(0, d * kGlobal / dp, (d + 1) * kGlobal / dp);
    at::Tensor loss = r.model->loss(mine.slice(1, 0, kContext), mine.slice(1, 1, kContext + 1));
    r.engine->backward(loss);
    r.engine->step();
    at::Tensor mean = torch::tensor({loss.item<double>()}, torch::kDouble);
    r.mesh->dp_group()->all_reduce(mean, zero::comm::ReduceOp::Avg);
    losses.push_back(mean.item<double>());
  }
  return losses;
}

// A fresh folder, the same on every rank.
std::string shared_dir(const std::string& name) {
  at::Tensor pid = torch::tensor({static_cast<int64_t>(getpid())});
  g_world->broadcast(pid, 0);
  return (fs::temp_directory_path() / ("zero_tp_ckpt_" + std::to_string(pid.item<int64_t>()) + "_" + name)).string();
}

TEST(TensorParallelCheckpoint, LoadsAtEveryLayoutWithoutConversion) {
  if (g_world->size() != 4) GTEST_SKIP() << "the layouts here are those of 4 ranks";
  const std::string dir = shared_dir("layouts");
  std::vector<double> went_on;
  {
    Trained a = make_run(1, 2, 0);
    train(a, 0, kSaveAt);
    a.engine->save_checkpoint(dir);
    went_on = train(a, kSaveAt, kSaveAt + kMore);
  }
  struct Layout {
    int stage, tp;
  };
  for (const Layout& l : {Layout{1, 2}, Layout{2, 1}, Layout{3, 4}, Layout{0, 2}}) {
    const std::string what = "stage " + std::to_string(l.stage) + " tp " + std::to_string(l.tp);
    SCOPED_TRACE(what);
    Trained b = make_run(l.stage, l.tp, 99);  // other initial weights: the checkpoint must replace them
    b.engine->load_checkpoint(dir);
    EXPECT_EQ(b.engine->global_steps(), kSaveAt);
    const std::vector<double> resumed = train(b, kSaveAt, kSaveAt + kMore);
    for (size_t i = 0; i < went_on.size(); ++i) {
      if (l.stage == 1 && l.tp == 2) {
        EXPECT_EQ(resumed[i], went_on[i]) << "same layout: exact resume, step " << kSaveAt + i;
      } else {
        EXPECT_NEAR(resumed[i], went_on[i], 1e-5 * went_on[i]) << "step " << kSaveAt + i;
      }
    }
  }

  // The full model: consolidate equals what the tp 1 engine loaded.
  Trained full = make_run(2, 1, 7);
  full.engine->load_checkpoint(dir);
  const auto loaded = full.engine->gathered_state_dict();
  if (g_world->rank() == 0) {
    const std::string out = dir + "/full.safetensors";
    zero::ckpt::consolidate(dir, zero::ckpt::read_latest(dir), out);
    zero::ckpt::SafetensorsFile file(out);
    for (const auto& [name, t] : loaded) {
      if (name.find("weight") == std::string::npos && name.find("bias") == std::string::npos) continue;
      ASSERT_TRUE(file.entries().count(name)) << name;
      const auto& e = file.entries().at(name);
      EXPECT_EQ(e.shape, t.sizes().vec()) << name << ": the full shape";
      at::Tensor values = torch::empty(t.sizes(), at::kFloat);
      file.read(name, 0, e.end - e.begin, values.data_ptr());
      EXPECT_TRUE(torch::equal(values, t.to(at::kFloat))) << name;
    }
  }
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

TEST(TensorParallelCheckpoint, MidAccumulationResumesOnlyOnItsOwnMesh) {
  if (g_world->size() != 4) GTEST_SKIP() << "the layouts here are those of 4 ranks";
  const std::string dir = shared_dir("mid");
  {
    // gas 2 and one micro-step: the checkpoint holds partial gradients.
    auto mesh = std::make_shared<zero::Mesh>(g_world, 2, 1);
    torch::manual_seed(0);
    TpNet model(mesh->tp_group(), 1);
    zero::InitOptions init;
    init.mesh = mesh;
    std::string cfg = config_of(1, 2);
    cfg.replace(cfg.find(R"("gradient_accumulation_steps": 1)"), 32, R"("gradient_accumulation_steps": 2)");
    auto engine = zero::initialize(zero::Config::from_json(cfg), model, init);
    const at::Tensor tokens = torch::randint(kVocab, {kGlobal / 2, kContext + 1}, torch::kLong);
    engine.backward(model->loss(tokens.slice(1, 0, kContext), tokens.slice(1, 1, kContext + 1)));
    engine.step();
    engine.save_checkpoint(dir);
  }
  auto mesh = std::make_shared<zero::Mesh>(g_world, 1, 1);
  TpNet model(mesh->tp_group(), 1);
  zero::InitOptions init;
  init.mesh = mesh;
  std::string cfg = config_of(1, 1);
  cfg.replace(cfg.find(R"("gradient_accumulation_steps": 1)"), 32, R"("gradient_accumulation_steps": 2)");
  cfg.replace(cfg.find(R"("train_micro_batch_size_per_gpu": 1)"), 35, R"("train_micro_batch_size_per_gpu": 2)");
  auto engine = zero::initialize(zero::Config::from_json(cfg), model, init);
  try {
    engine.load_checkpoint(dir);
    FAIL() << "partial gradients of tp 2 were loaded at tp 1";
  } catch (const zero::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("(tp 2 x pp 1)"), std::string::npos) << e.what();
  }
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

}  // namespace
