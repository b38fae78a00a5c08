// AVX2 + FMA + F16C loops of the CPU optimizers, 8 floats a vector.
// Compiled with -mavx2 -mfma -mf16c (offload/CMakeLists.txt); called only
// when the CPU has all three. The tail (n % 8 elements) and the head (up to
// the parameter's first 32-byte boundary) are copied into zero-padded stack
// arrays of 8 and run through the same vector code, so that every element is
// computed by the same instructions wherever it falls.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "offload/cpu_optimizer_dispatch.h"
#include "offload/cpu_optimizer_kernels.h"

namespace zero::offload::detail {
namespace {

#define ZERO_INLINE inline __attribute__((always_inline))

// 8 fp32 -> 8 fp16 or bf16 bits (round to nearest even; NaN stays NaN).
template <int kCopy>
ZERO_INLINE void store_copy8(uint16_t* dst, __m256 x) {
  if constexpr (kCopy == kHalfCopy) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  } else if constexpr (kCopy == kBf16Copy) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
    r = _mm256_srli_epi32(r, 16);
    const __m256i quiet_nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, quiet_nan, _mm256_castps_si256(is_nan));
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), packed);
  }
}

// 8 gradient elements widened to fp32 and scaled.
template <int kGrad>
ZERO_INLINE __m256 load_grad8(const typename GradElement<kGrad>::T* g, __m256 scale) {
  __m256 x;
  if constexpr (kGrad == kFloatGrad) {
    x = _mm256_loadu_ps(g);
  } else if constexpr (kGrad == kHalfGrad) {
    x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
  } else {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
    x = _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  return _mm256_mul_ps(x, scale);
}

struct AdamV {
  __m256 beta1, omb1, beta2, omb2, eps, step_size, inv_sqrt_bc2, l2, decay, grad_scale;
  explicit AdamV(const AdamScalars& s)
      : beta1(_mm256_set1_ps(s.beta1)), omb1(_mm256_set1_ps(s.omb1)), beta2(_mm256_set1_ps(s.beta2)),
        omb2(_mm256_set1_ps(s.omb2)), eps(_mm256_set1_ps(s.eps)), step_size(_mm256_set1_ps(s.step_size)),
        inv_sqrt_bc2(_mm256_set1_ps(s.inv_sqrt_bc2)), l2(_mm256_set1_ps(s.l2)), decay(_mm256_set1_ps(s.decay)),
        grad_scale(_mm256_set1_ps(s.grad_scale)) {}
};

template <bool kL2, bool kDecay, int kGrad, int kCopy>
ZERO_INLINE void adam8(const AdamV& c, float* p, const typename GradElement<kGrad>::T* g, float* m, float* v,
                       uint16_t* copy) {
  __m256 gv = load_grad8<kGrad>(g, c.grad_scale);
  __m256 pv = _mm256_loadu_ps(p);
  if constexpr (kL2) gv = _mm256_fmadd_ps(c.l2, pv, gv);
  if constexpr (kDecay) pv = _mm256_mul_ps(pv, c.decay);
  const __m256 mv = _mm256_fmadd_ps(c.beta1, _mm256_loadu_ps(m), _mm256_mul_ps(c.omb1, gv));
  const __m256 vv = _mm256_fmadd_ps(c.beta2, _mm256_loadu_ps(v), _mm256_mul_ps(_mm256_mul_ps(c.omb2, gv), gv));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), c.inv_sqrt_bc2, c.eps);
  pv = _mm256_fnmadd_ps(c.step_size, _mm256_div_ps(mv, denom), pv);
  _mm256_storeu_ps(m, mv);
  _mm256_storeu_ps(v, vv);
  _mm256_storeu_ps(p, pv);
  store_copy8<kCopy>(copy, pv);
}

// Elements before `p` reaches a 32-byte boundary: run them through the
// stack path first so that the body's loads and stores do not straddle
// cache lines (the other arrays are usually aligned alike). At most 7, at most n.
inline int64_t head_count(const float* p, int64_t n) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % sizeof(float) != 0) return 0;
  const auto head = static_cast<int64_t>(((32 - addr % 32) % 32) / sizeof(float));
  return head < n ? head : n;
}

