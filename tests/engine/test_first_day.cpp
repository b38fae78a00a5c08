// What a DeepSpeed user reaches for on the first day, and the natural
// mistakes, on every rank of the job: the call order of backward() and
// step() (Note [Call order]), a second thread, resume-if-present, buffers
// that a forward changes (DDP's broadcast_buffers), the batch accessors,
// and ranks that read different tags from `latest`.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <limits>
#include <thread>

#include "world_main.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;

const char* kConfig = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 2}})";

zero::Engine engine_for(torch::nn::Module& m, std::shared_ptr<torch::nn::Module> holder, bool broadcast_buffers = true) {
  zero::InitOptions init;
  init.group = g_world;
  init.broadcast_buffers = broadcast_buffers;
  return zero::initialize(zero::Config::from_json(kConfig), holder, init);
}

struct Net : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  Net() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    norm = register_module("norm", torch::nn::BatchNorm1d(4));
  }
  at::Tensor forward(const at::Tensor& x) { return norm(fc(x)); }
};

std::shared_ptr<Net> net() {
  torch::manual_seed(1);
  return std::make_shared<Net>();
}

// This rank's own data: the ranks' batches differ.
at::Tensor batch() { return torch::randn({2, 4}) + static_cast<double>(g_world->rank()); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const zero::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CallOrder, StepWithoutBackwardIsRefusedAndCountsNothing) {
  auto m = net();
  auto engine = engine_for(*m, m);
  EXPECT_NE(error_of([&] { engine.step(); }).find("engine.step was called without an engine.backward(loss) before it"),
            std::string::npos);
  EXPECT_EQ(engine.micro_steps(), 0);
  engine.backward(m->forward(batch()).pow(2).mean());
  engine.step();
  EXPECT_EQ(engine.micro_steps(), 1);
  // Two steps after one backward: the second is refused.
  EXPECT_NE(error_of([&] { engine.step(); }).find("without an engine.backward(loss) before it (micro step 1)"),
            std::string::npos);
  EXPECT_EQ(engine.micro_steps(), 1);
  EXPECT_EQ(engine.global_steps(), 0);
}

// DeepSpeed's behaviour: a second backward adds into the same micro-step.
// The reference: one backward of the two losses' sum.
TEST(CallOrder, BackwardTwiceAddsIntoOneMicroStep) {
  auto m = net();
  auto engine = engine_for(*m, m);
  auto reference = net();
  auto summed = engine_for(*reference, reference);
  torch::manual_seed(7 + g_world->rank());
  const at::Tensor x1 = batch(), x2 = batch();
  for (int i = 0; i < 2; ++i) {  // one optimizer step (gradient_accumulation_steps 2)
    engine.backward(m->forward(x1).pow(2).mean());
    if (i == 0) engine.backward(m->forward(x2).pow(2).mean());
    engine.step();
    summed.backward(i == 0 ? reference->forward(x1).pow(2).mean() + reference->forward(x2).pow(2).mean()
                           : reference->forward(x1).pow(2).mean());
    summed.step();
  }
  EXPECT_EQ(engine.global_steps(), 1);
  EXPECT_TRUE(torch::allclose(m->fc->weight, reference->fc->weight, 1e-6, 1e-7));
}

TEST(CallOrder, ASecondThreadIsRefusedByName) {
  auto m = net();
  auto engine = engine_for(*m, m);
  engine.backward(m->forward(batch()).pow(2).mean());
  std::string error;
  std::thread other([&] { error = error_of([&] { engine.step(); }); });
  other.join();
  EXPECT_NE(error.find("engine.step was called from another thread than the one training with this engine"),
            std::string::npos)
      << error;
  engine.step();  // the training thread goes on
  EXPECT_EQ(engine.micro_steps(), 1);
}

TEST(Resume, LoadCheckpointIfPresentReturnsNothingForAnEmptyFolder) {
  const fs::path dir = fs::temp_directory_path() / ("zero_test_first_day_resume" + std::to_string(g_world->size()));
  if (g_world->rank() == 0) fs::remove_all(dir);
  g_world->barrier();
  auto m = net();
  auto engine = engine_for(*m, m);
  EXPECT_FALSE(engine.load_checkpoint_if_present(dir.string()).has_value());  // no folder
  for (int i = 0; i < 2; ++i) {
    engine.backward(m->forward(batch()).pow(2).mean());
    engine.step();
  }
  engine.save_checkpoint(dir.string(), "", R"({"epoch": 3})");
  // Read back without an engine: the weights and buffers the engine holds.
  const auto state = zero::fp32_state_dict_from_checkpoint(dir.string());
  const auto held = engine.gathered_state_dict();
  ASSERT_EQ(state.size(), held.size());
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(state[i].first, held[i].first);
    EXPECT_TRUE(torch::equal(state[i].second, held[i].second.to(state[i].second.scalar_type()))) << held[i].first;
  }
  auto again = net();
  auto resumed = engine_for(*again, again);
  const auto client = resumed.load_checkpoint_if_present(dir.string());
  ASSERT_TRUE(client.has_value());
  EXPECT_NE(client->find("\"epoch\":3"), std::string::npos) << *client;
  EXPECT_EQ(resumed.global_steps(), 1);
  EXPECT_TRUE(torch::equal(again->fc->weight, m->fc->weight));
  EXPECT_NE(error_of([&] { resumed.load_checkpoint(dir.string(), "no_such_tag"); }), "(no error)");
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

