// offload_optimizer in the engine, on 1 and 2 ranks (through zero-run):
// training with the optimizer on the host (fused SIMD kernels), all of it or
// a share (partial offload), reaches the same parameters as the same run
// without offload, at stages 1-3, fp32, bf16 and fp16 (elementwise: CPU
// LibTorch has no fp16 matmul), with accumulation and clipping.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <functional>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "partition/estimate.h"
#include "tests/offload/two_unit_mlp.h"
#include "zero/zero.h"

namespace {

std::shared_ptr<zero::comm::ProcessGroup> g_world;
// ZERO_OFFLOAD_HOST_GRAD_COPIES=1 (a second ctest entry): offloaded buckets'
// gradients are copied to host tensors as on an accelerator, and without
// accumulation they leave the gradient partition.
bool grad_copies() {
  const char* v = std::getenv("ZERO_OFFLOAD_HOST_GRAD_COPIES");
  return v && std::string(v) == "1";
}
// The offload mode of partial offload at `ratio` ("ratio 0.5"; see config_json).
std::string partial_mode(double ratio) {
  std::ostringstream mode;
  mode << "ratio " << ratio;
  return mode.str();
}
using zero_test::kHidden;
using zero_test::kIn;
using zero_test::kOut;
using Mlp = zero_test::TwoUnitMlp;

struct Case {
  int stage;
  std::string dtype;      // fp32 | bf16
  int64_t gas;
  double clip;
  std::string optimizer;  // JSON
  bool cuda = false;      // model and batches on the GPU
  int backwards = 1;      // per micro-step (more: gradients add up before the step)
};

// offload: "none", "cpu" or "nvme" (files under a folder in /tmp, sub-groups
// of 500 elements so that the step pipelines over several).
std::string nvme_dir() {
  static const std::string dir = [] {
    auto d = std::filesystem::temp_directory_path() / "zero_test_offload_nvme";
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

std::string config_json(const Case& c, const std::string& offload) {
  std::string json = R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000, "gradient_accumulation_steps": )" +
                     std::to_string(c.gas) + R"(, "gradient_clipping": )" + std::to_string(c.clip) +
                     R"(, "optimizer": )" + c.optimizer + R"(, "zero_optimization": {"stage": )" + std::to_string(c.stage) +
                     R"(, "reduce_bucket_size": 300, "stage3_param_persistence_threshold": 0)";
  if (offload == "cpu") json += R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true})";
  if (offload.rfind("ratio ", 0) == 0) {  // partial offload: "ratio 0.5" (+ " param_cpu", or " nvme" for the optimizer)
    const std::string ratio = offload.substr(6, offload.find(' ', 6) - 6);
    if (offload.find(" nvme") != std::string::npos) {
      json += R"(, "sub_group_size": 500, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme_dir() +
              R"(", "ratio": )" + ratio + "}";
    } else {
      json += R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true, "ratio": )" + ratio + "}";
    }
    if (offload.find(" param_cpu") != std::string::npos) json += R"(, "offload_param": {"device": "cpu"})";
  }
  if (offload == "param_cpu") json += R"(, "offload_param": {"device": "cpu"})";
  if (offload == "param_nvme" || offload == "all_nvme") {
    json += R"(, "offload_param": {"device": "nvme", "nvme_path": ")" + nvme_dir() + R"("})";
  }
  if (offload == "all_nvme") {
    json += R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme_dir() + R"("})";
  }
  if (offload == "nvme") {
    json += R"(, "sub_group_size": 500, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme_dir() + R"("})";
  }
  json += "}";
  if (offload.find("nvme") != std::string::npos) json += R"(, "aio": {"block_size": 8192, "queue_depth": 4})";
  if (c.dtype == "bf16") json += R"(, "bf16": {"enabled": true})";
  return json + "}";
}

