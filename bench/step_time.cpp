// Step time and bytes communicated per ZeRO stage, against stage 0 and
// against a plain single-process LibTorch loop (torch::optim::AdamW) of the
// same model and per-rank micro batch, and against PyTorch DDP, measured in the same script run.
//
//   zero-run --nproc N bench_step_time --mode engine --stage S --out st.jsonl   (one stage; --overlap 0: reductions in series; --in-memory K)
//   zero-run --nproc N bench_step_time --mode engine --config ds.json --label L  (the ds_config file instead of
//       the generated one: bench/run_vs_deepspeed.sh gives DeepSpeed the same file; [--checkpoint DIR] then also
//       times save_checkpoint and load_checkpoint of the trained state into DIR)
//   bench_step_time --mode plain --threads T --out st.jsonl                     (the reference)
//   bench_step_time --mode report --in st.jsonl --world N                       (the table)
//   common: [--depth 6] [--width 768] [--heads 12] [--context 64] [--micro 2]
//           [--warmup 2] [--steps 10] [--bucket 5e6] [--threads 0 = cores / ranks]
//
// bench/run_step_time.sh runs the reference and stages 0-3 on 2 and 4 ranks.
//
// Step time: forward, backward and optimizer step of one micro batch
// (gradient_accumulation_steps 1); each step's time is the slowest rank's;
// the figure is the median over the measured steps, after the warm-up steps.
// Bytes: the growth of engine.group().stats().total() over the measured
// steps only (the initial broadcast and the warm-up are excluded), divided
// by the steps, the largest over the ranks. CommStats counts what a
// bandwidth-optimal ring sends. Theory, Ψ parameters, N ranks, fp32:
//   stages 0-2: 2Ψ(N-1)/N * 4 bytes (all-reduce; or reduce-scatter + all-gather)
//   stage 3:    3Ψ(N-1)/N * 4 bytes (+ one more all-gather of the parameters for
//               backward; 2Ψ when stage3_max_reuse_distance keeps them gathered,
//               DeepSpeed's default 1e9 for a model below 5e8 elements)
// Minor page faults per step (getrusage over the measured steps) show the
// allocator's churn; peak RSS is the process's high-water mark. Rank 0 also
// prints its split of the step (Engine::take_step_times(): forward, backward,
// waiting for reductions, optimizer step, publishing parameters). The report
// also reads the PyTorch peers' lines (bench/ddp_peer.py: DDP over gloo and
// a plain loop at the same threads per process).
// Goals (information only; the program exits 0 whatever it measures):
// stages 0-2 at most 0.8x DDP's step time, stage 3 at most 1.0x, fewer than
// 1000 minor faults per step, bytes within 5% of the theory.
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpt/corpus.h"
#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "core/blas_kernels.h"
#include "core/heap.h"
#include "zero/zero.h"
#include "median.h"

using namespace zero_examples;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

GPTOptions model_options(const zero_bench::Flags& flags, int64_t vocab) {
  GPTOptions o;
  o.vocab_size = vocab;
  o.depth = flags.num("depth");
  o.width = flags.num("width");
  o.heads = flags.num("heads");
  o.context = flags.num("context");
  return o;
}

int threads_for(const zero_bench::Flags& flags, int ranks) {
  const int64_t t = flags.num("threads");
  if (t > 0) return static_cast<int>(t);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, ranks));
}

// Minor page faults of this process so far: a fault per page the allocator
// maps afresh, so their growth per step is the step's allocator churn.
int64_t minor_faults() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_minflt);
}

void append(const std::string& path, const json& j) {
  std::ofstream out(path, std::ios::app);
  out << j.dump() << "\n";
  if (!out) throw std::runtime_error("cannot append to " + path);
}

// The BLAS this process computes with: OpenBLAS's kernels where it is
// loaded (Debian's LibTorch), else "mkl" (the torch wheel has MKL inside),
// as bench/ddp_peer.py records its side.
std::string blas_kernels() {
  const std::string core = zero::blas::loaded_openblas_core();
  return core.empty() && at::hasMKL() ? std::string("mkl") : core;
}

