// Larger than memory: a GPT whose training state (16 bytes a parameter:
// fp32 weights, gradients and Adam's two moments) is --state-vs-ram times
// this machine's RAM, built under zero::Init straight onto NVMe and trained
// at stage 3 with offload_param and offload_optimizer on NVMe and every
// block recomputing its activations, on a repeated batch.
// bench/run_larger_than_memory.sh measures the disk with fio and runs it:
//
//   zero-run --nproc 2 bench_larger_than_memory --state-vs-ram 2 --steps 3 --nvme DIR
//       --disk-read-bps B --disk-write-bps B [--clip 1.0] [--super-offload 0] [--nvme-gradients 0]
//
// --super-offload 1 with --clip 0 updates each sub-group inside backward,
// its NVMe reads and writes beside the backward's compute (Note [Updates
// in backward]); with clipping the update waits for the step.
// --nvme-gradients 1 keeps the reduced gradients on NVMe between backward
// and the step (Note [Gradients on NVMe]), not in host memory.
//
// The model is sized from /proc/meminfo (or --ram-bytes) and refused, with
// the bytes it needs and the bytes free, when the disk under --nvme cannot
// hold its state. Per step: the wall time on the slowest rank (median), the
// bytes this job read and wrote (/proc/self/io, every rank), and the bound:
// the larger of the compute time (one block's forward, recompute and
// backward measured alone, times the depth) and the I/O time (those bytes
// over the disk's bandwidth). Prints a report, then one JSON line.
#include <sys/statvfs.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "zero/zero.h"

