// GradSquares (Note [Gradient norm]) against a sum taken element by element
// in long double, over the places a gradient can be: host arrays of each
// training dtype, tensors the fused kernel does not read (non-contiguous,
// fp64), and sums taken earlier on a device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "partition/grad_norm.h"

namespace {

using zero::partition::GradSquares;

long double reference(const at::Tensor& t) {
  const at::Tensor wide = t.to(at::kDouble).contiguous();
  long double sum = 0;
  const double* p = wide.data_ptr<double>();
  for (int64_t i = 0; i < wide.numel(); ++i) sum += static_cast<long double>(p[i]) * p[i];
  return sum;
}

TEST(GradSquares, SumsEveryKindOfGradientOnce) {
  torch::manual_seed(3);
  const std::vector<at::Tensor> grads = {
      torch::randn({1000}),                              // fp32 host array
      torch::randn({777}).to(at::kHalf),                 // fp16 host array
      torch::randn({513}).to(at::kBFloat16),             // bf16 host array
      torch::randn({40, 30}).t(),                        // not contiguous: the tensor path
      torch::randn({321}, torch::kDouble),               // fp64: the tensor path
  };
  GradSquares squares;
  squares.reset();
  long double expected = 0;
  for (const auto& g : grads) {
    squares.add(g);
    expected += reference(g);
  }
  const at::Tensor earlier = torch::randn({99});
  squares.add_device_sum(GradSquares::on_device(earlier));
  expected += reference(earlier);
  squares.add(at::Tensor());  // a bucket without gradient adds nothing
  EXPECT_NEAR(squares.total(), static_cast<double>(expected), 1e-12 * static_cast<double>(expected));
  EXPECT_EQ(squares.total(), squares.total());  // read once, then kept

  squares.reset();
  EXPECT_EQ(squares.total(), 0.0);
  squares.add(grads[0]);
  EXPECT_NEAR(squares.total(), static_cast<double>(reference(grads[0])), 1e-12 * static_cast<double>(reference(grads[0])));
}

TEST(GradSquares, OnDeviceSumsInPiecesWithoutLosingAny) {
  // More than one 16 Mi piece, with a remainder.
  const int64_t n = 5 * ((int64_t{1} << 22) + 12345);
  const at::Tensor g = torch::full({n}, 0.5f).as_strided({n}, {1});
  const at::Tensor sum = GradSquares::on_device(g.reshape({n / 5, 5}).t());  // not contiguous either
  EXPECT_EQ(sum.scalar_type(), at::kDouble);
  EXPECT_EQ(sum.dim(), 0);
  EXPECT_DOUBLE_EQ(sum.item<double>(), 0.25 * static_cast<double>(n));
}

// The overflow check of fp16 reads the same sum: not finite exactly when an
// element is not, also for finite fp32 values whose squares pass fp32's range.
TEST(GradSquares, TotalIsNotFiniteExactlyWhenAnElementIsNot) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (const bool contiguous : {true, false}) {
      for (const float bad : {inf, -inf, nan}) {
        at::Tensor g = torch::ones({64, 3});
        g[17][1] = bad;
        g = g.to(dtype);
        GradSquares squares;
        squares.add(contiguous ? g : g.t());
        EXPECT_FALSE(std::isfinite(squares.total())) << dtype << " " << contiguous << " " << bad;
      }
    }
  }
  GradSquares large;
  const float big_value = std::ldexp(1.0f, 100);  // its square, 2^200, is past fp32 and exact in fp64
  const at::Tensor big = torch::full({2, 4}, big_value);
  large.add(big);
  large.add(big.t());
  EXPECT_TRUE(std::isfinite(large.total()));
  EXPECT_EQ(large.total(), 16 * std::ldexp(1.0, 200));
}

}  // namespace
