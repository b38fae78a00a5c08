// Block quantization (Note [Block quantization]): int8 blocks with an fp32
// scale each, against the formula written out element by element here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "partition/block_quant.h"

namespace {

using zero::partition::dequantize_into;
using zero::partition::packed_bytes;
using zero::partition::quantize_into;

at::Tensor round_trip(const at::Tensor& x, int64_t block) {
  at::Tensor packed = torch::empty({packed_bytes(x.numel(), block)}, torch::kByte);
  quantize_into(x, packed, block);
  at::Tensor out = torch::empty_like(x);
  dequantize_into(packed, out, block);
  return out;
}

// The formula: per block, scale = max |x| / 127; q = round-half-away(x / scale).
float expected(const float* block, int64_t n, int64_t i) {
  float absmax = 0;
  for (int64_t j = 0; j < n; ++j) absmax = std::max(absmax, std::fabs(block[j]));
  const float scale = absmax == 0 ? 1.0f : absmax / 127.0f;
  return std::round(block[i] / scale) * scale;
}

TEST(BlockQuant, EveryElementIsTheFormulasValueWithinBlocks) {
  torch::manual_seed(3);
  for (int64_t block : {8, 64, 4096}) {
    for (int64_t numel : {int64_t{1}, block - 1, block, 3 * block + 5}) {
      SCOPED_TRACE("block " + std::to_string(block) + " numel " + std::to_string(numel));
      at::Tensor x = torch::randn({numel}) * torch::logspace(-3, 3, numel);  // blocks of very different ranges
      const at::Tensor got = round_trip(x, block);
      const float* v = x.data_ptr<float>();
      for (int64_t start = 0; start < numel; start += block) {
        const int64_t n = std::min(block, numel - start);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_NEAR(got[start + i].item<float>(), expected(v + start, n, i), 1e-6 * std::fabs(v[start + i]) + 1e-30)
              << "element " << start + i;
        }
      }
    }
  }
}

TEST(BlockQuant, ErrorIsAtMostHalfAStepAndZerosAndTheBlockMaximumAreExact) {
  torch::manual_seed(4);
  at::Tensor x = torch::randn({1000});
  x.slice(0, 100, 200).zero_();
  const at::Tensor got = round_trip(x, 100);
  for (int64_t start = 0; start < 1000; start += 100) {
    const at::Tensor in = x.slice(0, start, start + 100), out = got.slice(0, start, start + 100);
    const double step = in.abs().max().item<double>() / 127;
    EXPECT_LE((out - in).abs().max().item<double>(), step / 2 * (1 + 1e-6)) << start;
    const int64_t at_max = in.abs().argmax().item<int64_t>();
    EXPECT_NEAR(out[at_max].item<float>(), in[at_max].item<float>(), 1e-6 * std::fabs(in[at_max].item<float>()));
  }
  EXPECT_TRUE(torch::equal(got.slice(0, 100, 200), torch::zeros({100})));
}

TEST(BlockQuant, PacksOneByteAnElementAndFourAScaleAndIsDeterministic) {
  EXPECT_EQ(packed_bytes(4096, 4096), 4096 + 4);
  EXPECT_EQ(packed_bytes(4097, 4096), 4100 + 8);
  EXPECT_EQ(packed_bytes(10, 4096), 12 + 4) << "a short last block is not padded";
  at::Tensor x = torch::randn({300}).to(torch::kBFloat16);
  at::Tensor a = torch::empty({packed_bytes(300, 64)}, torch::kByte), b = torch::empty_like(a);
  quantize_into(x, a, 64);
  quantize_into(x.clone(), b, 64);
  EXPECT_TRUE(torch::equal(a, b)) << "every rank, forward and backward, sees the same weights";
  at::Tensor out = torch::empty({300}, torch::kBFloat16);
  dequantize_into(a, out, 64);
  EXPECT_LE((out.to(torch::kFloat) - x.to(torch::kFloat)).abs().max().item<double>(),
            x.to(torch::kFloat).abs().max().item<double>() / 127);
}

}  // namespace
