// The offload headline: a GPT-style model whose mixed-precision training
// state is larger than the accelerator's memory trains with
// offload_optimizer "cpu", while the same model without offload runs out of
// memory. One configuration per process (the allocator's peak is a
// per-process figure); bench/gpu/run_all.sh runs them and FSDP2's
// offload on the same model and batch (bench/gpu/torch_reference.py).
//
//   bench_offload_headline --device cuda --cap-gb 80 --offload cpu [--ratio 0.6]
//       --depth 32 --width 4096 --heads 32 --context 1024 --micro 2
//
// --offload none|cpu|cpu+param|nvme|nvme+param (nvme needs --nvme-path);
// --stage 0-3 (2 by default). With --offload none it is also the GPU's
// step-time row at each stage (bench/gpu/run_all.sh). The result names the
// device and its dense peak (profile/device_peak.h) for the MFU.
//
// On CUDA, --cap-gb caps the caching allocator (setMemoryFraction) as if
// the GPU had that much memory. The data is random tokens (the step's cost
// does not depend on them). Per step: wall time of forward + backward +
// step on the slowest rank (synchronised), median over --steps after
// --warmup; the split is engine.take_step_times() over the measured steps.
// Prints one JSON line ("result": ...) and appends it to --out when given.
// Running out of memory is a result ("oom": true, with the phase), not an
// error. On CPU (--device cpu, small sizes) the same code runs as a check
// that the program works; the figures then mean little.
#include <torch/torch.h>
#if ZERO_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "activations/activation_memory.h"  // the CUDA allocator's peak, in libzero
#include "profile/device_peak.h"                // the device's dense peak, for the MFU
#include "zero/zero.h"

using namespace zero_examples;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void synchronize(const at::Device& device) {
#if ZERO_TORCH_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
  (void)device;
}

// Caps the CUDA caching allocator at `bytes`; returns the device's total memory.
int64_t cap_device_memory(const at::Device& device, double bytes) {
#if ZERO_TORCH_CUDA
  if (device.is_cuda()) {
    const int64_t total = static_cast<int64_t>(at::cuda::getDeviceProperties(device.index())->totalGlobalMem);
    if (bytes > 0) c10::cuda::CUDACachingAllocator::setMemoryFraction(std::min(1.0, bytes / total), device.index());
    return total;
  }
#endif
  (void)device;
  (void)bytes;
  return -1;
}

bool is_out_of_memory(const std::exception& e) {
  const std::string what = e.what();
  return what.find("out of memory") != std::string::npos || what.find("Out of memory") != std::string::npos ||
         what.find("out of host memory") != std::string::npos;
}

