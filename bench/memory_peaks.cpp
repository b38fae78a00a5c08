// Memory per rank at one ZeRO stage: what the engine holds (by kind), what
// zero::estimate_memory says it should hold (the formula, same Ψ, N, stage,
// dtype), and what the process really used (peak RSS; the CUDA allocator's
// peak on a GPU). Rank 0 appends one JSON line to --out; bench_memory_report
// turns the lines into a markdown table and an SVG chart.
//
//   zero-run --nproc 2 bench_memory_peaks --stage 2 --dtype bf16 --out peaks.jsonl
//            [--depth 8] [--width 256] [--heads 4] [--context 64] [--micro 4]
//            [--steps 3] [--bucket 500000] [--reuse ELEMENTS] [--device auto|cpu|cuda]
//
// Each stage runs in processes of its own (peak RSS is a per-process high
// water mark): bench/run_memory_peaks.sh runs stages 0-3 in fp32 and bf16,
// and stage 3 twice: at DeepSpeed's default stage3_max_reuse_distance (1e9:
// every unit gathered in forward stays gathered for backward, Note [Reuse
// distance]) and with --reuse 0 (each unit released after use).
//
// Figures per rank:
//   rss_baseline  peak RSS before the model is built (LibTorch, gloo, the
//                 corpus): what every process pays whatever the stage
//   rss_after_init  peak RSS after zero::initialize, before the first step
//   peak_rss      peak RSS after the last step
//   held          engine.memory_report() after the last step
//   cuda_peak     the CUDA caching allocator's peak allocated bytes (CUDA only)
// The estimate counts model states on the device only (its `device` totals);
// it leaves out the module's buffers, activations and temporaries, and at
// stage 3 the gathered parameters of the units in use.
#include <torch/torch.h>

#if ZERO_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpt/corpus.h"
#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "partition/estimate.h"
#include "zero/zero.h"

using namespace zero_examples;

namespace {

int64_t cuda_peak_bytes(const at::Device& device) {
#if ZERO_TORCH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<int64_t>(stats.allocated_bytes[0].peak);  // [0]: aggregate over pool kinds
  }
#endif
  (void)device;
  return -1;
}

// The per-rank figures, in the order they travel in the all-gather.
enum Field { kRssBaseline, kRssAfterInit, kPeakRss, kParams, kGrads, kMaster, kOptim, kBuffers, kCudaPeak, kGatheredPeak, kFields };

