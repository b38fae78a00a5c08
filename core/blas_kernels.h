#pragma once
// Which OpenBLAS kernels a process computes its matrix products with.
//
// An OpenBLAS built for many CPUs (Debian's) picks its kernels when it is
// loaded, from the CPU's model number. A model it does not know (a CPU newer
// than the library, or a virtual machine's generic model) gets its oldest
// x86-64 kernels, Prescott's (SSE3): on an AVX-512 CPU that made a CPU
// training step of the example GPT 2.2x slower than with its SkylakeX
// kernels (ARCHITECTURE.md, checked facts). OPENBLAS_CORETYPE, read when
// the library loads, chooses others; zero-run sets it for its ranks when
// OpenBLAS would misjudge the CPU, and the engine says at initialize when a
// rank runs on kernels older than its CPU.
#include <string>

namespace zero::blas {

struct CpuVectors {
  bool avx2_fma = false;  // what OpenBLAS's Haswell kernels need
  bool avx512 = false;    // F, CD, BW, DQ and VL: its SkylakeX kernels
};

// This CPU's vector extensions, as the OS enables them.
CpuVectors this_cpu();

// The kernels OpenBLAS picked in this process, as it names them
// ("Prescott", "Haswell", "SkylakeX", ...); "" when no OpenBLAS is loaded.
std::string loaded_openblas_core();

// Loads OpenBLAS (libopenblas.so.0) into this process, for good, and says
// which kernels it picked; "" when it is not installed.
std::string probe_openblas_core();

// The OPENBLAS_CORETYPE that runs faster than `detected` on `cpu`:
// "SkylakeX" or "Haswell" when `detected` has no AVX2 kernels although
// `cpu` has the extensions; "" when OpenBLAS's choice stands.
std::string better_core(const std::string& detected, CpuVectors cpu);

// One line for the log when this process runs OpenBLAS kernels older than
// its CPU, saying what to set; else "".
std::string advice();

}  // namespace zero::blas