json common_fields(const zero_bench::Flags& flags, int64_t psi, int threads) {
  return json{{"bench", "step_time"},
              {"allocator", zero::heap::allocator_name()},
              {"blas", blas_kernels()},
              {"params", psi},
              {"depth", flags.num("depth")},
              {"width", flags.num("width")},
              {"context", flags.num("context")},
              {"micro", flags.num("micro")},
              {"warmup", flags.num("warmup")},
              {"steps", flags.num("steps")},
              {"reduce_bucket_size", flags.num("bucket")},
              {"threads", threads}};
}

// The reference: one process, plain LibTorch, the same model, data, AdamW
// hyperparameters and clipping as the engine's config (gpt_bench.h).
// Started by zero-run with N > 1 processes, it runs N such loops side by
// side with no communication: the floor a data-parallel job of N ranks
// running the same kernels (torch::optim::AdamW) cannot go below on these
// cores, since the ranks share the cores, caches and memory bandwidth (each
// process writes its own line). zero's fused Adam (Note [Fused step on CPU
// ranks]) makes the step itself cheaper, so zero's rows can go below it.
int run_plain(const zero_bench::Flags& flags) {
  const char* size = std::getenv("WORLD_SIZE");
  const char* rank = std::getenv("RANK");
  const int world = size ? std::max(1, std::atoi(size)) : 1;
  const int threads = threads_for(flags, world);
  at::set_num_threads(threads);
  Corpus corpus;
  Batcher train(corpus.train_tokens(), BatcherOptions{0, 1});
  const GPTOptions options = model_options(flags, corpus.vocab_size());
  torch::manual_seed(0);
  GPT model(options);
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(3e-4).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.01));
  const int64_t micro = flags.num("micro"), warmup = flags.num("warmup"), steps = flags.num("steps");
  std::vector<double> times, forward_times, backward_times;
  int64_t faults_before = 0;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    if (step == warmup) faults_before = minor_faults();
    Batch batch = train.next_batch(micro, options.context, 0, 1, step, 0);
    const auto start = Clock::now();
    optimizer.zero_grad();
    at::Tensor loss = model->loss(batch.inputs, batch.targets);
    const auto forward_done = Clock::now();
    loss.backward();
    const auto backward_done = Clock::now();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    optimizer.step();
    if (step < warmup) continue;
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    forward_times.push_back(std::chrono::duration<double>(forward_done - start).count());
    backward_times.push_back(std::chrono::duration<double>(backward_done - forward_done).count());
  }
  json j = common_fields(flags, model->num_parameters(), threads);
  j["mode"] = world > 1 ? "side_by_side" : "plain";
  j["world"] = world;
  if (world > 1) j["rank"] = rank ? std::atoi(rank) : 0;
  j["vocab"] = options.vocab_size;  // for the PyTorch peer's model
  j["step_s"] = zero_bench::median(times);
  j["step_times"] = times;
  j["forward_s"] = zero_bench::median(forward_times);
  j["backward_s"] = zero_bench::median(backward_times);
  j["minflt_per_step"] = double(minor_faults() - faults_before) / steps;
  j["peak_rss"] = zero_bench::peak_rss_bytes();
  append(flags.str("out"), j);
  std::printf("plain LibTorch (%d process(es) side by side, %d thread(s) each): median step %.1f ms (forward %.1f, backward %.1f), %.0f minor faults per step, peak RSS %.0f MB\n",
              world, threads, j["step_s"].get<double>() * 1e3, j["forward_s"].get<double>() * 1e3,
              j["backward_s"].get<double>() * 1e3, j["minflt_per_step"].get<double>(), j["peak_rss"].get<double>() / 1e6);
  return 0;
}