std::map<std::string, torch::Tensor> train(const Case& c, const std::string& offload, zero::MemoryReport* report = nullptr) {
  torch::manual_seed(11);
  Mlp model;
  const at::Device device = c.cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  model->to(device);
  zero::InitOptions options;
  options.group = g_world;
  auto engine = zero::initialize(zero::Config::from_json(config_json(c, offload)), model, options);
  const auto dtype = c.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  for (int64_t k = 0; k < 5 * c.gas; ++k) {
    auto gen = at::detail::createCPUGenerator(77 + 10 * k + g_world->rank());
    auto x = torch::randn({4, kIn}, gen).to(device, dtype);
    auto y = torch::randint(0, kOut, {4}, gen).to(device);
    for (int b = 0; b < c.backwards; ++b) {
      auto loss = torch::nn::functional::cross_entropy(model->forward(x.roll(b, 0)).to(at::kFloat), y);
      engine.backward(loss);
    }
    engine.step();
  }
  if (report) *report = engine.memory_report();
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : engine.gathered_state_dict()) out[name] = t.to(at::kCPU, at::kFloat);
  return out;
}

// Bytes of this rank's shards of the two units' buckets: fc1 (kIn*kHidden
// + kHidden) and fc2 (kHidden*kHidden + kHidden) elements, each bucket
// padded to the world size (reduce_bucket_size 300 cuts them).
int64_t expected_unit_shard_bytes(const Case& c) {
  const int64_t W = g_world->size(), b = c.dtype == "bf16" ? 2 : 4;
  int64_t elements = 0;
  for (int64_t unit : {kIn * kHidden + kHidden, kHidden * kHidden + kHidden}) {
    // Reverse registration order (bias first), buckets of at most 300
    // elements; a larger parameter gets a bucket of its own.
    const int64_t bias = kHidden, weight = unit - kHidden;
    for (int64_t bucket : {bias, weight}) elements += (bucket + W - 1) / W;
  }
  return elements * b;
}

zero::MemoryReport expect_parity(const Case& c, const std::string& name, const std::string& offload = "cpu") {
  zero::MemoryReport report;
  const auto reference = train(c, "none");
  const auto offloaded = train(c, offload, &report);
  // fp32: the kernels agree with torch::optim to ~1e-7 per step; 16-bit:
  // a master weight that moved by that much may round to the next value.
  const double tolerance = c.dtype == "fp32" ? 1e-5 : 1e-2;
  for (const auto& [key, t] : reference) {
    const double scale = t.abs().max().item<double>() + 1e-12;
    const double err = (t - offloaded.at(key)).abs().max().item<double>() / scale;
    EXPECT_LT(err, tolerance) << name << ": " << key;
  }
  if (offload == "cpu") {
    EXPECT_GT(report.host_offloaded, 0) << name;
    EXPECT_EQ(report.host_offloaded, report.fp32_master + report.optimizer_states + report.offload_buffers) << name;
  } else if (offload == "nvme") {  // all on disk between steps; the host keeps the copies and gradients
    EXPECT_EQ(report.nvme_offloaded, report.fp32_master + report.optimizer_states) << name;
    EXPECT_EQ(report.host_offloaded, report.offload_buffers) << name;
  } else if (offload == "param_cpu") {  // the shards of the two units
    EXPECT_EQ(report.host_offloaded, expected_unit_shard_bytes(c)) << name;
  } else if (offload == "param_nvme") {
    EXPECT_EQ(report.nvme_offloaded, expected_unit_shard_bytes(c)) << name;
  } else if (offload == "all_nvme") {
    EXPECT_EQ(report.nvme_offloaded, expected_unit_shard_bytes(c) + report.fp32_master + report.optimizer_states) << name;
  }
  return report;
}

