// What the model's activations take: bytes held on the device the model
// runs on (activations/activation_memory.h).
#include "activations/activation_memory.h"

#if ZERO_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "core/heap.h"

namespace zero::activations {

int64_t allocated_bytes(const at::Device& device) {
#if ZERO_TORCH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<int64_t>(stats.allocated_bytes[0].current);  // [0]: aggregate over pool kinds
  }
#endif
  if (device.is_cpu()) return heap::allocated_bytes();
  return -1;
}

int64_t peak_allocated_bytes(const at::Device& device) {
#if ZERO_TORCH_CUDA
  if (device.is_cuda()) {
    return static_cast<int64_t>(c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak);
  }
#endif
  (void)device;
  return -1;
}

}  // namespace zero::activations
