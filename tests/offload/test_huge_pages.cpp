// offload::advise_huge_pages (offload/huge_pages.h) against what the kernel
// reports in /proc/self/smaps. Torch-free.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "offload/huge_pages.h"

namespace {

// advise_huge_pages: where the kernel hands out transparent huge pages on
// request ("madvise" or "always"), a 64 MiB array advised before its first
// write is backed by some (its mapping's AnonHugePages in /proc/self/smaps).
TEST(HostMemory, AdvisedArraysGetHugePages) {
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode((std::istreambuf_iterator<char>(mode_file)), std::istreambuf_iterator<char>());
  if (mode.find("[never]") != std::string::npos || mode.empty()) GTEST_SKIP() << "transparent huge pages are off here";
  const size_t bytes = size_t{64} << 20;
  void* p = nullptr;
  ASSERT_EQ(posix_memalign(&p, 4096, bytes), 0);
  zero::offload::advise_huge_pages(p, bytes);
  std::memset(p, 1, bytes);
  // The smaps entries over the array (the advice splits its mapping at the
  // 2 MiB boundaries inside it).
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false, seen = false;
  int64_t huge_kb = 0;
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo < end && begin < hi;
      seen = seen || inside;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      huge_kb += std::strtoll(line.c_str() + 14, nullptr, 10);
    }
  }
  std::free(p);
  ASSERT_TRUE(seen) << "no smaps entry for the array";
  EXPECT_GT(huge_kb, 0) << "the advised array got no huge pages (THP mode: " << mode << ")";
}

}  // namespace
