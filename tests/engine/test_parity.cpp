// Parity: training with the engine on 1, 2 or 4 ranks (ctest runs this
// binary through zero-run) ends with the same parameters as a single-process
// torch::optim run on the same global batches. Also the per-rank memory the
// engine holds against the ZeRO formulas, computed here from the model. With
// ZERO_TEST_DEVICE=cuda the engine's runs train on the GPU (the torch::optim
// references stay on the CPU).
#include <gtest/gtest.h>

#include <chrono>
#include <torch/torch.h>

#include <map>
#include <set>

#include "tests/engine/test_device.h"
#include "zero/zero.h"

namespace {

std::shared_ptr<zero::comm::ProcessGroup> g_world;

constexpr int64_t kVocab = 16, kDim = 8, kHidden = 12, kSeq = 6;

// The output projection registers the embedding's weight as its own: one
// tensor under two names.
struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(torch::Tensor tied) { weight = register_parameter("weight", tied); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(Head);

// Several layer types, a tied weight (head = embedding) and a module used
// twice in one forward (mix).
struct ToyImpl : torch::nn::Module {
  ToyImpl() {
    emb = register_module("emb", torch::nn::Embedding(kVocab, kDim));
    up = register_module("up", torch::nn::Linear(kDim, kHidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})));
    down = register_module("down", torch::nn::Linear(kHidden, kDim));
    mix = register_module("mix", torch::nn::Linear(kDim, kDim));
    head = register_module("head", Head(emb->weight));  // tied
    temperature = register_parameter("temperature", torch::ones({1}));  // fewer elements than ranks
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = emb(tokens);
    x = x + down(norm(torch::gelu(up(x))));
    x = torch::tanh(mix(x));
    x = mix(x);  // the same module again
    return head(x) * temperature;
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear up{nullptr}, down{nullptr}, mix{nullptr};
  Head head{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::Tensor temperature;
};
TORCH_MODULE(Toy);

// The same computation with stage-3 units: the middle block and the layer
// used twice are units; the embedding, tied to the head, stays outside.
// With `swap_order` the two units run in the other order on odd steps (a
// change of execution order between steps).
struct MidImpl : torch::nn::Module {
  MidImpl() {
    up = register_module("up", torch::nn::Linear(kDim, kHidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})));
    down = register_module("down", torch::nn::Linear(kHidden, kDim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + down(norm(torch::gelu(up(x)))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Mid);

struct ToyUnitsImpl : torch::nn::Module {
  ToyUnitsImpl() {
    emb = register_module("emb", torch::nn::Embedding(kVocab, kDim));
    mid = register_module("mid", zero::Unit<Mid>(Mid()));
    mix = register_module("mix", zero::Unit<torch::nn::Linear>(torch::nn::Linear(kDim, kDim)));
    head = register_module("head", Head(emb->weight));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = emb(tokens);
    if (swap_order && (calls++ % 2 == 1)) {
      x = torch::tanh(mix(x));
      x = mid(x);
    } else {
      x = mid(x);
      x = torch::tanh(mix(x));
    }
    x = mix(x);
    return head(x);
  }
  torch::nn::Embedding emb{nullptr};
  zero::Unit<Mid> mid{nullptr};
  zero::Unit<torch::nn::Linear> mix{nullptr};
  Head head{nullptr};
  bool swap_order = false;
  int calls = 0;
};
TORCH_MODULE(ToyUnits);

template <typename Model = Toy>
Model make_model() {
  torch::manual_seed(42);
  return Model();
}

// Global batch `step`: rows [W*micro*gas, kSeq+1] of tokens, the same for any
// world size. Rank r's micro-step m takes rows ((m * W) + r) * micro ...
torch::Tensor global_batch(int64_t step, int64_t rows) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  return torch::randint(0, kVocab, {rows, kSeq + 1}, gen, torch::kLong);
}

template <typename Model>
torch::Tensor loss_of(Model& model, const torch::Tensor& rows) {
  auto inputs = rows.slice(1, 0, kSeq), targets = rows.slice(1, 1, kSeq + 1);
  auto logits = model->forward(inputs);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape(-1));
}

std::vector<torch::Tensor> unique_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  std::set<const void*> seen;
  for (auto& p : m.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

struct Case {
  int stage;
  int64_t gas;
  double clip;
  std::string optimizer;  // JSON of the "optimizer" section
  std::string name;
};

std::string config_json(const Case& c, int64_t micro, int64_t bucket, int64_t persistence = 0) {
  return R"({"train_micro_batch_size_per_gpu": )" + std::to_string(micro) +
         R"(, "gradient_accumulation_steps": )" + std::to_string(c.gas) + R"(, "optimizer": )" + c.optimizer +
         R"(, "gradient_clipping": )" + std::to_string(c.clip) + R"(, "steps_per_print": 1000000,
           "zero_optimization": {"stage": )" + std::to_string(c.stage) +
         R"(, "reduce_bucket_size": )" + std::to_string(bucket) +
         R"(, "stage3_param_persistence_threshold": )" + std::to_string(persistence) + "}}";
}

std::unique_ptr<torch::optim::Optimizer> reference_optimizer(const std::string& type, std::vector<torch::Tensor> params) {
  if (type == "AdamW" || type == "AdamW torch_adam") return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  if (type == "Adagrad") return std::make_unique<torch::optim::Adagrad>(params, torch::optim::AdagradOptions(0.05).lr_decay(0.01).weight_decay(0.01).initial_accumulator_value(0.1));
  if (type == "Adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01).weight_decay(0.1));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(0.01));
}

std::string optimizer_json(const std::string& type) {
  if (type == "AdamW") return R"({"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}})";
  if (type == "AdamW torch_adam") {
    return R"({"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1, "torch_adam": true}})";
  }
  if (type == "Adam") return R"({"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.1, "adam_w_mode": false}})";
  if (type == "Adagrad") {
    return R"({"type": "Adagrad", "params": {"lr": 0.05, "lr_decay": 0.01, "weight_decay": 0.01, "initial_accumulator_value": 0.1}})";
  }
  return R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true, "weight_decay": 0.01}})";
}

