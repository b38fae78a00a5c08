#pragma once
// Block quantization for ZeRO++'s wire formats (Note [Block quantization]):
// a tensor cut into blocks of `block` elements, each sent as int8 with one
// fp32 scale. Packed into one byte tensor per rank, so a single collective
// of bytes carries the values and their scales together.
#include <torch/torch.h>

namespace zero::partition {

// Bytes a packed tensor of `numel` elements takes: numel int8 values (up
// to 3 bytes more, to align what follows), then one fp32 scale per block.
int64_t packed_bytes(int64_t numel, int64_t block);

// `values` (any floating dtype, contiguous) into `packed` (kByte,
// packed_bytes(values.numel(), block) of it).
void quantize_into(const at::Tensor& values, at::Tensor packed, int64_t block);
// The inverse: `out`'s numel() elements (any floating dtype) from `packed`.
void dequantize_into(const at::Tensor& packed, at::Tensor out, int64_t block);

}  // namespace zero::partition
