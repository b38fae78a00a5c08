#pragma once
// The model of the fp16 tests: LibTorch's CPU kernels lack fp16 matmul and
// layer norm, so it is element-wise: y = sum(x * w + b) per row, with kN
// elements, not a multiple of any world size the tests use.
#include <torch/torch.h>

namespace zero_test {

constexpr int64_t kN = 37;

struct ElementwiseImpl : torch::nn::Module {
  ElementwiseImpl() {
    torch::manual_seed(3);
    w = register_parameter("w", torch::randn({kN}) * 0.1);
    b = register_parameter("b", torch::zeros({kN}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return (x * w + b).sum(1); }
  torch::Tensor w, b;
};
TORCH_MODULE(Elementwise);

}  // namespace zero_test