// Returns the engine's split of the steps (take_step_times).
template <typename Model = Toy>
zero::StepTimes run_parity(const Case& c, int steps = 24, int64_t micro = 3, int64_t bucket = 50, bool swap_order = false) {
  const int W = g_world->size(), R = g_world->rank();
  const int64_t rows = micro * c.gas * W;

  Model reference = make_model<Model>();
  if constexpr (std::is_same<Model, ToyUnits>::value) reference->swap_order = swap_order;
  auto ref_params = unique_params(*reference);
  auto ref_opt = reference_optimizer(c.optimizer, ref_params);
  for (int step = 0; step < steps; ++step) {
    ref_opt->zero_grad();
    loss_of(reference, global_batch(step, rows)).backward();
    if (c.clip > 0) torch::nn::utils::clip_grad_norm_(ref_params, c.clip);
    ref_opt->step();
  }

  Model model = make_model<Model>();
  if constexpr (std::is_same<Model, ToyUnits>::value) model->swap_order = swap_order;
  const at::Device device = zero_test::test_device();
  model->to(device);
  zero::InitOptions options;
  options.group = g_world;
  Case cc = c;
  cc.optimizer = optimizer_json(c.optimizer);
  auto engine = zero::initialize(zero::Config::from_json(config_json(cc, micro, bucket)), model, options);
  for (int step = 0; step < steps; ++step) {
    auto batch = global_batch(step, rows).to(device);
    for (int64_t m = 0; m < c.gas; ++m) {
      const int64_t first = (m * W + R) * micro;
      engine.backward(loss_of(model, batch.slice(0, first, first + micro)));
      engine.step();
    }
  }
  EXPECT_EQ(engine.global_steps(), steps);

  std::map<std::string, torch::Tensor> ours;
  for (auto& [name, tensor] : engine.gathered_state_dict()) ours[name] = tensor.to(at::kCPU);
  auto theirs = reference->named_parameters();
  for (const auto& item : theirs) {
    const auto& a = ours.at(item.key());
    const auto& b = item.value();
    const double err = (a - b).abs().max().template item<double>() / b.abs().max().template item<double>();
    EXPECT_LT(err, zero_test::fp32_parity_tolerance(device)) << c.name << ": " << item.key() << " differs by " << err << " (relative)";
  }
  return engine.take_step_times();
}

