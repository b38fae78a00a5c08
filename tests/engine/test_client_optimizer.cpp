// A client optimizer (InitOptions::optimizer, lr_scheduler; Note [Client
// optimizer] in engine/client_optimizer.h): the engine steps the user's own
// torch::optim object over its partition, at stages 0-3 on 1 and 2 ranks,
// and ends with the parameters and rates of the same optimizer and
// scheduler stepping the whole model in one process. A checkpoint resumes
// the rates and the scheduler; what the engine cannot honour is refused
// with the reason.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "world_main.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
using torch::optim::OptimizerParamGroup;

constexpr int64_t kIn = 6, kHidden = 10, kOut = 3;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    up = register_module("up", zero::Unit<torch::nn::Linear>(torch::nn::Linear(kIn, kHidden)));
    down = register_module("down", torch::nn::Linear(kHidden, kOut));
  }
  torch::Tensor forward(const torch::Tensor& x) { return down(torch::tanh(up(x))); }
  zero::Unit<torch::nn::Linear> up{nullptr};
  torch::nn::Linear down{nullptr};
};
TORCH_MODULE(Net);

Net make_net() {
  torch::manual_seed(7);
  return Net();
}

// Weights decay at one rate, biases at none, each group with its own lr.
std::vector<OptimizerParamGroup> two_groups(Net& net) {
  std::vector<torch::Tensor> weights, biases;
  for (const auto& p : net->named_parameters()) (p.key().find("bias") == std::string::npos ? weights : biases).push_back(p.value());
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(weights);
  groups.emplace_back(biases);
  return groups;
}

using MakeOptimizer = std::function<std::shared_ptr<torch::optim::Optimizer>(Net&)>;

std::shared_ptr<torch::optim::Optimizer> adamw(Net& net) {
  auto groups = two_groups(net);
  groups[0].set_options(std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.01).weight_decay(0.1)));
  groups[1].set_options(std::make_unique<torch::optim::AdamWOptions>(
      torch::optim::AdamWOptions(0.02).weight_decay(0.0).betas({0.8, 0.99})));
  return std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(0.01));
}
std::shared_ptr<torch::optim::Optimizer> adam_l2(Net& net) {
  return std::make_shared<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(0.01).weight_decay(0.05));
}
std::shared_ptr<torch::optim::Optimizer> sgd_nesterov(Net& net) {
  auto groups = two_groups(net);
  groups[0].set_options(std::make_unique<torch::optim::SGDOptions>(
      torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01)));
  groups[1].set_options(std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.05).momentum(0.5)));
  return std::make_shared<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.1));
}
std::shared_ptr<torch::optim::Optimizer> adagrad(Net& net) {
  return std::make_shared<torch::optim::Adagrad>(
      net->parameters(), torch::optim::AdagradOptions(0.05).lr_decay(0.01).initial_accumulator_value(0.1));
}

// StepLR's rule (halve every `every` steps) with a count of its own:
// LibTorch 1.13's LRScheduler leaves its step_count_ uninitialized.
class HalveEvery : public torch::optim::LRScheduler {
 public:
  HalveEvery(torch::optim::Optimizer& optimizer, unsigned every) : LRScheduler(optimizer), every_(every) {}

 private:
  std::vector<double> get_lrs() override {
    std::vector<double> lrs = get_current_lrs();
    if (count_ > 0 && count_ % every_ == 0) {
      for (double& lr : lrs) lr *= 0.5;
    }
    ++count_;
    return lrs;
  }
  unsigned every_, count_ = 0;
};

// The global batch of `step`: rows x kIn inputs and their targets, the same
// for any world size.
std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step, int64_t rows) {
  auto gen = at::detail::createCPUGenerator(500 + step);
  return {torch::randn({rows, kIn}, gen), torch::randn({rows, kOut}, gen)};
}

torch::Tensor loss_of(Net& net, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::mse_loss(net->forward(x), y);
}

