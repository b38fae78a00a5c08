// Checkpoints across pipeline layouts on 4 gloo ranks: the pipeline model
// of pp_model.h (tied embedding and LM head, tensor-parallel blocks) saved
// at tp 2 x pp 2 x dp 1 loads at the same layout (and resumes exactly: the
// same losses, bit for bit), at tp 1 x pp 1 x dp 4, tp 2 x dp 2, pp 2 x dp 2
// and pp 4 (and resumes to within 1e-5 of the run that went on), with no
// conversion step; and back: saved at tp 2 x dp 2, it loads at tp 2 x pp 2.
// zero::ckpt::consolidate of a pipeline checkpoint gives the full model,
// equal to what the pp 1 engine loaded.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "pp_model.h"
#include "world_main.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
using pp_test::kContext;
using pp_test::kVocab;

constexpr int64_t kGlobal = 4;  // sequences per micro-batch, whatever the layout
constexpr int kGas = 2;
constexpr int kSaveAt = 3, kMore = 3;

struct Layout {
  int stage, tp, pp;
  std::string name() const {
    return "stage " + std::to_string(stage) + " tp " + std::to_string(tp) + " x pp " + std::to_string(pp);
  }
};

std::string config_of(const Layout& l) {
  const int dp = g_world->size() / (l.tp * l.pp);
  std::ostringstream c;
  c << R"({"train_micro_batch_size_per_gpu": )" << kGlobal / dp << R"(, "gradient_accumulation_steps": )" << kGas
    << R"(, "steps_per_print": 1000, "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
        "tensor_parallel": {"autotp_size": )" << l.tp << R"(}, "pipeline": {"stages": )" << l.pp
    << R"(}, "zero_optimization": {"stage": )" << l.stage << R"(, "reduce_bucket_size": 600}})";
  return c.str();
}

struct Trained {
  std::shared_ptr<zero::Mesh> mesh;
  std::shared_ptr<zero::pipe::PipelineModule> model;
  std::unique_ptr<zero::Engine> engine;
};

Trained make_run(const Layout& l, uint64_t seed) {
  Trained r;
  r.mesh = std::make_shared<zero::Mesh>(g_world, l.tp, l.pp);
  r.model = pp_test::pipe_net(r.mesh);
  if (seed != 0) {  // other initial weights: a checkpoint must replace them
    torch::NoGradGuard no_grad;
    torch::manual_seed(seed);
    for (auto& p : r.model->parameters()) p.add_(torch::randn_like(p) * 0.1);
  }
  zero::InitOptions init;
  init.mesh = r.mesh;
  r.engine = std::make_unique<zero::Engine>(zero::initialize(zero::Config::from_json(config_of(l)), r.model, init));
  return r;
}

// Steps [from, to): the mean loss over the global batch, per step.
std::vector<double> train(Trained& r, int from, int to) {
  std::vector<double> losses;
  const int dp = r.mesh->shape().dp, d = r.mesh->coordinates().dp;
  for (int step = from; step < to; ++step) {
    int micro = step * kGas;
    losses.push_back(r.engine->train_batch([&]() -> zero::Engine::Batch {
      torch::manual_seed(500 + micro++);
      const at::Tensor all = torch::randint(kVocab, {kGlobal, kContext + 1}, torch::kLong);
      const at::Tensor mine = all.slice(0, d * kGlobal / dp, (d + 1) * kGlobal / dp);
      return {mine.slice(1, 0, kContext), mine.slice(1, 1, kContext + 1)};
    }));
  }
  return losses;
}

std::string shared_dir(const std::string& name) {
  at::Tensor pid = torch::tensor({static_cast<int64_t>(getpid())});
  g_world->broadcast(pid, 0);
  return (fs::temp_directory_path() / ("zero_pp_ckpt_" + std::to_string(pid.item<int64_t>()) + "_" + name)).string();
}

void expect_resumes(const std::string& dir, const std::vector<double>& went_on, const Layout& saved,
                    const std::vector<Layout>& layouts) {
  for (const Layout& l : layouts) {
    const std::string what = "saved at " + saved.name() + ", loaded at " + l.name();
    SCOPED_TRACE(what);
    Trained b = make_run(l, 99);
    b.engine->load_checkpoint(dir);
    EXPECT_EQ(b.engine->global_steps(), kSaveAt);
    const std::vector<double> resumed = train(b, kSaveAt, kSaveAt + kMore);
    for (size_t i = 0; i < went_on.size(); ++i) {
      if (l.stage == saved.stage && l.tp == saved.tp && l.pp == saved.pp) {
        EXPECT_EQ(resumed[i], went_on[i]) << "same layout: exact resume, step " << kSaveAt + i;
      } else {
        EXPECT_NEAR(resumed[i], went_on[i], 1e-5 * went_on[i]) << "step " << kSaveAt + i;
      }
    }
  }
}

TEST(PipelineCheckpoint, LoadsAtEveryLayoutWithoutConversion) {
  if (g_world->size() != 4) GTEST_SKIP() << "the layouts here are those of 4 ranks";
  const std::string dir = shared_dir("layouts");
  const Layout saved{1, 2, 2};
  std::vector<double> went_on;
  {
    Trained a = make_run(saved, 0);
    train(a, 0, kSaveAt);
    a.engine->save_checkpoint(dir);
    went_on = train(a, kSaveAt, kSaveAt + kMore);
  }
  expect_resumes(dir, went_on, saved, {saved, {1, 1, 1}, {1, 2, 1}, {0, 1, 2}, {1, 1, 4}});

  // The full model: consolidate equals what the pp 1 engine loaded.
  Trained full = make_run({1, 1, 1}, 7);
  full.engine->load_checkpoint(dir);
  const auto loaded = full.engine->gathered_state_dict();
  if (g_world->rank() == 0) {
    const std::string out = dir + "/full.safetensors";
    zero::ckpt::consolidate(dir, zero::ckpt::read_latest(dir), out);
    zero::ckpt::SafetensorsFile file(out);
    EXPECT_EQ(file.entries().size(), loaded.size());
    for (const auto& [name, t] : loaded) {
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

TEST(PipelineCheckpoint, LoadsIntoAPipelineFromDataParallel) {
  if (g_world->size() != 4) GTEST_SKIP() << "the layouts here are those of 4 ranks";
  const std::string dir = shared_dir("back");
  const Layout saved{1, 2, 1};
  std::vector<double> went_on;
  {
    Trained a = make_run(saved, 0);
    train(a, 0, kSaveAt);
    a.engine->save_checkpoint(dir);
    went_on = train(a, kSaveAt, kSaveAt + kMore);
  }
  expect_resumes(dir, went_on, saved, {{1, 2, 2}, {0, 1, 4}});
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

}  // namespace