TEST(Parity, AdamWStage0) { run_parity({0, 1, 0.0, "AdamW", "stage 0"}); }
TEST(Parity, AdamWStage1) { run_parity({1, 1, 0.0, "AdamW", "stage 1"}); }
TEST(Parity, AdamWStage2) { run_parity({2, 1, 0.0, "AdamW", "stage 2"}); }
TEST(Parity, AdamWStage0AccumulationClipping) { run_parity({0, 3, 0.5, "AdamW", "stage 0, gas 3, clip"}); }
TEST(Parity, AdamWStage1AccumulationClipping) { run_parity({1, 3, 0.5, "AdamW", "stage 1, gas 3, clip"}); }
TEST(Parity, AdamWStage2AccumulationClipping) { run_parity({2, 3, 0.5, "AdamW", "stage 2, gas 3, clip"}); }
// Adam and AdamW run on the fused host kernels unless torch_adam asks for
// torch::optim's; both match it (Note [Fused step on CPU ranks]).
TEST(Parity, CpuRanksStepAdamWOnTheFusedKernelsUnlessTorchAdam) {
  for (int stage : {0, 2, 3}) {
    const zero::StepTimes fused = run_parity<ToyUnits>({stage, 1, 0.5, "AdamW", "fused, stage " + std::to_string(stage)});
    EXPECT_GT(fused.host_step, 0.0) << "stage " << stage << ": the fused kernels did not run";
    const zero::StepTimes torch_adam =
        run_parity<ToyUnits>({stage, 1, 0.5, "AdamW torch_adam", "torch_adam, stage " + std::to_string(stage)});
    EXPECT_EQ(torch_adam.host_step, 0.0) << "stage " << stage << ": torch_adam ran the fused kernels";
  }
}
TEST(Parity, AdamStage2Accumulation) { run_parity({2, 2, 0.0, "Adam", "Adam stage 2"}); }
TEST(Parity, SgdNesterovStage1) { run_parity({1, 2, 0.0, "SGD", "SGD stage 1"}); }
TEST(Parity, AdagradStage1Accumulation) { run_parity({1, 2, 0.0, "Adagrad", "Adagrad stage 1"}); }
TEST(Parity, SgdNesterovStage2Clipping) { run_parity({2, 1, 1.0, "SGD", "SGD stage 2"}); }
TEST(Parity, OneBigBucketStage2) { run_parity({2, 2, 0.5, "AdamW", "stage 2, one bucket"}, 12, 3, 1000000); }
// StepTimes::gather_wait is the part of forward and backward spent waiting
// for units' all-gathers: none below stage 3; at stage 3 each forward's
// first unit is gathered when it runs (nothing prefetched it), so the wait
// is positive, and it is part of forward + backward.
TEST(Parity, UnitsAtStage2AreAPassThrough) {
  const zero::StepTimes times = run_parity<ToyUnits>({2, 1, 0.0, "AdamW", "units at stage 2"});
  EXPECT_EQ(times.gather_wait, 0.0);
}
TEST(Parity, AdamWStage3) {
  const zero::StepTimes times = run_parity<ToyUnits>({3, 1, 0.0, "AdamW", "stage 3"});
  EXPECT_GT(times.gather_wait, 0.0);
  EXPECT_LE(times.gather_wait, times.forward + times.backward);
}
TEST(Parity, AdamWStage3AccumulationClipping) { run_parity<ToyUnits>({3, 3, 0.5, "AdamW", "stage 3, gas 3, clip"}); }
TEST(Parity, SgdStage3OneBigBucket) { run_parity<ToyUnits>({3, 2, 0.0, "SGD", "SGD stage 3"}, 12, 3, 1000000); }
TEST(Parity, Stage3WithoutUnits) { run_parity<Toy>({3, 1, 0.5, "AdamW", "stage 3, no units"}); }
TEST(Parity, Stage3OrderChangesBetweenSteps) {
  run_parity<ToyUnits>({3, 1, 0.0, "AdamW", "stage 3, order changes"}, 12, 3, 50, /*swap_order=*/true);
}

