// AVX-512 (F, BW, VL, DQ) loops of the CPU optimizers, 16 floats a vector.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
// (offload/CMakeLists.txt); called only when the CPU has them. The tail
// (n % 16 elements) and the head (up to the parameter's first 64-byte
// boundary) run through the same vector code with masked loads and stores,
// so that every element is computed by the same instructions wherever it
// falls; the operations are those of the AVX2 path, in the same order, so
// both give the same bits.
#include <immintrin.h>

#include <cstdint>

#include "offload/cpu_optimizer_dispatch.h"
#include "offload/cpu_optimizer_kernels.h"

namespace zero::offload::detail {
namespace {

#define ZERO_INLINE inline __attribute__((always_inline))

// 16 fp32 -> 16 fp16 or bf16 bits (round to nearest even; NaN stays NaN),
// stored under `mask`.
template <int kCopy>
ZERO_INLINE void store_copy16(uint16_t* dst, __m512 x, __mmask16 mask) {
  if constexpr (kCopy == kHalfCopy) {
    const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(dst, mask, h);
  } else if constexpr (kCopy == kBf16Copy) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb);
    r = _mm512_srli_epi32(r, 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, is_nan, hi, _mm512_set1_epi32(0x40));
    _mm256_mask_storeu_epi16(dst, mask, _mm512_cvtepi32_epi16(r));
  }
}

// 16 gradient elements under `mask`, widened to fp32 and scaled.
template <int kGrad>
ZERO_INLINE __m512 load_grad16(const typename GradElement<kGrad>::T* g, __mmask16 mask, __m512 scale) {
  __m512 x;
  if constexpr (kGrad == kFloatGrad) {
    x = _mm512_maskz_loadu_ps(mask, g);
  } else if constexpr (kGrad == kHalfGrad) {
    x = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, g));
  } else {
    x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, g)), 16));
  }
  return _mm512_mul_ps(x, scale);
}

struct AdamV {
  __m512 beta1, omb1, beta2, omb2, eps, step_size, inv_sqrt_bc2, l2, decay, grad_scale;
  explicit AdamV(const AdamScalars& s)
      : beta1(_mm512_set1_ps(s.beta1)), omb1(_mm512_set1_ps(s.omb1)), beta2(_mm512_set1_ps(s.beta2)),
        omb2(_mm512_set1_ps(s.omb2)), eps(_mm512_set1_ps(s.eps)), step_size(_mm512_set1_ps(s.step_size)),
        inv_sqrt_bc2(_mm512_set1_ps(s.inv_sqrt_bc2)), l2(_mm512_set1_ps(s.l2)), decay(_mm512_set1_ps(s.decay)),
        grad_scale(_mm512_set1_ps(s.grad_scale)) {}
};

template <bool kL2, bool kDecay, int kGrad, int kCopy>
ZERO_INLINE void adam16(const AdamV& c, float* p, const typename GradElement<kGrad>::T* g, float* m, float* v,
                        uint16_t* copy, __mmask16 k) {
  __m512 gv = load_grad16<kGrad>(g, k, c.grad_scale);
  __m512 pv = _mm512_maskz_loadu_ps(k, p);
  if constexpr (kL2) gv = _mm512_fmadd_ps(c.l2, pv, gv);
  if constexpr (kDecay) pv = _mm512_mul_ps(pv, c.decay);
  const __m512 mv = _mm512_fmadd_ps(c.beta1, _mm512_maskz_loadu_ps(k, m), _mm512_mul_ps(c.omb1, gv));
  const __m512 vv =
      _mm512_fmadd_ps(c.beta2, _mm512_maskz_loadu_ps(k, v), _mm512_mul_ps(_mm512_mul_ps(c.omb2, gv), gv));
  const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), c.inv_sqrt_bc2, c.eps);
  pv = _mm512_fnmadd_ps(c.step_size, _mm512_div_ps(mv, denom), pv);
  _mm512_mask_storeu_ps(m, k, mv);
  _mm512_mask_storeu_ps(v, k, vv);
  _mm512_mask_storeu_ps(p, k, pv);
  store_copy16<kCopy>(copy, pv, k);
}

// Elements before `p` reaches a 64-byte boundary (a cache line): run them
// masked first so that the body's loads and stores do not straddle lines
// (the other arrays are usually aligned alike). At most 15, at most n.
inline int64_t head_count(const float* p, int64_t n) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % sizeof(float) != 0) return 0;
  const auto head = static_cast<int64_t>(((64 - addr % 64) % 64) / sizeof(float));
  return head < n ? head : n;
}

