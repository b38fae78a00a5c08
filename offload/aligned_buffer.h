#pragma once
// Host memory for O_DIRECT I/O (the NVMe swapper, swapper.h): addresses and
// sizes aligned to kIoAlignment. Torch-free.
#include <cstddef>

namespace zero::offload {

constexpr size_t kIoAlignment = 4096;

// Host memory aligned (and sized) to kIoAlignment, zero-filled. From 2 MiB
// up it is 2 MiB aligned and asks for transparent huge pages (O_DIRECT pins
// fewer pages per request).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);  // capacity rounded up to kIoAlignment
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  void* data() const { return data_; }
  size_t size() const { return size_; }  // as asked
  size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
};

// `bytes` of kIoAlignment-aligned host memory, not zeroed, for std::free;
// throws OffloadError when there is none.
void* alloc_io_aligned(size_t bytes);

}  // namespace zero::offload
