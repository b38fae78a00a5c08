// The heap allocator zero-run starts the ranks with.
//
// glibc's malloc hands large blocks (a training step's activations, AdamW's
// temporaries, stage 3's gathered units) back to the kernel when they are
// freed and maps them afresh the next step: tens of thousands of minor page
// faults per step (bench/README.md, "step_time"). tcmalloc keeps them, and
// has the lowest peak RSS of the allocators measured there, so zero-run
// preloads it when it is installed (Debian: libtcmalloc-minimal4), as
// PyTorch's CPU performance guides recommend. It is a default, not a
// requirement: --allocator (or ZERO_ALLOCATOR) picks tcmalloc, jemalloc,
// system (no preload) or a library path, and an LD_PRELOAD that already
// names an allocator or a sanitizer runtime is left as it is.
#pragma once

#include <string>
#include <vector>

namespace zero_run {

struct AllocatorChoice {
  std::string name;                // "tcmalloc", "jemalloc", "system" or the library's path
  std::string library;             // what LD_PRELOAD gains; empty: nothing preloaded
  std::vector<std::string> env;    // NAME=value entries to set in the ranks (LD_PRELOAD and tuning)
  std::string note;                // a line for the user when the choice fell back, else empty
};

// `requested`: "" (default: ZERO_ALLOCATOR, else tcmalloc when found),
// "tcmalloc", "jemalloc", "system" or a path to a shared library. `environ`
// is the environment the ranks inherit. Throws std::invalid_argument for an
// unknown name or a path that is not a readable file.
AllocatorChoice choose_allocator(const std::string& requested, char** environ);

}  // namespace zero_run
