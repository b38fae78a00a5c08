#include "core/blas_kernels.h"

#include <dlfcn.h>

#include <cstdlib>

namespace zero::blas {

CpuVectors this_cpu() {
  CpuVectors cpu;
#if defined(__x86_64__) && defined(__GNUC__)
  // libgcc also checks that the OS saves the vector registers (XGETBV).
  __builtin_cpu_init();
  cpu.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vl");
#endif
  return cpu;
}

namespace {

using CoreName = char* (*)();

std::string core_from(void* handle) {
  const auto name = reinterpret_cast<CoreName>(::dlsym(handle, "openblas_get_corename"));
  const char* core = name ? name() : nullptr;
  return core ? core : "";
}

}  // namespace

std::string loaded_openblas_core() { return core_from(RTLD_DEFAULT); }

std::string probe_openblas_core() {
  // Not closed: unloading would run OpenBLAS's teardown for nothing, and a
  // leak checker would count its buffers as lost.
  void* handle = ::dlopen("libopenblas.so.0", RTLD_LAZY | RTLD_LOCAL);
  return handle ? core_from(handle) : "";
}

std::string better_core(const std::string& detected, CpuVectors cpu) {
  if (detected.empty()) return "";  // no OpenBLAS
  // OpenBLAS's x86-64 kernels with AVX2 or wider (its names); the others
  // are SSE or AVX ones.
  for (const char* modern : {"Haswell", "Excavator", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (detected == modern) return "";
  }
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return "";
}

std::string advice() {
  const std::string detected = loaded_openblas_core();
  const std::string better = better_core(detected, this_cpu());
  if (better.empty()) return "";
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  return "OpenBLAS computes matrix products with its " + detected + " kernels" +
         (forced ? std::string(" (OPENBLAS_CORETYPE=") + forced + ")" : std::string(", as it does not know this CPU's model")) +
         ", although this CPU has " + (better == "SkylakeX" ? "AVX-512" : "AVX2") +
         ": a CPU training step runs 2-3x slower. Start the ranks with OPENBLAS_CORETYPE=" + better +
         (forced ? std::string() : std::string(" (zero-run sets it when it is unset)"));
}

}  // namespace zero::blas
