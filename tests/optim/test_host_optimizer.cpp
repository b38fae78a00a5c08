// The host optimizers (optim/host_optimizer.h) as the partition's step
// drives them: one tensor at a time through update_tensor(i, target),
// against torch::optim's own optimizer of the same kind stepped on copies
// with the same gradients times the same factor. The target gets the new
// values in its dtype in the same pass; a tensor kept "elsewhere" (Note
// [Partial offload]) is updated by torch::optim itself.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "optim/host_optimizer.h"
#include "zero/error.h"

namespace {

using zero::optim::CpuAdagrad;
using zero::optim::CpuAdam;

std::vector<at::Tensor> make_tensors() {
  torch::manual_seed(3);
  return {torch::randn({257}), torch::randn({33})};
}

std::vector<at::Tensor> make_grads(int step) {
  torch::manual_seed(100 + step);
  return {torch::randn({257}), torch::randn({33})};
}

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.clone());
  return out;
}

// One group per tensor, as the engine makes one per parameter group.
template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> groups_of(const std::vector<at::Tensor>& ts, const Options& o) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto options = std::make_unique<Options>(o);
    options->weight_decay(0.01 * static_cast<double>(i + 1));
    groups.emplace_back(std::vector<at::Tensor>{ts[i]}, std::move(options));
  }
  return groups;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const char* what) {
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-6)) << what << ": max diff " << (a - b).abs().max().item<double>();
}

// `grad_dtype`: the training dtype the kernels read the gradients in.
void adam_against_torch(bool decoupled, at::ScalarType grad_dtype) {
  SCOPED_TRACE(std::string(decoupled ? "AdamW" : "Adam") + " grads " + c10::toString(grad_dtype));
  const double factor = 0.5;  // the loss scale's inverse times the clipping coefficient
  std::vector<at::Tensor> host = make_tensors(), ref = copies(host);
  std::unique_ptr<torch::optim::Optimizer> torch_opt;
  std::unique_ptr<CpuAdam> kernel;
  if (decoupled) {
    torch::optim::AdamWOptions o(1e-2);
    o.betas({0.9, 0.95}).eps(1e-8);
    torch_opt = std::make_unique<torch::optim::AdamW>(groups_of(ref, o), o);
    kernel = std::make_unique<CpuAdam>(groups_of(host, o), true);
  } else {
    torch::optim::AdamOptions o(1e-2);
    o.betas({0.9, 0.95}).eps(1e-8);
    torch_opt = std::make_unique<torch::optim::Adam>(groups_of(ref, o), o);
    kernel = std::make_unique<CpuAdam>(groups_of(host, o), false);
  }
  kernel->set_grad_scale(factor);
  for (int step = 1; step <= 3; ++step) {
    const auto grads = make_grads(step);
    for (size_t i = 0; i < host.size(); ++i) {
      const at::Tensor g = grads[i].to(grad_dtype);
      host[i].mutable_grad() = g;
      ref[i].mutable_grad() = g.to(at::kFloat) * factor;  // what the kernels read
    }
    torch_opt->step();
    for (size_t i = 0; i < host.size(); ++i) {
      at::Tensor target = torch::empty({host[i].numel()}, at::kBFloat16);
      kernel->update_tensor(i, target);
      expect_close(host[i], ref[i], "master");
      EXPECT_TRUE(torch::equal(target, host[i].to(at::kBFloat16))) << "the target holds the master in bf16";
    }
  }
}

TEST(HostOptimizer, AdamWAndAdamMatchTorchOptimTensorByTensor) {
  for (bool decoupled : {true, false}) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) adam_against_torch(decoupled, dtype);
  }
}

TEST(HostOptimizer, AdagradMatchesTorchOptimWithAnFp32Target) {
  std::vector<at::Tensor> host = make_tensors(), ref = copies(host);
  torch::optim::AdagradOptions o(5e-2);
  o.lr_decay(1e-3).eps(1e-10).initial_accumulator_value(0.1);
  torch::optim::Adagrad torch_opt(groups_of(ref, o), o);
  CpuAdagrad kernel(groups_of(host, o));
  for (int step = 1; step <= 3; ++step) {
    const auto grads = make_grads(step);
    for (size_t i = 0; i < host.size(); ++i) {
      host[i].mutable_grad() = grads[i];
      ref[i].mutable_grad() = grads[i].clone();
    }
    torch_opt.step();
    for (size_t i = 0; i < host.size(); ++i) {
      at::Tensor target = torch::empty({host[i].numel()});
      kernel.update_tensor(i, target);
      expect_close(host[i], ref[i], "master");
      EXPECT_TRUE(torch::equal(target, host[i])) << "an fp32 target is the master's copy";
    }
  }
}

// Note [Partial offload]: a tensor kept where the parameters are is updated
// there by torch::optim, with its gradient scaled as the kernels scale
// theirs and left as it was.
TEST(HostOptimizer, ATensorKeptElsewhereIsUpdatedByTorchOptim) {
  std::vector<at::Tensor> host = make_tensors(), ref = copies(host);
  torch::optim::AdamWOptions o(1e-2);
  torch::optim::AdamW torch_opt(groups_of(ref, o), o);
  CpuAdam kernel(groups_of(host, o), true, /*elsewhere=*/{host[1]});
  EXPECT_TRUE(kernel.on_host(host[0]));
  EXPECT_FALSE(kernel.on_host(host[1]));
  kernel.set_grad_scale(0.25);
  const auto grads = make_grads(1);
  for (size_t i = 0; i < host.size(); ++i) {
    host[i].mutable_grad() = grads[i].clone();
    ref[i].mutable_grad() = grads[i] * 0.25;
  }
  torch_opt.step();
  for (size_t i = 0; i < host.size(); ++i) {
    kernel.update_tensor(i, at::Tensor());
    expect_close(host[i], ref[i], "master");
  }
  EXPECT_TRUE(torch::equal(host[1].grad(), grads[1])) << "the gradient itself is left alone";
}

TEST(HostOptimizer, ATensorWithoutAGradientIsRefusedByIndex) {
  std::vector<at::Tensor> host = make_tensors();
  torch::optim::AdamWOptions o(1e-2);
  CpuAdam kernel(groups_of(host, o), true);
  try {
    kernel.update_tensor(1, at::Tensor());
    ADD_FAILURE() << "updated";
  } catch (const zero::OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("offloaded tensor 1 has no gradient"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kernel.update_tensor(2, at::Tensor()), zero::OffloadError);
}

}  // namespace
