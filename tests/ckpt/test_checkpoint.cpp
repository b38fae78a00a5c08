// Engine checkpoints on 1, 2 and 4 ranks (ctest runs this binary through
// zero-run): exact resume against the uninterrupted run, loading at another
// world size and stage against the saved fragments, and bad input.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "tests/ckpt/ckpt_test_support.h"
#include "zero/zero.h"

namespace {

namespace fs = std::filesystem;
std::shared_ptr<zero::comm::ProcessGroup> g_world;
std::string g_root;  // a folder every rank sees

constexpr int64_t kVocab = 16, kDim = 8, kHidden = 12, kSeq = 6, kMicro = 2;

struct HeadImpl : torch::nn::Module {
  explicit HeadImpl(torch::Tensor tied) { weight = register_parameter("weight", tied); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(Head);

struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    up = register_module("up", torch::nn::Linear(kDim, kHidden));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})));
    down = register_module("down", torch::nn::Linear(kHidden, kDim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + down(norm(torch::gelu(up(x)))); }
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Block);

// A tied weight (head = embedding), a frozen parameter, a buffer, dropout
// (the random generator must resume too) and a stage-3 unit.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t dim = kDim) {
    emb = register_module("emb", torch::nn::Embedding(kVocab, dim));
    block = register_module("block", zero::Unit<Block>(Block()));
    mix = register_module("mix", torch::nn::Linear(dim, dim));
    head = register_module("head", Head(emb->weight));
    shift = register_parameter("shift", torch::randn({dim}) * 0.1, /*requires_grad=*/false);
    gain = register_buffer("gain", torch::full({dim}, 1.5));
  }
  torch::Tensor forward(const torch::Tensor& tokens) {
    auto x = torch::dropout(emb(tokens) + shift, 0.2, is_training());
    x = torch::tanh(mix(block(x))) * gain;
    return head(x);
  }
  torch::nn::Embedding emb{nullptr};
  zero::Unit<Block> block{nullptr};
  torch::nn::Linear mix{nullptr};
  Head head{nullptr};
  torch::Tensor shift, gain;
};
TORCH_MODULE(Net);

Net make_net(uint64_t seed, int64_t dim = kDim) {
  torch::manual_seed(seed);
  return Net(dim);
}

struct RunSetup {
  int stage = 2;
  int64_t gas = 1;
  std::string dtype = "fp32";  // or "bf16"
  std::string optimizer = R"({"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}})";
  std::string scheduler;       // empty: none
  double clip = 0.0;
  std::string offload;         // e.g. R"(, "offload_optimizer": {"device": "cpu"})"
  at::Device device = at::kCPU;  // where the model trains
};

zero::Config config_of(const RunSetup& s) {
  std::string json = R"({"train_micro_batch_size_per_gpu": )" + std::to_string(kMicro) +
                     R"(, "gradient_accumulation_steps": )" + std::to_string(s.gas) +
                     R"(, "steps_per_print": 1000000, "optimizer": )" + s.optimizer +
                     R"(, "gradient_clipping": )" + std::to_string(s.clip) +
                     R"(, "zero_optimization": {"stage": )" + std::to_string(s.stage) +
                     R"(, "reduce_bucket_size": 40, "stage3_param_persistence_threshold": 0)" + s.offload + "}";
  if (s.dtype == "bf16") json += R"(, "bf16": {"enabled": true})";
  if (!s.scheduler.empty()) json += R"(, "scheduler": )" + s.scheduler;
  return zero::Config::from_json(json + "}");
}

zero::Engine make_engine(const RunSetup& s, Net& net, std::shared_ptr<zero::comm::ProcessGroup> group = g_world) {
  net->to(s.device);
  zero::InitOptions options;
  options.group = group;
  return zero::initialize(config_of(s), net, options);
}

// Global batch `step` is the same for any world size; rank r's micro-step m
// takes its rows ((m * W) + r) * micro.
torch::Tensor rows_for(int64_t step, int64_t micro_step, const zero::Engine& engine, zero::comm::ProcessGroup& group) {
  const int64_t gas = *engine.config().batch.gradient_accumulation_steps, W = group.size();
  auto gen = at::detail::createCPUGenerator(1000 + step);
  auto batch = torch::randint(0, kVocab, {W * kMicro * gas, kSeq + 1}, gen, torch::kLong);
  const int64_t first = (micro_step * W + group.rank()) * kMicro;
  return batch.slice(0, first, first + kMicro);
}

// Runs micro-steps [from, to) (micro-step k belongs to optimizer step k / gas)
// and returns the losses.
std::vector<float> train(zero::Engine& engine, Net& net, int64_t from, int64_t to, zero::comm::ProcessGroup& group) {
  const int64_t gas = *engine.config().batch.gradient_accumulation_steps;
  std::vector<float> losses;
  for (int64_t k = from; k < to; ++k) {
    auto rows = rows_for(k / gas, k % gas, engine, group).to(net->mix->weight.device());
    auto logits = net->forward(rows.slice(1, 0, kSeq));
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}).to(at::kFloat),
                                                     rows.slice(1, 1, kSeq + 1).reshape(-1));
    losses.push_back(loss.item<float>());
    engine.backward(loss);
    engine.step();
  }
  return losses;
}

std::map<std::string, torch::Tensor> weights(zero::Engine& engine) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : engine.gathered_state_dict()) out[name] = t;
  return out;
}

void expect_identical(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    EXPECT_TRUE(torch::equal(t, b.at(name))) << what << ": " << name << " differs by "
                                             << (t.to(at::kFloat) - b.at(name).to(at::kFloat)).abs().max().item<float>();
  }
}

std::string dir_for(const std::string& name) { return g_root + "/" + name; }

