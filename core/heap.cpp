#include "core/heap.h"

#include <dlfcn.h>
#include <malloc.h>

#include <cstddef>

namespace zero::heap {

std::string allocator_name() {
  // Each allocator exports an entry point of its own; the first object that
  // defines malloc (a preload comes first) is the one in use.
  if (dlsym(RTLD_DEFAULT, "tc_malloc") != nullptr) return "tcmalloc";
  if (dlsym(RTLD_DEFAULT, "mallctl") != nullptr) return "jemalloc";
  if (dlsym(RTLD_DEFAULT, "mi_malloc") != nullptr) return "mimalloc";
  return "glibc malloc";
}

std::string advice() {
  if (allocator_name() != "glibc malloc") return "";
  return "heap allocator: glibc malloc, which unmaps large freed blocks and faults them in again every step; "
         "zero-run preloads tcmalloc (apt-get install libtcmalloc-minimal4), or start the ranks with "
         "LD_PRELOAD=libtcmalloc_minimal.so.4 (bench/README.md, step_time)";
}

int64_t allocated_bytes() {
  // Looked up, not linked: the allocator is whichever the process runs with.
  using TcProperty = int (*)(const char*, size_t*);
  if (auto tc = reinterpret_cast<TcProperty>(dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty"))) {
    size_t bytes = 0;
    if (tc("generic.current_allocated_bytes", &bytes)) return static_cast<int64_t>(bytes);
  }
  using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);
  if (auto je = reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"))) {
    uint64_t epoch = 1;
    size_t size = sizeof epoch;
    je("epoch", &epoch, &size, &epoch, size);  // refreshes the statistics
    size_t bytes = 0;
    size = sizeof bytes;
    if (je("stats.allocated", &bytes, &size, nullptr, 0) == 0) return static_cast<int64_t>(bytes);
  }
  if (allocator_name() != "glibc malloc") return -1;
  const struct mallinfo2 info = mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);  // in use from the arenas + mmapped blocks
}

}  // namespace zero::heap
