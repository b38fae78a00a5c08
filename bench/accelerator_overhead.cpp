// What the Accelerator costs: the same GPT, ds_config and global batches
// trained through zero::Accelerator (its DataLoader, accumulate, backward)
// and through the engine called directly (rows sliced from the same token
// tensor by hand), in alternating blocks of steps in one run (which side
// goes first alternates too) so that the machine's noise falls on both alike; each block builds a fresh engine and
// its first --warmup steps are not timed. A step's time includes fetching
// its batch on both sides. Then the loader alone: batches per second over
// whole epochs, against the engine's step rate. Rank 0 prints two markdown
// tables (goal: through / direct at most 1.02; loader well above the step rate).
//   zero-run --nproc 2 bench_accelerator_overhead [--rounds 5 --steps 20 ...]
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <vector>

#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "zero/accelerate.h"
#include "zero/zero.h"
#include "median.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    zero_bench::Flags flags(argc, argv,
                            {{"rounds", "10"}, {"steps", "20"}, {"warmup", "3"}, {"depth", "4"}, {"width", "128"},
                             {"context", "64"}, {"micro", "16"}, {"threads", "1"}, {"stage", "2"}});
    at::set_num_threads(static_cast<int>(flags.num("threads")));
    auto world = zero::comm::init_process_group();
    const int ranks = world->size(), rank = world->rank();
    zero_examples::GPTOptions o;
    o.vocab_size = 96;
    o.context = flags.num("context");
    o.depth = flags.num("depth");
    o.width = flags.num("width");
    o.heads = 4;
    zero_bench::TrainSetup setup;
    setup.stage = static_cast<int>(flags.num("stage"));
    setup.micro_batch = flags.num("micro");
    const int64_t warmup = flags.num("warmup"), steps = flags.num("steps");

    // The ds_config as a file, for the Accelerator; the engine gets the same text.
    at::Tensor pid = torch::tensor({static_cast<int64_t>(getpid())});
    world->broadcast(pid, 0);
    const auto ds_path = std::filesystem::temp_directory_path() /
                         ("zero_accelerator_bench_" + std::to_string(pid.item<int64_t>()) + ".json");
    const std::string ds_text = zero_bench::ds_config(setup);
    if (rank == 0) std::ofstream(ds_path) << ds_text;
    world->barrier();

    // Token windows for every step of a block, global batch = micro x ranks.
    const int64_t global = setup.micro_batch * ranks;
    const int64_t samples = (warmup + steps) * global;
    torch::manual_seed(7);
    const at::Tensor windows = torch::randint(0, o.vocab_size, {samples, o.context + 1}, torch::kLong);
    auto dataset = std::make_shared<zero::TensorDataset>(
        std::vector<at::Tensor>{windows.slice(1, 0, -1).contiguous(), windows.slice(1, 1).contiguous()});

    std::vector<double> times[2];  // direct, through the Accelerator
    std::vector<double> round_ratios;
    for (int64_t round = 0; round < flags.num("rounds"); ++round) {
      std::vector<double> block[2];
      for (int turn = 0; turn < 2; ++turn) {
        const int side = (turn + round) % 2;  // ABBA: neither side always goes first
        torch::manual_seed(0);
        zero_examples::GPT model(o);
        if (side == 0) {
          auto engine = zero::initialize(zero::Config::from_json(ds_text), model);
          for (int64_t s = 0; s < warmup + steps; ++s) {
            const auto start = Clock::now();
            const at::Tensor rows = torch::arange(s * global + rank * setup.micro_batch,
                                                  s * global + (rank + 1) * setup.micro_batch, torch::kLong);
            const auto batch = dataset->get_batch(std::vector<int64_t>(rows.data_ptr<int64_t>(),
                                                                       rows.data_ptr<int64_t>() + rows.numel()));
            engine.backward(model->loss(batch[0], batch[1]));
            engine.step();
            if (s >= warmup) block[0].push_back(seconds_since(start));
          }
        } else {
          zero::AcceleratorOptions options;
          options.ds_config = ds_path.string();
          options.launch_config = "";
          zero::Accelerator acc(options);
          zero::DataLoaderOptions loader_options;
          loader_options.batch_size = setup.micro_batch;
          loader_options.shuffle = false;  // the rows the direct side takes
          auto loader = acc.prepare(dataset, loader_options);
          acc.prepare(model);
          int64_t s = 0;
          auto start = Clock::now();
          for (const auto& batch : loader) {  // the fetch of the next batch is part of the step
            acc.accumulate([&] { acc.backward(model->loss(batch[0], batch[1])); });
            if (s++ >= warmup) block[1].push_back(seconds_since(start));
            start = Clock::now();
          }
        }
      }
      for (int side = 0; side < 2; ++side) times[side].insert(times[side].end(), block[side].begin(), block[side].end());
      round_ratios.push_back(zero_bench::median(block[1]) / zero_bench::median(block[0]));
    }

    // The loader alone over whole epochs (shuffled, as in training).
    zero::AcceleratorOptions options;
    options.ds_config = ds_path.string();
    zero::Accelerator acc(options);
    zero::DataLoaderOptions loader_options;
    loader_options.batch_size = setup.micro_batch;
    auto loader = acc.prepare(dataset, loader_options);
    int64_t batches = 0;
    const auto start = Clock::now();
    for (int64_t epoch = 0; epoch < 20; ++epoch) {
      loader.set_epoch(epoch);
      for (const auto& batch : loader) batches += batch[0].size(0) > 0;
    }
    const double loader_rate = static_cast<double>(batches) / seconds_since(start);

    if (rank == 0) {
      const double direct_ms = zero_bench::median(times[0]) * 1e3, through_ms = zero_bench::median(times[1]) * 1e3;
      std::sort(round_ratios.begin(), round_ratios.end());
      std::printf("| ranks | threads per process | model | steps timed per side | engine direct (ms/step) | "
                  "through the Accelerator (ms/step) | through / direct | per-round, min - max | goal |\n"
                  "|---|---|---|---|---|---|---|---|---|\n");
      std::printf("| %d | %lld | GPT depth %lld width %lld context %lld, micro %lld, stage %d | %zu | %.1f | %.1f | "
                  "%.3f | %.3f - %.3f | <= 1.02 |\n\n",
                  ranks, static_cast<long long>(flags.num("threads")), static_cast<long long>(o.depth),
                  static_cast<long long>(o.width), static_cast<long long>(o.context),
                  static_cast<long long>(setup.micro_batch), setup.stage, times[0].size(), direct_ms, through_ms,
                  through_ms / direct_ms, round_ratios.front(), round_ratios.back());
      std::printf("| loader batches/s per rank (shuffled, %lld rows of %lld tokens) | training steps/s (direct) | "
                  "loader / steps |\n|---|---|---|\n| %.0f | %.1f | %.0fx |\n",
                  static_cast<long long>(setup.micro_batch), static_cast<long long>(o.context + 1), loader_rate,
                  1e3 / direct_ms, loader_rate * direct_ms / 1e3);
      std::filesystem::remove(ds_path);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_accelerator_overhead: " << e.what() << "\n";
    return 1;
  }
}