// K optimizer steps, save, K more; then fresh processes' state (another
// model init, another random seed) loads at K and runs the same K more.
void exact_resume(const RunSetup& s, const std::string& name, int64_t steps = 3, int64_t extra_micro = 0) {
  const std::string dir = dir_for(name);
  const int64_t save_at = steps * s.gas + extra_micro, end = 2 * steps * s.gas;
  Net a = make_net(1);
  auto ea = make_engine(s, a);
  torch::manual_seed(100 + g_world->rank());
  train(ea, a, 0, save_at, *g_world);
  ea.save_checkpoint(dir, "", R"({"epoch": 3, "position": 17})");
  const auto losses_a = train(ea, a, save_at, end, *g_world);
  const auto weights_a = weights(ea);

  Net b = make_net(2);
  auto eb = make_engine(s, b);
  torch::manual_seed(999);
  const std::string client = eb.load_checkpoint(dir);
  EXPECT_EQ(nlohmann::json::parse(client)["position"], 17) << name;
  EXPECT_EQ(eb.global_steps(), save_at / s.gas) << name;
  EXPECT_EQ(eb.micro_steps(), save_at) << name;
  const auto losses_b = train(eb, b, save_at, end, *g_world);
  ASSERT_EQ(losses_a.size(), losses_b.size());
  for (size_t i = 0; i < losses_a.size(); ++i) EXPECT_EQ(losses_a[i], losses_b[i]) << name << " loss " << i;
  EXPECT_EQ(ea.lr(), eb.lr()) << name;
  EXPECT_EQ(ea.global_steps(), eb.global_steps()) << name;
  expect_identical(weights_a, weights(eb), name);
}

TEST(ExactResume, Stage0WarmupLR) {
  RunSetup s;
  s.stage = 0;
  s.scheduler = R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.02, "warmup_num_steps": 4}})";
  exact_resume(s, "s0");
}
TEST(ExactResume, Stage1AdamL2WarmupDecayLRAccumulation) {
  RunSetup s;
  s.stage = 1;
  s.gas = 2;
  s.optimizer = R"({"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.1, "adam_w_mode": false}})";
  s.scheduler = R"({"type": "WarmupDecayLR", "params": {"warmup_max_lr": 0.02, "warmup_num_steps": 2, "total_num_steps": 10}})";
  exact_resume(s, "s1");
}
TEST(ExactResume, Stage2Bf16OneCycleClipping) {
  RunSetup s;
  s.dtype = "bf16";
  s.clip = 0.5;
  s.scheduler = R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.02, "cycle_first_step_size": 3}})";
  exact_resume(s, "s2");
}
TEST(ExactResume, Stage3WarmupCosineLRAccumulation) {
  RunSetup s;
  s.stage = 3;
  s.gas = 2;
  s.scheduler = R"({"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2, "total_num_steps": 10}})";
  exact_resume(s, "s3");
}
TEST(ExactResume, Stage3Bf16LambLRRangeTest) {
  RunSetup s;
  s.stage = 3;
  s.dtype = "bf16";
  s.optimizer = R"({"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.01}})";
  s.scheduler = R"({"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.001, "lr_range_test_step_size": 2}})";
  exact_resume(s, "s3lamb");
}
TEST(ExactResume, Stage2SgdMomentum) {
  RunSetup s;
  s.optimizer = R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}})";
  exact_resume(s, "s2sgd");
}
TEST(ExactResume, Stage1Adagrad) {
  RunSetup s;
  s.stage = 1;
  s.optimizer = R"({"type": "Adagrad", "params": {"lr": 0.05, "lr_decay": 0.01, "initial_accumulator_value": 0.1}})";
  exact_resume(s, "s1adagrad");
}
TEST(ExactResume, MidAccumulationStage1) {
  RunSetup s;
  s.stage = 1;
  s.gas = 3;
  exact_resume(s, "mid1", 2, /*extra_micro=*/1);
}
TEST(ExactResume, MidAccumulationStage3) {
  RunSetup s;
  s.stage = 3;
  s.gas = 3;
  exact_resume(s, "mid3", 2, /*extra_micro=*/2);
}

TEST(ExactResume, Stage2CpuOffloadBf16) {
  RunSetup s;
  s.dtype = "bf16";
  s.offload = R"(, "offload_optimizer": {"device": "cpu"})";
  exact_resume(s, "offload_cpu");
}
TEST(ExactResume, Stage3PartialOffloadBf16) {  // some buckets' states on the host, the others' with the parameters
  RunSetup s;
  s.stage = 3;
  s.dtype = "bf16";
  s.offload = R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5})";
  exact_resume(s, "offload_partial");
}
// While alive: offloaded gradients are copied to host tensors as an
// accelerator needs, here on CPU ranks (ZERO_OFFLOAD_HOST_GRAD_COPIES).
struct HostGradCopies {
  HostGradCopies() { setenv("ZERO_OFFLOAD_HOST_GRAD_COPIES", "1", 1); }
  ~HostGradCopies() { unsetenv("ZERO_OFFLOAD_HOST_GRAD_COPIES"); }
};

