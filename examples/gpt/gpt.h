// A GPT-style decoder-only transformer for the main job (and the tests).
//
//   tokens [B,T] int64
//     -> token embedding (wte) + learned position embedding (wpe), dropout
//     -> `depth` pre-LayerNorm blocks:  x += attn(ln1(x));  x += mlp(ln2(x))
//     -> final LayerNorm (ln_f)
//     -> LM head: x @ wte.weight^T when tie_embeddings (the default), else a
//        separate bias-free Linear (lm_head)
//   logits [B,T,V]
//
// Written with plain LibTorch pieces (Linear, LayerNorm, Embedding, matmul,
// softmax) that behave the same in LibTorch 1.13 and 2.x; no
// torch::nn::MultiheadAttention, no fused attention kernels.
//
// Parameter names (what a state dict / checkpoint sees):
//   wte.weight, wpe.weight,
//   blocks.<i>.ln1.{weight,bias}, blocks.<i>.attn.qkv.{weight,bias},
//   blocks.<i>.attn.proj.{weight,bias}, blocks.<i>.ln2.{weight,bias},
//   blocks.<i>.mlp.fc.{weight,bias}, blocks.<i>.mlp.proj.{weight,bias},
//   ln_f.{weight,bias}, and lm_head.weight only when the embeddings are untied.
//
// Tied weight: with tie_embeddings the output projection *is* wte.weight (one
// tensor used twice in forward, gradients from both uses accumulate into it).
// It is registered once, as wte.weight, so parameters() lists it once.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "zero/tensor_parallel.h"
#include "zero/unit.h"

namespace zero_examples {

struct GPTOptions {
  int64_t vocab_size = 0;      // required: number of token ids
  int64_t context = 64;        // maximum sequence length (number of positions)
  int64_t depth = 4;           // number of transformer blocks
  int64_t width = 128;         // embedding dimension
  int64_t heads = 4;           // attention heads; width % heads == 0
  int64_t mlp_ratio = 4;       // MLP hidden size = mlp_ratio * width
  double dropout = 0.0;        // embedding, attention and residual dropout
  bool tie_embeddings = true;  // LM head shares wte.weight

  // Throws std::invalid_argument naming the offending field.
  void validate() const;
};

// Causal multi-head self-attention: one fused qkv projection, scores
// (q k^T) / sqrt(head_dim) with positions > t masked to -inf, softmax (in
// float32 whatever the input dtype), weighted sum of v, output projection.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTOptions& options);
  at::Tensor forward(const at::Tensor& x);  // [B,T,C] -> [B,T,C]

  // zero::tp::Linear: a torch::nn::Linear that AutoTP can split in place
  // (include/zero/tensor_parallel.h); plain unless the engine runs tp > 1.
  zero::tp::Linear qkv{nullptr};   // C -> 3C
  zero::tp::Linear proj{nullptr};  // C -> C, a residual projection
  torch::nn::Dropout attn_drop{nullptr};
  torch::nn::Dropout resid_drop{nullptr};

 private:
  int64_t heads_;
};
TORCH_MODULE(CausalSelfAttention);

// Position-wise MLP: Linear(C, rC) -> GELU -> Linear(rC, C) -> dropout.
class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTOptions& options);
  at::Tensor forward(const at::Tensor& x);

  zero::tp::Linear fc{nullptr};    // C -> rC
  zero::tp::Linear proj{nullptr};  // rC -> C, a residual projection
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(MLP);

// One pre-LayerNorm transformer block. Each block is its own registered
// module: the unit a ZeRO stage-3 engine gathers and releases as a whole.
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTOptions& options);
  at::Tensor forward(const at::Tensor& x);  // [B,T,C] -> [B,T,C]

  // GPT-2 initialisation: weights ~ N(0, std), residual projections
  // (attn.proj, mlp.proj) ~ N(0, residual_std), biases 0, LayerNorm 1/0.
  void init_weights(double std, double residual_std);

  torch::nn::LayerNorm ln1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln2{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  // Builds and initialises the model; deterministic given torch::manual_seed
  // (construction consumes the default CPU generator in a fixed order).
  explicit GPTImpl(const GPTOptions& options);

  // tokens [B,T] int64 with T <= context -> logits [B,T,vocab_size].
  at::Tensor forward(const at::Tensor& tokens);

  // Mean cross-entropy (computed in float32) of forward(tokens) against
  // targets [B,T] int64, usually the tokens shifted by one.
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);

  // Greedy continuation of prompt [B,T0] by new_tokens tokens (no grad; the
  // window is cropped to the last `context` tokens). Returns [B,T0+new_tokens].
  at::Tensor generate(const at::Tensor& prompt, int64_t new_tokens);

  // Number of parameter elements, each tensor counted once (the tied
  // embedding/head weight once).
  int64_t num_parameters() const;

  // The weight of the output projection: wte->weight when tied.
  const at::Tensor& head_weight() const;

  const GPTOptions& options() const { return options_; }

  // Block i, as held in `blocks`: a zero::Unit around a Block.
  std::shared_ptr<zero::UnitImpl<Block>> block(size_t i) const { return blocks->ptr<zero::UnitImpl<Block>>(i); }

  torch::nn::Embedding wte{nullptr};   // [vocab_size, width]
  torch::nn::Embedding wpe{nullptr};   // [context, width]
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};  // `depth` Block modules, "blocks.<i>"
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  // only when !tie_embeddings

 private:
  void init_weights();
  GPTOptions options_;
};
TORCH_MODULE(GPT);

}  // namespace zero_examples