TEST(Resume, RanksThatReadDifferentTagsFromLatestAreRefused) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const fs::path dir = fs::temp_directory_path() / ("zero_test_first_day_latest" + std::to_string(g_world->size()));
  const fs::path copy = fs::temp_directory_path() / ("zero_test_first_day_latest_copy" + std::to_string(g_world->size()));
  if (g_world->rank() == 0) fs::remove_all(dir), fs::remove_all(copy);
  g_world->barrier();
  auto m = net();
  auto engine = engine_for(*m, m);
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < 2; ++i) {
      engine.backward(m->forward(batch()).pow(2).mean());
      engine.step();
    }
    engine.save_checkpoint(dir.string());
    g_world->barrier();
    if (step == 0 && g_world->rank() == 0) fs::copy(dir, copy, fs::copy_options::recursive);  // latest: global_step1
    g_world->barrier();
  }
  // As when another job's save moved `latest` between two ranks' reads.
  const std::string error = error_of([&] { engine.load_checkpoint((g_world->rank() == 0 ? copy : dir).string()); });
  EXPECT_NE(error.find("is another job saving into the same folder?"), std::string::npos) << error;
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir), fs::remove_all(copy);
}

// Every rank's copy of `t`, stacked.
at::Tensor gathered(const at::Tensor& t) {
  at::Tensor all = torch::empty({g_world->size(), t.numel()}, t.options());
  g_world->all_gather(all, t.contiguous().view(-1));
  return all;
}

TEST(Buffers, ABatchNormsRunningStatisticsAreRankZerosAfterEachStep) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (bool broadcast : {true, false}) {
    SCOPED_TRACE(broadcast ? "broadcast_buffers" : "each rank its own");
    auto m = net();
    auto engine = engine_for(*m, m, broadcast);
    at::Tensor rank0_mean;
    for (int i = 0; i < 2; ++i) {
      engine.backward(m->forward(batch()).pow(2).mean());
      rank0_mean = m->norm->running_mean.clone();  // what this rank's forward made
      engine.step();
    }
    const at::Tensor before = gathered(rank0_mean);
    const at::Tensor after = gathered(m->norm->running_mean);
    ASSERT_FALSE(torch::equal(before[0], before[1]));  // the data differ
    if (broadcast) {
      for (int r = 0; r < g_world->size(); ++r) EXPECT_TRUE(torch::equal(after[r], before[0])) << "rank " << r;
    } else {
      EXPECT_TRUE(torch::equal(after, before));
    }
  }
}

TEST(Accessors, TheBatchTriad) {
  auto m = net();
  auto engine = engine_for(*m, m);
  EXPECT_EQ(engine.train_micro_batch_size_per_gpu(), 2);
  EXPECT_EQ(engine.gradient_accumulation_steps(), 2);
  EXPECT_EQ(engine.train_batch_size(), 2 * 2 * g_world->size());
}

// ---- precision on CPU ranks: engine.forward ---------------------------------

zero::Engine precision_engine(std::shared_ptr<torch::nn::Module> m, const std::string& precision) {
  zero::InitOptions init;
  init.group = g_world;
  return zero::initialize(
      zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
                                  )" + precision + "}"),
      m, init);
}

TEST(Precision, AnFp32InputToABf16ModelIsAnErrorSayingWhatToCast) {
  torch::manual_seed(1);
  auto m = torch::nn::Linear(4, 4);
  auto engine = precision_engine(m.ptr(), R"("bf16": {"enabled": true})");
  EXPECT_EQ(engine.dtype(), torch::kBFloat16);
  const std::string error = error_of([&] { engine.forward(m, torch::randn({2, 4})); });
  EXPECT_NE(error.find("the model's weights are BFloat16 (bf16.enabled) and an input is not: cast floating-point inputs "
                       "with x.to(engine.dtype())"),
            std::string::npos)
      << error;
  const at::Tensor x = torch::randn({2, 4});
  EXPECT_TRUE(torch::equal(engine.forward(m, x.to(engine.dtype())), m->forward(x.to(torch::kBFloat16))));
}

