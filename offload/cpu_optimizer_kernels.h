#pragma once
// Internal to offload/: the per-instruction-set loops behind cpu_optimizer.h.
//
// cpu_optimizer.cpp computes the per-step scalars (in double, then rounded to
// float, as torch::optim does), splits the arrays into tiles and calls one of
// these on each tile. Each loop computes every element with the same
// instruction sequence wherever it falls (vector body or tail), so a tile's
// result does not depend on where the tile starts or ends.
//
// The per-ISA files are compiled with their own -m flags: they must include
// nothing but this header, cpu_optimizer_dispatch.h (the dispatch from run-time
// choices to their loops), <cstdint>, <cstring> and <immintrin.h> (an inline
// function from a standard header, instantiated there with AVX-512 enabled,
// could be the copy the linker keeps for everyone).
#include <cstdint>
#include <cstring>

#include "offload/cpu_optimizer.h"

namespace zero::offload::detail {

// Adam/AdamW, per element (g: gradient, p: parameter):
//   g = g * grad_scale                     (fp16/bf16 gradients widened to fp32 first)
//   kL2:    g = g + l2 * p                 (torch::optim::Adam's weight decay)
//   kDecay: p = p * decay                  (AdamW: decay = 1 - lr * wd)
//   m = beta1 * m + omb1 * g               (omb1 = 1 - beta1)
//   v = beta2 * v + omb2 * g * g
//   p = p - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
// step_size = lr / bc1, inv_sqrt_bc2 = 1 / sqrt(bc2); bc = 1 without bias correction.
struct AdamScalars {
  float beta1, omb1, beta2, omb2, eps, step_size, inv_sqrt_bc2, grad_scale;
  float l2;     // used when kL2
  float decay;  // used when kDecay
  bool apply_l2, apply_decay;
};

// Adagrad, per element:
//   g = g * grad_scale
//   kL2: g = g + l2 * p
//   sum = sum + g * g
//   p = p - clr * g / (sqrt(sum) + eps)     (clr = lr / (1 + (step - 1) * lr_decay))
struct AdagradScalars {
  float eps, clr, l2, grad_scale;
  bool apply_l2;
};

// n elements from the given pointers (already offset to the tile's start).
// `g` holds floats, or fp16/bf16 bits, as `gt` says. `copy` is written when
// dt != kNone (fp16 or bf16 bits, round to nearest even; a NaN stays a NaN
// of the same sign).
using AdamKernel = void (*)(const AdamScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* m,
                            float* v, uint16_t* copy, CopyDtype dt);
using AdagradKernel = void (*)(const AdagradScalars& s, int64_t n, float* p, const void* g, GradDtype gt,
                               float* sum, uint16_t* copy, CopyDtype dt);

void adam_portable(const AdamScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* m, float* v,
                   uint16_t* copy, CopyDtype dt);
void adam_avx2(const AdamScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* m, float* v,
               uint16_t* copy, CopyDtype dt);
void adam_avx512(const AdamScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* m, float* v,
                 uint16_t* copy, CopyDtype dt);

void adagrad_portable(const AdagradScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* sum,
                      uint16_t* copy, CopyDtype dt);
void adagrad_avx2(const AdagradScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* sum,
                  uint16_t* copy, CopyDtype dt);
void adagrad_avx512(const AdagradScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* sum,
                    uint16_t* copy, CopyDtype dt);

// fp16 / bf16 bits -> fp32, exactly (a NaN is quieted, as F16C's vcvtph2ps
// does). `static`: each file gets its own copy, compiled with its own flags.
static inline float widen_half(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1Fu) {
    bits = sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u);
  } else if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return sign ? -magnitude : magnitude;
  } else {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  }
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
static inline float widen_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// GradDtype and CopyDtype as template arguments of the loops.
constexpr int kFloatGrad = static_cast<int>(GradDtype::kFloat);
constexpr int kHalfGrad = static_cast<int>(GradDtype::kHalf);
constexpr int kBf16Grad = static_cast<int>(GradDtype::kBFloat16);
constexpr int kNoCopy = static_cast<int>(CopyDtype::kNone);
constexpr int kHalfCopy = static_cast<int>(CopyDtype::kHalf);
constexpr int kBf16Copy = static_cast<int>(CopyDtype::kBFloat16);

// The element type of a gradient array: float, or the 16-bit bits.
template <int kGrad>
struct GradElement {
  using T = uint16_t;
};
template <>
struct GradElement<kFloatGrad> {
  using T = float;
};

}  // namespace zero::offload::detail