// With the gradient copies an accelerator makes (run here on CPU ranks):
// without accumulation the offloaded gradients leave the partition; with it,
// a mid-accumulation save holds the partition's sum.
TEST(ExactResume, CpuOffloadWithHostGradientCopies) {
  const HostGradCopies copies;
  RunSetup s;
  s.stage = 3;
  s.dtype = "bf16";
  s.offload = R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5})";
  exact_resume(s, "offload_copies");
  s.stage = 2;
  s.gas = 2;
  exact_resume(s, "offload_copies_mid", 2, /*extra_micro=*/1);
}
TEST(ExactResume, Stage3NvmeOffloadAccumulation) {
  RunSetup s;
  s.stage = 3;
  s.gas = 2;
  const std::string nvme = dir_for("nvme_swap");
  fs::create_directories(nvme);
  s.offload = R"(, "sub_group_size": 100, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme +
              R"("}, "offload_param": {"device": "nvme", "nvme_path": ")" + nvme + R"("})";
  exact_resume(s, "offload_nvme");
  // Partial: half the optimizer on NVMe, the rest with the parameters.
  s.offload = R"(, "sub_group_size": 100, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme +
              R"(", "ratio": 0.5})";
  exact_resume(s, "offload_nvme_partial");
}
// Saving a tag that exists replaces it (the old and the new one are swapped
// in one step): the load gets the new state, nothing is left in .saving.
TEST(Save, SameTagAgainReplacesIt) {
  RunSetup s;
  const std::string dir = dir_for("same_tag");
  Net a = make_net(1);
  auto ea = make_engine(s, a);
  train(ea, a, 0, 2, *g_world);
  ea.save_checkpoint(dir, "t");
  train(ea, a, 2, 4, *g_world);
  ea.save_checkpoint(dir, "t", R"({"second": true})");
  Net b = make_net(2);
  auto eb = make_engine(s, b);
  EXPECT_TRUE(nlohmann::json::parse(eb.load_checkpoint(dir, "t")).value("second", false));
  expect_identical(weights(ea), weights(eb), "the second save of tag t");
  g_world->barrier();
  if (fs::exists(dir + "/.saving")) {
    for (const auto& e : fs::directory_iterator(dir + "/.saving")) ADD_FAILURE() << "left behind: " << e.path();
  }
}

// Note [Concurrent saves]: a rank file of another save of the same tag, as
// a reader meets it when the tag is saved again while it reads, is refused
// by its save id, even by a reader that leaves the file's hash to another
// rank (the sizes agree: the same model saved twice).
TEST(Save, AFileOfAnotherSaveOfTheTagIsRefused) {
  RunSetup s;
  const std::string dir = dir_for("other_save");
  const std::string file0 = dir + "/t/" + zero::ckpt::rank_file_name(0), first = dir + "/first_save_rank0";
  Net a = make_net(1);
  auto ea = make_engine(s, a);
  train(ea, a, 0, 2, *g_world);
  ea.save_checkpoint(dir, "t");
  if (g_world->rank() == 0) fs::copy_file(file0, first);
  train(ea, a, 2, 4, *g_world);
  ea.save_checkpoint(dir, "t");
  g_world->barrier();
  if (g_world->rank() == 0) {
    const zero::ckpt::Manifest m = zero::ckpt::read_manifest(dir, "t");
    ASSERT_FALSE(m.save_id.empty());
    ASSERT_EQ(fs::file_size(first), fs::file_size(file0));
    fs::copy_file(first, file0, fs::copy_options::overwrite_existing);
    zero::ckpt::FragmentReader reader(dir, m);
    reader.verify_only({});  // no hash here: another rank's business
    auto trainable = std::find_if(m.params.begin(), m.params.end(), [](const auto& p) { return p.trainable; });
    ASSERT_NE(trainable, m.params.end());
    try {
      float x = 0;
      reader.read_f32("fp32", trainable->name, 0, 1, &x);
      ADD_FAILURE() << "a rank file of the first save was read under the second save's manifest";
    } catch (const zero::CheckpointError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("was written by save"), std::string::npos) << msg;
      EXPECT_NE(msg.find(m.save_id), std::string::npos) << msg;
    }
  }
  g_world->barrier();
}

// Note [Tag rule]: the engine's save refuses what every reader would
// (a newline, which `latest` could not hold, is new), before it writes
// anything, on every rank alike.
TEST(Save, RefusesATagNoReaderWouldAccept) {
  RunSetup s;
  const std::string dir = dir_for("bad_tags");
  Net a = make_net(1);
  auto ea = make_engine(s, a);
  train(ea, a, 0, 1, *g_world);
  for (const std::string tag : {"latest", ".saving", "a/b", "step\n1", "latest.tmp"}) {
    SCOPED_TRACE(tag);
    try {
      ea.save_checkpoint(dir, tag);
      ADD_FAILURE() << "saved";
    } catch (const zero::CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("invalid checkpoint tag"), std::string::npos) << e.what();
    }
  }
  g_world->barrier();
  EXPECT_FALSE(fs::exists(dir + "/latest")) << "nothing was saved";
  ea.save_checkpoint(dir, "global_step1");  // the engine still saves
  EXPECT_TRUE(fs::exists(dir + "/latest"));
}

// On a GPU (skipped elsewhere; bench/gpu/run_all.sh runs them at world size 1):
// a CUDA run resumes bit-exactly (dropout draws from the GPU's generator,
// saved as "rng/cuda"), and a checkpoint from CPU ranks loads on the GPU
// with the same weights.
bool one_rank_with_cuda() { return g_world->size() == 1 && torch::cuda::is_available(); }

TEST(Cuda, ExactResumeStage2AndStage3) {
  if (!one_rank_with_cuda()) GTEST_SKIP() << "needs CUDA and one rank";
  for (int stage : {2, 3}) {
    RunSetup s;
    s.stage = stage;
    s.device = at::Device(at::kCUDA, 0);
    exact_resume(s, "cuda_s" + std::to_string(stage));
  }
}

TEST(Cuda, CheckpointFromCpuLoadsOnTheGpu) {
  if (!one_rank_with_cuda()) GTEST_SKIP() << "needs CUDA and one rank";
  RunSetup cpu;
  Net a = make_net(1);
  auto ea = make_engine(cpu, a);
  train(ea, a, 0, 3, *g_world);
  ea.save_checkpoint(dir_for("cpu_to_cuda"), "t");
  RunSetup gpu;
  gpu.stage = 3;
  gpu.device = at::Device(at::kCUDA, 0);
  Net b = make_net(2);
  auto eb = make_engine(gpu, b);
  eb.load_checkpoint(dir_for("cpu_to_cuda"), "t");
  std::map<std::string, torch::Tensor> on_gpu;
  for (auto& [name, t] : weights(eb)) on_gpu[name] = t.cpu();
  expect_identical(weights(ea), on_gpu, "CPU checkpoint on the GPU");
  for (float loss : train(eb, b, 3, 5, *g_world)) EXPECT_TRUE(std::isfinite(loss));
}

