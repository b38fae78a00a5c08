#pragma once
// Which malloc this process runs with, for the startup log: zero-run
// preloads tcmalloc (tools/launcher/allocator.h); a process started
// otherwise (torchrun, mpirun, srun) may be on glibc's malloc, whose churn
// of large blocks costs thousands of page faults per training step.
#include <string>

namespace zero::heap {

// "tcmalloc", "jemalloc", "mimalloc" or "glibc malloc".
std::string allocator_name();

// One line for the log when the allocator is glibc's, else empty.
std::string advice();

}  // namespace zero::heap