// zero-config --estimate's host and NVMe bytes against what the engine holds
// (memory_report) for the same model and config; exact but for the padding
// the engine adds per bucket (the estimate pads the whole model once). On
// CPU ranks the gradient shard already is in host memory and gets no second
// copy (accelerator = false).
void expect_estimate_matches(const Case& c, const std::string& offload, double ratio = 1.0) {
  zero::MemoryReport report;
  train(c, ratio < 1.0 ? partial_mode(ratio) : offload, &report);
  zero::EstimateInput in;
  in.params = kIn * kHidden + kHidden + kHidden * kHidden + kHidden + kHidden * kOut + kOut;
  in.world_size = g_world->size();
  in.stage = c.stage;
  in.dtype_bytes = c.dtype == "bf16" ? 2 : 4;
  in.mixed_precision = c.dtype == "bf16";
  in.state_bytes_per_element = 8;
  in.reduce_bucket_size = 300;
  in.offload_optimizer = *zero::offload_device_named(offload);
  in.offload_optimizer_ratio = ratio;
  in.sub_group_size = 500;
  in.accelerator = grad_copies();  // CPU ranks make the gradient copies only when asked; never staging buffers
  const zero::MemoryEstimate m = zero::estimate_memory(in);
  const int64_t staging = in.accelerator ? m.host.params : 0;
  const double slack = 0.02;  // per-bucket padding
  const std::string what = offload + " stage " + std::to_string(c.stage) + " " + c.dtype + " ratio " + std::to_string(ratio);
  if (offload == "cpu") {
    EXPECT_NEAR(report.host_offloaded, m.host.total() - staging, slack * m.host.total()) << what;
    EXPECT_EQ(m.nvme.total(), 0) << what;
    // What stays on the device: master weights and states of the rest.
    const int64_t device_kept = report.fp32_master + report.optimizer_states + report.offload_buffers - report.host_offloaded;
    const int64_t estimated = m.device.fp32_master + m.device.optimizer_states;
    EXPECT_NEAR(device_kept, estimated, slack * (m.device.fp32_master + m.host.fp32_master + m.device.optimizer_states + m.host.optimizer_states)) << what;
  } else {
    EXPECT_NEAR(report.nvme_offloaded, m.nvme.total(), slack * m.nvme.total()) << what;
    EXPECT_NEAR(report.offload_buffers, m.host.gradients, slack * m.host.gradients) << what;
    EXPECT_GT(report.nvme_host_peak, 0) << what;
    EXPECT_LE(report.nvme_host_peak, m.nvme.total()) << what;
  }
}

TEST(OffloadMemory, EstimateMatchesTheEngine) {
  expect_estimate_matches({2, "bf16", 1, 0.0, R"({"type": "AdamW", "params": {"lr": 0.01}})"}, "cpu");
  expect_estimate_matches({3, "bf16", 1, 0.0, R"({"type": "AdamW", "params": {"lr": 0.01}})"}, "cpu");
  expect_estimate_matches({3, "bf16", 1, 0.0, R"({"type": "AdamW", "params": {"lr": 0.01}})"}, "nvme");
}

const std::string kAdamW = R"({"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}})";
const std::string kAdamL2 = R"({"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.1, "adam_w_mode": false}})";
const std::string kAdagrad = R"({"type": "Adagrad", "params": {"lr": 0.05, "lr_decay": 0.01, "initial_accumulator_value": 0.1}})";

TEST(OffloadParity, Stage1AdamW) { expect_parity({1, "fp32", 1, 0.0, kAdamW}, "stage 1"); }
TEST(OffloadParity, Stage2AdamL2AccumulationClipping) { expect_parity({2, "fp32", 3, 0.5, kAdamL2}, "stage 2 L2"); }
TEST(OffloadParity, Stage3AdamW) { expect_parity({3, "fp32", 2, 0.0, kAdamW}, "stage 3"); }
TEST(OffloadParity, Stage2Bf16) { expect_parity({2, "bf16", 2, 1.0, kAdamW}, "stage 2 bf16"); }
TEST(OffloadParity, Stage3Bf16Adagrad) { expect_parity({3, "bf16", 1, 0.0, kAdagrad}, "stage 3 bf16 Adagrad"); }