// The resident set now (VmRSS), in bytes: the baseline before the model.
int64_t current_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return 0;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int run_engine(const zero_bench::Flags& flags) {
  auto world = zero::comm::init_process_group();
  const int rank = world->rank(), N = world->size();
  const int threads = threads_for(flags, N);
  at::set_num_threads(threads);
  const int64_t rss_baseline = current_rss_bytes();  // LibTorch and the process group, before the model
  Corpus corpus;
  Batcher train(corpus.train_tokens(), BatcherOptions{0, 1});
  const GPTOptions options = model_options(flags, corpus.vocab_size());
  torch::manual_seed(0);
  GPT model(options);

  zero_bench::TrainSetup setup;
  setup.stage = static_cast<int>(flags.num("stage"));
  setup.micro_batch = flags.num("micro");
  setup.reduce_bucket_size = flags.num("bucket");
  setup.offload_optimizer = flags.str("offload");
  setup.overlap_comm = flags.num("overlap") != 0;
  setup.in_memory_interval = flags.num("in-memory");
  const std::string config_file = flags.str("config");
  const zero::Config config =
      config_file.empty() ? zero::Config::from_json(zero_bench::ds_config(setup)) : zero::Config::from_file(config_file);
  if (!config_file.empty()) {  // the file decides; the line records what it said
    setup.stage = config.zero_optimization.stage;
    setup.micro_batch = config.batch.train_micro_batch_size_per_gpu.value_or(1);
    setup.offload_optimizer = config.zero_optimization.offload_optimizer.device;
  }
  zero::InitOptions init;
  init.group = world;
  auto engine = zero::initialize(config, model, init);

  const int64_t warmup = flags.num("warmup"), steps = flags.num("steps");
  std::vector<double> times;
  zero::comm::CommStats before;
  int64_t faults_before = 0;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      before = world->stats();
      faults_before = minor_faults();
      engine.take_step_times();  // the split below covers the measured steps only
    }
    Batch batch = train.next_batch(setup.micro_batch, options.context, rank, N, step, 0);
    const auto start = Clock::now();
    engine.backward(model->loss(batch.inputs, batch.targets));
    engine.step();
    if (step >= warmup) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  const zero::comm::CommStats after = world->stats();
  const double per_step = double(after.total() - before.total()) / steps;
  const double kinds[4] = {double(after.all_reduce_bytes - before.all_reduce_bytes) / steps,
                           double(after.reduce_scatter_bytes - before.reduce_scatter_bytes) / steps,
                           double(after.all_gather_bytes - before.all_gather_bytes) / steps,
                           double(after.broadcast_bytes - before.broadcast_bytes) / steps};

  // The slowest rank per step, and the largest byte count (collectives after the measurement).
  at::Tensor t = torch::tensor(times, torch::kDouble);
  world->all_reduce(t, zero::comm::ReduceOp::Max);
  const double faults = double(minor_faults() - faults_before) / steps;
  const zero::StepTimes split = engine.take_step_times();
  const double peak_rss = double(zero_bench::peak_rss_bytes());  // before the checkpoint's own buffers

  // The trained state saved and loaded back (every rank's time; the slowest counts).
  double save_s = NAN, load_s = NAN;
  const std::string checkpoint = flags.str("checkpoint");
  if (!checkpoint.empty()) {
    world->barrier();
    auto start = Clock::now();
    engine.save_checkpoint(checkpoint, "bench");
    save_s = seconds_since(start);
    world->barrier();
    start = Clock::now();
    engine.load_checkpoint(checkpoint, "bench");
    load_s = seconds_since(start);
  }
  at::Tensor b = torch::tensor({per_step, kinds[0], kinds[1], kinds[2], kinds[3], faults, peak_rss,
                                double(rss_baseline), save_s, load_s}, torch::kDouble);
  world->all_reduce(b, zero::comm::ReduceOp::Max);
  if (rank == 0) {
    const int64_t psi = model->num_parameters();
    // Stage 3 gathers the parameters for forward and again for backward,
    // unless stage3_max_reuse_distance keeps them all gathered in between
    // (Note [Reuse distance]: a model below half the distance).
    const bool regathers = 2 * psi >= config.zero_optimization.stage3_max_reuse_distance;
    const double theory = (setup.stage == 3 && regathers ? 3.0 : 2.0) * psi * (N - 1) / N * 4.0;
    std::vector<double> slowest(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    json j = common_fields(flags, psi, threads);
    j["mode"] = "engine";
    j["side"] = "zero";
    j["label"] = flags.str("label");
    j["offload_optimizer"] = setup.offload_optimizer;
    j["in_memory_interval"] = config.checkpoint.in_memory_interval;
    j["stage"] = setup.stage;
    j["world"] = N;
    j["step_s"] = zero_bench::median(slowest);
    j["step_times"] = slowest;
    j["bytes_per_step"] = b[0].item<double>();
    j["bytes_by_kind"] = {{"all_reduce", b[1].item<double>()},
                          {"reduce_scatter", b[2].item<double>()},
                          {"all_gather", b[3].item<double>()},
                          {"broadcast", b[4].item<double>()}};
    j["bytes_theory"] = theory;
    j["minflt_per_step"] = b[5].item<double>();
    j["peak_rss"] = b[6].item<double>();
    j["rss_baseline"] = b[7].item<double>();
    if (!checkpoint.empty()) {
      j["save_s"] = b[8].item<double>();
      j["load_s"] = b[9].item<double>();
    }
    // Rank 0's split of its step time (wall_clock_breakdown), per step.
    j["split_s"] = {{"forward", split.forward / steps}, {"backward", split.backward / steps},
                    {"reduce", split.reduce / steps}, {"step", split.step / steps}, {"gather", split.gather / steps},
                    {"host_kernels", split.host_step / steps}, {"gather_wait", split.gather_wait / steps}};
    append(flags.str("out"), j);
    std::printf("stage %d, %d ranks x %d thread(s): median step %.1f ms, %.2f MB sent per step per rank "
                "(theory %.2f MB; all-reduce %.2f, reduce-scatter %.2f, all-gather %.2f), %.0f minor faults per step, "
                "peak RSS %.0f MB\n",
                setup.stage, N, threads, zero_bench::median(slowest) * 1e3, b[0].item<double>() / 1e6, theory / 1e6,
                b[1].item<double>() / 1e6, b[2].item<double>() / 1e6, b[3].item<double>() / 1e6,
                b[5].item<double>(), b[6].item<double>() / 1e6);
    if (!checkpoint.empty()) {
      std::printf("stage %d checkpoint: saved in %.2f s, loaded in %.2f s (the slowest rank)\n", setup.stage,
                  b[8].item<double>(), b[9].item<double>());
    }
    std::printf("stage %d split per step on rank 0 (ms): forward %.1f, backward %.1f (of both, waiting for gathered "
                "parameters %.1f), waiting for reductions %.1f, optimizer step %.1f (fused host kernels %.1f), "
                "publishing parameters %.1f\n", setup.stage,
                split.forward / steps * 1e3, split.backward / steps * 1e3, split.gather_wait / steps * 1e3,
                split.reduce / steps * 1e3, split.step / steps * 1e3, split.host_step / steps * 1e3,
                split.gather / steps * 1e3);
  }
  return 0;
}

