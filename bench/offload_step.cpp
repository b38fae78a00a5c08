// Offload step: where the time of a training step goes with ZeRO-Offload /
// ZeRO-Infinity, against the same stage without offload, measured in one run
// on the same model and the same batches.
//
//   zero-run --nproc 2 bench_offload_step [--dtype bf16|fp32|both] [--nvme DIR]
//       [--depth 4] [--width 768] [--heads 12] [--context 64] [--micro 2]
//       [--warmup 2] [--steps 10] [--rounds 1] [--bucket 5e6] [--sub-group 2e6]
//       [--clip 1.0: gradient_clipping] [--aio-block 1048576] [--aio-depth 8] [--threads 0 = cores / ranks]
//       [--variants all | comma-separated names, e.g. s2,s2-opt-cpu]
//       [--out FILE: rank 0 also appends the markdown tables to FILE]
//
// bench/run_offload_step.sh runs it and keeps the table in bench/results/.
//
// Variants, one after the other in the same processes, each with a fresh
// model built from the same seed and fed the same batches (step i reads the
// same tokens in every variant):
//   s2                     stage 2, nothing offloaded                (reference of s2-*)
//   s2-opt-cpu             stage 2, offload_optimizer cpu
//   s3                     stage 3, nothing offloaded                (reference of s3-*)
//   s3-opt-cpu             stage 3, offload_optimizer cpu
//   s3-opt-nvme            stage 3, offload_optimizer nvme
//   s3-opt-nvme-param-nvme stage 3, offload_optimizer nvme + offload_param nvme
//   s2-opt-cpu-super, s3-opt-cpu-super, s3-opt-nvme-super, s3-opt-nvme-param-nvme-super
//                          the same with offload_optimizer.super_offload: the
//                          update runs inside backward (Note [Updates in
//                          backward]) when nothing clips: run with --clip 0
//
// Figures: `warmup` steps, then `steps` measured steps, per variant and
// round; with --rounds R the whole list of variants runs R times over (fresh
// engines each time, so slow drift on a shared machine hits every variant)
// and the figures pool the rounds. "ms/step" is the
// wall clock of a whole iteration (batch, forward, backward, step) on each
// rank, the slowest rank per step, mean and median over the measured steps;
// "x ref" is the median against the variant without offload at the same
// stage. The split is engine.take_step_times() over the measured steps,
// averaged over the ranks, per step:
//   forward    from the end of step() to backward(): batch, forward, and at
//              stage 3 the gathers (with offload_param nvme: the reads of the
//              shards from disk, waited for in the gather)
//   backward   backward with the gradient reductions it overlaps; with
//              offload_optimizer at stages 2-3 on an accelerator, also the
//              copy of each reduced gradient bucket to the host in the
//              training dtype, made as the bucket's reduction finishes (CPU
//              ranks: none, the host optimizer reads the partition in place)
//   reduce     waiting for the last reductions (and their copies) after backward
//   step       the optimizer step without the gather (norm, clip, update);
//              of which "host kern." (the host optimizer's SIMD kernels) and
//              "nvme wait" (offload_optimizer nvme: waiting for the reads and
//              writes of master weights and Adam states); "step rest" is what
//              is left: the gradient norm and its all-reduce, clipping
//              (without offload a pass of its own; with offload the kernels
//              apply it as they read), and with offload starting each
//              bucket's way to the parameters as it is updated
//   gather     publishing the updated parameters: without offload, the copy
//              of the master weights into the parameters and the
//              all-gather; with offload, waiting for what the step started
//              (each bucket's host-to-device copy and all-gather begin as
//              soon as the host optimizer has updated it, overlapping the
//              next buckets' update; offload_param nvme: the shard's write)
// Without offload the optimizer is torch::optim::AdamW on the partition, all
// of it in "step rest". On CPU ranks there is no device memory: "device-to-
// host" and "host-to-device" are host-memory copies here (the output says
// so). The engine does not time the copy, the norm or the clipping apart,
// so the program also times, in the same run on each rank's partition size
// (Ψ/N elements), what the engine does without offload: the gradient copy
// into fp32, the norm, the clipping multiply and a torch::optim::AdamW step.
// Memory: memory_report()'s host_offloaded and nvme_offloaded, max over ranks.
#include <nlohmann/json.hpp>
#include <tbb/global_control.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gpt/corpus.h"
#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "zero/zero.h"
#include "median.h"

using namespace zero_examples;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

