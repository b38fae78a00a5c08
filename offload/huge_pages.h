#pragma once
// Transparent huge pages for the large host arrays the CPU optimizer streams
// through (master weights, optimizer states, gradients). With 4 KiB pages
// every stream crosses a page every 1024 floats: a TLB miss, and the
// hardware prefetchers stop at the boundary. On the machine of
// bench/results/cpu_adam.md, 2 MiB pages made the fused AdamW step ~8-10%
// faster (bench_cpu_adam --huge-pages 1). Many kernels only give huge pages
// to memory that asks for them (transparent_hugepage "madvise"). Ask only
// for memory used again and again: with transparent_hugepage/defrag
// "madvise" the first touch of advised memory may compact memory first,
// 0.4 GB/s on the machine of bench/README.md ("Initialize at the disk's
// speed") against 2-2.5 GB/s for 4 KiB pages.
#include <cstddef>

namespace zero::offload {

// Asks the kernel to back the whole 2 MiB pages inside [data, data + bytes)
// with huge pages (madvise MADV_HUGEPAGE). Call it before the memory is
// first written: pages already touched stay small until khugepaged merges
// them. Does nothing under 4 MiB; the advice is a hint, so a kernel without
// transparent huge pages just ignores it.
void advise_huge_pages(void* data, size_t bytes);

}  // namespace zero::offload