// ZeRO-Infinity: a save and a load bring the NVMe-offloaded master weights
// and states into host memory a bucket at a time (the one in use, the next
// being read, the last being written back), as the optimizer step does with
// one bucket per sub-group, never the whole partition.
struct LayerImpl : torch::nn::Module {
  LayerImpl() { fc = register_module("fc", torch::nn::Linear(16, 16)); }
  torch::Tensor forward(const torch::Tensor& x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Layer);
struct ChainImpl : torch::nn::Module {
  ChainImpl() {
    for (int i = 0; i < 8; ++i) layers.push_back(register_module("layer" + std::to_string(i), zero::Unit<Layer>(Layer())));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& layer : layers) x = layer(x);
    return x;
  }
  std::vector<zero::Unit<Layer>> layers;
};
TORCH_MODULE(Chain);

TEST(NvmeOffload, CheckpointHoldsAFewBucketsInHostMemory) {
  const std::string nvme = dir_for("nvme_window_swap");
  fs::create_directories(nvme);
  const zero::Config config = zero::Config::from_json(
      R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000000, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 1,
          "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme + R"("}}})");
  torch::manual_seed(3);
  Chain chain;
  zero::InitOptions options;
  options.group = g_world;
  auto engine = zero::initialize(config, chain, options);
  for (int step = 0; step < 2; ++step) {
    auto loss = chain->forward(torch::randn({2, 16})).pow(2).mean();
    engine.backward(loss);
    engine.step();
  }
  const zero::MemoryReport after_steps = engine.memory_report();
  engine.save_checkpoint(dir_for("nvme_window"), "t");
  const zero::MemoryReport after_save = engine.memory_report();
  engine.load_checkpoint(dir_for("nvme_window"), "t");
  const zero::MemoryReport after_load = engine.memory_report();
  const int64_t total = after_load.nvme_offloaded;
  std::cout << "[nvme window] rank " << g_world->rank() << ": on NVMe " << total << " B; host peak after the steps "
            << after_steps.nvme_host_peak << ", after a save " << after_save.nvme_host_peak << ", after a load "
            << after_load.nvme_host_peak << " B\n";
  EXPECT_EQ(after_load.host_offloaded, after_load.offload_buffers) << "everything back on NVMe after the load";
  EXPECT_LE(after_steps.nvme_host_peak, total / 2) << "the step holds 3 of 8 buckets at most";
  EXPECT_EQ(after_save.nvme_host_peak, after_steps.nvme_host_peak) << "the save held more than the step";
  EXPECT_EQ(after_load.nvme_host_peak, after_steps.nvme_host_peak) << "the load held more than the step";
}

// fp16: LibTorch's CPU kernels lack fp16 matmul, so this model is
// element-wise. Overflows (an inf in one rank's input) before and after the
// save exercise the loss scaler's state.
struct ElementwiseImpl : torch::nn::Module {
  ElementwiseImpl() {
    w = register_parameter("w", torch::randn({37}) * 0.1);
    b = register_parameter("b", torch::zeros({37}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return (x * w + b).sum(1); }
  torch::Tensor w, b;
};
TORCH_MODULE(Elementwise);

std::vector<float> train_fp16(zero::Engine& engine, Elementwise& model, int64_t from, int64_t to) {
  std::vector<float> losses;
  for (int64_t step = from; step < to; ++step) {
    auto gen = at::detail::createCPUGenerator(500 + step * 7 + g_world->rank());
    auto x = torch::randn({4, 37}, gen).to(at::kHalf);
    if ((step == 1 || step == 5) && g_world->rank() == g_world->size() - 1) x[0][0] = INFINITY;
    auto loss = (model->forward(x).to(at::kFloat) - 1.0).pow(2).mean();
    losses.push_back(loss.item<float>());
    engine.backward(loss);
    engine.step();
  }
  return losses;
}

TEST(ExactResume, Fp16LossScalerState) {
  const std::string dir = dir_for("fp16");
  const auto config = zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 16},
    "fp16": {"enabled": true, "initial_scale_power": 8, "hysteresis": 2, "loss_scale_window": 3}})");
  zero::InitOptions options;
  options.group = g_world;
  torch::manual_seed(1);
  Elementwise a;
  auto ea = zero::initialize(config, a, options);
  train_fp16(ea, a, 0, 4);
  ea.save_checkpoint(dir);
  const auto losses_a = train_fp16(ea, a, 4, 9);
  torch::manual_seed(2);
  Elementwise b;
  auto eb = zero::initialize(config, b, options);
  eb.load_checkpoint(dir);
  const auto losses_b = train_fp16(eb, b, 4, 9);
  EXPECT_EQ(losses_a, losses_b);
  EXPECT_EQ(ea.skipped_steps(), 2);
  EXPECT_EQ(eb.skipped_steps(), ea.skipped_steps());
  EXPECT_EQ(eb.loss_scale(), ea.loss_scale());
  expect_identical(weights(ea), weights(eb), "fp16");
}

