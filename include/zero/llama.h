// The Llama family (Llama 2/3, and the models that differ from it only in
// details) as a LibTorch module built from a Hugging Face config.json, with
// Hugging Face's parameter names, so that its safetensors files load as
// they are:
//
//   tokens [B,T] -> model.embed_tokens
//     -> num_hidden_layers decoder layers, each a zero::Unit:
//          x += self_attn(input_layernorm(x))        (RoPE, grouped-query)
//          x += mlp(post_attention_layernorm(x))     (SwiGLU)
//     -> model.norm (RMSNorm) -> lm_head (or embed_tokens' weight when tied)
//   logits [B,T,vocab]
//
// Each operation is transformers' (LlamaForCausalLM, eager attention), in
// the same order and precision: RMSNorm in float32, rotary frequencies in
// float32 (rope_type default or llama3), softmax in float32.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/activation_checkpointing.h"
#include "zero/error.h"
#include "zero/pipeline.h"
#include "zero/sequence_parallel.h"
#include "zero/tensor_parallel.h"
#include "zero/unit.h"

namespace zero::llama {

struct LlamaConfig {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  bool tie_word_embeddings = false, attention_bias = false, mlp_bias = false;
  // rope_type "llama3" (Llama 3.1's frequency scaling) when set.
  bool llama3_rope = false;
  double rope_factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position_embeddings = 0;

  // config.json's text: sizes, rope (transformers 5's "rope_parameters" or
  // the older "rope_theta" and "rope_scaling"). An unknown model_type, or a
  // key that would change the architecture in a way not built here
  // (sliding windows, another activation, partial rotary embeddings, another
  // rope type), throws a zero::ConfigError naming the key; keys that do
  // not change the architecture are ignored.
  static LlamaConfig from_json_text(const std::string& text, const std::string& where);
  static LlamaConfig from_file(const std::string& path);
};

// The parameters a config builds, by Hugging Face's names, with the
// config.json keys that set each shape, computed without building anything:
// a program compares them with the weight files and the machine's memory
// before it allocates (tools/llama/main.cpp). The first `layers`
// decoder layers are listed (they all have the same shapes). Counts
// beyond 2^62 saturate.
struct ParameterShape {
  std::string name;
  std::vector<int64_t> shape;
  std::string keys;  // e.g. "vocab_size, hidden_size"
};
std::vector<ParameterShape> parameter_shapes(const LlamaConfig& c, int64_t layers);
// All the config's parameters (what LlamaForCausalLM(c) holds).
int64_t parameter_count(const LlamaConfig& c);
// Elements of `shape`, saturating at 2^62 rather than overflowing.
int64_t elements(const std::vector<int64_t>& shape);

// Rotary embeddings: the inverse frequencies [head_dim / 2] in float32, and
// cos, sin [B,T,head_dim] for positions first..first+T-1 in `dtype`, as
// transformers computes them.
at::Tensor rope_inv_freq(const LlamaConfig& c);
std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t batch, int64_t time,
                                               at::ScalarType dtype, const at::Device& device, int64_t first = 0);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& c);
  // x [B,T,C]; cos, sin [B,T,head_dim] in x's dtype. With a sequence-
  // parallel group, x is this rank's T/P tokens and cos, sin theirs
  // (Ulysses: zero/sequence_parallel.h).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  zero::tp::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  zero::sp::Group sp;  // null or one rank: the whole sequence here
  int64_t attention_block = 0;  // above 0: blockwise_causal_attention over that many query rows; 0: eager

 private:
  int64_t head_dim_;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const LlamaConfig& c);
  at::Tensor forward(const at::Tensor& x);
  zero::tp::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  int64_t tiles = 1;  // above 1: over that many slices of the sequence (zero::tiled_compute)
};
TORCH_MODULE(MLP);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const LlamaConfig& c);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

// A decoder layer that makes its own rotary embeddings: one layer of the
// pipeline layer list (pipeline_layers), whose layers take one tensor.
// With a sequence-parallel group its tokens are this rank's share, at
// their global positions, and its attention is Ulysses'.
class PipeDecoderLayerImpl : public DecoderLayerImpl {
 public:
  explicit PipeDecoderLayerImpl(const LlamaConfig& c, zero::sp::Group sp = nullptr);
  at::Tensor forward(const at::Tensor& x);

 private:
  at::Tensor inv_freq_;
  zero::sp::Group sp_;
};
TORCH_MODULE(PipeDecoderLayer);