struct Scale : torch::nn::Module {
  at::Tensor w;
  Scale() { w = register_parameter("w", torch::randn({4})); }
  at::Tensor forward(const at::Tensor& x, int64_t times) { return x * w * static_cast<double>(times); }
};

TEST(Precision, Fp16AutoCastCastsFloatingInputsOnly) {
  torch::manual_seed(2);
  auto m = std::make_shared<Scale>();
  auto engine = precision_engine(m, R"("fp16": {"enabled": true, "auto_cast": true})");
  const at::Tensor x = torch::randn({2, 4});
  const at::Tensor y = engine.forward(m, x, int64_t{3});  // the int passes through as it is
  EXPECT_EQ(y.scalar_type(), torch::kHalf);
  EXPECT_TRUE(torch::equal(y, m->forward(x.to(torch::kHalf), 3)));
  auto strict = std::make_shared<Scale>();
  auto no_cast = precision_engine(strict, R"("fp16": {"enabled": true})");
  // Without auto_cast the input stays Float (here promoted with the Half weight).
  EXPECT_EQ(no_cast.forward(strict, x, int64_t{1}).scalar_type(), torch::kFloat);
}

// ---- gather_parameters with a modifier rank ----------------------------------

struct Stack : torch::nn::Module {
  zero::Unit<torch::nn::Linear> first{nullptr}, second{nullptr};
  Stack() {
    torch::manual_seed(4);
    first = register_module("first", zero::Unit<torch::nn::Linear>(torch::nn::Linear(6, 6)));
    second = register_module("second", zero::Unit<torch::nn::Linear>(torch::nn::Linear(6, 3)));
  }
  at::Tensor forward(const at::Tensor& x) { return second(torch::tanh(first(x))); }
};

zero::Engine stack_engine(std::shared_ptr<Stack> m, int stage, const std::string& dtype) {
  zero::InitOptions init;
  init.group = g_world;
  return zero::initialize(
      zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                                  "zero_optimization": {"stage": )" + std::to_string(stage) + "}" +
                              (dtype == "bf16" ? R"(, "bf16": {"enabled": true})" : "") + "}"),
      m, init);
}

// Trains 3 steps on data that differ by rank; returns the first layer's weight, gathered.
at::Tensor train_and_read(zero::Engine& engine, Stack& m) {
  torch::manual_seed(11 + g_world->rank());
  for (int i = 0; i < 3; ++i) {
    engine.backward(m.forward(torch::randn({2, 6}).to(engine.dtype())).to(torch::kFloat).pow(2).mean());
    engine.step();
  }
  for (const auto& [name, t] : engine.gathered_state_dict()) {
    if (name == "first.weight") return t.to(torch::kFloat);
  }
  return at::Tensor();
}

// A change rank 1 makes inside the scope reaches every rank's shards and
// masters; the reference is a model built with that change before initialize.
TEST(GatheredParameters, ModifierRanksChangesReachEveryRankAtEveryStage) {
  const int modifier = g_world->size() - 1;
  for (int stage : {1, 2, 3}) {
    for (const std::string dtype : {"fp32", "bf16"}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " " + dtype);
      auto changed = std::make_shared<Stack>();
      auto engine = stack_engine(changed, stage, dtype);
      {
        auto scope = engine.gather_parameters(*changed->first, modifier);
        torch::NoGradGuard no_grad;
        changed->first->inner()->weight.fill_(g_world->rank() == modifier ? 0.25 : -3.0);
      }
      auto reference = std::make_shared<Stack>();
      {
        torch::NoGradGuard no_grad;
        reference->first->inner()->weight.fill_(0.25);
      }
      auto reference_engine = stack_engine(reference, stage, dtype);
      const at::Tensor got = train_and_read(engine, *changed);
      const at::Tensor want = train_and_read(reference_engine, *reference);
      EXPECT_TRUE(torch::equal(got, want)) << (got - want).abs().max().item<double>();
    }
  }
}

TEST(GatheredParameters, AModifierRankOutsideTheGroupIsRefused) {
  auto m = std::make_shared<Stack>();
  auto engine = stack_engine(m, 3, "fp32");
  EXPECT_NE(error_of([&] { engine.gather_parameters(*m->first, g_world->size()); })
                .find("modifier_rank " + std::to_string(g_world->size()) + " is not a data-parallel rank (0 to " +
                      std::to_string(g_world->size() - 1) + ")"),
            std::string::npos);
}

