#pragma once
// Internal to offload/: from the run-time choices of one call (weight decay
// as L2 or decoupled, the gradients' dtype, the copy's dtype) to the loop of
// one instruction set compiled for exactly those, written once for every
// per-ISA file (cpu_optimizer_kernels.h).
//
// `Loops` is a struct of the calling file's anonymous namespace with
//   template <bool kL2, bool kDecay, int kGrad, int kCopy>
//   static void adam(const AdamScalars&, int64_t n, float* p, const void* g, float* m, float* v, uint16_t* copy);
//   template <bool kL2, int kGrad, int kCopy>
//   static void adagrad(const AdagradScalars&, int64_t n, float* p, const void* g, float* sum, uint16_t* copy);
// kGrad and kCopy are GradDtype's and CopyDtype's values (kFloatGrad, ...,
// kNoCopy, ... in cpu_optimizer_kernels.h). Being local to that file, it
// makes every instantiation below local too: each ISA keeps its own,
// compiled with its own -m flags, and the linker cannot pick one for another.
#include <cstdint>

#include "offload/cpu_optimizer_kernels.h"

namespace zero::offload::detail::dispatch {

template <class Loops, bool kL2, bool kDecay, int kGrad>
void adam_copy(const AdamScalars& s, int64_t n, float* p, const void* g, float* m, float* v, uint16_t* copy,
               CopyDtype dt) {
  switch (dt) {
    case CopyDtype::kNone: return Loops::template adam<kL2, kDecay, kGrad, kNoCopy>(s, n, p, g, m, v, copy);
    case CopyDtype::kHalf: return Loops::template adam<kL2, kDecay, kGrad, kHalfCopy>(s, n, p, g, m, v, copy);
    case CopyDtype::kBFloat16: return Loops::template adam<kL2, kDecay, kGrad, kBf16Copy>(s, n, p, g, m, v, copy);
  }
}

template <class Loops, bool kL2, bool kDecay>
void adam_grad(const AdamScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* m, float* v,
               uint16_t* copy, CopyDtype dt) {
  switch (gt) {
    case GradDtype::kFloat: return adam_copy<Loops, kL2, kDecay, kFloatGrad>(s, n, p, g, m, v, copy, dt);
    case GradDtype::kHalf: return adam_copy<Loops, kL2, kDecay, kHalfGrad>(s, n, p, g, m, v, copy, dt);
    case GradDtype::kBFloat16: return adam_copy<Loops, kL2, kDecay, kBf16Grad>(s, n, p, g, m, v, copy, dt);
  }
}

// The body of adam_<isa>().
template <class Loops>
void adam(const AdamScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* m, float* v,
          uint16_t* copy, CopyDtype dt) {
  if (s.apply_l2) return adam_grad<Loops, true, false>(s, n, p, g, gt, m, v, copy, dt);
  if (s.apply_decay) return adam_grad<Loops, false, true>(s, n, p, g, gt, m, v, copy, dt);
  adam_grad<Loops, false, false>(s, n, p, g, gt, m, v, copy, dt);
}

template <class Loops, bool kL2, int kGrad>
void adagrad_copy(const AdagradScalars& s, int64_t n, float* p, const void* g, float* sum, uint16_t* copy,
                  CopyDtype dt) {
  switch (dt) {
    case CopyDtype::kNone: return Loops::template adagrad<kL2, kGrad, kNoCopy>(s, n, p, g, sum, copy);
    case CopyDtype::kHalf: return Loops::template adagrad<kL2, kGrad, kHalfCopy>(s, n, p, g, sum, copy);
    case CopyDtype::kBFloat16: return Loops::template adagrad<kL2, kGrad, kBf16Copy>(s, n, p, g, sum, copy);
  }
}

template <class Loops, bool kL2>
void adagrad_grad(const AdagradScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* sum,
                  uint16_t* copy, CopyDtype dt) {
  switch (gt) {
    case GradDtype::kFloat: return adagrad_copy<Loops, kL2, kFloatGrad>(s, n, p, g, sum, copy, dt);
    case GradDtype::kHalf: return adagrad_copy<Loops, kL2, kHalfGrad>(s, n, p, g, sum, copy, dt);
    case GradDtype::kBFloat16: return adagrad_copy<Loops, kL2, kBf16Grad>(s, n, p, g, sum, copy, dt);
  }
}

// The body of adagrad_<isa>().
template <class Loops>
void adagrad(const AdagradScalars& s, int64_t n, float* p, const void* g, GradDtype gt, float* sum,
             uint16_t* copy, CopyDtype dt) {
  if (s.apply_l2) return adagrad_grad<Loops, true>(s, n, p, g, gt, sum, copy, dt);
  adagrad_grad<Loops, false>(s, n, p, g, gt, sum, copy, dt);
}

}  // namespace zero::offload::detail::dispatch