// Software prefetch into L2, 2 KiB ahead of each stream, one line (two
// vectors) per iteration: ~5-10% more bandwidth than the hardware
// prefetchers alone on the machine of bench/results/cpu_adam.md. Prefetches
// never fault, so running past the end of an array is harmless.
constexpr int64_t kPrefetchAhead = 512;  // elements
template <class T>
ZERO_INLINE void prefetch_ahead(const T* a) {
  _mm_prefetch(reinterpret_cast<const char*>(a + kPrefetchAhead), _MM_HINT_T1);
}

// r < 8 elements through the vector code, via zero-padded stack copies.
template <bool kL2, bool kDecay, int kGrad, int kCopy>
void adam_partial(const AdamV& c, int64_t r, float* p, const typename GradElement<kGrad>::T* g, float* m, float* v,
                  uint16_t* copy) {
  alignas(32) float tp[8] = {}, tm[8] = {}, tv[8] = {};
  alignas(32) typename GradElement<kGrad>::T tg[8] = {};
  alignas(16) uint16_t tc[8] = {};
  const size_t bytes = static_cast<size_t>(r) * sizeof(float);
  std::memcpy(tp, p, bytes);
  std::memcpy(tg, g, static_cast<size_t>(r) * sizeof(tg[0]));
  std::memcpy(tm, m, bytes);
  std::memcpy(tv, v, bytes);
  adam8<kL2, kDecay, kGrad, kCopy>(c, tp, tg, tm, tv, tc);
  std::memcpy(p, tp, bytes);
  std::memcpy(m, tm, bytes);
  std::memcpy(v, tv, bytes);
  if constexpr (kCopy != 0) std::memcpy(copy, tc, static_cast<size_t>(r) * sizeof(uint16_t));
}

template <bool kL2, bool kDecay, int kGrad, int kCopy>
void adam_loop(const AdamScalars& s, int64_t n, float* p, const void* grad, float* m, float* v,
               uint16_t* copy) {
  const AdamV c(s);
  const auto* g = static_cast<const typename GradElement<kGrad>::T*>(grad);
  int64_t i = head_count(p, n);
  if (i > 0) adam_partial<kL2, kDecay, kGrad, kCopy>(c, i, p, g, m, v, copy);
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(p + i);
    prefetch_ahead(g + i);
    prefetch_ahead(m + i);
    prefetch_ahead(v + i);
    adam8<kL2, kDecay, kGrad, kCopy>(c, p + i, g + i, m + i, v + i, kCopy ? copy + i : nullptr);
    adam8<kL2, kDecay, kGrad, kCopy>(c, p + i + 8, g + i + 8, m + i + 8, v + i + 8, kCopy ? copy + i + 8 : nullptr);
  }
  for (; i + 8 <= n; i += 8)
    adam8<kL2, kDecay, kGrad, kCopy>(c, p + i, g + i, m + i, v + i, kCopy ? copy + i : nullptr);
  if (i < n) adam_partial<kL2, kDecay, kGrad, kCopy>(c, n - i, p + i, g + i, m + i, v + i, kCopy ? copy + i : nullptr);
}

struct AdagradV {
  __m256 eps, clr, l2, grad_scale;
  explicit AdagradV(const AdagradScalars& s)
      : eps(_mm256_set1_ps(s.eps)), clr(_mm256_set1_ps(s.clr)), l2(_mm256_set1_ps(s.l2)),
        grad_scale(_mm256_set1_ps(s.grad_scale)) {}
};