TEST(OffloadParity, NvmeStage3AdamWAccumulationClipping) { expect_parity({3, "fp32", 2, 0.5, kAdamW}, "nvme stage 3", "nvme"); }
TEST(OffloadParity, NvmeStage3Bf16Adagrad) { expect_parity({3, "bf16", 1, 0.0, kAdagrad}, "nvme stage 3 bf16 Adagrad", "nvme"); }

TEST(OffloadParity, ParamCpuStage3) { expect_parity({3, "fp32", 2, 0.0, kAdamW}, "param cpu", "param_cpu"); }
TEST(OffloadParity, ParamNvmeStage3Bf16) { expect_parity({3, "bf16", 1, 0.5, kAdamW}, "param nvme bf16", "param_nvme"); }
TEST(OffloadParity, ParamAndOptimizerNvmeStage3) { expect_parity({3, "fp32", 2, 0.0, kAdamW}, "all nvme", "all_nvme"); }

// Partial offload (Note [Partial offload] in partition/master_store.h): whole
// buckets in flat order go to the host, the nearest split to the ratio. The
// model's buckets, in flat order (reverse registration, a parameter above
// reduce_bucket_size 300 alone): out.bias, out.weight, fc2.bias, fc2.weight,
// fc1.bias, fc1.weight; on 1 or 2 ranks ratio 0.3 offloads the first three,
// 0.5 the first four (e.g. 1 rank, 0.5 of 3050 elements: 450 + 1600 is
// nearer than 450). The host holds their master weights and states (on CPU
// ranks nothing else), the rest stays with the parameters.
int64_t first_buckets_shard_elements(int buckets) {
  const int64_t W = g_world->size();
  const int64_t numel[] = {kOut, kHidden * kOut, kHidden, kHidden * kHidden, kHidden, kIn * kHidden};
  int64_t elements = 0;
  for (int k = 0; k < buckets; ++k) elements += (numel[k] + W - 1) / W;
  return elements;
}

void expect_partial_parity(const Case& c, double ratio, int host_buckets, int64_t host_bytes_per_element) {
  const std::string name = "ratio " + std::to_string(ratio) + " stage " + std::to_string(c.stage) + " " + c.dtype;
  const zero::MemoryReport report = expect_parity(c, name, partial_mode(ratio));
  // CPU ranks: no staging buffers, and gradient copies only when asked for.
  const int64_t grad_bytes = c.dtype == "fp32" ? 4 : 2;
  const int64_t copies = grad_copies() ? grad_bytes * first_buckets_shard_elements(host_buckets) : 0;
  EXPECT_EQ(report.offload_buffers, copies) << name;
  EXPECT_EQ(report.host_offloaded, host_bytes_per_element * first_buckets_shard_elements(host_buckets) + copies) << name;
  // The buckets left on the device keep their master weights (16-bit
  // training) and states there.
  const int64_t device_elements = first_buckets_shard_elements(6) - first_buckets_shard_elements(host_buckets);
  const int64_t device_master = c.dtype == "fp32" ? 0 : 4 * device_elements;
  EXPECT_EQ(report.fp32_master + report.optimizer_states + report.offload_buffers - report.host_offloaded,
            device_master + (host_bytes_per_element - 4) * device_elements)
      << name;
  // With the copies the offloaded buckets' gradients leave the partition,
  // with accumulation too: it holds the device buckets' shards (and the
  // reduce buckets' buffers, whatever this ratio).
  if (grad_copies() && c.stage >= 2) {
    zero::MemoryReport kept;
    train(c, "ratio 0", &kept);
    const int64_t left = grad_bytes * first_buckets_shard_elements(host_buckets);
    EXPECT_EQ(kept.gradients - report.gradients, left) << name;
  }
}