struct Variant {
  const char* name;
  int stage;
  const char* offload_optimizer;  // none | cpu | nvme
  const char* offload_param;      // none | cpu | nvme
  bool super_offload = false;     // offload_optimizer.super_offload: the update inside backward
};

const Variant kVariants[] = {
    {"s2", 2, "none", "none"},         {"s2-opt-cpu", 2, "cpu", "none"},   {"s3", 3, "none", "none"},
    {"s3-opt-cpu", 3, "cpu", "none"},  {"s3-opt-nvme", 3, "nvme", "none"}, {"s3-opt-nvme-param-nvme", 3, "nvme", "nvme"},
    {"s3-param-nvme", 3, "none", "nvme"},
    {"s2-opt-cpu-super", 2, "cpu", "none", true}, {"s3-opt-cpu-super", 3, "cpu", "none", true},
    {"s3-opt-nvme-super", 3, "nvme", "none", true}, {"s3-opt-nvme-param-nvme-super", 3, "nvme", "nvme", true},
};

// Per step, in seconds: the columns of the table.
struct Result {
  const Variant* variant = nullptr;
  std::vector<double> times;                      // wall clock of each measured step, the slowest rank's
  std::vector<double> round_medians;              // the median of each round's steps
  double mean = 0, median = 0, min = 0, max = 0;  // of `times`
  double forward = 0, backward = 0, reduce = 0, step = 0, host_step = 0, nvme_wait = 0, gather = 0;
  double host_bytes = 0, nvme_bytes = 0;  // max over ranks
  double loss = 0;                        // the last measured step's, mean over ranks
};

std::string default_nvme_dir() {
  // A folder under the build dir: beside this binary's folder (build/bench/..).
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "offload_step_nvme";
  return (exe.parent_path().parent_path() / "offload_step_nvme").string();
}

