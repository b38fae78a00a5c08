// Note [Block quantization]: ZeRO++ (qwZ, qgZ) sends weights and gradients
// as symmetric int8 in blocks, each with its own scale absmax / 127, so one
// outlier costs precision only in its block. DeepSpeed's quantizer picks
// groups near 8,000 elements that divide the tensor ("the optimal size is
// 4k"); zero takes a fixed block (zero_quantization_block_size, 4096) and
// lets the last one be short. Rounding is to the
// nearest step, so the error of an element is at most scale / 2 = absmax /
// 254 of its block. The same input always gives the same bytes, so every
// rank, and forward and backward, dequantize to the same weights.
#include "partition/block_quant.h"

namespace zero::partition {
namespace {

int64_t blocks_of(int64_t numel, int64_t block) { return (numel + block - 1) / block; }
// The int8 values take numel bytes, rounded up so that the scales after them are aligned.
int64_t values_bytes(int64_t numel) { return (numel + 3) / 4 * 4; }

}  // namespace

int64_t packed_bytes(int64_t numel, int64_t block) {
  return values_bytes(numel) + blocks_of(numel, block) * static_cast<int64_t>(sizeof(float));
}

void quantize_into(const at::Tensor& values, at::Tensor packed, int64_t block) {
  torch::NoGradGuard no_grad;
  const int64_t numel = values.numel(), blocks = blocks_of(numel, block);
  at::Tensor x = values.reshape(-1).to(at::kFloat);
  if (blocks * block != numel) x = at::constant_pad_nd(x, {0, blocks * block - numel});  // zeros: no effect on a scale
  x = x.view({blocks, block});
  at::Tensor scale = std::get<0>(x.abs().max(1, /*keepdim=*/true)).div_(127.0);
  scale.masked_fill_(scale == 0, 1.0);  // an all-zero block: any scale is exact
  const at::Tensor q = x.div(scale).round_().clamp_(-127, 127).to(at::kChar).view(-1).slice(0, 0, numel);
  packed.slice(0, 0, numel).copy_(q.view(at::kByte));
  packed.slice(0, values_bytes(numel), packed_bytes(numel, block)).copy_(scale.view(-1).view(at::kByte));
}

void dequantize_into(const at::Tensor& packed, at::Tensor out, int64_t block) {
  torch::NoGradGuard no_grad;
  const int64_t numel = out.numel(), blocks = blocks_of(numel, block);
  at::Tensor q = packed.slice(0, 0, numel).view(at::kChar).to(at::kFloat);
  if (blocks * block != numel) q = at::constant_pad_nd(q, {0, blocks * block - numel});
  const at::Tensor scale =
      packed.slice(0, values_bytes(numel), packed_bytes(numel, block)).view(at::kFloat).view({blocks, 1});
  out.view(-1).copy_(q.view({blocks, block}).mul_(scale).view(-1).slice(0, 0, numel));
}

}  // namespace zero::partition