// "model": embed_tokens, layers, norm.
class LlamaModelImpl : public torch::nn::Module {
 public:
  // With a tensor-parallel group of more than one rank (and a vocabulary it
  // divides), embed_tokens is split by vocabulary rows (vocab_embed).
  explicit LlamaModelImpl(const LlamaConfig& c, zero::tp::Group tp = nullptr);
  at::Tensor forward(const at::Tensor& tokens);  // [B,T] -> hidden [B,T,C]
  // Ulysses over `sp` (Mesh::sp_group()): forward then takes this rank's
  // T/P tokens of each sequence (zero::sp::own_tokens), positions counted
  // from its first. Null or a group of one: the whole sequence.
  void sequence_parallel(const zero::sp::Group& sp);
  std::shared_ptr<zero::UnitImpl<DecoderLayer>> layer(size_t i) const {
    return layers->ptr<zero::UnitImpl<DecoderLayer>>(i);
  }
  // The embedding's weight (this rank's rows when vocab-parallel).
  const at::Tensor& embedding_weight() const { return vocab_embed ? vocab_embed->weight : embed_tokens->weight; }
  torch::nn::Embedding embed_tokens{nullptr};          // registered as "embed_tokens", or
  zero::tp::VocabParallelEmbedding vocab_embed{nullptr};  // this one, under the same name
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};

 private:
  LlamaConfig config_;
  at::Tensor inv_freq_;  // [head_dim / 2] float32, not a parameter or buffer (as transformers: non-persistent)
  zero::sp::Group sp_;
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  // Weights are initialised as transformers does (normal(0,
  // initializer_range 0.02), norms 1), deterministic given the seed;
  // loading a checkpoint replaces them.
  // `tp`: a tensor-parallel group; with more than one rank (and a vocabulary
  // it divides) the embedding and the head are split by vocabulary rows and
  // the logits gathered (Megatron's vocab-parallel layers); the decoder
  // layers are split by AutoTP's Llama rules (zero::tp::llama_rules()).
  explicit LlamaForCausalLMImpl(const LlamaConfig& c, zero::tp::Group tp = nullptr);
  at::Tensor forward(const at::Tensor& tokens);  // [B,T] int64 -> logits [B,T,vocab]
  // Mean next-token cross-entropy (in float32) of forward(tokens) against
  // targets [B,T] (-100: no target). With sequence parallelism, tokens and
  // targets are this rank's slices and the mean is over the whole sequence
  // (zero::sp::cross_entropy).
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);
  // Ulysses sequence parallelism over `sp` (LlamaModelImpl::sequence_parallel).
  void sequence_parallel(const zero::sp::Group& sp);
  // ALST's tiled compute (zero::tiled_compute): every decoder layer's MLP
  // over `mlp_tiles` slices of the sequence, and loss() over `loss_tiles`
  // (the head's logits are then never whole); 1: off. The results are the
  // same; the MLP's intermediate activations and the logits peak at one
  // slice's, for a second forward of each.
  void tiled(int64_t mlp_tiles, int64_t loss_tiles);
  // Attention over blocks of `rows` query rows (blockwise_causal_attention),
  // whose memory grows with the context, not its square; 0: transformers'
  // eager attention (the default, [T, T] scores per head).
  void blockwise_attention(int64_t rows);
  const LlamaConfig& config() const { return config_; }

  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // absent when tie_word_embeddings, or
  zero::tp::ColumnParallelLinear vocab_head{nullptr};  // vocab-parallel, registered as "lm_head"

 private:
  at::Tensor logits_of(const at::Tensor& hidden);  // the head, tied or not, split or not
  std::vector<at::Tensor> head_parameters();

  LlamaConfig config_;
  zero::tp::Group tp_;  // set when the vocabulary is split
  zero::sp::Group sp_;
  int64_t loss_tiles_ = 1;
};
TORCH_MODULE(LlamaForCausalLM);

// Causal attention as FlashAttention computes it, over blocks of `block`
// query rows (llama/blockwise_attention.cpp): q, k, v [B, H, T, D] (key/value
// heads repeated to the query heads) -> [B, H, T, D], softmax(q k^T / sqrt(D))
// v with the future masked, computed in float32; only one block's scores
// exist at a time, in forward and in backward (which recomputes them from
// each row's log-sum-exp).
at::Tensor blockwise_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t block);

// Ulysses sequence parallelism over `sp` ranks (LlamaModelImpl::sequence_parallel):
// throws ConfigError naming the numbers when the attention heads do not split
// over them, when key/value heads and sp do not divide one another, or when
// `ctx` (if above 0) tokens do not split over them.
void check_sequence_parallel(const LlamaConfig& c, int64_t sp, int64_t ctx = 0);

// Pipeline parallelism (pipeline.stages > 1): the model as a layer list for
// zero::pipe::PipelineModule, as DeepSpeed's PipelineModule takes it:
// the embedding, the decoder layers, the final norm and the head (tied to
// the embedding when tie_word_embeddings). Its parameters are named by
// layer ("3.self_attn.q_proj.weight", "tied_embed.weight"); hf_name() gives
// Hugging Face's name of each, for Engine::load_weights. With `sp` (the
// mesh's sp_group()), each decoder layer runs Ulysses over it.
std::vector<zero::pipe::Layer> pipeline_layers(const LlamaConfig& c, const zero::sp::Group& sp = nullptr);
std::string hf_name(const LlamaConfig& c, const std::string& pipeline_name);
// The last stage's loss: mean float32 cross-entropy of logits [B,T,V] against labels [B,T].
at::Tensor pipeline_loss(const at::Tensor& logits, const at::Tensor& labels);
// The same over the whole sequence of an sp group (zero::sp::cross_entropy:
// labels shifted over the whole sequence, -100 after the last).
zero::pipe::LossFn pipeline_loss_over(const zero::sp::Group& sp);

}  // namespace zero::llama