// Engine::take_step_times() and the progress line each count their own
// window: a progress line every 2 steps leaves take_step_times' count of
// steps whole.
TEST(StepTimes, CountTheirOwnWindowBesideTheProgressLine) {
  Toy model = make_model();
  zero::InitOptions options;
  options.group = g_world;
  const std::string json = R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 2, "wall_clock_breakdown": true,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 2}})";
  auto engine = zero::initialize(zero::Config::from_json(json), model, options);
  auto train = [&](int steps) {
    for (int step = 0; step < steps; ++step) {
      auto batch = global_batch(step, 2 * g_world->size());
      engine.backward(loss_of(model, batch.slice(0, 2 * g_world->rank(), 2 * g_world->rank() + 2)));
      engine.step();
    }
  };
  train(5);
  const zero::StepTimes t = engine.take_step_times();
  EXPECT_EQ(t.steps, 5) << "the progress lines at steps 2 and 4 must not drain take_step_times' window";
  EXPECT_GT(t.forward, 0.0);
  EXPECT_GT(t.backward, 0.0);
  EXPECT_GT(t.step, 0.0);
  train(3);
  EXPECT_EQ(engine.take_step_times().steps, 3);
}

// With overlap_comm, stage 2's bucket buffers stay few over many steps:
// never the whole gradient, and no growth after the first step.
TEST(Memory, Stage2BucketBuffersDoNotGrow) {
  Toy model = make_model();
  zero::InitOptions options;
  options.group = g_world;
  const std::string json = R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000000,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 40}})";
  auto engine = zero::initialize(zero::Config::from_json(json), model, options);
  int64_t full = 0;
  for (auto& p : unique_params(*model)) full += p.numel();
  int64_t after_first = 0;
  for (int step = 0; step < 10; ++step) {
    auto batch = global_batch(step, 2 * g_world->size());
    engine.backward(loss_of(model, batch.slice(0, 2 * g_world->rank(), 2 * g_world->rank() + 2)));
    engine.step();
    if (step == 0) after_first = engine.memory_report().gradients;
  }
  // At most two buffers with overlap_comm (the first step may have needed
  // one); the largest bucket here is the embedding, padded.
  const int64_t largest = kVocab * kDim + g_world->size();
  EXPECT_LE(engine.memory_report().gradients - after_first, 4 * largest);
  const int W = g_world->size();
  EXPECT_LE(engine.memory_report().gradients, 4 * ((full + 8 * W) / W + 2 * largest)) << "partition + two buckets";
}

// Stage 3 keeps no unit's full parameters outside its forward and backward.
TEST(Memory, Stage3ReleasesUnitParameters) {
  ToyUnits model = make_model<ToyUnits>();
  zero::InitOptions options;
  options.group = g_world;
  Case c{3, 1, 0.0, optimizer_json("AdamW"), ""};
  auto engine = zero::initialize(zero::Config::from_json(config_json(c, 2, 50)), model, options);
  auto unit_storage = [&] {
    int64_t bytes = 0;
    for (auto& p : model->mid->parameters()) bytes += p.storage().nbytes();
    for (auto& p : model->mix->parameters()) bytes += p.storage().nbytes();
    return bytes;
  };
  EXPECT_EQ(unit_storage(), 0) << "after initialize";
  auto batch = global_batch(0, 2 * g_world->size());
  auto loss = loss_of(model, batch.slice(0, 2 * g_world->rank(), 2 * g_world->rank() + 2));
  EXPECT_EQ(unit_storage(), 0) << "after forward";
  engine.backward(loss);
  EXPECT_EQ(unit_storage(), 0) << "after backward";
  engine.step();
  EXPECT_EQ(unit_storage(), 0) << "after step";
  EXPECT_GT(model->emb->weight.storage().nbytes(), 0) << "the tied embedding stays gathered";
  // Held parameter bytes: every shard plus the buckets that stay gathered (the embedding).
  const int W = g_world->size();
  const int64_t emb = kVocab * kDim, emb_padded = (emb + W - 1) / W * W;
  int64_t in_units = 0, unit_tensors = 0;
  for (auto& p : model->mid->parameters()) in_units += zero::gathered_numel(p), ++unit_tensors;  // released: numel() 0
  for (auto& p : model->mix->parameters()) in_units += zero::gathered_numel(p), ++unit_tensors;
  const int64_t held = engine.memory_report().params;
  EXPECT_GE(held, 4 * (emb_padded + in_units / W));
  EXPECT_LE(held, 4 * (emb_padded + (in_units + unit_tensors * (W - 1)) / W));  // padding: < W per bucket

  // gather_parameters brings a unit's weights back while it lives.
  {
    auto scope = engine.gather_parameters(*model->mid);
    EXPECT_GT(model->mid->parameters()[0].storage().nbytes(), 0);
  }
  EXPECT_EQ(unit_storage(), 0) << "after the gathered scope";
}

