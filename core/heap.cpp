#include "core/heap.h"

#include <dlfcn.h>

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

}  // namespace zero::heap
