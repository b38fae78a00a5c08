// Fused CPU optimizer steps: run-time choice of the SIMD path, the per-step
// scalars (in double, as torch::optim), and the split into tiles over oneTBB.
#include "offload/cpu_optimizer.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/env.h"
#include "offload/cpu_optimizer_kernels.h"
#include "zero/error.h"

namespace zero::offload {
namespace {

// Elements per tile: 16Ki floats are 64 KiB per array. A task takes whole
// tiles, so tile boundaries fall at multiples of kTile whatever the thread
// count (not that it matters: every element gets the same instructions).
constexpr int64_t kTile = 16 * 1024;

struct CpuFeatures {
  bool avx2 = false;
  bool avx512 = false;
  std::string avx2_missing, avx512_missing;
};

const CpuFeatures& features() {
  static const CpuFeatures f = [] {
    CpuFeatures r;
    __builtin_cpu_init();
    auto need = [](bool have, const char* name, std::string& missing) {
      if (!have) missing += (missing.empty() ? "" : ", ") + std::string(name);
      return have;
    };
    // __builtin_cpu_supports also checks that the OS saves the AVX/AVX-512 state.
    r.avx2 = need(__builtin_cpu_supports("avx2"), "avx2", r.avx2_missing) &
             need(__builtin_cpu_supports("fma"), "fma", r.avx2_missing) &
             need(__builtin_cpu_supports("f16c"), "f16c", r.avx2_missing);
    r.avx512 = need(__builtin_cpu_supports("avx512f"), "avx512f", r.avx512_missing) &
               need(__builtin_cpu_supports("avx512bw"), "avx512bw", r.avx512_missing) &
               need(__builtin_cpu_supports("avx512vl"), "avx512vl", r.avx512_missing) &
               need(__builtin_cpu_supports("avx512dq"), "avx512dq", r.avx512_missing) &
               need(__builtin_cpu_supports("fma"), "fma", r.avx512_missing) &
               need(__builtin_cpu_supports("f16c"), "f16c", r.avx512_missing);
    return r;
  }();
  return f;
}

std::string supported_list() {
  std::string s = "portable";
  if (simd_supported(Simd::kAvx2)) s += ", avx2";
  if (simd_supported(Simd::kAvx512)) s += ", avx512";
  return s;
}

void require_supported(Simd s, const char* who) {
  if (simd_supported(s)) return;
  const CpuFeatures& f = features();
  std::string missing = s == Simd::kAvx512 ? f.avx512_missing : s == Simd::kAvx2 ? f.avx2_missing : "";
  throw OffloadError(std::string(who) + ": the " + simd_name(s) + " path needs CPU features this machine lacks (" +
                     missing + "); paths supported here: " + supported_list());
}

void check_arrays(const char* who, int64_t n, std::initializer_list<const void*> arrays, const uint16_t* copy,
                  CopyDtype copy_dtype) {
  if (n < 0) throw OffloadError(std::string(who) + ": negative element count " + std::to_string(n));
  if (n == 0) return;
  for (const void* a : arrays)
    if (a == nullptr) throw OffloadError(std::string(who) + ": null parameter, gradient or state array for " +
                                         std::to_string(n) + " elements");
  if (copy_dtype != CopyDtype::kNone && copy == nullptr)
    throw OffloadError(std::string(who) + ": copy_dtype asks for an fp16/bf16 copy but `copy` is null");
}

// Runs f(offset, count) over [0, n) in whole tiles, on the current task arena.
template <class F>
void for_tiles(int64_t n, const F& f) {
  if (n <= kTile) {
    if (n > 0) f(0, n);
    return;
  }
  const int64_t tiles = (n + kTile - 1) / kTile;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, tiles), [&](const tbb::blocked_range<int64_t>& r) {
    const int64_t begin = r.begin() * kTile;
    const int64_t end = std::min(n, r.end() * kTile);
    f(begin, end - begin);
  });
}

// Where element `offset` of a gradient array starts.
const void* grad_at(GradArray grad, int64_t offset) {
  return static_cast<const char*>(grad.data) + offset * grad.element_size();
}

}  // namespace

bool simd_supported(Simd s) {
  switch (s) {
    case Simd::kPortable: return true;
    case Simd::kAvx2: return features().avx2;
    case Simd::kAvx512: return features().avx512;
  }
  return false;
}

Simd best_simd() {
  if (simd_supported(Simd::kAvx512)) return Simd::kAvx512;
  if (simd_supported(Simd::kAvx2)) return Simd::kAvx2;
  return Simd::kPortable;
}

const char* simd_name(Simd s) {
  switch (s) {
    case Simd::kPortable: return "portable";
    case Simd::kAvx2: return "avx2";
    case Simd::kAvx512: return "avx512";
  }
  return "unknown";
}

Simd default_simd() {
  const std::string forced = env::cpu_optimizer_simd();
  if (forced.empty()) return best_simd();
  for (Simd s : {Simd::kPortable, Simd::kAvx2, Simd::kAvx512}) {
    if (forced == simd_name(s)) {
      require_supported(s, "ZERO_CPU_OPTIMIZER_SIMD");
      return s;
    }
  }
  throw OffloadError("ZERO_CPU_OPTIMIZER_SIMD=" + forced +
                     ": unknown path; use portable, avx2 or avx512 (supported here: " + supported_list() +
                     "), or unset it for the best one");
}