// `extra`: more top-level keys; `zero_extra`: more of zero_optimization's.
std::string config_json(int stage, int64_t gas, double clip, const std::string& extra = "", const std::string& zero_extra = "") {
  return R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": )" + std::to_string(gas) +
         R"(, "gradient_clipping": )" + std::to_string(clip) + R"(, "steps_per_print": 1000000)" + extra +
         R"(, "zero_optimization": {"stage": )" + std::to_string(stage) + R"(, "reduce_bucket_size": 20)" + zero_extra + "}}";
}

struct Trained {
  std::map<std::string, torch::Tensor> params;
  std::vector<double> lrs;  // every group's rate after the last step
  double lr = 0, get_lr = 0;
};

std::vector<double> lrs_of(const torch::optim::Optimizer& o) {
  std::vector<double> out;
  for (const auto& g : o.param_groups()) out.push_back(g.options().get_lr());
  return out;
}

// The reference: the optimizer and a StepLR (HalveEvery 2 steps) over
// the whole model in this process.
Trained reference(const MakeOptimizer& make, int steps, int64_t gas, double clip) {
  const int64_t rows = 2 * gas * g_world->size();
  Net net = make_net();
  auto optimizer = make(net);
  HalveEvery scheduler(*optimizer, 2);
  Trained out;
  for (int step = 0; step < steps; ++step) {
    optimizer->zero_grad();
    auto [x, y] = global_batch(step, rows);
    for (int64_t m = 0; m < gas; ++m) {  // each micro-step's rows of every rank, averaged as the engine does
      const auto part = x.slice(0, m * rows / gas, (m + 1) * rows / gas);
      (loss_of(net, part, y.slice(0, m * rows / gas, (m + 1) * rows / gas)) / gas).backward();
    }
    if (clip > 0) torch::nn::utils::clip_grad_norm_(net->parameters(), clip);
    out.lr = optimizer->param_groups()[0].options().get_lr();
    optimizer->step();
    scheduler.step();
  }
  for (const auto& p : net->named_parameters()) out.params[p.key()] = p.value().detach().clone();
  out.lrs = lrs_of(*optimizer);
  out.get_lr = out.lrs[0];
  return out;
}

// Rank r's micro-step m takes rows ((m * W) + r) * 2 of the global batch,
// which the reference's micro-step m covers with every rank's.
void train(zero::Engine& engine, Net& net, int from, int to, int64_t gas) {
  const int W = g_world->size(), R = g_world->rank();
  const int64_t rows = 2 * gas * W;
  for (int step = from; step < to; ++step) {
    auto [x, y] = global_batch(step, rows);
    for (int64_t m = 0; m < gas; ++m) {
      const int64_t first = (m * W + R) * 2;
      engine.backward(loss_of(net, x.slice(0, first, first + 2), y.slice(0, first, first + 2)));
      engine.step();
    }
  }
}

Trained ours(const MakeOptimizer& make, int stage, int steps, int64_t gas, double clip) {
  Net net = make_net();
  zero::InitOptions options;
  options.group = g_world;
  options.optimizer = make(net);
  options.lr_scheduler = std::make_shared<HalveEvery>(*options.optimizer, 2);
  auto client = options.optimizer;
  auto engine = zero::initialize(zero::Config::from_json(config_json(stage, gas, clip)), net, options);
  train(engine, net, 0, steps, gas);
  Trained out;
  for (auto& [name, tensor] : engine.gathered_state_dict()) out.params[name] = tensor;
  out.lrs = lrs_of(*client);
  out.lr = engine.lr();
  out.get_lr = engine.get_lr();
  return out;
}

