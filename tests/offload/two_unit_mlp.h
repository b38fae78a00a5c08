#pragma once
// The small model of the offload tests: two stage-3 units (fc1, fc2) and an
// output layer outside every unit, so every bucket kind is there.
#include <torch/torch.h>

#include "zero/zero.h"

namespace zero_test {

constexpr int64_t kIn = 24, kHidden = 40, kOut = 10;

struct TwoUnitMlpImpl : torch::nn::Module {
  TwoUnitMlpImpl() {
    fc1 = register_module("fc1", zero::Unit<torch::nn::Linear>(torch::nn::Linear(kIn, kHidden)));
    fc2 = register_module("fc2", zero::Unit<torch::nn::Linear>(torch::nn::Linear(kHidden, kHidden)));
    out = register_module("out", torch::nn::Linear(kHidden, kOut));
  }
  torch::Tensor forward(torch::Tensor x) { return out(torch::gelu(fc2(torch::gelu(fc1(x))))); }
  zero::Unit<torch::nn::Linear> fc1{nullptr}, fc2{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(TwoUnitMlp);

}  // namespace zero_test