TEST(PartialOffload, Stage1AdamWHalf) { expect_partial_parity({1, "fp32", 1, 0.0, kAdamW}, 0.5, 4, 12); }
TEST(PartialOffload, Stage2Bf16AccumulationClipping) { expect_partial_parity({2, "bf16", 2, 1.0, kAdamW}, 0.3, 3, 12); }
TEST(PartialOffload, Stage2AdamL2Clipping) { expect_partial_parity({2, "fp32", 3, 0.5, kAdamL2}, 0.5, 4, 12); }
TEST(PartialOffload, Stage2Bf16) { expect_partial_parity({2, "bf16", 1, 1.0, kAdamW}, 0.5, 4, 12); }
// Two backwards before a step (no accumulation configured): the second adds
// to the first, also in gradients that went to the host.
TEST(PartialOffload, Stage2TwoBackwardsBeforeAStep) {
  Case c{2, "fp32", 1, 0.5, kAdamL2};
  c.backwards = 2;
  expect_partial_parity(c, 0.5, 4, 12);
}
TEST(PartialOffload, Stage3Bf16Adagrad) { expect_partial_parity({3, "bf16", 1, 0.0, kAdagrad}, 0.5, 4, 8); }
// With offload_param too: the units' shards in host memory, the buckets
// kept "on the device" update their masters there and copy to those shards.
TEST(PartialOffload, Stage3WithParamOffload) {
  expect_parity({3, "bf16", 2, 0.5, kAdamW}, "ratio 0.5 param cpu", "ratio 0.5 param_cpu");
}
// NVMe: the offloaded share's master weights and states in files, stepped
// sub-group by sub-group; the rest updated with the parameters.
TEST(PartialOffload, NvmeStage3) {
  for (const Case& c : {Case{3, "fp32", 2, 0.5, kAdamW}, Case{3, "bf16", 1, 0.0, kAdagrad}}) {
    const zero::MemoryReport report = expect_parity(c, "ratio 0.5 nvme " + c.dtype, "ratio 0.5 nvme");
    const int64_t bytes_per_element = c.optimizer == kAdagrad ? 8 : 12;
    EXPECT_EQ(report.nvme_offloaded, bytes_per_element * first_buckets_shard_elements(4)) << c.dtype;
  }
}
TEST(PartialOffload, Stage3RatioZeroKeepsEverythingOnTheDevice) {
  expect_partial_parity({3, "fp32", 2, 0.5, kAdamW}, 0.0, 0, 12);
}
// The estimate's host and device shares at the ratio of the engine's split
// (the first four buckets), where the estimate's round(ratio * S) lands on it.
TEST(PartialOffload, EstimateMatchesTheEngine) {
  const double share = static_cast<double>(first_buckets_shard_elements(4)) / first_buckets_shard_elements(6);
  expect_estimate_matches({2, "bf16", 1, 0.0, R"({"type": "AdamW", "params": {"lr": 0.01}})"}, "cpu", share);
  expect_estimate_matches({3, "bf16", 1, 0.0, R"({"type": "AdamW", "params": {"lr": 0.01}})"}, "cpu", share);
}