void expect_same(const Trained& a, const Trained& ref, const std::string& what) {
  for (const auto& [name, expected] : ref.params) {
    ASSERT_TRUE(a.params.count(name)) << what << ": " << name << " missing";
    const double err = (a.params.at(name) - expected).abs().max().item<double>() / expected.abs().max().item<double>();
    EXPECT_LT(err, 1e-5) << what << ": " << name << " differs by " << err << " (relative)";
  }
  ASSERT_EQ(a.lrs.size(), ref.lrs.size()) << what;
  for (size_t g = 0; g < ref.lrs.size(); ++g) EXPECT_DOUBLE_EQ(a.lrs[g], ref.lrs[g]) << what << ": group " << g << "'s lr";
  EXPECT_DOUBLE_EQ(a.lr, ref.lr) << what << ": engine.lr(), the rate the last step used";
  EXPECT_DOUBLE_EQ(a.get_lr, ref.get_lr) << what << ": engine.get_lr(), the rate the next step uses";
}

TEST(ClientOptimizer, AdamWWithTwoGroupsAndASchedulerMatchOneProcessAtEveryStage) {
  const Trained ref = reference(adamw, 5, 2, 0.5);
  for (int stage : {0, 1, 2, 3}) expect_same(ours(adamw, stage, 5, 2, 0.5), ref, "AdamW stage " + std::to_string(stage));
}

TEST(ClientOptimizer, SgdAdamAndAdagradMatchOneProcess) {
  expect_same(ours(sgd_nesterov, 2, 5, 1, 0.0), reference(sgd_nesterov, 5, 1, 0.0), "SGD nesterov stage 2");
  expect_same(ours(adam_l2, 3, 5, 2, 0.0), reference(adam_l2, 5, 2, 0.0), "Adam (L2) stage 3");
  expect_same(ours(adagrad, 1, 5, 1, 0.0), reference(adagrad, 5, 1, 0.0), "Adagrad stage 1");
}

// A checkpoint keeps the rates and the scheduler's place: a new engine,
// optimizer and scheduler loaded at step 3 end where the run that went on did.
TEST(ClientOptimizer, ResumesTheRatesAndTheScheduler) {
  const fs::path dir = fs::temp_directory_path() / ("zero_test_client_optimizer" + std::to_string(g_world->size()));
  if (g_world->rank() == 0) fs::remove_all(dir);
  g_world->barrier();
  auto start = [](Net& net) {
    zero::InitOptions options;
    options.group = g_world;
    options.optimizer = adamw(net);
    options.lr_scheduler = std::make_shared<HalveEvery>(*options.optimizer, 2);
    return std::make_pair(zero::initialize(zero::Config::from_json(config_json(2, 1, 0.0)), net, options), options.optimizer);
  };
  Net net = make_net();
  auto [engine, client] = start(net);
  train(engine, net, 0, 3, 1);
  engine.save_checkpoint(dir.string(), "step3");
  train(engine, net, 3, 6, 1);

  Net resumed_net = make_net();
  auto [resumed, resumed_client] = start(resumed_net);
  resumed.load_checkpoint(dir.string(), "step3");
  EXPECT_EQ(lrs_of(*resumed_client), std::vector<double>({0.005, 0.01})) << "the scheduler halved the rates once in 3 steps";
  train(resumed, resumed_net, 3, 6, 1);
  auto a = engine.gathered_state_dict(), b = resumed.gathered_state_dict();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  EXPECT_EQ(lrs_of(*resumed_client), lrs_of(*client));
  EXPECT_DOUBLE_EQ(resumed.get_lr(), engine.get_lr());

  // Its scheduler has stepped since: it cannot be set back, and nothing is loaded.
  try {
    resumed.load_checkpoint(dir.string(), "step3");
    ADD_FAILURE() << "a load into a scheduler that has stepped was not refused";
  } catch (const zero::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be set back"), std::string::npos) << e.what();
  }
  EXPECT_EQ(resumed.global_steps(), 6);
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

// With the config's "scheduler", it sets every group's rate, as DeepSpeed's do.
TEST(ClientOptimizer, TheConfigsSchedulerSetsEveryGroup) {
  Net net = make_net();
  zero::InitOptions options;
  options.group = g_world;
  options.optimizer = adamw(net);
  const std::string warmup =
      R"(, "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.004, "warmup_num_steps": 4, "warmup_type": "linear"}})";
  auto engine = zero::initialize(zero::Config::from_json(config_json(1, 1, 0.0, warmup)), net, options);
  train(engine, net, 0, 3, 1);
  // DeepSpeed's WarmupLR: 0 for the first two steps, then (k - 1) / 4 of the way.
  EXPECT_DOUBLE_EQ(engine.lr(), 0.001) << "WarmupLR's linear rate at the third step";
  for (double lr : lrs_of(*options.optimizer)) EXPECT_DOUBLE_EQ(lr, 0.001);
}

