// Portable (plain C++) loops of the CPU optimizers: the path for CPUs without
// AVX2+FMA+F16C. Compiled with -ffp-contract=off (see offload/CMakeLists.txt)
// so that whatever the compiler vectorizes computes exactly what its scalar
// remainder loop computes: every operation here is one IEEE operation.
//
// Where the SIMD paths use an FMA, this one computes a*b + c in double (the
// product of two floats is exact there) and rounds once to float: the same
// result as the FMA but for the rare double-rounding tie. A plain float
// multiply-add would lose the low bits of g + wd*p where the weight decay
// cancels the gradient, which torch (whose add(alpha) is an FMA) keeps.
#include <cstdint>
#include <cstring>

#include "offload/cpu_optimizer_dispatch.h"
#include "offload/cpu_optimizer_kernels.h"

namespace zero::offload::detail {
namespace {

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// fp32 -> fp16 bits, round to nearest even; what F16C's vcvtps2ph with
// _MM_FROUND_TO_NEAREST_INT gives (a NaN keeps its sign and the top payload
// bits, and is quieted).
inline uint16_t half_bits(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (or inf): inf
  if (a >= 0x38800000u) {                                              // >= 2^-14: normal fp16
    const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u) - (112u << 23);   // round, rebias 127 -> 15
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal fp16 (or zero): adding 0.5 rounds |x| to a multiple of 2^-24
  // (the ulp of 0.5), nearest even; the low bits are then the fp16 mantissa
  // (0x400 when it rounds up to the smallest normal, also the right code).
  const float shifted = float_of(a) + 0.5f;
  return static_cast<uint16_t>(sign | (bits_of(shifted) - 0x3F000000u));
}

// fp32 -> bf16 bits, round to nearest even; a NaN stays a quiet NaN of the same sign.
inline uint16_t bf16_bits(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// A gradient element widened to fp32 and scaled.
template <int kGrad>
inline float grad_at(const typename GradElement<kGrad>::T* g, int64_t i, float scale) {
  if constexpr (kGrad == kFloatGrad) {
    return g[i] * scale;
  } else if constexpr (kGrad == kHalfGrad) {
    return widen_half(g[i]) * scale;
  } else {
    return widen_bf16(g[i]) * scale;
  }
}

// a * b + c, rounded once to float (but for double rounding).
inline float mul_add(float a, float b, float c) {
  return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c));
}

template <int kCopy>
inline void store_copy(uint16_t* copy, int64_t i, float x) {
  if constexpr (kCopy == kHalfCopy) copy[i] = half_bits(x);
  if constexpr (kCopy == kBf16Copy) copy[i] = bf16_bits(x);
}

template <bool kL2, bool kDecay, int kGrad, int kCopy>
void adam_loop(const AdamScalars& s, int64_t n, float* __restrict p, const void* grad, float* __restrict m,
               float* __restrict v, uint16_t* __restrict copy) {
  const float beta1 = s.beta1, omb1 = s.omb1, beta2 = s.beta2, omb2 = s.omb2, eps = s.eps;
  const float step_size = s.step_size, inv_sqrt_bc2 = s.inv_sqrt_bc2, l2 = s.l2, decay = s.decay;
  const float scale = s.grad_scale;
  const auto* __restrict g = static_cast<const typename GradElement<kGrad>::T*>(grad);
  for (int64_t i = 0; i < n; ++i) {
    float gi = grad_at<kGrad>(g, i, scale);
    float pi = p[i];
    if constexpr (kL2) gi = mul_add(l2, pi, gi);
    if constexpr (kDecay) pi = pi * decay;
    const float mi = mul_add(beta1, m[i], omb1 * gi);
    const float vi = mul_add(beta2, v[i], (omb2 * gi) * gi);
    const float denom = mul_add(__builtin_sqrtf(vi), inv_sqrt_bc2, eps);
    pi = mul_add(-step_size, mi / denom, pi);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    store_copy<kCopy>(copy, i, pi);
  }
}

template <bool kL2, int kGrad, int kCopy>
void adagrad_loop(const AdagradScalars& s, int64_t n, float* __restrict p, const void* grad,
                  float* __restrict sum, uint16_t* __restrict copy) {
  const float eps = s.eps, clr = s.clr, l2 = s.l2, scale = s.grad_scale;
  const auto* __restrict g = static_cast<const typename GradElement<kGrad>::T*>(grad);
  for (int64_t i = 0; i < n; ++i) {
    float gi = grad_at<kGrad>(g, i, scale);
    float pi = p[i];
    if constexpr (kL2) gi = mul_add(l2, pi, gi);
    const float si = mul_add(gi, gi, sum[i]);
    const float denom = __builtin_sqrtf(si) + eps;
    pi = mul_add(-clr, gi / denom, pi);
    sum[i] = si;
    p[i] = pi;
    store_copy<kCopy>(copy, i, pi);
  }
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

}  // namespace

void adam_portable(const AdamScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* m, float* v,
                   uint16_t* copy, CopyDtype dt) {
  dispatch::adam<Loops>(s, n, p, g, gt, m, v, copy, dt);
}

void adagrad_portable(const AdagradScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* sum,
                      uint16_t* copy, CopyDtype dt) {
  dispatch::adagrad<Loops>(s, n, p, g, gt, sum, copy, dt);
}

}  // namespace zero::offload::detail