// fp16 with an overflow on one rank, in each of the two parameters (each a
// bucket of its own) in turn: both runs skip the same two steps.
void fp16_parity(int stage, const std::string& offload_json, const at::Device device = at::kCPU) {
  constexpr int64_t kWidth = 37;
  auto run = [&](bool offload) {
    torch::manual_seed(3);
    struct Elementwise : torch::nn::Module {
      Elementwise() {
        w = register_parameter("w", torch::randn({kWidth}) * 0.1);
        v = register_parameter("v", torch::randn({kWidth}) * 0.1);
      }
      torch::Tensor w, v;
    };
    auto model = std::make_shared<Elementwise>();
    model->to(device);
    std::string json = R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "fp16": {"enabled": true, "initial_scale_power": 8},
      "zero_optimization": {"stage": )" + std::to_string(stage) + R"(, "reduce_bucket_size": 16, "sub_group_size": 20)";
    if (offload) json += offload_json;
    zero::InitOptions options;
    options.group = g_world;
    auto engine = zero::initialize(zero::Config::from_json(json + "}}"), model, options);
    for (int step = 0; step < 7; ++step) {
      auto gen = at::detail::createCPUGenerator(500 + step * 7 + g_world->rank());
      auto x = torch::randn({4, 2 * kWidth}, gen).to(at::kHalf);
      const bool last = g_world->rank() == g_world->size() - 1;
      if (step == 2 && last) x[0][0] = INFINITY;       // w's gradient
      if (step == 4 && last) x[1][kWidth] = INFINITY;  // v's gradient
      x = x.to(device);
      auto y = (x.slice(1, 0, kWidth) * model->w).sum(1) + (x.slice(1, kWidth) * model->v).sum(1);
      engine.backward((y.to(at::kFloat) - 1.0).pow(2).mean());
      engine.step();
    }
    EXPECT_EQ(engine.skipped_steps(), 2);
    return torch::cat({model->w.detach().to(at::kCPU, at::kFloat), model->v.detach().to(at::kCPU, at::kFloat)});
  };
  const auto a = run(false), b = run(true);
  EXPECT_LT((a - b).abs().max().item<double>(), 2e-3 * a.abs().max().item<double>());
}

TEST(OffloadParity, Fp16OverflowSkippingCpu) { fp16_parity(2, R"(, "offload_optimizer": {"device": "cpu"})"); }
TEST(OffloadParity, Fp16OverflowSkippingNvmeStage3) {
  fp16_parity(3, R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme_dir() + R"("})");
}
// Partial offload: v's bucket (first in flat order) on the host, w's where it is.
TEST(PartialOffload, Fp16OverflowSkipping) {
  fp16_parity(2, R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5})");
}

TEST(OffloadConfig, UnsupportedOptimizerIsAClearError) {
  Mlp model;
  zero::InitOptions options;
  options.group = g_world;
  try {
    zero::initialize(zero::Config::from_json(config_json({2, "fp32", 1, 0.0, R"({"type": "Lamb", "params": {"lr": 0.01}})"}, "cpu")),
                     model, options);
    FAIL() << "Lamb with offload_optimizer was accepted";
  } catch (const zero::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("Lamb"), std::string::npos) << e.what();
  }
}

