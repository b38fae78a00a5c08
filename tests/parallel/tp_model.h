#pragma once
// A small transformer-like language model built from the tensor-parallel
// layers (include/zero/tensor_parallel.h): vocab-parallel embedding, blocks
// of LayerNorm -> column-parallel fc -> GELU -> row-parallel proj with a
// residual, each a zero::Unit, and a column-parallel LM head feeding the
// vocab-parallel cross-entropy. On a tp group of one it is the reference
// model, with the same weights for the same seed.
#include <torch/torch.h>

#include "zero/tensor_parallel.h"
#include "zero/unit.h"

namespace tp_test {

constexpr int64_t kVocab = 32, kWidth = 16, kHidden = 32, kContext = 8;

struct TpBlockImpl : torch::nn::Module {
  explicit TpBlockImpl(const zero::tp::Group& group) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
    fc = register_module("fc", zero::tp::ColumnParallelLinear(kWidth, kHidden, group));
    proj = register_module("proj", zero::tp::RowParallelLinear(kHidden, kWidth, group));
  }
  at::Tensor forward(const at::Tensor& x) { return x + proj(torch::gelu(fc(ln(x)))); }
  torch::nn::LayerNorm ln{nullptr};
  zero::tp::ColumnParallelLinear fc{nullptr};
  zero::tp::RowParallelLinear proj{nullptr};
};
TORCH_MODULE(TpBlock);

struct TpNetImpl : torch::nn::Module {
  TpNetImpl(const zero::tp::Group& group, int depth) : group(group) {
    wte = register_module("wte", zero::tp::VocabParallelEmbedding(kVocab, kWidth, group));
    for (int i = 0; i < depth; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), zero::Unit<TpBlock>(TpBlock(group))));
    }
    lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
    head = register_module("head", zero::tp::ColumnParallelLinear(kWidth, kVocab, group, /*bias=*/false));
  }
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) {
    at::Tensor x = wte(tokens);
    for (auto& b : blocks) x = b(x);
    return zero::tp::vocab_parallel_cross_entropy(head(lnf(x)), targets, group).mean();
  }
  zero::tp::Group group;
  zero::tp::VocabParallelEmbedding wte{nullptr};
  std::vector<zero::Unit<TpBlock>> blocks;
  torch::nn::LayerNorm lnf{nullptr};
  zero::tp::ColumnParallelLinear head{nullptr};
};
TORCH_MODULE(TpNet);

}  // namespace tp_test