// `setup` fills the options and the config's extra keys (top level, zero_optimization's).
void expect_refused(const std::function<void(zero::InitOptions&, std::string&, std::string&)>& setup, const std::string& words) {
  Net net = make_net();
  zero::InitOptions options;
  options.group = g_world;
  std::string extra, zero_extra;
  setup(options, extra, zero_extra);
  if (!options.optimizer && !options.lr_scheduler) options.optimizer = adamw(net);
  const std::string json = config_json(2, 1, 0.0, extra, zero_extra);
  try {
    zero::initialize(zero::Config::from_json(json), net, options);
    ADD_FAILURE() << "not refused; expected: " << words;
  } catch (const zero::Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(ClientOptimizer, RefusesWhatItCannotHonour) {
  Net other = make_net();
  expect_refused([&](auto& o, auto&, auto&) { o.optimizer = std::make_shared<torch::optim::LBFGS>(other->parameters()); },
                 "LBFGS, which steps through a closure");
  expect_refused([&](auto& o, auto&, auto&) { o.optimizer = std::make_shared<torch::optim::RMSprop>(other->parameters()); },
                 "zero steps a client torch::optim::Adam, AdamW, SGD or Adagrad");
  expect_refused(
      [&](auto& o, auto&, auto&) {
        o.optimizer = std::make_shared<torch::optim::AdamW>(other->parameters());
        loss_of(other, torch::ones({2, kIn}), torch::zeros({2, kOut})).backward();
        o.optimizer->step();
      },
      "has stepped already");
  expect_refused([&](auto&, auto& extra, auto&) { extra = R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}})"; },
                 "both say how to step");
  expect_refused([&](auto& o, auto&, auto&) { o.param_groups.push_back({other->parameters(), 0.0}); }, "leave param_groups empty");
  expect_refused([&](auto&, auto&, auto& zero_extra) { zero_extra = R"(, "offload_optimizer": {"device": "cpu"})"; },
                 "zero_force_ds_cpu_optimizer");
  expect_refused(
      [&](auto& o, auto&, auto&) {
        static auto lonely = std::make_shared<torch::optim::SGD>(other->parameters(), torch::optim::SGDOptions(0.1));
        o.lr_scheduler = std::make_shared<HalveEvery>(*lonely, 1);
      },
      "lr_scheduler is given without InitOptions::optimizer");
  expect_refused(
      [&](auto& o, auto& extra, auto&) {
        o.optimizer = adamw(other);
        o.lr_scheduler = std::make_shared<HalveEvery>(*o.optimizer, 1);
        extra = R"(, "scheduler": {"type": "WarmupLR"})";
      },
      "both set the rates; keep one");
  expect_refused(
      [&](auto& o, auto&, auto&) {
        auto groups = two_groups(other);
        groups[0].set_options(std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.01).amsgrad(true)));
        groups[1].set_options(std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.01)));
        o.optimizer = std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(0.01));
      },
      "differ in amsgrad");
  expect_refused([&](auto& o, auto&, auto&) { o.optimizer = adamw(other); }, "not a parameter of the model");
}

}  // namespace