// Note [Reuse distance]: from the second step (the first records the
// order), DeepSpeed's default stage3_max_reuse_distance (1e9 elements) keeps
// units gathered from their forward into their backward, so backward gathers
// nothing again; 0 releases each after its forward. The training is the same.
TEST(Memory, Stage3KeepsUnitsGatheredWithinTheReuseDistance) {
  struct Run {
    std::vector<double> losses;
    int64_t unit_bytes_after_forward = 0, unit_bytes_after_backward = 0, gathered_bytes = 0;
  };
  auto run = [](const std::string& reuse_key) {
    ToyUnits model = make_model<ToyUnits>();
    zero::InitOptions options;
    options.group = g_world;
    Case c{3, 1, 0.0, optimizer_json("AdamW"), ""};
    std::string json = config_json(c, 2, 50);
    json.insert(json.rfind("}}"), reuse_key);
    auto engine = zero::initialize(zero::Config::from_json(json), model, options);
    auto unit_bytes = [&] {
      int64_t bytes = 0;
      for (auto& p : model->mid->parameters()) bytes += p.storage().nbytes();
      for (auto& p : model->mix->parameters()) bytes += p.storage().nbytes();
      return bytes;
    };
    Run r;
    for (int64_t step = 0; step < 3; ++step) {
      auto batch = global_batch(step, 2 * g_world->size());
      const auto before = g_world->stats().all_gather_bytes;
      auto loss = loss_of(model, batch.slice(0, 2 * g_world->rank(), 2 * g_world->rank() + 2));
      if (step == 1) r.unit_bytes_after_forward = unit_bytes();
      engine.backward(loss);
      if (step == 1) r.unit_bytes_after_backward = unit_bytes();
      engine.step();
      if (step == 1) r.gathered_bytes = g_world->stats().all_gather_bytes - before;
      r.losses.push_back(loss.item<double>());
    }
    return r;
  };
  const Run kept = run("");  // DeepSpeed's default distance
  const Run released = run(R"(, "stage3_max_reuse_distance": 0)");
  EXPECT_GT(kept.unit_bytes_after_forward, 0) << "the units stay gathered for backward";
  EXPECT_EQ(released.unit_bytes_after_forward, 0);
  EXPECT_EQ(kept.unit_bytes_after_backward, 0) << "released once their gradients are reduced";
  EXPECT_EQ(kept.losses, released.losses);
  // Gathers saved: mid's in backward, and two of mix's (it runs twice in
  // forward: kept, its second run needs no gather, nor its backward, which
  // gathers once for both runs). Each is the unit's full parameters less
  // this rank's share, as a ring all-gather sends them (padding: < W a tensor).
  const int W = g_world->size();
  int64_t mid = 0, mix = 0, tensors = 0;
  for (auto& p : ToyUnits()->mid->parameters()) mid += p.numel(), ++tensors;
  for (auto& p : ToyUnits()->mix->parameters()) mix += 2 * p.numel(), tensors += 2;
  const int64_t saved = released.gathered_bytes - kept.gathered_bytes;
  EXPECT_GE(saved, 4 * (mid + mix) * (W - 1) / W);
  EXPECT_LE(saved, 4 * (mid + mix + tensors * W) * (W - 1) / W);
}