std::string ds_config(const zero_bench::Flags& flags) {
  json z = {{"stage", flags.num("stage")},
            {"overlap_comm", true},
            {"contiguous_gradients", true},
            {"reduce_bucket_size", flags.num("bucket")},
            {"sub_group_size", flags.num("bucket")}};
  const std::string offload = flags.str("offload");  // none | cpu | cpu+param | nvme | nvme+param
  const bool nvme = offload.rfind("nvme", 0) == 0;
  if (offload != "none" && offload != "cpu" && offload != "cpu+param" && !nvme) {
    throw std::invalid_argument("--offload must be none, cpu, cpu+param, nvme or nvme+param; got '" + offload + "'");
  }
  if (nvme && flags.str("nvme-path").empty()) throw std::invalid_argument("--offload " + offload + " needs --nvme-path DIR");
  if (offload != "none") {
    // --ratio below 1: partial offload, the rest of the optimizer on the device.
    z["offload_optimizer"] = {{"device", nvme ? "nvme" : "cpu"}, {"pin_memory", true}, {"ratio", std::stod(flags.str("ratio"))}};
    if (nvme) z["offload_optimizer"]["nvme_path"] = flags.str("nvme-path");
  }
  if (offload == "cpu+param") z["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (offload == "nvme+param") z["offload_param"] = {{"device", "nvme"}, {"pin_memory", true}, {"nvme_path", flags.str("nvme-path")}};
  json c = {{"train_micro_batch_size_per_gpu", flags.num("micro")},
            {"gradient_accumulation_steps", 1},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}, {"betas", {0.9, 0.95}}, {"weight_decay", 0.01}}}}},
            {"gradient_clipping", 1.0},
            {"bf16", {{"enabled", flags.str("dtype") == "bf16"}}},
            {"steps_per_print", 1000000000},
            {"zero_optimization", z}};
  if (nvme) c["aio"] = {{"block_size", 1048576}, {"queue_depth", 8}};
  return c.dump();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const zero_bench::Flags flags(argc, argv,
                                  {{"device", "auto"}, {"cap-gb", "0"}, {"offload", "cpu"}, {"ratio", "1"}, {"stage", "2"},
                                   {"dtype", "bf16"}, {"depth", "4"}, {"width", "256"}, {"heads", "4"},
                                   {"context", "128"}, {"vocab", "50304"}, {"micro", "2"}, {"steps", "4"},
                                   {"warmup", "1"}, {"bucket", "500000000"}, {"nvme-path", ""}, {"out", ""}});
    auto world = zero::comm::init_process_group();
    const int rank = world->rank(), N = world->size();
    const at::Device device = zero_bench::bench_device(flags.str("device"));
    if (device.is_cpu()) at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / N));
    const double cap = static_cast<double>(flags.num("cap-gb")) * 1e9;
    const int64_t device_total = cap_device_memory(device, cap);

    GPTOptions options;
    options.vocab_size = flags.num("vocab");
    options.depth = flags.num("depth");
    options.width = flags.num("width");
    options.heads = flags.num("heads");
    options.context = flags.num("context");
    const int64_t micro = flags.num("micro"), steps = flags.num("steps"), warmup = flags.num("warmup");

    json result = {{"offload", flags.str("offload")}, {"ratio", std::stod(flags.str("ratio"))}, {"stage", flags.num("stage")}, {"dtype", flags.str("dtype")},
                   {"device", device.str()}, {"ranks", N}, {"cap_bytes", cap}, {"device_total_bytes", device_total},
                   {"depth", options.depth}, {"width", options.width}, {"context", options.context},
                   {"micro_batch", micro}, {"tokens_per_step", micro * options.context * N}, {"oom", false},
                   {"device_name", zero::profile::accelerator_name(device)},
                   {"peak_flops", zero::profile::peak_flops_per_s(zero::profile::accelerator_name(device),
                                                                  flags.str("dtype") == "bf16" ? at::kBFloat16 : at::kFloat, false)}};
    std::string phase = "building the model";
    const auto t_start = Clock::now();
    try {
      torch::manual_seed(0);
      GPT model(options);
      result["params"] = model->num_parameters();
      model->to(device);
      phase = "initialize";
      zero::InitOptions init;
      init.group = world;
      auto engine = zero::initialize(zero::Config::from_json(ds_config(flags)), model, init);
      result["init_s"] = since(t_start);

      phase = "training";
      auto gen = at::detail::createCPUGenerator(1234 + rank);
      std::vector<double> times;
      for (int64_t step = 0; step < warmup + steps; ++step) {
        at::Tensor tokens = torch::randint(0, options.vocab_size, {micro, options.context + 1}, gen, torch::kLong).to(device);
        if (step == warmup) engine.take_step_times();  // the measured window starts here
        world->barrier();
        const auto t = Clock::now();
        at::Tensor loss = model->loss(tokens.slice(1, 0, options.context), tokens.slice(1, 1, options.context + 1));
        engine.backward(loss);
        engine.step();
        synchronize(device);
        at::Tensor slowest = torch::tensor({since(t)}, torch::kDouble);
        world->all_reduce(slowest, zero::comm::ReduceOp::Max);
        if (step >= warmup) times.push_back(slowest.item<double>());
        if (rank == 0) std::fprintf(stderr, "step %lld: %.3f s, loss %.4f\n", static_cast<long long>(step), times.empty() ? 0.0 : times.back(), loss.item<float>());
      }
      const zero::MemoryReport held = engine.memory_report();  // after a step: the optimizer states exist
      result["memory_report"] = held.describe();
      result["host_offloaded_bytes"] = held.host_offloaded;
      const zero::StepTimes st = engine.take_step_times();
      std::vector<double> sorted = times;
      std::sort(sorted.begin(), sorted.end());
      const double per = st.steps > 0 ? 1.0 / static_cast<double>(st.steps) : 0.0;
      result["step_s_median"] = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
      result["step_s"] = times;
      result["split_s"] = {{"forward", st.forward * per}, {"backward", st.backward * per}, {"reduce", st.reduce * per},
                           {"step", st.step * per},       {"host_step", st.host_step * per}, {"gather", st.gather * per},
                           {"gather_wait", st.gather_wait * per}, {"nvme_wait", st.nvme_wait * per}};
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
      result["oom"] = true;
      result["oom_phase"] = phase;
      std::string what = e.what();
      result["oom_message"] = what.substr(0, what.find('\n'));
    }
    result["device_peak_bytes"] = zero::activations::peak_allocated_bytes(device);
    result["host_peak_rss_bytes"] = zero_bench::peak_rss_bytes();
    if (rank == 0) {
      const std::string line = json{{"result", result}}.dump();
      std::printf("%s\n", line.c_str());
      if (!flags.str("out").empty()) std::ofstream(flags.str("out"), std::ios::app) << line << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_offload_headline: %s\n", e.what());
    return 1;
  }
}
