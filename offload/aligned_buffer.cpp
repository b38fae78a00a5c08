// Aligned host memory for O_DIRECT (aligned_buffer.h).
#include "offload/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "zero/error.h"

namespace zero::offload {
namespace {

[[noreturn]] void fail(const std::string& message) { throw OffloadError("NVMe swapper: " + message); }

size_t round_up(size_t n) { return (n + kIoAlignment - 1) / kIoAlignment * kIoAlignment; }

}  // namespace

void* alloc_io_aligned(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kIoAlignment, bytes) != 0) {
    fail("cannot allocate " + std::to_string(bytes) + " bytes of " + std::to_string(kIoAlignment) +
         "-byte aligned host memory; lower block_size/buffer_count or free host memory");
  }
  return p;
}

// Buffers of 2 MiB and more are 2 MiB aligned and asked for transparent huge
// pages: fewer page faults when filled, and O_DIRECT pins one huge page per
// request instead of up to block_size / 4 KiB small ones.
AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes), capacity_(round_up(bytes)) {
  if (capacity_ == 0) return;
  constexpr size_t kHuge = size_t(2) << 20;
  if (capacity_ >= kHuge) {
    void* p = nullptr;
    if (posix_memalign(&p, kHuge, capacity_) != 0) {
      fail("cannot allocate " + std::to_string(capacity_) + " bytes of aligned host memory; free host memory");
    }
    (void)::madvise(p, capacity_ / kHuge * kHuge, MADV_HUGEPAGE);  // a hint; fine when refused
    data_ = p;
  } else {
    data_ = alloc_io_aligned(capacity_);
  }
  std::memset(data_, 0, capacity_);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      capacity_(std::exchange(o.capacity_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}

}  // namespace zero::offload