using namespace zero_examples;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A field of a /proc file in kB ("MemTotal:" of /proc/meminfo, "VmRSS:" of
// /proc/self/status), in bytes; -1 when absent.
int64_t proc_bytes(const std::string& file, const std::string& field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

// The bytes of this rank's NVMe files: its swap folders under `nvme`
// (zero_swap_rank<r>_<pid>..., offload/swap_folder.h).
int64_t swap_file_bytes(const std::string& nvme, int rank) {
  namespace fs = std::filesystem;
  const std::string prefix = "zero_swap_rank" + std::to_string(rank) + "_";
  int64_t bytes = 0;
  std::error_code error;
  for (const auto& folder : fs::directory_iterator(nvme, error)) {
    if (folder.path().filename().string().rfind(prefix, 0) != 0) continue;
    for (const auto& f : fs::directory_iterator(folder.path(), error)) {
      if (f.is_regular_file(error)) bytes += static_cast<int64_t>(f.file_size(error));
    }
  }
  return bytes;
}

// Bytes this process has read from and written to storage (O_DIRECT included).
std::pair<int64_t, int64_t> io_bytes() {
  std::ifstream in("/proc/self/io");
  std::string key;
  int64_t value = 0, read = 0, written = 0;
  while (in >> key >> value) {
    if (key == "read_bytes:") read = value;
    if (key == "write_bytes:") written = value;
  }
  return {read, written};
}

// A GPT of about `params` parameters: blocks of 12 w^2 (width w, 64 per
// head), about 48 of them.
GPTOptions sized(int64_t params, int64_t context) {
  GPTOptions o;
  o.vocab_size = 256;
  o.context = context;
  const double width = std::sqrt(static_cast<double>(params) / (12.0 * 48.0));
  o.width = std::clamp<int64_t>(static_cast<int64_t>(std::llround(width / 128.0)) * 128, 128, 8192);
  o.heads = o.width / 64;
  o.depth = std::max<int64_t>(2, std::llround(static_cast<double>(params) / (12.0 * o.width * o.width + 13.0 * o.width)));
  return o;
}

std::string ds_config(const std::string& nvme, int64_t micro, int64_t bucket, int64_t prefetch, double lr, double clip,
                      bool super_offload, bool nvme_gradients) {
  json offload = {{"device", "nvme"}, {"nvme_path", nvme}};
  json offload_optimizer = offload;
  offload_optimizer["super_offload"] = super_offload;  // in backward when nothing clips (Note [Updates in backward])
  offload_optimizer["nvme_gradients"] = nvme_gradients;
  json c = {{"train_micro_batch_size_per_gpu", micro},
            {"gradient_accumulation_steps", 1},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", lr}, {"weight_decay", 0.0}}}}},
            {"gradient_clipping", clip},
            {"steps_per_print", 1000000000},
            {"activation_checkpointing", {{"checkpoint_every", 1}}},
            {"zero_optimization",
             {{"stage", 3},
              {"reduce_bucket_size", bucket},
              {"sub_group_size", bucket},
              {"stage3_param_persistence_threshold", 0},
              {"stage3_prefetch_bucket_size", prefetch},
              // Every block released after its forward (Note [Reuse distance]):
              // DeepSpeed's default keeps the last 5e8 elements gathered into backward.
              {"stage3_max_reuse_distance", 0},
              {"offload_param", offload},
              {"offload_optimizer", offload_optimizer}}}};
  return c.dump();
}

// One block's forward, recompute and backward, alone in memory: the compute
// of a step per block on this rank.
void add_times(zero::StepTimes& sum, const zero::StepTimes& t) {
  sum.steps += t.steps;
  sum.forward += t.forward;
  sum.backward += t.backward;
  sum.reduce += t.reduce;
  sum.step += t.step;
  sum.gather += t.gather;
  sum.gather_wait += t.gather_wait;
  sum.host_step += t.host_step;
  sum.nvme_wait += t.nvme_wait;
}

double block_seconds(const GPTOptions& o, int64_t micro) {
  Block block(o);
  at::Tensor x = torch::randn({micro, o.context, o.width});
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto t = Clock::now();
    {
      torch::NoGradGuard no_grad;
      block->forward(x);  // the forward whose activations are not kept
    }
    at::Tensor y = block->forward(x.detach().requires_grad_());  // the recompute
    y.sum().backward();
    best = std::min(best, since(t));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const zero_bench::Flags flags(argc, argv,
                                  {{"state-vs-ram", "2"}, {"steps", "3"}, {"nvme", ""}, {"ram-bytes", "0"},
                                   {"context", "64"}, {"micro", "1"}, {"bucket", "50000000"},
                                   {"disk-read-bps", "0"}, {"disk-write-bps", "0"}, {"out", ""},
                                   {"config-out", ""}, {"checkpoint", ""},
                                   {"prefetch", "50000000"}, {"lr", "1e-4"}, {"clip", "1.0"},
                                   {"super-offload", "0"}, {"nvme-gradients", "0"}});
    auto world = zero::comm::init_process_group();
    const int rank = world->rank(), ranks = world->size();
    at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks));
    const std::string nvme = flags.str("nvme");
    if (nvme.empty()) throw std::invalid_argument("--nvme DIR: the folder on the disk to offload to");
    const int64_t ram = flags.num("ram-bytes") > 0 ? flags.num("ram-bytes") : proc_bytes("/proc/meminfo", "MemTotal");
    const double ratio = std::stod(flags.str("state-vs-ram"));
    const int64_t micro = flags.num("micro");
    const GPTOptions options = sized(static_cast<int64_t>(ratio * static_cast<double>(ram) / 16.0), flags.num("context"));
    const int64_t block_params = 12 * options.width * options.width + 13 * options.width;
    const int64_t params = options.depth * block_params + (options.vocab_size + options.context + 2) * options.width;
    // On disk: fp32 parameter shards, master weights and two moments (16
    // bytes a parameter); the parts of construction (4) are gone by the time
    // the optimizer's files are written. With --checkpoint, a checkpoint's
    // master weights and moments (12) too. A tenth spare.
    // With --nvme-gradients, the fp32 gradients (4), unless the update in
    // backward takes them all from memory (super_offload, nothing clips).
    const bool nvme_gradients = flags.num("nvme-gradients") != 0;
    const bool gradients_written = nvme_gradients && !(flags.num("super-offload") != 0 && flags.real("clip") == 0.0);
    const double per_param = (flags.str("checkpoint").empty() ? 16.0 : 28.0) + (gradients_written ? 4.0 : 0.0);
    const int64_t needed = static_cast<int64_t>(1.1 * per_param * static_cast<double>(params));
    struct statvfs disk {};
    if (statvfs(nvme.c_str(), &disk) != 0) throw std::invalid_argument("--nvme " + nvme + ": no such folder");
    const int64_t free_bytes = static_cast<int64_t>(disk.f_bavail) * static_cast<int64_t>(disk.f_frsize);
    if (free_bytes < needed) {
      if (rank == 0) {
        std::fprintf(stderr,
                     "bench_larger_than_memory: a state %.2fx RAM (%lld parameters) needs %lld bytes under %s, "
                     "which has %lld free; free space there, point --nvme at a larger disk, or lower --state-vs-ram\n",
                     ratio, static_cast<long long>(params), static_cast<long long>(needed), nvme.c_str(),
                     static_cast<long long>(free_bytes));
      }
      return 2;
    }
    if (rank == 0) {
      std::fprintf(stderr, "model: %lld parameters (depth %lld, width %lld), state %.1f GB = %.2fx RAM %.1f GB; disk needs %.1f of %.1f GB free\n",
                   static_cast<long long>(params), static_cast<long long>(options.depth),
                   static_cast<long long>(options.width), 16e-9 * params, 16.0 * params / ram, 1e-9 * ram, 1e-9 * needed,
                   1e-9 * free_bytes);
    }
    const std::string config_text = ds_config(nvme, micro, flags.num("bucket"), flags.num("prefetch"), std::stod(flags.str("lr")),
                                                flags.real("clip"), flags.num("super-offload") != 0, nvme_gradients);
    const zero::Config config = zero::Config::from_json(config_text);
    // For `zero-config FILE --estimate` to predict this run from.
    if (rank == 0 && !flags.str("config-out").empty()) std::ofstream(flags.str("config-out")) << config_text << "\n";
    const int64_t rss_before = proc_bytes("/proc/self/status", "VmRSS");  // the process before the model: LibTorch, the transport

    // Built under zero::Init straight onto NVMe, then laid out by initialize.
    auto build = [&](GPT& model) {
      torch::manual_seed(0);
      zero::PartitionedInitOptions init;
      init.group = world;
      init.remote_device = "nvme";
      zero::Init partitioned(config, init);
      model = GPT(options);
    };
    zero::InitOptions init_options;
    init_options.group = world;
    const auto t_build = Clock::now();
    GPT model{nullptr};
    build(model);
    const double build_s = since(t_build);
    world->barrier();
    const auto [init_r0, init_w0] = io_bytes();
    const auto t_init = Clock::now();
    auto engine = std::make_unique<zero::Engine>(zero::initialize(config, model, init_options));
    const double init_s = since(t_init);
    // What initialize read (the parts of construction) and wrote (the
    // parameter shards and master weights), every rank.
    const auto [init_r1, init_w1] = io_bytes();
    at::Tensor init_io = torch::tensor({static_cast<double>(init_r1 - init_r0), static_cast<double>(init_w1 - init_w0)}, torch::kDouble);
    world->all_reduce(init_io, zero::comm::ReduceOp::Sum);
    const double init_read = init_io[0].item<double>(), init_written = init_io[1].item<double>();
    if (rank == 0) {
      std::fprintf(stderr, "built in %.1f s, initialized in %.1f s (read %.2f GB, wrote %.2f GB: %.2f GB/s)\n", build_s,
                   init_s, 1e-9 * init_read, 1e-9 * init_written, 1e-9 * init_written / init_s);
    }

    auto gen = at::detail::createCPUGenerator(1234 + rank);
    const at::Tensor tokens = torch::randint(0, options.vocab_size, {micro, options.context + 1}, gen, torch::kLong);
    std::vector<double> times, losses;
    int64_t read = 0, written = 0;
    (void)engine->take_step_times();  // the steps' own, below
    // Where rank 0's steps went (wall_clock_breakdown's clocks): the mean
    // of the steps after the first, whose optimizer creates its states.
    zero::StepTimes parts;
    for (int64_t step = 0; step < flags.num("steps"); ++step) {
      world->barrier();
      const auto [r0, w0] = io_bytes();
      const auto t = Clock::now();
      at::Tensor loss = model->loss(tokens.slice(1, 0, options.context), tokens.slice(1, 1, options.context + 1));
      engine->backward(loss);
      engine->step();
      at::Tensor slowest = torch::tensor({since(t)}, torch::kDouble);
      world->all_reduce(slowest, zero::comm::ReduceOp::Max);
      const auto [r1, w1] = io_bytes();
      at::Tensor io = torch::tensor({static_cast<double>(r1 - r0), static_cast<double>(w1 - w0)}, torch::kDouble);
      world->all_reduce(io, zero::comm::ReduceOp::Sum);
      at::Tensor mean_loss = torch::tensor({loss.item<double>()}, torch::kDouble);
      world->all_reduce(mean_loss, zero::comm::ReduceOp::Sum);
      times.push_back(slowest.item<double>());
      losses.push_back(mean_loss.item<double>() / ranks);
      read += static_cast<int64_t>(io[0].item<double>());
      written += static_cast<int64_t>(io[1].item<double>());
      const zero::StepTimes own = engine->take_step_times();
      if (step > 0 || flags.num("steps") == 1) add_times(parts, own);
      if (rank == 0) {
        std::fprintf(stderr, "step %lld: %.1f s, loss %.4f (rank 0: forward %.2f s, backward %.2f s, optimizer %.2f s)\n",
                     static_cast<long long>(step), times.back(), losses.back(), own.forward, own.backward, own.step);
      }
    }
    const int64_t steps = static_cast<int64_t>(times.size());
    const double per = parts.steps > 0 ? 1.0 / static_cast<double>(parts.steps) : 0.0;
    const json breakdown = {{"forward_s", parts.forward * per},   {"backward_s", parts.backward * per},
                            {"reduce_s", parts.reduce * per},     {"optimizer_s", parts.step * per},
                            {"publish_s", parts.gather * per},    {"gather_wait_s", parts.gather_wait * per},
                            {"host_update_s", parts.host_step * per}, {"nvme_wait_s", parts.nvme_wait * per}};
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    const double step_s = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
    at::Tensor peak = torch::tensor({static_cast<double>(zero_bench::peak_rss_bytes())}, torch::kDouble);
    world->all_reduce(peak, zero::comm::ReduceOp::Max);
    // What the model took, per rank (the most of any rank): host memory
    // beyond the process before it, and the files on NVMe after the steps
    // (every state has been written once by then).
    at::Tensor held = torch::tensor({static_cast<double>(zero_bench::peak_rss_bytes() - rss_before),
                                     static_cast<double>(swap_file_bytes(nvme, rank))},
                                    torch::kDouble);
    world->all_reduce(held, zero::comm::ReduceOp::Max);
    const zero::MemoryReport report = engine->memory_report();

    // --checkpoint DIR: save at this size, take two more steps, then build
    // the model again, resume from the checkpoint (streaming, bucket by
    // bucket) and take the same two steps: the losses must be equal.
    json checkpoint;
    if (!flags.str("checkpoint").empty()) {
      auto mean_loss_of_step = [&](zero::Engine& e, GPT& m) {
        at::Tensor loss = m->loss(tokens.slice(1, 0, options.context), tokens.slice(1, 1, options.context + 1));
        e.backward(loss);
        e.step();
        at::Tensor mean = torch::tensor({loss.item<double>()}, torch::kDouble);
        world->all_reduce(mean, zero::comm::ReduceOp::Sum);
        return mean.item<double>() / ranks;
      };
      const std::string dir = flags.str("checkpoint");
      auto t = Clock::now();
      engine->save_checkpoint(dir, "larger_than_memory");
      const double save_s = since(t);
      std::vector<double> continued, resumed;
      for (int i = 0; i < 2; ++i) continued.push_back(mean_loss_of_step(*engine, model));
      engine.reset();  // its NVMe files go: the disk holds one run and the checkpoint
      model = nullptr;
      t = Clock::now();
      build(model);
      engine = std::make_unique<zero::Engine>(zero::initialize(config, model, init_options));
      engine->load_checkpoint(dir, "larger_than_memory");
      const double resume_s = since(t);
      for (int i = 0; i < 2; ++i) resumed.push_back(mean_loss_of_step(*engine, model));
      int64_t bytes = 0;
      for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
        if (f.is_regular_file()) bytes += static_cast<int64_t>(f.file_size());
      }
      checkpoint = {{"bytes", bytes}, {"save_s", save_s}, {"rebuild_and_load_s", resume_s},
                    {"losses_continued", continued}, {"losses_resumed", resumed}, {"resumed_equal", continued == resumed}};
      if (rank == 0) {
        std::fprintf(stderr, "checkpoint: %.1f GB saved in %.1f s; rebuilt and loaded in %.1f s; losses after it %.6f %.6f, "
                     "resumed %.6f %.6f (%s)\n", 1e-9 * bytes, save_s, resume_s, continued[0], continued[1], resumed[0],
                     resumed[1], continued == resumed ? "equal" : "DIFFERENT");
      }
    }

    const double compute_s = block_seconds(options, micro) * static_cast<double>(options.depth);
    const double read_bps = static_cast<double>(flags.num("disk-read-bps"));
    const double write_bps = static_cast<double>(flags.num("disk-write-bps"));
    const double read_per_step = steps ? static_cast<double>(read) / steps : 0.0;
    const double written_per_step = steps ? static_cast<double>(written) / steps : 0.0;
    const double io_s = (read_bps > 0 ? read_per_step / read_bps : 0.0) + (write_bps > 0 ? written_per_step / write_bps : 0.0);
    const double bound_s = std::max(compute_s, io_s);
    if (rank == 0) {
      std::printf("Larger than memory: %lld parameters, state %.1f GB on %d ranks, RAM %.1f GB\n",
                  static_cast<long long>(params), 16e-9 * params, ranks, 1e-9 * ram);
      std::printf("  held by rank 0: %s\n", report.describe().c_str());
      std::printf("  per rank (most of any): host %.2f GB beyond the process before the model, NVMe files %.2f GB\n",
                  1e-9 * held[0].item<double>(), 1e-9 * held[1].item<double>());
      std::printf("  step %.1f s (median of %lld); bound %.1f s (compute %.1f s, I/O %.1f s: %s bounds it); "
                  "step/bound %.2f\n", step_s, static_cast<long long>(steps), bound_s, compute_s, io_s,
                  compute_s >= io_s ? "compute" : "I/O", bound_s > 0 ? step_s / bound_s : 0.0);
      std::printf("  NVMe per step: read %.2f GB, written %.2f GB; peak RSS per rank %.2f GB\n", 1e-9 * read_per_step,
                  1e-9 * written_per_step, 1e-9 * peak.item<double>());
      std::printf("  rank 0's step: forward %.2f s, backward %.2f s (waiting for units %.2f s), reduce %.2f s, "
                  "optimizer %.2f s (host update %.2f s, NVMe wait %.2f s), publish %.2f s\n",
                  breakdown["forward_s"].get<double>(), breakdown["backward_s"].get<double>(),
                  breakdown["gather_wait_s"].get<double>(), breakdown["reduce_s"].get<double>(),
                  breakdown["optimizer_s"].get<double>(), breakdown["host_update_s"].get<double>(),
                  breakdown["nvme_wait_s"].get<double>(), breakdown["publish_s"].get<double>());
      const json result = {{"params", params},
                           {"state_bytes", 16 * params},
                           {"ram_bytes", ram},
                           {"peak_rss_per_rank", static_cast<int64_t>(peak.item<double>())},
                           {"step_s", step_s},
                           {"bound_s", bound_s},
                           {"compute_s", compute_s},
                           {"io_s", io_s},
                           // 1: the smaller side hidden entirely behind the larger; 0: in series.
                           {"overlap", std::min(compute_s, io_s) > 0
                                           ? (compute_s + io_s - step_s) / std::min(compute_s, io_s) : 0.0},
                           {"bound_by", compute_s >= io_s ? "compute" : "io"},
                           {"gradient_clipping", flags.real("clip")},
                           {"super_offload", flags.num("super-offload") != 0},
                           {"nvme_gradients", nvme_gradients},
                           {"nvme_read_bytes_per_step", static_cast<int64_t>(read_per_step)},
                           {"nvme_write_bytes_per_step", static_cast<int64_t>(written_per_step)},
                           {"loss_first", losses.empty() ? 0.0 : losses.front()},
                           {"loss_last", losses.empty() ? 0.0 : losses.back()},
                           {"host_bytes_per_rank", static_cast<int64_t>(held[0].item<double>())},
                           {"nvme_bytes_per_rank", static_cast<int64_t>(held[1].item<double>())},
                           {"gathered_params_peak", report.gathered_params_peak},
                           {"lr", std::stod(flags.str("lr"))},
                           {"build_s", build_s},
                           {"init_s", init_s},
                           {"init_read_bytes", static_cast<int64_t>(init_read)},
                           {"init_write_bytes", static_cast<int64_t>(init_written)},
                           // Initialize writing at the disk's speed: the goal is >= 0.7 (bench/README.md).
                           {"init_write_vs_disk", write_bps > 0 ? init_written / init_s / write_bps : 0.0},
                           // Its I/O alone, reads then writes at fio's rates, over its time.
                           {"init_io_bound_s", (read_bps > 0 ? init_read / read_bps : 0.0) +
                                                   (write_bps > 0 ? init_written / write_bps : 0.0)},
                           {"checkpoint", checkpoint},
                           {"breakdown", breakdown},
                           {"model", {{"micro", micro}, {"context", options.context}, {"width", options.width},
                                      {"depth", options.depth}, {"heads", options.heads}, {"vocab", options.vocab_size}}}};
      std::printf("%s\n", result.dump().c_str());
      if (!flags.str("out").empty()) std::ofstream(flags.str("out"), std::ios::app) << result.dump() << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_larger_than_memory: %s\n", e.what());
    return 1;
  }
}