// On a GPU (skipped elsewhere; bench/gpu/run_all.sh runs them at world
// size 1): offload's CUDA path (reduced gradients copied to pinned host
// memory as buckets finish, their norm summed on the GPU, updated shards
// back through the pinned staging buffers, asynchronously) reaches what the
// same run on the GPU without offload reaches.
// Note [A failed transfer in the step]: `fail` makes the step's writes fail
// (on every rank, or on rank 0 alone while the others succeed). Every rank
// raises, naming a file and what to do; the engine refuses to step, save or
// load; once `unfail` mends the disk, a new engine loads the last
// checkpoint, and the step taken again equals that of an engine whose disk
// had room all along.
void expect_a_failed_step_to_recover(const std::string& nvme, int steps_before, const std::function<void()>& fail,
                                     const std::function<void()>& unfail, const std::string& expected,
                                     bool super_offload = false, bool nvme_gradients = false) {
  const int rank = g_world->rank();
  const std::string ckpt = (std::filesystem::temp_directory_path() /
                            ("zero_test_failed_step_ckpt_" + std::to_string(::getppid()))).string();
  auto config_for = [&](const std::string& path) {
    return zero::Config::from_json(
        R"({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000000, "gradient_clipping": )" +
        std::string(super_offload ? "0" : "0.5") + R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zero_optimization": {"stage": 3, "reduce_bucket_size": 300, "stage3_param_persistence_threshold": 0,
              "sub_group_size": 500, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + path + R"(",
              "super_offload": )" + (super_offload ? "true" : "false") +
        R"(, "nvme_gradients": )" + (nvme_gradients ? "true" : "false") + R"(},
              "offload_param": {"device": "nvme", "nvme_path": ")" + path + R"("}},
            "aio": {"block_size": 8192, "queue_depth": 4}})");
  };
  auto gen = at::detail::createCPUGenerator(5 + rank);
  const at::Tensor x = torch::randn({4, kIn}, gen);
  const at::Tensor y = torch::randint(0, kOut, {4}, gen);
  auto one_step = [&](zero::Engine& engine, Mlp& model) {
    engine.backward(torch::nn::functional::cross_entropy(model->forward(x), y));
    engine.step();
  };
  zero::InitOptions options;
  options.group = g_world;

  // The reference: the checkpoint, then one step, with room on the disk.
  std::map<std::string, torch::Tensor> expected_state;
  {
    torch::manual_seed(11);
    Mlp model;
    auto engine = zero::initialize(config_for(nvme_dir()), model, options);
    for (int i = 0; i < steps_before; ++i) one_step(engine, model);
    engine.save_checkpoint(ckpt, "before");
    one_step(engine, model);
    for (auto& [name, t] : engine.gathered_state_dict()) expected_state[name] = t;
  }
  {
    torch::manual_seed(11);
    Mlp model;
    auto engine = zero::initialize(config_for(nvme), model, options);
    for (int i = 0; i < steps_before; ++i) one_step(engine, model);
    g_world->barrier();
    fail();
    std::string error;
    try {
      one_step(engine, model);
    } catch (const zero::Error& e) {
      error = e.what();
    }
    unfail();
    ASSERT_FALSE(error.empty()) << "rank " << rank << ": the step succeeded";
    EXPECT_NE(error.find(expected), std::string::npos) << error;
    EXPECT_NE(error.find("/zero_swap_rank0_"), std::string::npos) << "rank 0's file is not named: " << error;
    EXPECT_NE(error.find("did not complete on any rank"), std::string::npos) << error;
    for (const std::string call : {"step", "save", "load"}) {
      try {
        if (call == "step") {
          one_step(engine, model);
        } else if (call == "save") {
          engine.save_checkpoint(ckpt, "after");
        } else {
          engine.load_checkpoint(ckpt, "before");
        }
        ADD_FAILURE() << call << " went on after a failed step";
      } catch (const zero::EngineError& e) {
        EXPECT_NE(std::string(e.what()).find("create a new engine"), std::string::npos) << e.what();
      }
    }
    g_world->barrier();
  }
  torch::manual_seed(11);
  Mlp model;
  auto engine = zero::initialize(config_for(nvme), model, options);
  engine.load_checkpoint(ckpt, "before");
  one_step(engine, model);
  for (auto& [name, t] : engine.gathered_state_dict()) EXPECT_TRUE(torch::equal(t, expected_state.at(name))) << name;
  g_world->barrier();
  if (rank == 0) std::filesystem::remove_all(ckpt);
}