// Optional fields (the peers' lines have no byte counts; older lines no faults).
double field(const json& j, const char* key) { return j.contains(key) ? j[key].get<double>() : NAN; }

std::string mb(double bytes) {
  if (std::isnan(bytes)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", bytes / 1e6);
  return text;
}

// The lines of one row (the rounds of the script, or the processes of a
// side-by-side run): their step times pooled and the median taken over all
// of them; minor faults averaged, the largest peak RSS.
json pooled(const std::vector<json>& lines) {
  if (lines.empty()) return json();
  json j = lines.back();
  std::vector<double> times;
  double faults = 0, rss = 0;
  for (const json& line : lines) {
    for (const auto& t : line["step_times"]) times.push_back(t.get<double>());
    faults += field(line, "minflt_per_step");
    rss = std::max(rss, field(line, "peak_rss"));
  }
  j["step_s"] = zero_bench::median(times);
  j["pooled_steps"] = times.size();
  j["minflt_per_step"] = faults / lines.size();
  j["peak_rss"] = rss;
  return j;
}

int run_report(const zero_bench::Flags& flags) {
  const int world = static_cast<int>(flags.num("world"));
  const int threads = threads_for(flags, world);
  std::ifstream file(flags.str("in"));
  if (!file) throw std::runtime_error("cannot read " + flags.str("in"));
  std::vector<json> plain_lines, python_lines, side_lines, fsdp2_lines;
  std::map<std::string, std::vector<json>> ddp_lines;  // by allocator
  std::map<int, std::vector<json>> stage_lines;
  std::string text;
  std::set<std::string> blas;  // the OpenBLAS kernels of every row: like with like when one
  while (std::getline(file, text)) {
    if (text.empty()) continue;
    json j = json::parse(text);
    if (j.value("bench", "") != "step_time" || j["threads"].get<int>() != threads) continue;
    blas.insert(j.value("blas", std::string("not recorded")));
    if (j["mode"] == "plain") plain_lines.push_back(j);
    if (j["mode"] == "python") python_lines.push_back(j);
    const bool here = j["world"].get<int>() == world;
    if (j["mode"] == "side_by_side" && here) side_lines.push_back(j);
    if (j["mode"] == "ddp" && here) ddp_lines[j.value("allocator", "")].push_back(j);
    if (j["mode"] == "fsdp2" && here) fsdp2_lines.push_back(j);
    if (j["mode"] == "engine" && here) stage_lines[j["stage"].get<int>()].push_back(j);
  }
  const json plain = pooled(plain_lines), python = pooled(python_lines), side = pooled(side_lines);
  const json fsdp2 = pooled(fsdp2_lines);
  std::map<std::string, json> ddp;
  for (const auto& kv : ddp_lines) ddp[kv.first] = pooled(kv.second);
  std::map<int, json> stages;
  for (const auto& kv : stage_lines) stages[kv.first] = pooled(kv.second);
  if (stages.empty()) throw std::runtime_error("no engine results for " + std::to_string(world) + " ranks");
  const json& any = stages.begin()->second;
  const double base = stages.count(0) ? stages[0]["step_s"].get<double>() : NAN;
  const double ref = plain.is_null() ? NAN : plain["step_s"].get<double>();
  // The goals are against the fastest DDP run, whichever allocator it had.
  double peer = NAN;
  for (const auto& kv : ddp) peer = std::isnan(peer) ? kv.second["step_s"].get<double>() : std::min(peer, kv.second["step_s"].get<double>());
  std::printf("\n## step time, %d ranks x %d thread(s) each: GPT %lld params (depth %lld, width %lld), fp32, AdamW, micro "
              "batch %lld x context %lld, reduce_bucket_size %lld, overlap_comm on, median of %lld steps after %lld warm-up in each of %zu round(s), pooled\n",
              world, threads, (long long)any["params"].get<int64_t>(),
              (long long)any["depth"].get<int64_t>(), (long long)any["width"].get<int64_t>(),
              (long long)any["micro"].get<int64_t>(), (long long)any["context"].get<int64_t>(),
              (long long)any.value("reduce_bucket_size", int64_t(0)), (long long)any["steps"].get<int64_t>(), (long long)any["warmup"].get<int64_t>(),
              stage_lines.begin()->second.size());
  std::printf("goals: stages 0-2 <= 0.80x DDP, stage 3 <= 1.00x DDP, < 1000 minor faults per step, bytes within 5%% of "
              "theory (2Psi(N-1)/N*4 B stages 0-2, 3Psi(N-1)/N*4 B stage 3, 2Psi when stage3_max_reuse_distance keeps the model gathered into backward); information only. Peak RSS is per "
              "rank (the Python interpreter included for the PyTorch rows); x DDP is against the fastest DDP row. The side-by-side row is N plain loops at once with no communication: the "
              "step time no N-rank job with torch::optim's AdamW can go below on these cores. The PyTorch and plain "
              "LibTorch rows step torch.optim / torch::optim AdamW; zero steps its fused AdamW (torch_adam: false, "
              "DeepSpeed's default).\n");
  std::string kernels;
  for (const std::string& b : blas) kernels += (kernels.empty() ? "" : ", ") + (b.empty() ? std::string("no OpenBLAS") : b);
  std::printf("BLAS kernels: %s%s.\n\n", kernels.c_str(), blas.size() == 1 ? " in every row" : " (they differ between rows: not like with like)");
  std::printf("| run | step ms | x DDP | x stage 0 | x plain LibTorch | minor faults/step | peak RSS MB | MB sent/step/rank "
              "| bytes/theory | time goal | faults goal |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
  auto row = [&](const std::string& name, const json& j, const std::string& time_goal, const std::string& bytes) {
    const double s = j["step_s"].get<double>(), faults = field(j, "minflt_per_step");
    const std::string fault_goal = std::isnan(faults) ? "-" : faults < 1000 ? "pass" : "miss";
    std::printf("| %s | %.1f | %.3f | %.3f | %.3f | %.0f | %s | %s | %s | %s | %s |\n", name.c_str(), s * 1e3, s / peer,
                s / base, s / ref, faults, mb(field(j, "peak_rss")).c_str(), mb(field(j, "bytes_per_step")).c_str(),
                bytes.c_str(), time_goal.c_str(), fault_goal.c_str());
  };
  for (const auto& kv : ddp) {
    row("PyTorch " + kv.second.value("torch", std::string()) + " DDP over gloo, " + std::to_string(world) + " ranks, " +
            kv.first, kv.second, "-", "-");
  }
  if (!fsdp2.is_null()) {
    row("PyTorch " + fsdp2.value("torch", std::string()) + " FSDP2 (fully_shard per block) over gloo, " +
            std::to_string(world) + " ranks, " + fsdp2.value("allocator", std::string()), fsdp2, "-", "-");
  }
  if (!python.is_null()) row("plain PyTorch, 1 process, " + python.value("allocator", std::string()), python, "-", "-");
  if (!plain.is_null()) row("plain LibTorch, 1 process, " + plain.value("allocator", std::string()), plain, "-", "-");
  if (!side.is_null()) {
    row("plain LibTorch, " + std::to_string(world) + " processes side by side, no communication (the floor), " +
            side.value("allocator", std::string()), side, "-", "-");
  }
  for (const auto& kv : stages) {
    const int stage = kv.first;
    const json& j = kv.second;
    const double ratio = j["step_s"].get<double>() / peer, goal = stage == 3 ? 1.0 : 0.8;
    char time_goal[48], bytes[32];
    std::snprintf(time_goal, sizeof time_goal, "%s (<= %.2fx DDP)", std::isnan(ratio) ? "-" : ratio <= goal ? "pass" : "miss", goal);
    const double byte_ratio = j["bytes_per_step"].get<double>() / j["bytes_theory"].get<double>();
    std::snprintf(bytes, sizeof bytes, "%.4f %s", byte_ratio, std::fabs(byte_ratio - 1.0) <= 0.05 ? "pass" : "miss");
    row("zero stage " + std::to_string(stage) + ", " + j.value("allocator", std::string()), j, time_goal, bytes);
  }
  // Where a step's time goes, rank 0, the median over the rounds of each part.
  std::printf("\nrank 0's split of a step (ms, median over the rounds): compute is forward + backward less the waits "
              "for gathered parameters (stage 3's units, where prefetching was late); the reductions still running "
              "after backward are waited for apart; publishing is the all-gather of the updated parameters.\n\n");
  std::printf("| stage | forward + backward | of which waiting for gathers | waiting for reductions | optimizer step | "
              "publishing | step |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& kv : stage_lines) {
    std::map<std::string, std::vector<double>> parts;
    for (const json& line : kv.second) {
      if (!line.contains("split_s")) continue;
      for (const auto& part : line["split_s"].items()) parts[part.key()].push_back(part.value().get<double>() * 1e3);
    }
    const auto ms = [&](const std::string& part) {
      return parts[part].empty() ? NAN : zero_bench::median(parts[part]);
    };
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", kv.first, ms("forward") + ms("backward"),
                ms("gather_wait"), ms("reduce"), ms("step"), ms("gather"), stages[kv.first]["step_s"].get<double>() * 1e3);
  }
  std::printf("\nbytes by kind per step per rank (MB): ");
  for (const auto& kv : stages) {
    const json& k = kv.second["bytes_by_kind"];
    std::printf("stage %d: all-reduce %.2f, reduce-scatter %.2f, all-gather %.2f, broadcast %.2f; ", kv.first,
                k["all_reduce"].get<double>() / 1e6, k["reduce_scatter"].get<double>() / 1e6,
                k["all_gather"].get<double>() / 1e6, k["broadcast"].get<double>() / 1e6);
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    zero_bench::Flags flags(argc, argv,
                            {{"mode", "engine"},
                             {"stage", "0"},
                             {"out", "step_time.jsonl"},
                             {"in", "step_time.jsonl"},
                             {"world", "2"},
                             {"depth", "6"},
                             {"width", "768"},
                             {"heads", "12"},
                             {"context", "64"},
                             {"micro", "2"},
                             {"warmup", "2"},
                             {"steps", "10"},
                             {"bucket", "5e6"},
                             {"offload", "none"},
                             {"config", ""},
                             {"checkpoint", ""},
                             {"label", ""},
                             {"overlap", "1"}, {"in-memory", "0"},  // checkpoint.in_memory.interval
                             {"threads", "0"}});
    const std::string mode = flags.str("mode");
    if (mode == "plain") return run_plain(flags);
    if (mode == "engine") return run_engine(flags);
    if (mode == "report") return run_report(flags);
    throw std::invalid_argument("--mode must be engine, plain or report; got '" + mode + "'");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_step_time: %s\n", e.what());
    return 1;
  }
}
