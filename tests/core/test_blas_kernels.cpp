// core/blas_kernels.h: OpenBLAS's own choice stands unless it has no AVX2
// kernels on a CPU that has AVX2; then the widest kernels the CPU runs.
#include "core/blas_kernels.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace {

using zero::blas::better_core;
using zero::blas::CpuVectors;

const CpuVectors kSse{false, false};
const CpuVectors kAvx2{true, false};
const CpuVectors kAvx512{true, true};

TEST(BlasKernels, OldKernelsOnANewerCpuAreReplacedByItsWidest) {
  for (const char* old : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Unknown", "Bulldozer"}) {
    EXPECT_EQ(better_core(old, kAvx512), "SkylakeX") << old;
    EXPECT_EQ(better_core(old, kAvx2), "Haswell") << old;
    EXPECT_EQ(better_core(old, kSse), "") << old;  // nothing wider to run
  }
}

TEST(BlasKernels, OpenBlasChoiceOfAvx2KernelsStands) {
  for (const char* modern : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"}) {
    EXPECT_EQ(better_core(modern, kAvx512), "") << modern;
    EXPECT_EQ(better_core(modern, kAvx2), "") << modern;
  }
  EXPECT_EQ(better_core("", kAvx512), "");  // no OpenBLAS
}

// The flags /proc/cpuinfo lists (the kernel's view, read independently of
// the compiler's CPU detection).
std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(BlasKernels, ThisCpuAgreesWithProcCpuinfo) {
  const auto flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  const CpuVectors cpu = zero::blas::this_cpu();
  EXPECT_EQ(cpu.avx2_fma, flags.count("avx2") && flags.count("fma"));
  EXPECT_EQ(cpu.avx512, flags.count("avx512f") && flags.count("avx512cd") && flags.count("avx512bw") &&
                            flags.count("avx512dq") && flags.count("avx512vl"));
}

}  // namespace