// Every fragment of two checkpoints (any layouts) holds the same values.
void expect_same_contents(const std::string& dir1, const std::string& dir2, const std::string& what) {
  const auto m1 = zero::ckpt::read_manifest(dir1, zero::ckpt::read_latest(dir1));
  const auto m2 = zero::ckpt::read_manifest(dir2, zero::ckpt::read_latest(dir2));
  zero::ckpt::FragmentReader r1(dir1, m1), r2(dir2, m2);
  ASSERT_EQ(m1.states, m2.states) << what;
  std::vector<std::string> kinds{"fp32"};
  kinds.insert(kinds.end(), m1.states.begin(), m1.states.end());
  int64_t compared = 0;
  for (const auto& p : m1.params) {
    if (!p.trainable) continue;
    int64_t n = 1;
    for (auto d : p.shape) n *= d;
    for (const auto& kind : kinds) {
      std::vector<float> x(n), y(n);
      r1.read_f32(kind, p.name, 0, n, x.data());
      r2.read_f32(kind, p.name, 0, n, y.data());
      EXPECT_EQ(0, std::memcmp(x.data(), y.data(), n * sizeof(float))) << what << ": " << kind << " of " << p.name;
      compared += n;
    }
  }
  EXPECT_GT(compared, 0);
  EXPECT_EQ(m1.engine["optimizer_steps"], m2.engine["optimizer_steps"]) << what;
  // Saved in the middle of an accumulation: each rank's gradients so far.
  for (int rank = 0; rank < m1.world_size; ++rank) {
    ASSERT_EQ(r1.has(rank, "accum/grads"), r2.has(rank, "accum/grads")) << what << ": rank " << rank;
    if (!r1.has(rank, "accum/grads")) continue;
    std::vector<uint8_t> s1, s2;
    const zero::ckpt::TensorData g1 = r1.read_whole(rank, "accum/grads", s1), g2 = r2.read_whole(rank, "accum/grads", s2);
    ASSERT_EQ(g1.bytes, g2.bytes) << what << ": accum/grads of rank " << rank;
    EXPECT_EQ(0, std::memcmp(g1.data, g2.data, g1.bytes)) << what << ": accum/grads of rank " << rank;
  }
}

// Saved by all W ranks at `from` stage; loaded by the first M ranks at `to`
// stage: the loaded state, saved again, equals the original exactly, and
// training continues like the original run (to rounding: the reduction
// order changes with the world size).
void reshard(int M, int from, int to, const std::string& name) {
  const int W = g_world->size(), R = g_world->rank();
  const std::string dir = dir_for(name), again = dir_for(name + "_again");
  RunSetup s;
  s.stage = from;
  s.gas = 2;
  Net a = make_net(1);
  auto ea = make_engine(s, a);
  torch::manual_seed(5);
  a->eval();  // no dropout: the continuation is compared across world sizes
  train(ea, a, 0, 6, *g_world);
  ea.save_checkpoint(dir);
  train(ea, a, 6, 10, *g_world);
  const auto weights_a = weights(ea);

  std::vector<int> members;
  for (int r = 0; r < M; ++r) members.push_back(r);
  auto group = g_world->new_group(members);
  if (R < M) {
    RunSetup t = s;
    t.stage = to;
    t.gas = s.gas * W / M;  // the same global batch
    Net b = make_net(2);
    b->eval();
    auto eb = make_engine(t, b, group);
    eb.load_checkpoint(dir);
    EXPECT_EQ(eb.global_steps(), 3) << name;
    eb.save_checkpoint(again);
    expect_same_contents(dir, again, name);
    // Continue: micro-steps of the new layout for optimizer steps 3 and 4.
    train(eb, b, 3 * t.gas, 5 * t.gas, *group);
    const auto weights_b = weights(eb);
    for (const auto& [key, tensor] : weights_a) {
      const double err = (tensor - weights_b.at(key)).abs().max().item<double>();
      EXPECT_LT(err, 1e-5) << name << ": " << key;
    }
  }
  g_world->barrier();
}

// A checkpoint saved with offload `from` loads with offload `to` and saves
// the same contents again (checkpoints are in model space whatever is offloaded).
void save_load_save(int stage, const std::string& from, const std::string& to, const std::string& name, int64_t gas = 1) {
  RunSetup s;
  s.stage = stage;
  s.gas = gas;
  s.offload = from;
  const std::string dir = dir_for(name), again = dir_for(name + "_again");
  Net a = make_net(1);
  auto ea = make_engine(s, a);
  train(ea, a, 0, 3, *g_world);  // with gas 2: in the middle of an accumulation
  ea.save_checkpoint(dir);
  RunSetup t = s;
  t.offload = to;
  Net b = make_net(2);
  auto eb = make_engine(t, b);
  eb.load_checkpoint(dir);
  eb.save_checkpoint(again);
  expect_same_contents(dir, again, name);
}

TEST(Reshard, OffloadToNone) { save_load_save(3, R"(, "offload_optimizer": {"device": "cpu"})", "", "offload_none"); }
TEST(Reshard, PartialOffloadToFullOffload) {
  save_load_save(2, R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.4})",
                 R"(, "offload_optimizer": {"device": "cpu"})", "partial_full");
}
// The gradients summed so far are saved in the same layout whether some of
// them were in host copies (an accelerator's offload, forced here on CPU
// ranks) or all in the partition: each loads into the other.
TEST(Reshard, MidAccumulationGradientsWithAndWithoutHostCopies) {
  const HostGradCopies copies;
  for (int stage : {2, 3}) {
    const std::string tag = "mid_copies" + std::to_string(stage);
    save_load_save(stage, R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5})", "", tag + "_none", 2);
    save_load_save(stage, "", R"(, "offload_optimizer": {"device": "cpu"})", tag + "_all", 2);
  }
}

