// Note [LibTorch 1.13 and 2.x]: each difference absorbed by
// core/torch_compat.h, checked on the LibTorch this test is built with. CI
// builds it against both (ZERO_TORCH=debian and wheel), so every entry is
// checked on each side; a test that belongs to the other side skips, saying so.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/torch_compat.h"
#include "engine/checkpoint_io.h"
#include "zero/error.h"

namespace {

using zero::compat::GradAccumulatorPtr;

struct CountingHook : torch::autograd::FunctionPostHook {
  CountingHook(std::vector<at::Tensor>* seen, at::Tensor param) : seen(seen), param(std::move(param)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    seen->push_back(param.grad().clone());
    return outputs;
  }
  std::vector<at::Tensor>* seen;
  at::Tensor param;
};

// What stages 1-2 rely on: a post-hook on the AccumulateGrad node, held
// through GradAccumulatorPtr, fires once per backward, after the gradient
// has been accumulated into .grad.
TEST(TorchCompat, GradAccumulatorPostHookFiresOncePerBackwardAfterAccumulation) {
  auto w = torch::tensor({1.0f, 2.0f, 3.0f}, torch::requires_grad());
  std::vector<at::Tensor> seen;
  GradAccumulatorPtr acc = torch::autograd::impl::grad_accumulator(w);
  ASSERT_TRUE(acc);
  acc->add_post_hook(std::make_unique<CountingHook>(&seen, w));
  const auto x = torch::tensor({4.0f, 5.0f, 6.0f});
  (w * x).sum().backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(torch::equal(seen[0], x));
  (w * w).sum().backward();  // accumulates 2w onto x
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(torch::equal(seen[1], x + 2 * w.detach()));
}

// torch::optim's state after a step is found under the parameter's key.
TEST(TorchCompat, OptimizerStateKeyFindsTheParametersState) {
  auto w = torch::ones({3}, torch::requires_grad());
  torch::optim::Adam adam({w}, torch::optim::AdamOptions(0.1));
  (w * w).sum().backward();
  adam.step();
  const auto it = adam.state().find(zero::compat::optimizer_state_key(w));
  ASSERT_NE(it, adam.state().end());
  const auto& state = static_cast<const torch::optim::AdamParamState&>(*it->second);
  EXPECT_EQ(state.step(), 1);
  EXPECT_TRUE(torch::allclose(state.exp_avg(), 0.1 * 2 * torch::ones({3})));
  auto other = torch::ones({3});
  EXPECT_EQ(adam.state().find(zero::compat::optimizer_state_key(other)), adam.state().end());
}

// A group's options stay as given, whatever the optimizer's defaults: also a
// field equal to its type's constructor default (lr 1e-3 for Adam).
TEST(TorchCompat, KeepGroupOptionsKeepsEveryGroupAsGiven) {
  auto a = torch::ones({2}, torch::requires_grad()), b = torch::ones({2}, torch::requires_grad());
  std::vector<torch::optim::OptimizerParamGroup> given;
  given.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<torch::optim::AdamOptions>(1e-3));
  given.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<torch::optim::AdamOptions>(0.25));
  torch::optim::Adam adam(given, torch::optim::AdamOptions(0.5));
  zero::compat::keep_group_options(adam, given);
  EXPECT_EQ(adam.param_groups()[0].options().get_lr(), 1e-3);
  EXPECT_EQ(adam.param_groups()[1].options().get_lr(), 0.25);
  EXPECT_EQ(adam.defaults().get_lr(), 0.5);
}

// On 2.x: torch's own float8 dtypes decode every code as the checkpoint
// format does, and the engine maps them both ways.
TEST(TorchCompat, Float8TensorsAreTorchsFloat8) {
  if (!zero::compat::float8_e4m3fn())
    GTEST_SKIP() << "LibTorch " << zero::compat::torch_version()
                 << " has no float8 dtypes; Float8IsRefusedByNameWithoutThem covers this build";
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  for (zero::ckpt::DType d : {zero::ckpt::DType::F8_E4M3, zero::ckpt::DType::F8_E5M2}) {
    const at::ScalarType t = zero::engine::from_ckpt(d);
    EXPECT_EQ(zero::engine::to_ckpt(t), d);
    const at::Tensor ref = torch::from_blob(codes.data(), {256}, t).to(at::kFloat);
    std::vector<float> ours(256);
    zero::ckpt::convert_to_f32(d, codes.data(), codes.size(), ours.data());
    for (int i = 0; i < 256; ++i) {
      const float r = ref[i].item<float>();
      if (std::isnan(r)) EXPECT_TRUE(std::isnan(ours[i])) << zero::ckpt::dtype_name(d) << " code " << i;
      else EXPECT_EQ(ours[i], r) << zero::ckpt::dtype_name(d) << " code " << i;
    }
  }
}

// On 1.13: a float8 tensor cannot become a torch tensor, and the error says
// which LibTorch would do it.
TEST(TorchCompat, Float8IsRefusedByNameWithoutThem) {
  if (zero::compat::float8_e4m3fn())
    GTEST_SKIP() << "LibTorch " << zero::compat::torch_version()
                 << " has float8 dtypes; Float8TensorsAreTorchsFloat8 covers this build";
  for (zero::ckpt::DType d : {zero::ckpt::DType::F8_E4M3, zero::ckpt::DType::F8_E5M2}) {
    try {
      zero::engine::from_ckpt(d);
      ADD_FAILURE() << zero::ckpt::dtype_name(d) << " was accepted";
    } catch (const zero::CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(zero::ckpt::dtype_name(d)), std::string::npos) << what;
      EXPECT_NE(what.find("LibTorch 2.1 or newer"), std::string::npos) << what;
      EXPECT_NE(what.find(zero::compat::torch_version()), std::string::npos) << what;
    }
  }
}

}  // namespace