// The issue's case: nvme_path is a small tmpfs, filled up after initialize
// (every rank's writes fail with ENOSPC). Needs root to mount it.
TEST(OffloadErrors, ADiskThatFillsMidStepFailsTheStepOnEveryRank) {
  const int rank = g_world->rank();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("zero_test_full_disk_" + std::to_string(::getppid()))).string();
  at::Tensor unmounted = torch::zeros({1});
  std::string why;
  if (rank == 0) {
    std::filesystem::create_directories(path);
    if (::geteuid() != 0) {
      why = "not running as root, cannot mount a tmpfs";
    } else if (::mount("tmpfs", path.c_str(), "tmpfs", 0, "size=2m") != 0) {
      why = std::string("mount -t tmpfs failed: ") + std::strerror(errno);
    }
    if (!why.empty()) unmounted.fill_(1);
  }
  g_world->all_reduce(unmounted, zero::comm::ReduceOp::Max);
  if (unmounted.item<float>() > 0) {
    if (rank == 0) std::filesystem::remove_all(path);
    GTEST_SKIP() << (rank == 0 ? why : "rank 0 cannot mount a tmpfs");
  }
  const std::string filler = path + "/filler";
  auto fill_the_disk = [&] {
    if (rank == 0) {
      std::FILE* f = std::fopen(filler.c_str(), "wb");
      ASSERT_NE(f, nullptr);
      const std::vector<char> page(4096, 1);
      while (std::fwrite(page.data(), 1, page.size(), f) == page.size() && std::fflush(f) == 0) {
      }
      std::fclose(f);
    }
    g_world->barrier();
  };
  auto free_space = [&] {
    if (rank == 0) std::filesystem::remove(filler);
  };
  expect_a_failed_step_to_recover(path, 0, fill_the_disk, free_space, "no space left on ");
  // With the gradients on NVMe the backward's writes meet the full disk first.
  expect_a_failed_step_to_recover(path, 0, fill_the_disk, free_space, "no space left on ", false, /*nvme_gradients=*/true);
  g_world->barrier();
  if (rank == 0) {
    ::umount2(path.c_str(), MNT_DETACH);
    std::filesystem::remove_all(path);
  }
}

// One rank fails while the others write: rank 0's file-size limit (ulimit
// -f) drops to 0, so its writes fail with EFBIG; the others go through the
// step's collectives and meet its error at the end.
TEST(OffloadErrors, AWriteThatFailsOnOneRankFailsTheStepOnEveryRank) {
  const int rank = g_world->rank();
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  auto previous = std::signal(SIGXFSZ, SIG_IGN);  // the write reports EFBIG instead
  auto limit = [&] {
    if (rank != 0) return;
    rlimit none = before;
    none.rlim_cur = 0;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &none), 0);
  };
  auto unlimit = [&] { ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &before), 0); };
  expect_a_failed_step_to_recover(nvme_dir(), 1, limit, unlimit, "file too large: ");
  // Again with the update inside the backward (Note [Updates in backward]),
  // whose reductions go on beside the failed writes.
  expect_a_failed_step_to_recover(nvme_dir(), 1, limit, unlimit, "file too large: ", /*super_offload=*/true);
  // Again with the gradients on NVMe (Note [Gradients on NVMe]): their
  // writes in backward fail first, and the step fails with them.
  expect_a_failed_step_to_recover(nvme_dir(), 1, limit, unlimit, "file too large: ", false, /*nvme_gradients=*/true);
  std::signal(SIGXFSZ, previous);
}

bool one_rank_with_cuda() { return g_world->size() == 1 && torch::cuda::is_available(); }

TEST(Cuda, OffloadMatchesNoOffload) {
  if (!one_rank_with_cuda()) GTEST_SKIP() << "needs CUDA and one rank";
  for (const Case& c : {Case{1, "bf16", 2, 0.5, kAdamW, true}, Case{2, "bf16", 2, 0.5, kAdamW, true},
                        Case{3, "bf16", 1, 0.5, kAdagrad, true}, Case{2, "fp32", 2, 0.5, kAdamL2, true}}) {
    expect_parity(c, "cuda stage " + std::to_string(c.stage) + " " + c.dtype);
  }
  expect_parity(Case{3, "bf16", 2, 0.5, kAdamW, true}, "cuda param cpu", "param_cpu");
  fp16_parity(2, R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true})", at::Device(at::kCUDA, 0));
  // Partial offload: the buckets kept on the GPU are updated there while the host updates its share.
  expect_parity(Case{2, "bf16", 2, 0.5, kAdamW, true}, "cuda partial stage 2", "ratio 0.5");
  expect_parity(Case{3, "bf16", 1, 0.5, kAdagrad, true}, "cuda partial stage 3", "ratio 0.3");
  fp16_parity(2, R"(, "offload_optimizer": {"device": "cpu", "pin_memory": true, "ratio": 0.5})", at::Device(at::kCUDA, 0));
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