// Parameter groups with their own weight decay (none for biases, norms and
// the one-element temperature, a group with fewer elements than ranks) and a
// frozen parameter, against torch::optim::AdamW with the same groups.
void run_groups(int stage) {
  const int W = g_world->size(), R = g_world->rank();
  const int64_t micro = 2, rows = micro * W;
  auto split = [](torch::nn::Module& m, std::vector<torch::Tensor>& decay, std::vector<torch::Tensor>& no_decay,
                  std::vector<torch::Tensor>& scalar) {
    std::set<const void*> seen;
    for (auto& item : m.named_parameters()) {
      auto& p = item.value();
      if (!seen.insert(p.unsafeGetTensorImpl()).second || !p.requires_grad()) continue;
      if (item.key() == "temperature") {
        scalar.push_back(p);
      } else if (p.dim() == 1) {
        no_decay.push_back(p);
      } else {
        decay.push_back(p);
      }
    }
  };
  Toy reference = make_model();
  reference->down->bias.requires_grad_(false);  // frozen
  std::vector<torch::Tensor> rd, rn, rs;
  split(*reference, rd, rn, rs);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(rd, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.01).weight_decay(0.1)));
  groups.emplace_back(rn, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.01).weight_decay(0.0)));
  groups.emplace_back(rs, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.01).weight_decay(0.0)));
  torch::optim::AdamW ref_opt(std::move(groups));
  for (int step = 0; step < 16; ++step) {
    ref_opt.zero_grad();
    loss_of(reference, global_batch(step, rows)).backward();
    ref_opt.step();
  }

  Toy model = make_model();
  const at::Device device = zero_test::test_device();
  model->to(device);
  model->down->bias.requires_grad_(false);
  std::vector<torch::Tensor> d, n, sc;
  split(*model, d, n, sc);
  zero::InitOptions options;
  options.group = g_world;
  options.param_groups = {{d, std::nullopt}, {n, 0.0}, {sc, 0.0}};
  Case c{stage, 1, 0.0, optimizer_json("AdamW"), ""};
  auto engine = zero::initialize(zero::Config::from_json(config_json(c, micro, 50)), model, options);
  const auto frozen_before = model->down->bias.detach().clone();
  for (int step = 0; step < 16; ++step) {
    auto batch = global_batch(step, rows).to(device);
    engine.backward(loss_of(model, batch.slice(0, R * micro, (R + 1) * micro)));
    engine.step();
  }
  std::map<std::string, torch::Tensor> ours;
  for (auto& [name, tensor] : engine.gathered_state_dict()) ours[name] = tensor.to(at::kCPU);
  EXPECT_TRUE(ours.at("down.bias").equal(frozen_before.to(at::kCPU))) << "a frozen parameter is left alone";
  for (const auto& item : reference->named_parameters()) {
    const auto& a = ours.at(item.key());
    const auto& b = item.value();
    const double err = (a - b).abs().max().item<double>() / b.abs().max().item<double>();
    EXPECT_LT(err, zero_test::fp32_parity_tolerance(device)) << "stage " << stage << ": " << item.key() << " differs by " << err;
  }
}

TEST(Parity, ParamGroupsFrozenAndTinyGroupStage1) { run_groups(1); }
TEST(Parity, ParamGroupsFrozenAndTinyGroupStage2) { run_groups(2); }
TEST(Parity, ParamGroupsFrozenAndTinyGroupStage3) { run_groups(3); }

