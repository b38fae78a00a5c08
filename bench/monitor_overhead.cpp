// What the monitors cost: the same GPT, ds_config and batches trained with
// everything off and with csv_monitor + tensorboard + comms_logger +
// flops_profiler on (its profile step inside the warm-up, so what is timed
// is the cost outside the profile step), in alternating blocks of steps in
// one run, so that the machine's noise falls on both alike. Each block
// builds a fresh engine; its first --warmup steps are not timed. Rank 0
// prints a markdown table: median step time of each side, the ratio
// (goal: at most 1.01) and the threads per process (the same on both sides).
//   zero-run --nproc 2 bench_monitor_overhead [--rounds 5 --steps 20 ...]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <vector>

#include "core/progress.h"
#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "zero/zero.h"
#include "median.h"

int main(int argc, char** argv) {
  try {
    zero_bench::Flags flags(argc, argv,
                            {{"rounds", "10"}, {"steps", "20"}, {"warmup", "3"}, {"depth", "4"}, {"width", "128"},
                             {"context", "64"}, {"micro", "8"}, {"threads", "1"}, {"stage", "2"}});
    at::set_num_threads(static_cast<int>(flags.num("threads")));
    auto world = zero::comm::init_process_group();
    at::Tensor pid = torch::tensor({static_cast<int64_t>(getpid())});
    world->broadcast(pid, 0);
    const std::string dir = (std::filesystem::temp_directory_path() / ("zero_monitor_bench_" + std::to_string(pid.item<int64_t>()))).string();
    zero_examples::GPTOptions o;
    o.vocab_size = 96;
    o.context = flags.num("context");
    o.depth = flags.num("depth");
    o.width = flags.num("width");
    o.heads = 4;
    zero_bench::TrainSetup setup;
    setup.stage = static_cast<int>(flags.num("stage"));
    setup.micro_batch = flags.num("micro");
    const std::string base = zero_bench::ds_config(setup);
    const std::string monitor = R"({"enabled": true, "output_path": ")" + dir + R"(", "job_name": "bench"})";
    const std::string on = base.substr(0, base.size() - 1) + R"(, "csv_monitor": )" + monitor + R"(, "tensorboard": )" +
                           monitor + R"(, "comms_logger": {"enabled": true}, "flops_profiler": {"enabled": true,
                           "profile_step": 1, "output_file": ")" + dir + R"(/flops.txt"}})";
    const int64_t warmup = flags.num("warmup"), steps = flags.num("steps");
    std::vector<double> times[2];  // off, on
    std::vector<double> round_ratios;  // each round's median on / median off: the noise between blocks
    zero::ProgressOptions counted;
    counted.bytes = false;
    zero::Progress progress("bench_monitor_overhead steps", flags.num("rounds") * 2 * (warmup + steps), world->rank() == 0, counted);
    for (int64_t round = 0; round < flags.num("rounds"); ++round) {
      std::vector<double> block[2];
      for (int side = 0; side < 2; ++side) {
        torch::manual_seed(0);
        zero_examples::GPT model(o);
        auto engine = zero::initialize(zero::Config::from_json(side ? on : base), model);
        for (int64_t s = 0; s < warmup + steps; ++s) {
          torch::manual_seed(1000 * s + world->rank());
          at::Tensor tokens = torch::randint(0, o.vocab_size, {setup.micro_batch, o.context + 1}, torch::kLong);
          const auto start = std::chrono::steady_clock::now();
          engine.backward(model->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1)));
          engine.step();
          const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          if (s >= warmup) times[side].push_back(seconds), block[side].push_back(seconds);
          progress.advance(1);
        }
      }
      round_ratios.push_back(zero_bench::median(block[1]) / zero_bench::median(block[0]));
    }
    progress.finish();
    if (world->rank() == 0) {
      const double off_ms = zero_bench::median(times[0]) * 1e3, on_ms = zero_bench::median(times[1]) * 1e3;
      std::sort(round_ratios.begin(), round_ratios.end());
      std::printf("| ranks | threads per process | model | steps timed per side | all off (ms/step) | "
                  "monitors + comms logger + profiler on (ms/step) | on / off | per-round on / off, min - max | goal |\n"
                  "|---|---|---|---|---|---|---|---|---|\n");
      std::printf("| %d | %lld | GPT depth %lld width %lld context %lld, micro %lld, stage %d | %zu | %.1f | %.1f | %.3f | "
                  "%.3f - %.3f | <= 1.01 |\n",
                  world->size(), static_cast<long long>(flags.num("threads")), static_cast<long long>(o.depth),
                  static_cast<long long>(o.width), static_cast<long long>(o.context),
                  static_cast<long long>(setup.micro_batch), setup.stage, times[0].size(), off_ms, on_ms, on_ms / off_ms,
                  round_ratios.front(), round_ratios.back());
      std::filesystem::remove_all(dir);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_monitor_overhead: " << e.what() << "\n";
    return 1;
  }
}
