#pragma once
// Fused CPU optimizer steps over fp32 parameter, gradient and state arrays
// (ZeRO-Offload's host side). Torch-free: the engine passes raw pointers.
//
// One pass per step reads param, grad and the states, writes param and the
// states and, when asked, the updated parameter rounded to fp16 or bf16
// (DeepSpeed needs a second pass for that copy). The gradient may be fp32 or
// the training dtype's fp16/bf16 as the engine reduced it, and is multiplied
// by a scale as it is read (unscaling the loss scale and clipping, so that
// the 16-bit gradients need neither an fp32 copy nor a pass of their own). The body runs on the best
// SIMD path the CPU has (AVX-512, AVX2+FMA, portable), chosen at run time,
// parallel over tiles with oneTBB. Every element is computed by the same
// instruction sequence wherever it falls (body or tail, any tile), so the
// result does not depend on the thread count. The AVX2 and AVX-512 paths give
// the same bits; results agree with torch::optim to 1e-6 relative (FMA
// versus separate roundings), see tests/offload/test_cpu_optimizers.cpp.
#include <cstdint>

namespace zero::offload {

enum class Simd { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
Simd best_simd();                 // what this CPU supports
bool simd_supported(Simd s);      // AVX-512: avx512f+bw+vl+dq; AVX2: avx2+fma+f16c
const char* simd_name(Simd s);    // "avx512", "avx2", "portable"
// The path the overloads without a Simd argument use: ZERO_CPU_OPTIMIZER_SIMD
// (portable|avx2|avx512) when set, else best_simd(). Throws OffloadError when
// the variable names an unknown path or one this CPU lacks.
Simd default_simd();

enum class CopyDtype { kNone, kHalf, kBFloat16 };
enum class GradDtype { kFloat, kHalf, kBFloat16 };

// A gradient array: fp32, or fp16/bf16 bits. Converts from `const float*`.
struct GradArray {
  GradArray(const float* p) : data(p), dtype(GradDtype::kFloat) {}  // NOLINT: implicit by design
  GradArray(const uint16_t* p, GradDtype d) : data(p), dtype(d) {}
  const void* data;
  GradDtype dtype;
  int element_size() const { return dtype == GradDtype::kFloat ? 4 : 2; }
};

struct AdamStep {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool decoupled_weight_decay = true;  // AdamW; false: L2 added to the gradient (torch::optim::Adam)
  bool bias_correction = true;
  int64_t step = 1;                    // this update's step number, 1-based (already incremented)
  float grad_scale = 1.0f;             // each gradient element is multiplied by it as it is read
};

struct AdagradStep {
  float lr = 1e-2f, lr_decay = 0.0f, eps = 1e-10f, weight_decay = 0.0f;
  int64_t step = 1;                    // 1-based, as torch::optim::Adagrad's state step after increment
  float grad_scale = 1.0f;             // as AdamStep's
};

// `copy` (n uint16 elements) receives the updated parameter in `copy_dtype`
// when copy_dtype != kNone, rounded as torch's .to(kHalf) / .to(kBFloat16)
// round (nearest even; a NaN stays a NaN). `simd`: the path to use (default:
// default_simd()); OffloadError when the CPU lacks it, when n < 0, a pointer
// is null, or step < 1. The per-step scalars (bias corrections, step size,
// AdamW's 1 - lr*wd, Adagrad's decayed lr) are computed in double and rounded
// to float, as torch::optim computes them. Runs on the calling thread's
// oneTBB task arena, in tiles of 16Ki elements.
void adam_step(const AdamStep& h, int64_t n, float* param, GradArray grad, float* exp_avg,
               float* exp_avg_sq, uint16_t* copy = nullptr, CopyDtype copy_dtype = CopyDtype::kNone);
void adam_step(const AdamStep& h, int64_t n, float* param, GradArray grad, float* exp_avg,
               float* exp_avg_sq, uint16_t* copy, CopyDtype copy_dtype, Simd simd);
void adagrad_step(const AdagradStep& h, int64_t n, float* param, GradArray grad, float* sum,
                  uint16_t* copy = nullptr, CopyDtype copy_dtype = CopyDtype::kNone);
void adagrad_step(const AdagradStep& h, int64_t n, float* param, GradArray grad, float* sum,
                  uint16_t* copy, CopyDtype copy_dtype, Simd simd);

// Sum of x[i]^2 in double (for the gradient norm of host gradients): one
// pass, parallel over tiles, the tiles' sums added in tile order so that the
// result does not depend on the thread count. Not finite when any element is
// not (so it also answers whether fp16 gradients overflowed).
double sum_of_squares(GradArray x, int64_t n);

}  // namespace zero::offload
