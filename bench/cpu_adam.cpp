// The fused CPU Adam (offload/cpu_optimizer.h) against torch::optim::AdamW
// and against the memory bandwidth, measured in the same run at the same
// thread count.
//
//   bench_cpu_adam [--params 33554432] [--iters 9] [--threads 0 = all cores] [--triad 67108864]
//                  [--huge-pages 0|1]
//
// ours:   AdamW steps (weight decay 0.01) over `params` fp32 elements on each
//         SIMD path this CPU has, without and with a bf16 / fp16 copy-out,
//         and as the engine runs it in bf16 mixed precision: bf16 gradients
//         in, bf16 copy out.
// torch:  torch::optim::AdamW on one tensor of `params` elements, same
//         hyperparameters, at::set_num_threads(threads).
// triad:  a[i] = b[i] + s * c[i] over `triad` floats per array, split over the
//         same threads with oneTBB; 24 bytes per element (two reads, one
//         write; the write-allocate read is not counted, as STREAM does).
// Measured in `iters` rounds after one warm-up round, each round one triad
// pass, one step of each of ours and one torch step, so that all see the
// same machine; a step's figure is its median, the triad's its best.
// bound:  best triad bytes/s / bytes per parameter: 16 read (param, grad,
//         exp_avg, exp_avg_sq) + 12 written (param, exp_avg, exp_avg_sq) = 28,
//         +2 with the copy-out, -2 with bf16 gradients.
// --huge-pages 1: our arrays and the triad's are backed by 2 MiB pages
// (offload::advise_huge_pages, as the engine's host tensors are; torch's
// AdamW keeps its own allocations), which moves both ours and the bound.
// Prints a markdown table and the ratios ours/torch (goal >= 5) and
// ours/bound (goal >= 0.8). Exits 0 whatever it measures.
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <torch/torch.h>
#include <xmmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "offload/cpu_optimizer.h"
#include "offload/huge_pages.h"
#include "median.h"

using Clock = std::chrono::steady_clock;
using zero::offload::CopyDtype;
using zero::offload::Simd;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Whether Buffers ask for huge pages (--huge-pages).
bool g_huge_pages = false;

// Page-aligned, uninitialised; first touched by the threads that use it.
template <class T>
struct Buffer {
  T* p = nullptr;
  explicit Buffer(int64_t n) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(T);
    if (posix_memalign(reinterpret_cast<void**>(&p), 4096, bytes) != 0) {
      std::fprintf(stderr, "out of memory for %lld elements\n", static_cast<long long>(n));
      std::exit(1);
    }
    if (g_huge_pages) zero::offload::advise_huge_pages(p, bytes);
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

template <class F>
void parallel(int64_t n, const F& f) {
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, n, 1 << 16),
      [&](const tbb::blocked_range<int64_t>& r) { f(r.begin(), r.end()); }, tbb::static_partitioner());
}

// Deterministic pseudo-random floats in [-scale, scale).
float noise(uint64_t i, float scale) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return scale * (static_cast<float>(x >> 40) / static_cast<float>(1u << 23) - 1.0f);
}

struct Flags {
  int64_t params = int64_t{32} << 20;
  int64_t iters = 9;
  int64_t threads = 0;
  int64_t triad = int64_t{64} << 20;
  bool huge_pages = false;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf("usage: %s [--params N] [--iters N] [--threads N] [--triad N] [--huge-pages 0|1]\n", argv[0]);
      std::exit(0);
    }
    auto value = [&]() -> int64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::strtoll(argv[++i], nullptr, 10);
    };
    if (a == "--params") f.params = value();
    else if (a == "--iters") f.iters = value();
    else if (a == "--threads") f.threads = value();
    else if (a == "--triad") f.triad = value();
    else if (a == "--huge-pages") f.huge_pages = value() != 0;
    else {
      std::fprintf(stderr, "usage: %s [--params N] [--iters N] [--threads N] [--triad N] [--huge-pages 0|1]\n", argv[0]);
      std::exit(2);
    }
  }
  if (f.threads <= 0) f.threads = std::max(1u, std::thread::hardware_concurrency());
  f.iters = std::max<int64_t>(1, f.iters);
  return f;
}