TEST(Reshard, Stage2ToStage3SameRanks) { reshard(g_world->size(), 2, 3, "r23"); }
TEST(Reshard, Stage3ToStage0SameRanks) { reshard(g_world->size(), 3, 0, "r30"); }
TEST(Reshard, ToHalfTheRanksStage1To3) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  reshard(g_world->size() / 2, 1, 3, "rhalf");
}
TEST(Reshard, ToOneRankStage2To2) {
  if (g_world->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  reshard(1, 2, 2, "rone");
}

// A checkpoint to break: saved by this world at stage 2.
std::string saved_checkpoint(const std::string& name, RunSetup s = {}) {
  const std::string dir = dir_for(name);
  Net a = make_net(1);
  auto ea = make_engine(s, a);
  train(ea, a, 0, 2, *g_world);
  ea.save_checkpoint(dir);
  return dir;
}

template <typename F>
std::string load_error(const std::string& dir, F&& prepare_on_rank0, Net net = make_net(3)) {
  if (g_world->rank() == 0) prepare_on_rank0();
  g_world->barrier();
  auto engine = make_engine({}, net);
  std::string message;
  try {
    engine.load_checkpoint(dir);
  } catch (const zero::CheckpointError& e) {
    message = e.what();
  }
  g_world->barrier();
  return message;
}

std::string rank0_file(const std::string& dir) {
  return dir + "/" + zero::ckpt::read_latest(dir) + "/" + zero::ckpt::rank_file_name(0);
}

// Rewrites the manifest of `tag` (default: the latest) in `dir` through `edit`.
void edit_manifest(const std::string& dir, const std::function<void(nlohmann::json&)>& edit, std::string tag = "") {
  const std::string path = dir + "/" + (tag.empty() ? zero::ckpt::read_latest(dir) : tag) + "/manifest.json";
  nlohmann::json j;
  std::ifstream(path) >> j;
  edit(j);
  std::ofstream(path) << j.dump();
}

TEST(BadInput, CorruptedShardFailsItsChecksum) {
  const std::string dir = saved_checkpoint("corrupt");
  const std::string msg = load_error(dir, [&] {
    std::fstream f(rank0_file(dir), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-4, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-4, std::ios::end);
    c ^= 0x5a;
    f.write(&c, 1);
  });
  EXPECT_NE(msg.find("rank00000.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
}

TEST(BadInput, TruncatedShard) {
  const std::string dir = saved_checkpoint("truncated");
  const std::string msg = load_error(dir, [&] { fs::resize_file(rank0_file(dir), fs::file_size(rank0_file(dir)) / 2); });
  EXPECT_NE(msg.find("rank00000.safetensors"), std::string::npos) << msg;
}

TEST(BadInput, UnknownFormatVersion) {
  const std::string dir = saved_checkpoint("version");
  const std::string msg = load_error(dir, [&] { edit_manifest(dir, [](nlohmann::json& j) { j["version"] = 99; }); });
  EXPECT_NE(msg.find("99"), std::string::npos) << msg;
}

TEST(BadInput, AnotherModelListsTheDifferences) {
  const std::string dir = saved_checkpoint("othermodel");
  const std::string msg = load_error(dir, [] {}, make_net(3, kDim + 2));
  EXPECT_NE(msg.find("shapes differ"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mix.weight"), std::string::npos) << msg;
}

// A file whose frozen parameter or buffer holds fewer elements than the
// model's (its manifest rewritten to match a bigger model): a clear error
// naming the tensor, not a read past the end of the file's tensor.
TEST(BadInput, AShortFrozenParameterOrBufferIsRefused) {
  for (const std::string name : {"shift", "gain"}) {
    const std::string dir = saved_checkpoint("short_" + name);
    Net net = make_net(3);
    {
      torch::NoGradGuard no_grad;
      (name == "shift" ? net->shift : net->gain).set_data(torch::zeros({4 * kDim}));
    }
    const std::string msg = load_error(
        dir,
        [&] {
          edit_manifest(dir, [&](nlohmann::json& j) {
            for (auto& p : j["params"]) {
              if (p["name"] == name) p["shape"] = {4 * kDim};
            }
          });
        },
        net);
    // The frozen parameter by the listing its file records (before: by the
    // tensor's size); the buffer, which the listing leaves out, by its size.
    EXPECT_NE(msg.find(name == "shift" ? "\"shift\" has shape [" + std::to_string(kDim) + "] in the files, [" +
                                                     std::to_string(4 * kDim) + "] in the manifest"
                                               : std::string("\"module/gain\"")),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(std::to_string(4 * kDim)), std::string::npos) << msg;
  }
}

// The folder a manifest is in is the checkpoint: a renamed folder loads,
// and the manifest's own tag (here pointing elsewhere) reads nothing.
TEST(BadInput, TheFolderIsTheCheckpointWhateverTheManifestsTagSays) {
  const std::string dir = dir_for("renamed");
  Net a = make_net(1);
  auto ea = make_engine({}, a);
  train(ea, a, 0, 2, *g_world);
  ea.save_checkpoint(dir);
  const auto saved = weights(ea);
  if (g_world->rank() == 0) {
    fs::rename(dir + "/global_step2", dir + "/moved");
    edit_manifest(dir, [](nlohmann::json& j) { j["tag"] = "../../elsewhere/global_step2"; }, "moved");
  }
  g_world->barrier();
  Net b = make_net(2);
  auto eb = make_engine({}, b);
  eb.load_checkpoint(dir, "moved");
  expect_identical(saved, weights(eb), "renamed folder");
}

// The engine's record with a field of the wrong type or out of range: a
// CheckpointError naming the key (not a JSON exception, not a negative step).
TEST(BadInput, AWrongTypedOrAbsurdEngineFieldIsNamed) {
  const std::string dir = saved_checkpoint("enginefields");
  const std::string path = dir + "/" + zero::ckpt::read_latest(dir) + "/manifest.json";
  nlohmann::json original;
  std::ifstream(path) >> original;
  g_world->barrier();
  const std::vector<std::pair<std::string, nlohmann::json>> edits = {
      {"global_steps", "two"}, {"global_steps", 1e30}, {"micro_steps", -3}, {"lr", "fast"}, {"next_lr", -1.0},
      {"mid_accumulation", 1}, {"skipped_steps", 5}};
  for (const auto& [key, value] : edits) {
    const std::string msg = load_error(dir, [&, key = key, value = value] {
      nlohmann::json j = original;
      j["engine"][key] = value;
      std::ofstream(path) << j.dump();
    });
    EXPECT_NE(msg.find("\"engine\"." + key), std::string::npos) << key << " = " << value.dump() << ": " << msg;
  }
  const std::string msg = load_error(dir, [&] {
    nlohmann::json j = original;
    j["engine"] = 7;
    std::ofstream(path) << j.dump();
  });
  EXPECT_NE(msg.find("\"engine\" is 7"), std::string::npos) << msg;
}

TEST(BadInput, MissingLatest) {
  const std::string dir = saved_checkpoint("nolatest");
  const std::string msg = load_error(dir, [&] { fs::remove(dir + "/latest"); });
  EXPECT_NE(msg.find("latest"), std::string::npos) << msg;
  EXPECT_NE(msg.find("global_step2"), std::string::npos) << msg;  // the tag that is there
}

TEST(BadInput, ReshardingMidAccumulationIsRefused) {
  RunSetup s;
  s.gas = 2;
  const std::string dir = dir_for("midrefused");
  {
    Net a = make_net(1);
    auto ea = make_engine(s, a);
    train(ea, a, 0, 3, *g_world);
    ea.save_checkpoint(dir);
  }
  RunSetup t = s;
  t.stage = 3;
  Net b = make_net(2);
  auto eb = make_engine(t, b);
  try {
    eb.load_checkpoint(dir);
    FAIL() << "loaded a mid-accumulation checkpoint at another stage";
  } catch (const zero::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("accumulation"), std::string::npos) << e.what();
  }
}

// The last rank's writes fail (a file-size limit: EFBIG, as a full disk
// would); every rank gets an error, `latest` and the previous checkpoint
// stay, nothing half-written remains.
TEST(BadInput, FailedWriteKeepsThePreviousCheckpoint) {
  const std::string dir = dir_for("diskfull");
  Net a = make_net(1);
  auto ea = make_engine({}, a);
  train(ea, a, 0, 2, *g_world);
  ea.save_checkpoint(dir);
  const auto before = weights(ea);
  train(ea, a, 2, 4, *g_world);
  const bool limited = g_world->rank() == g_world->size() - 1;
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  if (limited) {
    rlimit small = old;
    small.rlim_cur = 512;
    setrlimit(RLIMIT_FSIZE, &small);
  }
  std::string message;
  try {
    ea.save_checkpoint(dir);
  } catch (const zero::CheckpointError& e) {
    message = e.what();
  }
  if (limited) setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(message.empty()) << "the save did not fail";
  if (limited) EXPECT_NE(message.find(".safetensors"), std::string::npos) << message;
  EXPECT_EQ(zero::ckpt::read_latest(dir), "global_step2");
  EXPECT_FALSE(fs::exists(dir + "/global_step4"));
  EXPECT_FALSE(fs::exists(dir + "/.saving")) << "a failed save left its staging folder";
  g_world->barrier();
  Net b = make_net(2);
  auto eb = make_engine({}, b);
  eb.load_checkpoint(dir);
  expect_identical(before, weights(eb), "previous checkpoint");
}

// A fragment rewritten as F16, the manifest's size and checksum fixed to
// match (so that only a dtype check finds it): load_checkpoint and
// fp32_state_dict_from_checkpoint refuse it naming the fragment, the file
// and both dtypes. It loaded, converted to fp32, before.
TEST(BadInput, AFragmentRewrittenInAnotherDtypeIsRefused) {
  const std::string dir = saved_checkpoint("f16fragment");
  const std::string file = rank0_file(dir);
  std::string fragment;
  {
    const zero::ckpt::SafetensorsFile f(file);
    for (const auto& [name, entry] : f.entries()) {
      if (name.rfind("fp32/", 0) == 0) fragment = name;
    }
  }
  ASSERT_FALSE(fragment.empty()) << "rank 0 holds master weights";
  const std::string msg = load_error(dir, [&] {
    const zero::ckpt::FileInfo info = ckpt_test::rewrite_as_f16(file, fragment);
    edit_manifest(dir, [&](nlohmann::json& j) {
      j["files"][0]["bytes"] = info.bytes;
      j["files"][0]["xxh3"] = info.xxh3;
    });
  });
  const std::string expected = "fragment \"" + fragment + "\" in " + file + " is F16, not F32";
  EXPECT_NE(msg.find(expected), std::string::npos) << msg;
  if (g_world->rank() == 0) {
    const std::string e = ckpt_test::error_of([&] { zero::fp32_state_dict_from_checkpoint(dir); });
    EXPECT_NE(e.find(expected), std::string::npos) << e;
  }
  g_world->barrier();
}

// fp32_state_dict_from_checkpoint checks the manifest against the
// parameters rank 0's file was saved with, as load_checkpoint checks it
// against the model: a transposed shape or a removed parameter is named
// (they were read as the manifest said).
TEST(BadInput, AManifestEditedAfterTheSaveIsRefusedWithoutAModel) {
  const std::string dir = saved_checkpoint("editedmanifest");
  const std::string path = dir + "/" + zero::ckpt::read_latest(dir) + "/manifest.json";
  nlohmann::json original;
  std::ifstream(path) >> original;
  g_world->barrier();
  if (g_world->rank() == 0) {
    const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> edits = {
        {[](nlohmann::json& j) {
           for (auto& p : j["params"]) {
             if (p["name"] == "emb.weight") p["shape"] = {kDim, kVocab};
           }
         },
         "\"emb.weight\" has shape [16,8] in the files, [8,16] in the manifest"},
        {[](nlohmann::json& j) {
           auto& params = j["params"];
           for (size_t i = 0; i < params.size(); ++i) {
             if (params[i]["name"] == "mix.bias") params.erase(i);
           }
         },
         "\"mix.bias\" is in the files, not in the manifest"},
    };
    for (const auto& [edit, expected] : edits) {
      nlohmann::json j = original;
      edit(j);
      std::ofstream(path) << j.dump();
      const std::string e = ckpt_test::error_of([&] { zero::fp32_state_dict_from_checkpoint(dir); });
      EXPECT_NE(e.find(expected), std::string::npos) << e;
    }
    std::ofstream(path) << original.dump();
    EXPECT_EQ(zero::fp32_state_dict_from_checkpoint(dir).size(), original["params"].size() + original["buffers"].size());
  }
  g_world->barrier();
}

// Master weights that are NaN (training diverged; here one element set
// through gather_parameters with a modifier rank) are refused at save on
// every rank, naming the parameter and the element, before anything
// replaces the checkpoint saved under the same tag. SaveOptions and
// LoadOptions::allow_non_finite keep and load them on purpose. The save
// succeeded without a word before.
TEST(NonFinite, NaNMasterWeightsAreRefusedAtSaveAndKeepWhatWasSaved) {
  const std::string dir = dir_for("nonfinite");
  Net a = make_net(1);
  auto ea = make_engine({}, a);
  train(ea, a, 0, 2, *g_world);
  ea.save_checkpoint(dir);  // global_step2
  const auto saved = weights(ea);
  {
    auto scope = ea.gather_parameters(*a->mix, 0);
    torch::NoGradGuard no_grad;
    a->mix->weight[1][2] = std::numeric_limits<float>::quiet_NaN();
  }
  const std::string expected = "the master weights of parameter mix.weight hold nan at element " + std::to_string(kDim + 2);
  const std::string error = ckpt_test::error_of([&] { ea.save_checkpoint(dir); });  // global_step2 again
  EXPECT_NE(error.find("save_checkpoint: " + expected), std::string::npos) << error;
  EXPECT_EQ(zero::ckpt::read_latest(dir), "global_step2");
  EXPECT_FALSE(fs::exists(dir + "/.saving")) << "a refused save left its staging folder";
  {
    Net b = make_net(2);
    auto eb = make_engine({}, b);
    eb.load_checkpoint(dir);
    expect_identical(saved, weights(eb), "the checkpoint saved before under the same tag");
  }
  zero::SaveOptions keep;
  keep.allow_non_finite = true;
  ea.save_checkpoint(dir, "diverged", "{}", keep);
  Net c = make_net(2);
  auto ec = make_engine({}, c);
  const std::string load = ckpt_test::error_of([&] { ec.load_checkpoint(dir, "diverged"); });
  EXPECT_NE(load.find("load_checkpoint: " + expected), std::string::npos) << load;
  zero::LoadOptions look;
  look.allow_non_finite = true;
  ec.load_checkpoint(dir, "diverged", look);
  EXPECT_TRUE(std::isnan(weights(ec).at("mix.weight")[1][2].item<float>()));
}

TEST(Options, ModuleOnlyAndFreshOptimizer) {
  const std::string dir = saved_checkpoint("options");
  Net a = make_net(1);
  auto ea = make_engine({}, a);
  train(ea, a, 0, 2, *g_world);
  {
    Net b = make_net(2);
    auto eb = make_engine({}, b);
    zero::LoadOptions o;
    o.load_module_only = true;
    eb.load_checkpoint(dir, "", o);
    expect_identical(weights(ea), weights(eb), "module only");
    EXPECT_EQ(eb.global_steps(), 0);
    EXPECT_EQ(eb.memory_report().optimizer_states, 0);  // Adam's moments come with the first step
  }
  {
    Net b = make_net(2);
    auto eb = make_engine({}, b);
    zero::LoadOptions o;
    o.load_optimizer_states = false;
    eb.load_checkpoint(dir, "", o);
    EXPECT_EQ(eb.global_steps(), 2);
    EXPECT_EQ(eb.memory_report().optimizer_states, 0);
  }
}

// zero-ckpt consolidate's fp32 weights are the engine's gathered weights.
TEST(Consolidate, EqualsTheGatheredWeights) {
  RunSetup s;
  s.stage = 3;
  const std::string dir = dir_for("consolidate");
  Net a = make_net(1);
  auto ea = make_engine(s, a);
  train(ea, a, 0, 3, *g_world);
  ea.save_checkpoint(dir);
  const auto gathered = weights(ea);
  if (g_world->rank() == 0) {
    const std::string out = dir + "/full.safetensors";
    zero::ckpt::consolidate(dir, zero::ckpt::read_latest(dir), out);
    zero::ckpt::SafetensorsFile file(out);
    for (const auto& [name, t] : gathered) {
      if (name == "head.weight") continue;  // tied: stored once, as emb.weight
      ASSERT_TRUE(file.entries().count(name)) << name;
      const auto& e = file.entries().at(name);
      at::Tensor values = torch::empty(t.sizes(), at::kFloat);
      file.read(name, 0, e.end - e.begin, values.data_ptr());
      EXPECT_TRUE(torch::equal(values, t.to(at::kFloat))) << name;
    }
  }
  g_world->barrier();
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_world = zero::comm::init_process_group();
  // Rank 0 picks a fresh folder and tells the others.
  at::Tensor name = torch::zeros({256}, at::kByte);
  if (g_world->rank() == 0) {
    std::string dir = (fs::temp_directory_path() / "zero_test_ckpt_XXXXXX").string();
    if (!mkdtemp(dir.data())) return 1;
    std::memcpy(name.data_ptr(), dir.data(), dir.size());
  }
  g_world->broadcast(name, 0);
  g_root = reinterpret_cast<const char*>(name.data_ptr());
  const int rc = RUN_ALL_TESTS();
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(g_root);
  g_world.reset();
  return rc;
}
