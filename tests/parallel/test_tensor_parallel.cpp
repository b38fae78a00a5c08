// Tensor-parallel layers (include/zero/tensor_parallel.h) on 1, 2 and 4
// gloo ranks, the whole world one TP group: each layer, seeded, holds the
// slices of the torch::nn layer built with the same seed, and its output,
// its input's gradient and its weights' gradients equal that layer's (the
// reference computed on every rank, no communication).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "world_main.h"
#include "zero/error.h"
#include "zero/mesh.h"
#include "zero/tensor_parallel.h"

namespace {

namespace tp = zero::tp;

zero::tp::Group tp_group() {
  static zero::Mesh mesh(g_world, g_world->size(), 1);
  return mesh.tp_group();
}

at::Tensor slice(const at::Tensor& full, int dim) {
  return full.chunk(g_world->size(), dim)[g_world->rank()];
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6)) << what << ": max difference "
                                                      << (got - want).abs().max().item<double>();
}

TEST(TensorParallel, ColumnThenRowEqualsTheFullMlp) {
  const int64_t in = 8, hidden = 16, out = 6;
  torch::manual_seed(7);
  tp::ColumnParallelLinear fc(in, hidden, tp_group());
  tp::RowParallelLinear proj(hidden, out, tp_group());
  torch::manual_seed(7);
  torch::nn::Linear fc_ref(in, hidden), proj_ref(hidden, out);
  expect_close(fc->weight, slice(fc_ref->weight, 0), "column weight");
  expect_close(fc->bias, slice(fc_ref->bias, 0), "column bias");
  expect_close(proj->weight, slice(proj_ref->weight, 1), "row weight");
  expect_close(proj->bias, proj_ref->bias, "row bias (replicated)");

  torch::manual_seed(11);
  at::Tensor x = torch::randn({3, 5, in});
  at::Tensor upstream = torch::randn({3, 5, out});
  at::Tensor x_tp = x.clone().requires_grad_(), x_ref = x.clone().requires_grad_();
  at::Tensor y = proj(torch::gelu(fc(x_tp)));
  at::Tensor y_ref = proj_ref(torch::gelu(fc_ref(x_ref)));
  expect_close(y, y_ref, "output");
  (y * upstream).sum().backward();
  (y_ref * upstream).sum().backward();
  expect_close(x_tp.grad(), x_ref.grad(), "input gradient");
  expect_close(fc->weight.grad(), slice(fc_ref->weight.grad(), 0), "column weight gradient");
  expect_close(fc->bias.grad(), slice(fc_ref->bias.grad(), 0), "column bias gradient");
  expect_close(proj->weight.grad(), slice(proj_ref->weight.grad(), 1), "row weight gradient");
  expect_close(proj->bias.grad(), proj_ref->bias.grad(), "row bias gradient");
}

TEST(TensorParallel, GatheredColumnAndScatteredRowInputs) {
  torch::manual_seed(3);
  tp::ColumnParallelLinear fc(4, 8, tp_group(), /*bias=*/false, /*gather_output=*/true);
  tp::RowParallelLinear proj(8, 4, tp_group(), /*bias=*/false, /*input_is_parallel=*/false);
  torch::manual_seed(3);
  torch::nn::Linear fc_ref(torch::nn::LinearOptions(4, 8).bias(false)), proj_ref(torch::nn::LinearOptions(8, 4).bias(false));
  at::Tensor x = torch::randn({6, 4});
  at::Tensor x_tp = x.clone().requires_grad_(), x_ref = x.clone().requires_grad_();
  at::Tensor y = proj(fc(x_tp)), y_ref = proj_ref(fc_ref(x_ref));
  expect_close(y, y_ref, "output");
  y.pow(2).sum().backward();
  y_ref.pow(2).sum().backward();
  expect_close(x_tp.grad(), x_ref.grad(), "input gradient");
  expect_close(fc->weight.grad(), slice(fc_ref->weight.grad(), 0), "column weight gradient");
  expect_close(proj->weight.grad(), slice(proj_ref->weight.grad(), 1), "row weight gradient");
}

TEST(TensorParallel, VocabParallelEmbeddingEqualsTheFullTable) {
  torch::manual_seed(5);
  tp::VocabParallelEmbedding wte(12, 6, tp_group());
  torch::manual_seed(5);
  torch::nn::Embedding ref(12, 6);
  expect_close(wte->weight, slice(ref->weight, 0), "table rows");
  EXPECT_EQ(wte->first_row(), g_world->rank() * 12 / g_world->size());
  at::Tensor tokens = torch::tensor({0, 11, 5, 5, 3, 7, 2, 9}, torch::kLong).view({2, 4});
  at::Tensor upstream = torch::randn({2, 4, 6});
  at::Tensor e = wte(tokens), e_ref = ref(tokens);
  expect_close(e, e_ref, "embeddings");
  (e * upstream).sum().backward();
  (e_ref * upstream).sum().backward();
  expect_close(wte->weight.grad(), slice(ref->weight.grad(), 0), "table gradient");
}

