#pragma once
// Which malloc this process runs with, for the startup log: zero-run
// preloads tcmalloc (tools/launcher/allocator.h); a process started
// otherwise (torchrun, mpirun, srun) may be on glibc's malloc, whose churn
// of large blocks costs thousands of page faults per training step.
#include <cstdint>
#include <string>

namespace zero::heap {

// "tcmalloc", "jemalloc", "mimalloc" or "glibc malloc".
std::string allocator_name();

// One line for the log when the allocator is glibc's, else empty.
std::string advice();

// Bytes the program holds from the heap now (what it allocated and has not
// freed), as the allocator in use counts them; -1 when it cannot say.
int64_t allocated_bytes();

}  // namespace zero::heap