void adam_step(const AdamStep& h, int64_t n, float* param, GradArray grad, float* exp_avg, float* exp_avg_sq,
               uint16_t* copy, CopyDtype copy_dtype, Simd simd) {
  require_supported(simd, "adam_step");
  check_arrays("adam_step", n, {param, grad.data, exp_avg, exp_avg_sq}, copy, copy_dtype);
  if (h.step < 1) throw OffloadError("adam_step: step " + std::to_string(h.step) + " (1-based; increment before)");

  // As torch::optim::Adam/AdamW: hyperparameters are doubles there, the
  // scalars are computed in double and rounded to float by the tensor ops.
  const double beta1 = h.beta1, beta2 = h.beta2, lr = h.lr, wd = h.weight_decay;
  double bc1 = 1.0, bc2 = 1.0;
  if (h.bias_correction) {
    bc1 = 1.0 - std::pow(beta1, static_cast<double>(h.step));
    bc2 = 1.0 - std::pow(beta2, static_cast<double>(h.step));
  }
  detail::AdamScalars s{};
  s.beta1 = h.beta1;
  s.omb1 = static_cast<float>(1.0 - beta1);
  s.beta2 = h.beta2;
  s.omb2 = static_cast<float>(1.0 - beta2);
  s.eps = h.eps;
  s.step_size = static_cast<float>(lr / bc1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.grad_scale = h.grad_scale;
  s.l2 = h.weight_decay;
  s.decay = static_cast<float>(1.0 - lr * wd);
  s.apply_l2 = !h.decoupled_weight_decay && h.weight_decay != 0.0f;
  s.apply_decay = h.decoupled_weight_decay && h.weight_decay != 0.0f;

  detail::AdamKernel kernel = simd == Simd::kAvx512 ? detail::adam_avx512
                              : simd == Simd::kAvx2 ? detail::adam_avx2
                                                    : detail::adam_portable;
  for_tiles(n, [&](int64_t off, int64_t count) {
    kernel(s, count, param + off, grad_at(grad, off), grad.dtype, exp_avg + off, exp_avg_sq + off,
           copy_dtype == CopyDtype::kNone ? nullptr : copy + off, copy_dtype);
  });
}

void adam_step(const AdamStep& h, int64_t n, float* param, GradArray grad, float* exp_avg, float* exp_avg_sq,
               uint16_t* copy, CopyDtype copy_dtype) {
  adam_step(h, n, param, grad, exp_avg, exp_avg_sq, copy, copy_dtype, default_simd());
}

void adagrad_step(const AdagradStep& h, int64_t n, float* param, GradArray grad, float* sum, uint16_t* copy,
                  CopyDtype copy_dtype, Simd simd) {
  require_supported(simd, "adagrad_step");
  check_arrays("adagrad_step", n, {param, grad.data, sum}, copy, copy_dtype);
  if (h.step < 1) throw OffloadError("adagrad_step: step " + std::to_string(h.step) + " (1-based; increment before)");

  // As torch::optim::Adagrad: clr = lr / (1 + (step - 1) * lr_decay) in double.
  detail::AdagradScalars s{};
  s.eps = h.eps;
  s.clr = static_cast<float>(static_cast<double>(h.lr) /
                             (1.0 + static_cast<double>(h.step - 1) * static_cast<double>(h.lr_decay)));
  s.l2 = h.weight_decay;
  s.apply_l2 = h.weight_decay != 0.0f;
  s.grad_scale = h.grad_scale;

  detail::AdagradKernel kernel = simd == Simd::kAvx512 ? detail::adagrad_avx512
                                 : simd == Simd::kAvx2 ? detail::adagrad_avx2
                                                       : detail::adagrad_portable;
  for_tiles(n, [&](int64_t off, int64_t count) {
    kernel(s, count, param + off, grad_at(grad, off), grad.dtype, sum + off, copy_dtype == CopyDtype::kNone ? nullptr : copy + off,
           copy_dtype);
  });
}

void adagrad_step(const AdagradStep& h, int64_t n, float* param, GradArray grad, float* sum, uint16_t* copy,
                  CopyDtype copy_dtype) {
  adagrad_step(h, n, param, grad, sum, copy, copy_dtype, default_simd());
}

namespace {

// x[i] as a double: fp32, or fp16/bf16 bits widened exactly.
template <GradDtype kDtype>
double element(const void* x, int64_t i) {
  if constexpr (kDtype == GradDtype::kFloat) {
    return static_cast<const float*>(x)[i];
  } else if constexpr (kDtype == GradDtype::kHalf) {
    return detail::widen_half(static_cast<const uint16_t*>(x)[i]);
  } else {
    return detail::widen_bf16(static_cast<const uint16_t*>(x)[i]);
  }
}

template <GradDtype kDtype>
double sum_of_squares_of(const void* x, int64_t n) {
  if (n <= 0) return 0.0;
  const int64_t tiles = (n + kTile - 1) / kTile;
  std::vector<double> partial(static_cast<size_t>(tiles));
  for_tiles(n, [&](int64_t off, int64_t count) {
    // Whole tiles: one sum per tile, eight independent accumulators in it.
    for (int64_t t = off / kTile; t * kTile < off + count; ++t) {
      const int64_t begin = t * kTile, end = std::min(n, begin + kTile);
      double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = begin;
      for (; i + 8 <= end; i += 8) {
        for (int k = 0; k < 8; ++k) {
          const double e = element<kDtype>(x, i + k);
          acc[k] += e * e;
        }
      }
      for (; i < end; ++i) {
        const double e = element<kDtype>(x, i);
        acc[0] += e * e;
      }
      partial[t] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

double sum_of_squares(GradArray x, int64_t n) {
  switch (x.dtype) {
    case GradDtype::kHalf: return sum_of_squares_of<GradDtype::kHalf>(x.data, n);
    case GradDtype::kBFloat16: return sum_of_squares_of<GradDtype::kBFloat16>(x.data, n);
    case GradDtype::kFloat: break;
  }
  return sum_of_squares_of<GradDtype::kFloat>(x.data, n);
}

}  // namespace zero::offload
