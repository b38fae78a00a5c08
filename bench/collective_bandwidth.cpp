// Collective bandwidth on host tensors: all-reduce, reduce-scatter and
// all-gather from 1 MiB to 256 MiB, reported as algorithm and bus bandwidth
// (nccl-tests' definitions) beside memcpy bandwidth measured in the same run,
// and the CPU time the collective costs this process (user + system, all
// threads): on CPU ranks that time is taken from the ranks' compute.
// Run: zero-run --nproc 2 bench_collectives [--max-mib 256] [--iters 5]
//      (bench/run_collectives.sh runs 2 and 4 ranks, over both transports).
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "zero/zero.h"

namespace {

using Clock = std::chrono::steady_clock;

double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

struct Timing {
  double seconds;      // the slowest rank's wall time, median over runs
  double cpu_seconds;  // this process's CPU time, median over runs
};

// `iters` runs of `body` after one warm-up.
Timing measure(zero::comm::ProcessGroup& world, int iters, const std::function<void()>& body) {
  body();
  std::vector<double> times, cpu;
  for (int i = 0; i < iters; ++i) {
    world.barrier();
    const double cpu_start = cpu_seconds();
    const auto start = Clock::now();
    body();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    cpu.push_back(cpu_seconds() - cpu_start);
    at::Tensor t = torch::tensor({seconds}, torch::kDouble);
    world.all_reduce(t, zero::comm::ReduceOp::Max);
    times.push_back(t.item<double>());
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu.begin(), cpu.end());
  return {times[times.size() / 2], cpu[cpu.size() / 2]};
}

double memcpy_gbps(size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> times;
  for (int i = 0; i <= iters; ++i) {
    const auto start = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin() + 1, times.end());  // drop the first (page faults)
  return bytes / times[1 + iters / 2] / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int max_mib = 256, iters = 5;
  const char* usage = "usage: bench_collectives [--max-mib N] [--iters N] (under zero-run --nproc N)\n";
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "-h" || key == "--help") {
      std::printf("%s", usage);
      return 0;
    }
    const int value = i + 1 < argc ? std::atoi(argv[i + 1]) : 0;
    if ((key != "--max-mib" && key != "--iters") || value <= 0) {
      std::fprintf(stderr, "bench_collectives: %s needs a whole number >= 1 and is --max-mib or --iters\n%s", key.c_str(), usage);
      return 2;
    }
    (key == "--max-mib" ? max_mib : iters) = value;
  }
  at::set_num_threads(1);
  auto world = zero::comm::init_process_group();
  const int W = world->size();
  const double ring = double(W - 1) / W;
  if (world->rank() == 0) {
    const std::string transport = world->host_transport();
    std::printf("# collectives over %s, %d ranks, fp32, median of %d\n",
                transport == "shm" ? "shared memory" : "gloo (TCP loopback)", W, iters);
    std::printf("%-15s %9s %10s %10s %11s %12s %12s\n", "op", "size MiB", "time ms", "algbw GB/s", "busbw GB/s",
                "busbw/memcpy", "CPU ms/rank");
  }
  for (int mib = 1; mib <= max_mib; mib *= 4) {
    const size_t bytes = size_t(mib) << 20;
    const int64_t n = bytes / 4 / W * W;  // elements, a multiple of W
    const double copy = memcpy_gbps(bytes, iters);
    at::Tensor full = torch::ones({n});
    at::Tensor part = torch::ones({n / W});
    struct Case {
      const char* name;
      std::function<void()> run;
      double bus_factor;  // busbw = algbw * factor (nccl-tests)
    };
    std::vector<Case> cases = {
        {"all_reduce", [&] { world->all_reduce(full); }, 2 * ring},
        {"reduce_scatter", [&] { world->reduce_scatter(part, full); }, ring},
        {"all_gather", [&] { world->all_gather(full, part); }, ring},
    };
    for (auto& c : cases) {
      const Timing timing = measure(*world, iters, c.run);
      const double algbw = n * 4.0 / timing.seconds / 1e9;
      if (world->rank() == 0) {
        std::printf("%-15s %9d %10.2f %10.2f %11.2f %12.3f %12.2f\n", c.name, mib, timing.seconds * 1e3, algbw,
                    algbw * c.bus_factor, algbw * c.bus_factor / copy, timing.cpu_seconds * 1e3);
      }
    }
    if (world->rank() == 0) std::printf("%-15s %9d %10s %10.2f %11s %12s\n", "memcpy (ref)", mib, "", copy, "", "");
  }
  return 0;
}