inline __mmask16 first_lanes(int64_t k) { return static_cast<__mmask16>((1u << k) - 1u); }

// Software prefetch into L2, 2 KiB ahead of each stream, one line per
// iteration: ~5-10% more bandwidth than the hardware prefetchers alone on the
// machine of bench/results/cpu_adam.md. Prefetches never fault, so running
// past the end of an array is harmless.
constexpr int64_t kPrefetchAhead = 512;  // elements
template <class T>
ZERO_INLINE void prefetch_ahead(const T* a) {
  _mm_prefetch(reinterpret_cast<const char*>(a + kPrefetchAhead), _MM_HINT_T1);
}

template <bool kL2, bool kDecay, int kGrad, int kCopy>
void adam_loop(const AdamScalars& s, int64_t n, float* p, const void* grad, float* m, float* v,
               uint16_t* copy) {
  const AdamV c(s);
  const auto* g = static_cast<const typename GradElement<kGrad>::T*>(grad);
  int64_t i = head_count(p, n);
  if (i > 0) adam16<kL2, kDecay, kGrad, kCopy>(c, p, g, m, v, copy, first_lanes(i));
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(p + i);
    prefetch_ahead(g + i);
    prefetch_ahead(m + i);
    prefetch_ahead(v + i);
    adam16<kL2, kDecay, kGrad, kCopy>(c, p + i, g + i, m + i, v + i, kCopy ? copy + i : nullptr, 0xFFFF);
  }
  if (i < n) adam16<kL2, kDecay, kGrad, kCopy>(c, p + i, g + i, m + i, v + i, kCopy ? copy + i : nullptr, first_lanes(n - i));
}

struct AdagradV {
  __m512 eps, clr, l2, grad_scale;
  explicit AdagradV(const AdagradScalars& s)
      : eps(_mm512_set1_ps(s.eps)), clr(_mm512_set1_ps(s.clr)), l2(_mm512_set1_ps(s.l2)),
        grad_scale(_mm512_set1_ps(s.grad_scale)) {}
};

template <bool kL2, int kGrad, int kCopy>
ZERO_INLINE void adagrad16(const AdagradV& c, float* p, const typename GradElement<kGrad>::T* g, float* sum,
                           uint16_t* copy, __mmask16 k) {
  __m512 gv = load_grad16<kGrad>(g, k, c.grad_scale);
  __m512 pv = _mm512_maskz_loadu_ps(k, p);
  if constexpr (kL2) gv = _mm512_fmadd_ps(c.l2, pv, gv);
  const __m512 sv = _mm512_fmadd_ps(gv, gv, _mm512_maskz_loadu_ps(k, sum));
  const __m512 denom = _mm512_add_ps(_mm512_sqrt_ps(sv), c.eps);
  pv = _mm512_fnmadd_ps(c.clr, _mm512_div_ps(gv, denom), pv);
  _mm512_mask_storeu_ps(sum, k, sv);
  _mm512_mask_storeu_ps(p, k, pv);
  store_copy16<kCopy>(copy, pv, k);
}

template <bool kL2, int kGrad, int kCopy>
void adagrad_loop(const AdagradScalars& s, int64_t n, float* p, const void* grad, float* sum,
                  uint16_t* copy) {
  const AdagradV c(s);
  const auto* g = static_cast<const typename GradElement<kGrad>::T*>(grad);
  int64_t i = head_count(p, n);
  if (i > 0) adagrad16<kL2, kGrad, kCopy>(c, p, g, sum, copy, first_lanes(i));
  for (; i + 16 <= n; i += 16) {
    prefetch_ahead(p + i);
    prefetch_ahead(g + i);
    prefetch_ahead(sum + i);
    adagrad16<kL2, kGrad, kCopy>(c, p + i, g + i, sum + i, kCopy ? copy + i : nullptr, 0xFFFF);
  }
  if (i < n) adagrad16<kL2, kGrad, kCopy>(c, p + i, g + i, sum + i, kCopy ? copy + i : nullptr, first_lanes(n - i));
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

void adam_avx512(const AdamScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* m, float* v,
                 uint16_t* copy, CopyDtype dt) {
  dispatch::adam<Loops>(s, n, p, g, gt, m, v, copy, dt);
}

void adagrad_avx512(const AdagradScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* sum,
                    uint16_t* copy, CopyDtype dt) {
  dispatch::adagrad<Loops>(s, n, p, g, gt, sum, copy, dt);
}

}  // namespace zero::offload::detail