struct Row {
  std::string name, copy;
  std::vector<double> seconds;  // step times
  double bytes;                 // per parameter
  double median_s() const { return zero_bench::median(seconds); }
};

// Triad arrays, first touched by the threads that use them.
struct Triad {
  int64_t n;
  Buffer<float> a, b, c;
  explicit Triad(int64_t n_) : n(n_), a(n_), b(n_), c(n_) {
    parallel(n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        a.p[i] = 0.0f;
        b.p[i] = 1.0f;
        c.p[i] = 2.0f;
      }
    });
  }
  // One pass; returns its seconds.
  double rep() {
    float* __restrict pa = a.p;
    const float* __restrict pb = b.p;
    const float* __restrict pc = c.p;
    const float s = 3.0f;
    const auto t0 = Clock::now();
    parallel(n, [&](int64_t lo, int64_t hi) {
      // SSE2 (every x86-64 has it): the loop must not be left to -O2's
      // vectorizer, which keeps loops of unknown trip count scalar.
      const __m128 vs = _mm_set1_ps(s);
      int64_t i = lo;
      for (; i + 8 <= hi; i += 8) {
        _mm_storeu_ps(pa + i, _mm_add_ps(_mm_loadu_ps(pb + i), _mm_mul_ps(vs, _mm_loadu_ps(pc + i))));
        _mm_storeu_ps(pa + i + 4, _mm_add_ps(_mm_loadu_ps(pb + i + 4), _mm_mul_ps(vs, _mm_loadu_ps(pc + i + 4))));
      }
      for (; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
    });
    const double t = seconds_since(t0);
    if (pa[n / 2] != 7.0f) std::fprintf(stderr, "triad: wrong result %g\n", pa[n / 2]);
    return t;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  const int64_t n = f.params;
  const int threads = static_cast<int>(f.threads);
  g_huge_pages = f.huge_pages;
  at::set_num_threads(threads);
  tbb::global_control gc(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads));

  std::printf("bench_cpu_adam: %lld parameters, %d threads, median of %lld steps; best path %s; %s pages\n\n",
              static_cast<long long>(n), threads, static_cast<long long>(f.iters),
              zero::offload::simd_name(zero::offload::best_simd()), f.huge_pages ? "huge (2 MiB)" : "4 KiB");

  // Everything is allocated first; then each round runs one triad pass, one
  // step of each of ours and one torch step, so that all of them see the same
  // machine (other processes, turbo) over the run.
  Buffer<float> p(n), g(n), m(n), v(n);
  Buffer<uint16_t> copy(n), g16(n);
  parallel(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      p.p[i] = noise(i, 1.0f);
      g.p[i] = noise(i + n, 1e-2f);
      uint32_t bits;
      std::memcpy(&bits, &g.p[i], sizeof bits);
      g16.p[i] = static_cast<uint16_t>(bits >> 16);  // truncated: any bf16 value will do
      m.p[i] = 0.0f;
      v.p[i] = 0.0f;
      copy.p[i] = 0;
    }
  });
  struct Run {
    Simd simd;
    CopyDtype copy;
    bool bf16_grads;
  };
  std::vector<Run> runs;
  for (Simd s : {Simd::kAvx512, Simd::kAvx2, Simd::kPortable})
    if (zero::offload::simd_supported(s)) runs.push_back({s, CopyDtype::kNone, false});
  runs.push_back({zero::offload::best_simd(), CopyDtype::kBFloat16, false});
  runs.push_back({zero::offload::best_simd(), CopyDtype::kHalf, false});
  runs.push_back({zero::offload::best_simd(), CopyDtype::kBFloat16, true});  // the engine's bf16 step
  std::vector<Row> rows;
  for (const Run& r : runs)
    rows.push_back({std::string("zero ") + zero::offload::simd_name(r.simd) + (r.bf16_grads ? ", bf16 grads" : ""),
                    r.copy == CopyDtype::kNone ? "-" : r.copy == CopyDtype::kHalf ? "fp16" : "bf16", {},
                    28.0 + (r.copy == CopyDtype::kNone ? 0.0 : 2.0) - (r.bf16_grads ? 2.0 : 0.0)});
  zero::offload::AdamStep h;
  h.weight_decay = 0.01f;

  torch::NoGradGuard no_grad;
  at::Tensor tp = torch::empty({n});
  at::Tensor tg = torch::empty({n});
  std::memcpy(tp.data_ptr<float>(), p.p, static_cast<size_t>(n) * sizeof(float));
  std::memcpy(tg.data_ptr<float>(), g.p, static_cast<size_t>(n) * sizeof(float));
  tp.mutable_grad() = tg;
  torch::optim::AdamW opt({tp}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  Row torch_row{"torch::optim::AdamW", "-", {}, 28.0};

  Triad triad(f.triad);
  std::vector<double> triad_s;
  for (int64_t round = 0; round <= f.iters; ++round) {  // round 0 is the warm-up
    const double t = triad.rep();
    if (round > 0) triad_s.push_back(t);
    for (size_t r = 0; r < runs.size(); ++r) {
      h.step += 1;
      const auto t0 = Clock::now();
      const zero::offload::GradArray grad =
          runs[r].bf16_grads ? zero::offload::GradArray(g16.p, zero::offload::GradDtype::kBFloat16) : g.p;
      zero::offload::adam_step(h, n, p.p, grad, m.p, v.p, copy.p, runs[r].copy, runs[r].simd);
      if (round > 0) rows[r].seconds.push_back(seconds_since(t0));
    }
    const auto t0 = Clock::now();
    opt.step();
    if (round > 0) torch_row.seconds.push_back(seconds_since(t0));
  }
  rows.push_back(torch_row);

  const double triad_best = 24.0 * static_cast<double>(f.triad) / *std::min_element(triad_s.begin(), triad_s.end());
  const double triad_median = 24.0 * static_cast<double>(f.triad) / zero_bench::median(triad_s);
  const double torch_rate = static_cast<double>(n) / torch_row.median_s();
  std::printf("| optimizer | copy | ms/step | Mparams/s | GB/s moved | vs torch | vs bound |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    const double rate = static_cast<double>(n) / r.median_s();
    const double bound = triad_best / r.bytes;
    std::printf("| %s | %s | %.1f | %.0f | %.1f | %.2f | %.2f |\n", r.name.c_str(), r.copy.c_str(),
                r.median_s() * 1e3, rate / 1e6, rate * r.bytes / 1e9, rate / torch_rate, rate / bound);
  }
  std::printf("\ntriad (a = b + s*c, %lld floats per array, 24 B/element): best %.2f GB/s, median %.2f GB/s\n",
              static_cast<long long>(f.triad), triad_best / 1e9, triad_median / 1e9);
  std::printf("bound (best triad): %.0f Mparams/s at 28 B/param, %.0f Mparams/s at 30 B/param (with copy-out)\n",
              triad_best / 28 / 1e6, triad_best / 30 / 1e6);
  const Row& best = rows.front();
  const double best_rate = static_cast<double>(n) / best.median_s();
  // Noise-robust views of the same ratio on a shared machine: fastest step
  // against fastest triad pass, and the median over rounds of the ratio
  // within a round (a step and the triad pass just before it).
  const double fastest = static_cast<double>(n) / *std::min_element(best.seconds.begin(), best.seconds.end());
  std::vector<double> paired;
  for (size_t r = 0; r < triad_s.size(); ++r)
    paired.push_back((static_cast<double>(n) / best.seconds[r]) /
                     (24.0 * static_cast<double>(f.triad) / triad_s[r] / 28.0));
  std::printf("\nours (%s) / torch = %.2f  (goal >= 5)\n", best.name.c_str(), best_rate / torch_rate);
  std::printf("ours (%s) / bound = %.2f  (goal >= 0.8; median step against best triad)\n", best.name.c_str(),
              best_rate / (triad_best / 28.0));
  std::printf("  same ratio, fastest step against best triad: %.2f; median of per-round ratios: %.2f\n",
              fastest / (triad_best / 28.0), zero_bench::median(paired));
  return 0;
}