TEST(TensorParallel, VocabParallelCrossEntropyEqualsTheFullLoss) {
  torch::manual_seed(9);
  const int64_t vocab = 16;
  at::Tensor logits = torch::randn({3, 4, vocab}) * 4;
  at::Tensor targets = torch::randint(vocab, {3, 4}, torch::kLong);
  at::Tensor mine = slice(logits, -1).clone().requires_grad_();
  at::Tensor ref = logits.clone().requires_grad_();
  at::Tensor loss = tp::vocab_parallel_cross_entropy(mine, targets, tp_group());
  at::Tensor loss_ref = torch::nn::functional::cross_entropy(
      ref.view({-1, vocab}), targets.view({-1}), torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  expect_close(loss, loss_ref.view({3, 4}), "per-token loss");
  at::Tensor weights = torch::rand({3, 4});
  (loss * weights).sum().backward();
  (loss_ref.view({3, 4}) * weights).sum().backward();
  expect_close(mine.grad(), slice(ref.grad(), -1), "logits gradient");
}

TEST(TensorParallel, SplitsDescribeFullShapes) {
  struct Net : torch::nn::Module {
    Net() {
      fc = register_module("fc", tp::ColumnParallelLinear(4, 8, tp_group()));
      proj = register_module("proj", tp::RowParallelLinear(8, 4, tp_group()));
      norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})));
    }
    tp::ColumnParallelLinear fc{nullptr};
    tp::RowParallelLinear proj{nullptr};
    torch::nn::LayerNorm norm{nullptr};
  };
  Net net;
  const auto splits = tp::tensor_parallel_splits(net);
  ASSERT_EQ(splits.size(), 3u);  // fc.weight, fc.bias, proj.weight; proj.bias and the norm replicated
  EXPECT_EQ(splits.at("fc.weight").full_shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(splits.at("fc.bias").dim, 0);
  EXPECT_EQ(splits.at("proj.weight").dim, 1);
  EXPECT_EQ(splits.at("proj.weight").rank, g_world->rank());
  EXPECT_EQ(net.named_parameters()["proj.weight"].size(1) * g_world->size(), 8);
}

// full_ranges against slice_of: every element of a slice, found through
// its ranges, is the full tensor's element there (rows, columns, a fused
// 3-part dimension, a 3-D tensor), for fragments cut at odd places.
TEST(TensorParallel, FullRangesLocateEverySliceElement) {
  struct Case {
    std::vector<int64_t> shape;
    int dim, parts;
  };
  const int n = 2;
  for (const Case& c : {Case{{8, 6}, 0, 1}, Case{{6, 8}, 1, 1}, Case{{12, 4}, 0, 3}, Case{{2, 4, 6}, 1, 1},
                        Case{{12}, 0, 3}}) {
    const at::Tensor full = torch::arange(c.shape[0] * (c.shape.size() > 1 ? c.shape[1] : 1) *
                                          (c.shape.size() > 2 ? c.shape[2] : 1), torch::kFloat).view(c.shape);
    for (int r = 0; r < n; ++r) {
      const tp::Split split{c.dim, r, n, c.shape, c.parts};
      const at::Tensor mine = tp::slice_of(full, split).contiguous().view({-1});
      const at::Tensor flat = full.view({-1});
      for (int64_t offset : {int64_t{0}, int64_t{1}, int64_t{5}}) {
        const int64_t length = mine.numel() - offset - (offset > 0 ? 1 : 0);
        int64_t covered = 0;
        for (const auto& range : tp::full_ranges(split, offset, length)) {
          EXPECT_EQ(range.offset, offset + covered);
          EXPECT_TRUE(torch::equal(mine.slice(0, range.offset, range.offset + range.length),
                                   flat.slice(0, range.full_offset, range.full_offset + range.length)));
          covered += range.length;
        }
        EXPECT_EQ(covered, length);
      }
    }
  }
}

TEST(TensorParallel, ASizeThatDoesNotDivideIsAClearError) {
  if (g_world->size() == 1) GTEST_SKIP() << "every size divides by 1";
  try {
    tp::ColumnParallelLinear fc(4, 2 * g_world->size() + 1, tp_group());
    FAIL() << "an output size that does not divide was accepted";
  } catch (const zero::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide by the tensor-parallel size"), std::string::npos) << e.what();
  }
}

}  // namespace