template <bool kL2, int kGrad, int kCopy>
ZERO_INLINE void adagrad8(const AdagradV& c, float* p, const typename GradElement<kGrad>::T* g, float* sum,
                          uint16_t* copy) {
  __m256 gv = load_grad8<kGrad>(g, c.grad_scale);
  __m256 pv = _mm256_loadu_ps(p);
  if constexpr (kL2) gv = _mm256_fmadd_ps(c.l2, pv, gv);
  const __m256 sv = _mm256_fmadd_ps(gv, gv, _mm256_loadu_ps(sum));
  const __m256 denom = _mm256_add_ps(_mm256_sqrt_ps(sv), c.eps);
  pv = _mm256_fnmadd_ps(c.clr, _mm256_div_ps(gv, denom), pv);
  _mm256_storeu_ps(sum, sv);
  _mm256_storeu_ps(p, pv);
  store_copy8<kCopy>(copy, pv);
}

template <bool kL2, int kGrad, int kCopy>
void adagrad_partial(const AdagradV& c, int64_t r, float* p, const typename GradElement<kGrad>::T* g, float* sum,
                     uint16_t* copy) {
  alignas(32) float tp[8] = {}, ts[8] = {};
  alignas(32) typename GradElement<kGrad>::T tg[8] = {};
  alignas(16) uint16_t tc[8] = {};
  const size_t bytes = static_cast<size_t>(r) * sizeof(float);
  std::memcpy(tp, p, bytes);
  std::memcpy(tg, g, static_cast<size_t>(r) * sizeof(tg[0]));
  std::memcpy(ts, sum, bytes);
  adagrad8<kL2, kGrad, kCopy>(c, tp, tg, ts, tc);
  std::memcpy(p, tp, bytes);
  std::memcpy(sum, ts, bytes);
  if constexpr (kCopy != 0) std::memcpy(copy, tc, static_cast<size_t>(r) * sizeof(uint16_t));
}

template <bool kL2, int kGrad, int kCopy>
void adagrad_loop(const AdagradScalars& s, int64_t n, float* p, const void* grad, float* sum,
                  uint16_t* copy) {
  const AdagradV c(s);
  const auto* g = static_cast<const typename GradElement<kGrad>::T*>(grad);
  int64_t i = head_count(p, n);
  if (i > 0) adagrad_partial<kL2, kGrad, kCopy>(c, i, p, g, sum, copy);
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(p + i);
    prefetch_ahead(g + i);
    prefetch_ahead(sum + i);
    adagrad8<kL2, kGrad, kCopy>(c, p + i, g + i, sum + i, kCopy ? copy + i : nullptr);
    adagrad8<kL2, kGrad, kCopy>(c, p + i + 8, g + i + 8, sum + i + 8, kCopy ? copy + i + 8 : nullptr);
  }
  for (; i + 8 <= n; i += 8) adagrad8<kL2, kGrad, kCopy>(c, p + i, g + i, sum + i, kCopy ? copy + i : nullptr);
  if (i < n) adagrad_partial<kL2, kGrad, kCopy>(c, n - i, p + i, g + i, sum + i, kCopy ? copy + i : nullptr);
}

// The loops, for the dispatch of cpu_optimizer_dispatch.h.
struct Loops {
  template <bool kL2, bool kDecay, int kGrad, int kCopy>
  static void adam(const AdamScalars& s, int64_t n, float* p, const void* g, float* m, float* v, uint16_t* copy) {
    adam_loop<kL2, kDecay, kGrad, kCopy>(s, n, p, g, m, v, copy);
  }
  template <bool kL2, int kGrad, int kCopy>
  static void adagrad(const AdagradScalars& s, int64_t n, float* p, const void* g, float* sum, uint16_t* copy) {
    adagrad_loop<kL2, kGrad, kCopy>(s, n, p, g, sum, copy);
  }
};

#undef ZERO_INLINE

}  // namespace

void adam_avx2(const AdamScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* m, float* v,
               uint16_t* copy, CopyDtype dt) {
  dispatch::adam<Loops>(s, n, p, g, gt, m, v, copy, dt);
}

void adagrad_avx2(const AdagradScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* sum,
                  uint16_t* copy, CopyDtype dt) {
  dispatch::adagrad<Loops>(s, n, p, g, gt, sum, copy, dt);
}

}  // namespace zero::offload::detail
