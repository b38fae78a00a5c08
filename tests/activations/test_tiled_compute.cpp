// zero::tiled_compute (ALST's tiled compute) on one process, against the
// same computation untiled: an MLP's output and the gradients of its input
// and parameters, a loss summed over tiles, uneven tiles, one tile per
// position, evaluation, nesting inside zero::checkpoint, and a parameter
// left out of the list refused by name.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "zero/activation_checkpointing.h"
#include "zero/error.h"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    gate = register_module("gate", torch::nn::Linear(8, 20));
    up = register_module("up", torch::nn::Linear(8, 20));
    down = register_module("down", torch::nn::Linear(20, 8));
  }
  at::Tensor forward(const at::Tensor& x) { return down(torch::silu(gate(x)) * up(x)); }
  torch::nn::Linear gate{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(Mlp);

double relative(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(want.abs().max().item<double>(), 1e-30);
}

struct Outcome {
  at::Tensor out, input_grad;
  std::vector<at::Tensor> grads;
};

// forward(x) of a fresh MLP (seed 0) on x (seed 1), backward of a fixed
// weighting of the output.
template <typename F>
Outcome run(F&& forward) {
  torch::manual_seed(0);
  Mlp mlp;
  torch::manual_seed(1);
  at::Tensor x = torch::randn({3, 13, 8}).requires_grad_(true);
  at::Tensor weight = torch::randn({3, 13, 8});
  Outcome o;
  o.out = forward(mlp, x);
  (o.out * weight).sum().backward();
  o.input_grad = x.grad().clone();
  for (const auto& p : mlp->parameters()) o.grads.push_back(p.grad().clone());
  return o;
}

void expect_close(const Outcome& got, const Outcome& want) {
  EXPECT_LT(relative(got.out, want.out), 1e-6) << "output";
  EXPECT_LT(relative(got.input_grad, want.input_grad), 1e-6) << "input gradient";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i) EXPECT_LT(relative(got.grads[i], want.grads[i]), 1e-6) << "parameter " << i;
}

TEST(TiledCompute, MlpEqualsUntiledForAnyNumberOfTiles) {
  const Outcome want = run([](Mlp& m, const at::Tensor& x) { return m(x); });
  for (int64_t tiles : {1, 2, 3, 5, 13, 40}) {  // 13 positions: uneven tiles, one per position, more than positions
    SCOPED_TRACE(std::to_string(tiles) + " tiles");
    expect_close(run([tiles](Mlp& m, const at::Tensor& x) {
                   return zero::tiled_compute([&m](const at::Tensor& t, int64_t) { return m(t); }, x, m->parameters(),
                                              tiles);
                 }),
                 want);
  }
}

TEST(TiledCompute, ScalarResultsAreSummedAndTilesKnowTheirStart) {
  torch::manual_seed(2);
  torch::nn::Linear head(8, 30);
  at::Tensor h = torch::randn({2, 11, 8}).requires_grad_(true);
  at::Tensor labels = torch::randint(30, {2, 11}, torch::kLong);
  labels[0][4] = -100;
  namespace F = torch::nn::functional;
  auto loss_of = [&](const at::Tensor& tile, int64_t start) {
    at::Tensor logits = head(tile);
    return F::cross_entropy(logits.reshape({-1, 30}), labels.narrow(1, start, tile.size(1)).reshape({-1}),
                            F::CrossEntropyFuncOptions().reduction(torch::kSum));
  };
  at::Tensor whole = loss_of(h, 0);
  whole.backward();
  const at::Tensor h_grad = h.grad().clone(), w_grad = head->weight.grad().clone();
  h.mutable_grad() = at::Tensor();
  head->weight.mutable_grad() = at::Tensor();
  head->bias.mutable_grad() = at::Tensor();
  at::Tensor tiled = zero::tiled_compute(loss_of, h, head->parameters(), 4);
  ASSERT_EQ(tiled.dim(), 0);
  EXPECT_NEAR(tiled.item<double>(), whole.item<double>(), 1e-6 * std::abs(whole.item<double>()));
  tiled.backward();
  EXPECT_LT(relative(h.grad(), h_grad), 1e-6);
  EXPECT_LT(relative(head->weight.grad(), w_grad), 1e-6);
}

TEST(TiledCompute, NestsInsideACheckpointAndRunsWithoutGrad) {
  const Outcome want = run([](Mlp& m, const at::Tensor& x) { return m(x); });
  expect_close(run([](Mlp& m, const at::Tensor& x) {
                 return zero::checkpoint_with_params(
                     m->parameters(),
                     [&m](const at::Tensor& in) {
                       return zero::tiled_compute([&m](const at::Tensor& t, int64_t) { return m(t); }, in,
                                                  m->parameters(), 3);
                     },
                     x);
               }),
               want);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  Mlp mlp;
  at::Tensor x = torch::randn({2, 9, 8});
  at::Tensor tiled = zero::tiled_compute([&mlp](const at::Tensor& t, int64_t) { return mlp(t); }, x, {}, 4);
  EXPECT_LT(relative(tiled, mlp(x)), 1e-6);
}

TEST(TiledCompute, AParameterLeftOutOfTheListIsRefused) {
  torch::manual_seed(0);
  Mlp mlp;
  at::Tensor x = torch::randn({1, 6, 8}).requires_grad_(true);
  std::vector<at::Tensor> listed{mlp->gate->weight, mlp->gate->bias, mlp->up->weight, mlp->up->bias};  // not down's
  at::Tensor y = zero::tiled_compute([&mlp](const at::Tensor& t, int64_t) { return mlp(t); }, x, listed, 2);
  try {
    y.sum().backward();
    FAIL() << "expected an EngineError";
  } catch (const c10::Error& e) {  // autograd wraps what backward throws
    EXPECT_NE(std::string(e.what()).find("not listed in `params`"), std::string::npos) << e.what();
  } catch (const zero::EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("not listed in `params`"), std::string::npos) << e.what();
  }
  EXPECT_THROW(zero::tiled_compute([&mlp](const at::Tensor& t, int64_t) { return mlp(t); }, x, {}, 0), zero::EngineError);
}

}  // namespace
