#pragma once
// Measuring activation memory: the engine reads the bytes allocated on the
// model's device when forward starts (the end of the previous backward or
// step) and when backward starts; the growth is what forward left alive for
// backward, the activations autograd keeps (and the loss).
#include <c10/core/Device.h>

#include <cstdint>

namespace zero::activations {

// Bytes allocated now on `device` (CUDA: the caching allocator's count; the
// host: the heap allocator's); -1 when it cannot be read.
int64_t allocated_bytes(const at::Device& device);
// The most bytes ever allocated at once on `device` (CUDA: the caching
// allocator's peak, what the monitors report); -1 when not known (the host).
int64_t peak_allocated_bytes(const at::Device& device);

}  // namespace zero::activations