std::string ds_config(const zero_bench::Flags& flags, const Variant& v, const std::string& dtype,
                      const std::string& nvme_dir) {
  json z = {{"stage", v.stage},
            {"overlap_comm", true},
            {"contiguous_gradients", true},
            {"reduce_bucket_size", flags.num("bucket")},
            {"sub_group_size", flags.num("sub-group")}};
  const std::string opt = v.offload_optimizer, par = v.offload_param;
  if (opt != "none") {
    z["offload_optimizer"] = {{"device", opt}, {"super_offload", v.super_offload}};
    if (opt == "nvme") z["offload_optimizer"]["nvme_path"] = nvme_dir;
  }
  if (par != "none") {
    z["offload_param"] = {{"device", par}};
    if (par == "nvme") z["offload_param"]["nvme_path"] = nvme_dir;
  }
  json c = {{"train_micro_batch_size_per_gpu", flags.num("micro")},
            {"gradient_accumulation_steps", 1},
            {"optimizer",
             {{"type", "AdamW"},
              {"params", {{"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.01}}}}},
            {"gradient_clipping", flags.real("clip")},
            {"fp16", {{"enabled", false}}},
            {"bf16", {{"enabled", dtype == "bf16"}}},
            {"steps_per_print", 1000000000},
            {"zero_optimization", z},
            {"aio", {{"block_size", flags.num("aio-block")}, {"queue_depth", flags.num("aio-depth")}}}};
  return c.dump();
}

GPTOptions model_options(const zero_bench::Flags& flags, int64_t vocab) {
  GPTOptions o;
  o.vocab_size = vocab;
  o.depth = flags.num("depth");
  o.width = flags.num("width");
  o.heads = flags.num("heads");
  o.context = flags.num("context");
  return o;
}

Result run_variant(const zero_bench::Flags& flags, const Variant& v, const std::string& dtype,
                   const std::string& nvme_dir, const std::shared_ptr<zero::comm::ProcessGroup>& world,
                   const Corpus& corpus, int64_t* psi) {
  const int rank = world->rank(), N = world->size();
  Batcher train(corpus.train_tokens(), BatcherOptions{0, 1});
  const GPTOptions options = model_options(flags, corpus.vocab_size());
  torch::manual_seed(0);
  GPT model(options);
  *psi = model->num_parameters();
  zero::InitOptions init;
  init.group = world;
  Result r;
  r.variant = &v;
  {
    auto engine = zero::initialize(zero::Config::from_json(ds_config(flags, v, dtype, nvme_dir)), model, init);
    const int64_t warmup = flags.num("warmup"), steps = flags.num("steps");
    const int64_t micro = flags.num("micro");
    std::vector<double> times;
    double last_loss = 0;
    for (int64_t step = 0; step < warmup + steps; ++step) {
      if (step == warmup) engine.take_step_times();  // the measured window starts here
      const auto start = Clock::now();
      Batch batch = train.next_batch(micro, options.context, rank, N, step, 0);
      at::Tensor loss = model->loss(batch.inputs, batch.targets);
      engine.backward(loss);
      engine.step();
      if (step >= warmup) {
        times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
        last_loss = loss.detach().to(at::kDouble).item<double>();
      }
    }
    const zero::StepTimes st = engine.take_step_times();
    const zero::MemoryReport mem = engine.memory_report();
    if (st.steps != steps) {
      throw std::runtime_error(std::string(v.name) + ": take_step_times counted " + std::to_string(st.steps) +
                               " steps, expected " + std::to_string(steps));
    }
    at::Tensor t = torch::tensor(times, torch::kDouble);
    world->all_reduce(t, zero::comm::ReduceOp::Max);
    at::Tensor split = torch::tensor({st.forward, st.backward, st.reduce, st.step, st.host_step, st.nvme_wait,
                                      st.gather, last_loss},
                                     torch::kDouble) /
                       double(steps);
    split[7] = last_loss;
    world->all_reduce(split, zero::comm::ReduceOp::Avg);
    at::Tensor bytes = torch::tensor({double(mem.host_offloaded), double(mem.nvme_offloaded)}, torch::kDouble);
    world->all_reduce(bytes, zero::comm::ReduceOp::Max);

    r.times.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    const double* s = split.data_ptr<double>();
    r.forward = s[0], r.backward = s[1], r.reduce = s[2], r.step = s[3], r.host_step = s[4], r.nvme_wait = s[5];
    r.gather = s[6], r.loss = s[7];
    r.host_bytes = bytes[0].item<double>(), r.nvme_bytes = bytes[1].item<double>();
  }  // the engine goes (its NVMe files with it) before the next variant starts
  world->barrier();
  return r;
}

// Folds one more round of a variant into `into` (the splits: mean over rounds).
void merge(Result& into, const Result& r, int rounds_before) {
  if (rounds_before == 0) {
    into = r;
  } else {
    const double a = double(rounds_before) / (rounds_before + 1), b = 1.0 / (rounds_before + 1);
    into.forward = a * into.forward + b * r.forward, into.backward = a * into.backward + b * r.backward;
    into.reduce = a * into.reduce + b * r.reduce, into.step = a * into.step + b * r.step;
    into.host_step = a * into.host_step + b * r.host_step, into.nvme_wait = a * into.nvme_wait + b * r.nvme_wait;
    into.gather = a * into.gather + b * r.gather;
    into.host_bytes = std::max(into.host_bytes, r.host_bytes), into.nvme_bytes = std::max(into.nvme_bytes, r.nvme_bytes);
    into.loss = r.loss;
    into.times.insert(into.times.end(), r.times.begin(), r.times.end());
  }
  into.round_medians.push_back(zero_bench::median(r.times));
  double sum = 0;
  for (double t : into.times) sum += t;
  into.mean = sum / into.times.size();
  into.median = zero_bench::median(into.times);
  into.min = *std::min_element(into.times.begin(), into.times.end());
  into.max = *std::max_element(into.times.begin(), into.times.end());
}

// References for the parts of "step" the engine does not time apart, each
// the median of 5 on one rank's partition (numel elements) in this process,
// as the partition does them without offload (ShardedParams::step, partition/step.cpp):
struct HostRefs {
  double copy = 0;   // the gradient copy into the fp32 master gradient
  double norm = 0;   // the local squared norm: grad.pow(2).sum(kDouble)
  double scale = 0;  // clipping: grad.mul_(factor)
  double adamw = 0;  // torch::optim::AdamW's step, the optimizer without offload
};

template <typename F>
double median_ms(F&& f) {
  f();  // first touch
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return zero_bench::median(ms);
}

// In pieces of `piece` elements, like the engine's per-bucket master tensors.
HostRefs host_refs(int64_t numel, int64_t piece, const std::string& dtype) {
  torch::NoGradGuard no_grad;
  HostRefs r;
  std::vector<at::Tensor> src, grad, params;
  for (int64_t done = 0; done < numel; done += piece) {
    const int64_t n = std::min(piece, numel - done);
    src.push_back(torch::randn({n}).to(dtype == "bf16" ? at::kBFloat16 : at::kFloat));
    grad.push_back(torch::empty({n}, torch::kFloat));
    params.push_back(torch::randn({n}));
    params.back().mutable_grad() = grad.back();
  }
  r.copy = median_ms([&] {
    for (size_t i = 0; i < src.size(); ++i) grad[i].copy_(src[i]);
  });
  r.norm = median_ms([&] {
    at::Tensor sum = at::zeros({}, torch::kDouble);
    for (const auto& g : grad) sum += g.pow(2).sum(at::kDouble);
    (void)sum.item<double>();
  });
  r.scale = median_ms([&] {
    for (auto& g : grad) g.mul_(0.999);
  });
  torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.01));
  r.adamw = median_ms([&] { adamw.step(); });
  return r;
}

// printf, appending to a string.
__attribute__((format(printf, 2, 3))) void add(std::string& out, const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::vector<char> buf(static_cast<size_t>(std::max(n, 0)) + 1);
  std::vsnprintf(buf.data(), buf.size(), format, again);
  va_end(again);
  out.append(buf.data(), static_cast<size_t>(std::max(n, 0)));
}

std::string table(const zero_bench::Flags& flags, const std::string& dtype, int N, int threads, int64_t psi,
                  const std::vector<Result>& results, const HostRefs& refs, const std::string& nvme_dir) {
  std::string out;
  add(out, "\n## %s: GPT %.1f M parameters (depth %lld, width %lld, heads %lld), %d ranks x %d thread(s), AdamW, "
              "micro batch %lld x context %lld, reduce_bucket_size %lld, overlap_comm on, sub_group_size %lld, "
              "gradient_clipping %g, aio block %lld x depth %lld; %lld round(s) of %lld steps after %lld warm-up; "
              "nvme_path %s\n\n",
              dtype.c_str(), psi / 1e6, (long long)flags.num("depth"), (long long)flags.num("width"),
              (long long)flags.num("heads"), N, threads, (long long)flags.num("micro"),
              (long long)flags.num("context"), (long long)flags.num("bucket"), (long long)flags.num("sub-group"),
              flags.real("clip"), (long long)flags.num("aio-block"), (long long)flags.num("aio-depth"), (long long)flags.num("rounds"),
      (long long)flags.num("steps"),
              (long long)flags.num("warmup"), nvme_dir.c_str());
  add(out, "| variant | stage | offload opt / param | ms/step mean | median | per round | x ref (median) | forward | backward "
              "| reduce | step | host kern. | nvme wait | step rest (norm, clip) | gather (H2D, all-gather) "
              "| host MB | NVMe MB | last loss |\n");
  add(out, "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Result& r : results) {
    double ref = NAN;
    for (const Result& o : results) {
      if (o.variant->stage == r.variant->stage && std::string(o.variant->offload_optimizer) == "none" &&
          std::string(o.variant->offload_param) == "none")
        ref = o.median;
    }
    // *-super: host kern. and nvme wait count what ran inside backward too,
    // so step minus them says nothing.
    char rest[32] = "-";
    if (!r.variant->super_offload) std::snprintf(rest, sizeof rest, "%.1f", (r.step - r.host_step - r.nvme_wait) * 1e3);
    std::string rounds;
    for (double m : r.round_medians) add(rounds, "%s%.0f", rounds.empty() ? "" : ", ", m * 1e3);
    char ratio[32] = "-";  // no reference when --variants left it out
    if (!std::isnan(ref)) std::snprintf(ratio, sizeof ratio, "%.3f", r.median / ref);
    add(out, "| %s | %d | %s / %s | %.1f | %.1f | %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %.1f | "
                "%.1f | %.1f | %.4f |\n",
                r.variant->name, r.variant->stage, r.variant->offload_optimizer, r.variant->offload_param,
                r.mean * 1e3, r.median * 1e3, rounds.c_str(), ratio, r.forward * 1e3, r.backward * 1e3, r.reduce * 1e3,
                r.step * 1e3, r.host_step * 1e3, r.nvme_wait * 1e3, rest, r.gather * 1e3, r.host_bytes / 1e6,
                r.nvme_bytes / 1e6, r.loss);
  }
  add(out, "\nCPU ranks have no device memory: the host optimizer reads the reduced gradients where they are and "
              "writes the updated parameters into them, so offload has no device-to-host or host-to-device copy "
              "here; each bucket's all-gather starts as the optimizer finishes it (step rest), gather waits for "
              "what is left. host kern. and nvme wait are parts of step; in the *-super variants the update runs "
              "inside backward (offload_optimizer.super_offload, when nothing clips), so they count what ran there "
              "too, most of it part of backward, and step rest is not shown; "
              "without offload, CPU ranks run the same fused kernels on their master weights in place (torch_adam: "
              "false). offload_param nvme's reads "
              "are waited for in forward/backward (stage 3 gathers) and its writes in gather.\n\n"
              "References, same run, one rank's partition (%.1f M elements, in pieces of reduce_bucket_size / N "
              "as the engine's master tensors), without offload, ms: gradient copy (%s -> fp32) %.2f; "
              "gradient norm (pow(2).sum in double) %.2f; clipping (mul_) %.2f; torch::optim::AdamW step %.2f.\n",
              double(psi) / N / 1e6, dtype.c_str(), refs.copy, refs.norm, refs.scale, refs.adamw);
  return out;
}

int run(const zero_bench::Flags& flags) {
  auto world = zero::comm::init_process_group();
  const int rank = world->rank(), N = world->size();
  int threads = static_cast<int>(flags.num("threads"));
  if (threads <= 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, N));
  }
  at::set_num_threads(threads);
  // The host optimizer's kernels run on oneTBB: as many threads as LibTorch's.
  tbb::global_control tbb_threads(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads));

  std::string nvme_dir = flags.str("nvme");
  if (nvme_dir.empty()) nvme_dir = default_nvme_dir();
  std::filesystem::create_directories(nvme_dir);

  std::vector<const Variant*> chosen;
  const std::string wanted = flags.str("variants");
  for (const Variant& v : kVariants) {
    if (wanted == "all" || ("," + wanted + ",").find("," + std::string(v.name) + ",") != std::string::npos)
      chosen.push_back(&v);
  }
  if (chosen.empty()) throw std::invalid_argument("--variants: no known variant in '" + wanted + "'");

  std::vector<std::string> dtypes;
  const std::string d = flags.str("dtype");
  if (d == "both") dtypes = {"bf16", "fp32"};
  else if (d == "bf16" || d == "fp32") dtypes = {d};
  else throw std::invalid_argument("--dtype must be bf16, fp32 or both; got '" + d + "'");

  const int rounds = static_cast<int>(flags.num("rounds"));
  if (rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  Corpus corpus;
  for (const std::string& dtype : dtypes) {
    std::vector<Result> results(chosen.size());
    int64_t psi = 0;
    for (int round = 0; round < rounds; ++round) {  // rounds interleave the variants: drift hits them all
      for (size_t i = 0; i < chosen.size(); ++i) {
        Result r = run_variant(flags, *chosen[i], dtype, nvme_dir, world, corpus, &psi);
        Result alone;
        merge(alone, r, 0);
        merge(results[i], r, round);
        if (rank == 0) {
          std::fprintf(stderr, "bench_offload_step: %s %s round %d: %.1f ms/step (median %.1f, min %.1f, max %.1f)\n",
                       dtype.c_str(), chosen[i]->name, round + 1, alone.mean * 1e3, alone.median * 1e3,
                       alone.min * 1e3, alone.max * 1e3);
        }
      }
    }
    const int64_t piece = std::max<int64_t>(1, flags.num("bucket") / N);
    const HostRefs refs = host_refs(psi / N, piece, dtype);  // every rank at once, as in the steps
    at::Tensor c = torch::tensor({refs.copy, refs.norm, refs.scale, refs.adamw}, torch::kDouble);
    world->all_reduce(c, zero::comm::ReduceOp::Avg);
    if (rank == 0) {
      const std::string text = table(flags, dtype, N, threads, psi, results,
                                     HostRefs{c[0].item<double>(), c[1].item<double>(), c[2].item<double>(),
                                              c[3].item<double>()},
                                     nvme_dir);
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
      // The launcher prefixes every relayed line with its rank: the file keeps the plain table.
      if (!flags.str("out").empty()) {
        std::ofstream file(flags.str("out"), std::ios::app);
        file << text;
        if (!file) throw std::runtime_error("cannot append to " + flags.str("out"));
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    zero_bench::Flags flags(argc, argv,
                            {{"dtype", "bf16"},
                             {"out", ""},
                             {"nvme", ""},
                             {"variants", "all"},
                             {"depth", "4"},
                             {"width", "768"},
                             {"heads", "12"},
                             {"context", "64"},
                             {"micro", "2"},
                             {"warmup", "2"},
                             {"steps", "10"},
                             {"rounds", "1"},
                             {"bucket", "5e6"},
                             {"sub-group", "2e6"},
                             {"clip", "1.0"},
                             {"aio-block", "1048576"},
                             {"aio-depth", "8"},
                             {"threads", "0"}});
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_offload_step: %s\n", e.what());
    return 1;
  }
}