// Lamb's trust ratio needs whole-parameter norms, summed over the ranks'
// pieces of each parameter: W ranks at stages 1-3 against the engine on a
// group of one rank (each rank its own) with the whole global batch.
void run_lamb(int stage) {
  const int W = g_world->size(), R = g_world->rank();
  const int64_t micro = 2, rows = micro * W;
  const std::string lamb = R"({"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.01}})";
  std::shared_ptr<zero::comm::ProcessGroup> alone;
  for (int r = 0; r < W; ++r) {
    auto g = g_world->new_group({r});
    if (r == R) alone = g;
  }
  ToyUnits reference = make_model<ToyUnits>();
  zero::InitOptions ref_options;
  ref_options.group = alone;
  auto ref_engine = zero::initialize(zero::Config::from_json(config_json({0, 1, 0.0, lamb, ""}, rows, 50)), reference, ref_options);
  ToyUnits model = make_model<ToyUnits>();
  zero::InitOptions options;
  options.group = g_world;
  auto engine = zero::initialize(zero::Config::from_json(config_json({stage, 1, 0.0, lamb, ""}, micro, 50)), model, options);
  for (int step = 0; step < 12; ++step) {
    auto batch = global_batch(step, rows);
    ref_engine.backward(loss_of(reference, batch));
    ref_engine.step();
    engine.backward(loss_of(model, batch.slice(0, R * micro, (R + 1) * micro)));
    engine.step();
  }
  std::map<std::string, torch::Tensor> ours;
  for (auto& [name, tensor] : engine.gathered_state_dict()) ours[name] = tensor;
  for (const auto& item : reference->named_parameters()) {
    const auto& a = ours.at(item.key());
    const auto& b = item.value();
    const double err = (a - b).abs().max().item<double>() / b.abs().max().item<double>();
    EXPECT_LT(err, 1e-5) << "Lamb stage " << stage << ": " << item.key() << " differs by " << err;
  }
}

TEST(Parity, LambStage1) { run_lamb(1); }
TEST(Parity, LambStage2) { run_lamb(2); }
TEST(Parity, LambStage3) { run_lamb(3); }

// Held bytes against the formulas of the ZeRO paper for fp32 Adam (params
// 4, gradients 4, moments 8 bytes per element), padding included: with
// reduce_bucket_size 1 every parameter is its own bucket, padded to a
// multiple of the owners (the world size at stages 1-2).
TEST(Memory, HeldBytesMatchTheStageFormulas) {
  const int W = g_world->size();
  for (int stage = 0; stage <= 2; ++stage) {
    Toy model = make_model();
    int64_t padded = 0, largest = 0;
    for (auto& p : unique_params(*model)) {
      const int64_t owners = stage == 0 ? 1 : W;
      const int64_t n = (p.numel() + owners - 1) / owners * owners;
      padded += n;
      largest = std::max(largest, n);
    }
    const int64_t part = stage == 0 ? padded : padded / W;
    zero::InitOptions options;
    options.group = g_world;
    Case c{stage, 1, 0.0, optimizer_json("AdamW"), ""};
    auto engine = zero::initialize(zero::Config::from_json(config_json(c, 2, 1)), model, options);
    auto batch = global_batch(0, 2 * W);
    engine.backward(loss_of(model, batch.slice(0, 2 * g_world->rank(), 2 * g_world->rank() + 2)));
    for (auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined()) << "stage " << stage;
    engine.step();
    const auto m = engine.memory_report();
    EXPECT_EQ(m.params, 4 * padded) << "stage " << stage;
    EXPECT_EQ(m.fp32_master, 0) << "stage " << stage;
    EXPECT_EQ(m.optimizer_states, 8 * part) << "stage " << stage;
    // Stages 0-1 keep the whole gradient; stage 2 its partition plus the
    // bucket buffers in flight, each the size of the largest bucket: one,
    // plus one for each bucket that completes before the one that must be
    // reduced first (buckets are reduced in order; autograd may finish a
    // Linear's bias before its weight), never the whole gradient.
    if (stage <= 1) {
      EXPECT_EQ(m.gradients, 4 * padded) << "stage " << stage;
    } else {
      const int64_t staging = m.gradients - 4 * part;
      EXPECT_EQ(staging % (4 * largest), 0) << staging;
      EXPECT_GE(staging / (4 * largest), 1);
      EXPECT_LE(staging / (4 * largest), 3);
    }
  }
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