std::string kinds_json(int64_t params, int64_t grads, int64_t master, int64_t optim, int64_t buffers) {
  std::ostringstream j;
  j << "{\"params\": " << params << ", \"gradients\": " << grads << ", \"fp32_master\": " << master
    << ", \"optimizer_states\": " << optim;
  const int64_t states = params + grads + master + optim;
  j << ", \"model_states\": " << states;
  if (buffers >= 0) j << ", \"buffers\": " << buffers << ", \"total\": " << states + buffers;
  j << "}";
  return j.str();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    zero_bench::Flags flags(argc, argv,
                            {{"stage", "0"},
                             {"dtype", "fp32"},
                             {"out", "memory_peaks.jsonl"},
                             {"depth", "8"},
                             {"width", "256"},
                             {"heads", "4"},
                             {"context", "64"},
                             {"micro", "4"},
                             {"steps", "3"},
                             {"bucket", "500000"},
                             {"reuse", "-1"},  // negative: the config leaves the key out
                             {"device", "auto"}});
    zero_bench::TrainSetup setup;
    setup.stage = static_cast<int>(flags.num("stage"));
    setup.dtype = flags.str("dtype");
    setup.micro_batch = flags.num("micro");
    setup.reduce_bucket_size = flags.num("bucket");
    setup.stage3_max_reuse_distance = flags.num("reuse");
    const int64_t steps = flags.num("steps");

    auto world = zero::comm::init_process_group();
    const int rank = world->rank(), N = world->size();
    // The cores shared out among the ranks, as a launcher per node would.
    at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / N));
    const at::Device device = zero_bench::bench_device(flags.str("device"));

    Corpus corpus;
    Batcher train(corpus.train_tokens(), BatcherOptions{0, 1});
    const int64_t rss_baseline = zero_bench::peak_rss_bytes();

    GPTOptions options;
    options.vocab_size = corpus.vocab_size();
    options.depth = flags.num("depth");
    options.width = flags.num("width");
    options.heads = flags.num("heads");
    options.context = flags.num("context");
    torch::manual_seed(0);
    GPT model(options);
    model->to(device);
    const int64_t psi = model->num_parameters();

    zero::InitOptions init;
    init.group = world;
    auto engine = zero::initialize(zero::Config::from_json(zero_bench::ds_config(setup)), model, init);
    const int64_t rss_after_init = zero_bench::peak_rss_bytes();
    for (int64_t step = 0; step < steps; ++step) {
      Batch batch = train.next_batch(setup.micro_batch, options.context, rank, N, step, 0);
      engine.backward(model->loss(batch.inputs.to(device), batch.targets.to(device)));
      engine.step();
    }
    const zero::MemoryReport held = engine.memory_report();
    const int64_t peak_rss = zero_bench::peak_rss_bytes();

    // Every rank's figures to every rank (a small int64 all-gather).
    at::Tensor mine = torch::tensor(std::vector<int64_t>{rss_baseline, rss_after_init, peak_rss, held.params, held.gradients,
                                                         held.fp32_master, held.optimizer_states, held.buffers,
                                                         cuda_peak_bytes(device), held.gathered_params_peak},
                                    torch::kInt64);
    at::Tensor all = torch::zeros({N * kFields}, torch::kInt64);
    world->all_gather(all, mine);

    zero::EstimateInput in;
    in.params = psi;
    in.world_size = N;
    in.stage = setup.stage;
    in.dtype_bytes = setup.dtype == "fp32" ? 4 : 2;
    in.mixed_precision = setup.dtype != "fp32";
    in.state_bytes_per_element = zero::optimizer_state_bytes("AdamW", false, 0.0);
    in.reduce_bucket_size = setup.reduce_bucket_size;
    in.overlap_comm = engine.config().zero_optimization.overlap_comm;
    in.stage3_max_live_parameters = engine.config().zero_optimization.stage3_max_live_parameters;
    in.stage3_max_reuse_distance = engine.config().zero_optimization.stage3_max_reuse_distance;
    in.stage3_prefetch_bucket_size = engine.config().zero_optimization.stage3_prefetch_bucket_size;
    // The largest unit: a block, or the parameters outside the blocks
    // (embeddings, head). Counted gathered: at stage 3 a released
    // parameter has 0 elements between its unit's uses.
    int64_t outside_blocks = psi;
    for (int64_t i = 0; i < options.depth; ++i) {
      int64_t block = 0;
      for (const auto& p : model->block(static_cast<size_t>(i))->parameters()) block += zero::gathered_numel(p);
      in.unit_params = std::max(in.unit_params, block);
      outside_blocks -= block;
    }
    in.unit_params = std::max(in.unit_params, outside_blocks);
    in.root_params = outside_blocks;  // kept gathered at stage 3; bounds its buckets
    in.stage3_param_persistence_threshold = engine.config().zero_optimization.stage3_param_persistence_threshold;
    for (const auto& p : model->parameters()) in.largest_tensor = std::max(in.largest_tensor, zero::gathered_numel(p));
    const zero::MemoryEstimate est = zero::estimate_memory(in);

    if (rank == 0) {
      auto a = all.accessor<int64_t, 1>();
      std::ostringstream line;
      line << "{\"bench\": \"memory_peaks\", \"stage\": " << setup.stage << ", \"dtype\": \"" << setup.dtype
           << "\", \"world\": " << N << ", \"params\": " << psi << ", \"depth\": " << options.depth
           << ", \"width\": " << options.width << ", \"context\": " << options.context
           << ", \"micro\": " << setup.micro_batch << ", \"steps\": " << steps
           << ", \"reduce_bucket_size\": " << setup.reduce_bucket_size
           << ", \"stage3_max_reuse_distance\": " << in.stage3_max_reuse_distance
           << ", \"stage3_max_live_parameters\": " << in.stage3_max_live_parameters << ", \"device\": \"" << (device.is_cuda() ? "cuda" : "cpu")
           << "\", \"estimate\": "
           << kinds_json(est.device.params, est.device.gradients, est.device.fp32_master,
                         est.device.optimizer_states, -1)
           << ", \"estimate_reduce_buffers\": " << est.reduce_buffers
           << ", \"estimate_gathered_params_max\": " << est.gathered_params_max << ", \"ranks\": [";
      for (int r = 0; r < N; ++r) {
        const int64_t* f = &a[r * kFields];
        line << (r ? ", " : "") << "{\"rank\": " << r << ", \"rss_baseline\": " << f[kRssBaseline]
             << ", \"rss_after_init\": " << f[kRssAfterInit] << ", \"peak_rss\": " << f[kPeakRss] << ", \"cuda_peak\": ";
        if (f[kCudaPeak] >= 0) line << f[kCudaPeak];
        else line << "null";
        line << ", \"gathered_peak\": " << f[kGatheredPeak];
        line << ", \"held\": " << kinds_json(f[kParams], f[kGrads], f[kMaster], f[kOptim], f[kBuffers]) << "}";
      }
      line << "]}";
      std::ofstream out(flags.str("out"), std::ios::app);
      out << line.str() << "\n";
      if (!out) throw std::runtime_error("cannot append to " + flags.str("out"));
      const double mib = 1024.0 * 1024.0;
      std::printf("stage %d %s: %lld params, %d ranks, %s: held %.1f MiB (formula %.1f MiB), peak RSS %.1f MiB "
                  "(%.1f MiB before the model), CUDA peak %s\n",
                  setup.stage, setup.dtype.c_str(), (long long)psi, N, device.is_cuda() ? "cuda" : "cpu", held.total() / mib,
                  est.device.total() / mib, peak_rss / mib, rss_baseline / mib,
                  a[kCudaPeak] >= 0 ? (std::to_string(a[kCudaPeak] / (1 << 20)) + " MiB").c_str() : "n/a");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_memory_peaks: %s\n", e.what());
    return 1;
  }
}