// DeepSpeed's released parameter: between its unit's uses a stage-3
// parameter has no elements (sizes() [0]); zero::gathered_shape keeps its
// shape (ds_shape), and gather_parameters, checkpoints and state dicts see
// it whole.
TEST(ReleasedParameters, ShowNoElementsAndKeepTheirGatheredShape) {
  auto m = std::make_shared<Stack>();
  const at::Tensor built = m->first->inner()->weight.detach().clone();
  zero::InitOptions init;
  init.group = g_world;
  auto engine = zero::initialize(
      zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                                  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})"),
      m, init);
  const at::Tensor& w = m->first->inner()->weight;
  EXPECT_EQ(w.sizes(), (std::vector<int64_t>{0}));
  EXPECT_EQ(zero::gathered_shape(w), (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(zero::gathered_numel(w), 36);
  const at::Tensor x = torch::ones({1, 6});
  try {
    torch::matmul(x, w.t());
    ADD_FAILURE() << "a released parameter was used";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("size mismatch"), std::string::npos)
        << "a released parameter fails on its shape, not inside its storage: " << e.what();
  }
  {
    auto scope = engine.gather_parameters(*m->first);
    EXPECT_EQ(w.sizes(), (std::vector<int64_t>{6, 6}));
    EXPECT_TRUE(torch::equal(w, built));
  }
  EXPECT_EQ(w.numel(), 0) << "released again when the scope ends";

  train_and_read(engine, *m);  // forward and backward gather it whole
  EXPECT_EQ(w.numel(), 0);
  at::Tensor from_state;
  for (const auto& [name, t] : engine.gathered_state_dict()) {
    if (name == "first.weight") from_state = t;
  }
  ASSERT_TRUE(from_state.defined());
  EXPECT_EQ(from_state.sizes(), (std::vector<int64_t>{6, 6}));
  const fs::path dir = fs::temp_directory_path() / ("zero_test_first_day_released" + std::to_string(g_world->size()));
  if (g_world->rank() == 0) fs::remove_all(dir);
  g_world->barrier();
  engine.save_checkpoint(dir.string(), "t");
  const auto saved = zero::fp32_state_dict_from_checkpoint(dir.string(), "t");
  auto it = std::find_if(saved.begin(), saved.end(), [](const auto& kv) { return kv.first == "first.weight"; });
  ASSERT_NE(it, saved.end());
  EXPECT_TRUE(torch::equal(it->second, from_state)) << "the checkpoint holds it whole";
}

// DeepSpeed's rule: at stage 3 save_16bit_model saves only when the config
// lets it gather the whole model.
TEST(Save16bitModel, AtStage3OnlyWithGather16bitWeightsOnModelSave) {
  const fs::path dir = fs::temp_directory_path() / ("zero_test_first_day_16bit" + std::to_string(g_world->size()));
  for (bool allowed : {false, true}) {
    if (g_world->rank() == 0) fs::remove_all(dir);
    g_world->barrier();
    auto m = std::make_shared<Stack>();
    zero::InitOptions init;
    init.group = g_world;
    auto engine = zero::initialize(
        zero::Config::from_json(std::string(R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": )") +
                                (allowed ? "true" : "false") + "}}"),
        m, init);
    EXPECT_EQ(engine.save_16bit_model(dir.string()), allowed);
    g_world->barrier();
    EXPECT_EQ(fs::exists(dir / "model.safetensors"), allowed);
  }
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

// A checkpoint whose master weights hold NaN (saved after training
// diverged, with valid checksums) is refused naming the parameter.
TEST(Resume, NonFiniteMasterWeightsAreRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / ("zero_test_first_day_nan" + std::to_string(g_world->size()));
  if (g_world->rank() == 0) fs::remove_all(dir);
  g_world->barrier();
  auto m = std::make_shared<Stack>();
  auto engine = stack_engine(m, 2, "fp32");
  {
    auto scope = engine.gather_parameters(*m->second, 0);
    torch::NoGradGuard no_grad;
    m->second->inner()->weight[1][2] = std::numeric_limits<float>::quiet_NaN();
  }
  zero::SaveOptions keep;  // saved on purpose (a save refuses them otherwise)
  keep.allow_non_finite = true;
  engine.save_checkpoint(dir.string(), "", "{}", keep);
  auto again = std::make_shared<Stack>();
  auto resumed = stack_engine(again, 2, "fp32");
  const std::string error = error_of([&] { resumed.load_checkpoint(dir.string()); });
  EXPECT_NE(error.find("the master weights of parameter second.weight hold nan at element 8"), std::string::npos) << error;
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

}  // namespace
