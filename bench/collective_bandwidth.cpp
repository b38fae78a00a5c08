// Collective bandwidth on host tensors: all-reduce, reduce-scatter and
// all-gather from 1 MiB to 256 MiB, reported as algorithm and bus bandwidth
// (nccl-tests' definitions) beside memcpy bandwidth measured in the same run.
// Run: zero-run --nproc 2 bench_collectives [--max-mib 256] [--iters 5]
//      (bench/run_collectives.sh runs 2 and 4 ranks).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "zero/zero.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of `iters` runs of `body` after one warm-up, agreed across
// ranks (the slowest rank's time for each run).
double median_seconds(zero::comm::ProcessGroup& world, int iters, const std::function<void()>& body) {
  body();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    world.barrier();
    const auto start = Clock::now();
    body();
    at::Tensor t = torch::tensor({std::chrono::duration<double>(Clock::now() - start).count()}, torch::kDouble);
    world.all_reduce(t, zero::comm::ReduceOp::Max);
    times.push_back(t.item<double>());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
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
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--max-mib") max_mib = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--iters") iters = std::stoi(argv[i + 1]);
  }
  at::set_num_threads(1);
  auto world = zero::comm::init_process_group();
  const int W = world->size();
  const double ring = double(W - 1) / W;
  if (world->rank() == 0) {
    std::printf("# collectives over gloo (TCP loopback), %d ranks, fp32, median of %d\n", W, iters);
    std::printf("%-15s %9s %10s %10s %11s %12s\n", "op", "size MiB", "time ms", "algbw GB/s", "busbw GB/s",
                "busbw/memcpy");
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
      const double seconds = median_seconds(*world, iters, c.run);
      const double algbw = n * 4.0 / seconds / 1e9;
      if (world->rank() == 0) {
        std::printf("%-15s %9d %10.2f %10.2f %11.2f %12.3f\n", c.name, mib, seconds * 1e3, algbw,
                    algbw * c.bus_factor, algbw * c.bus_factor / copy);
      }
    }
    if (world->rank() == 0) std::printf("%-15s %9d %10s %10.2f %11s %12s\n", "memcpy (ref)", mib, "", copy, "", "");
  }
  return 0;
}
