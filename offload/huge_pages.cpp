#include "offload/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>

namespace zero::offload {

void advise_huge_pages(void* data, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (data == nullptr || bytes < 2 * kHuge) return;
  const auto start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (start + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t last = (start + bytes) & ~(kHuge - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // a hint: errors ignored
}

}  // namespace zero::offload
