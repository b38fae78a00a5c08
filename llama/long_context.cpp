// The Llama family's long-context switches (zero/llama.h): Ulysses
// sequence parallelism, ALST's tiled MLP and loss, and blockwise attention,
// with the loss they change.
#include <torch/torch.h>

#include <string>
#include <vector>

#include "zero/activation_checkpointing.h"
#include "zero/error.h"
#include "zero/llama.h"
#include "zero/sequence_parallel.h"

namespace zero::llama {

void check_sequence_parallel(const LlamaConfig& c, int64_t sp, int64_t ctx) {
  if (c.num_attention_heads % sp != 0) {
    throw ConfigError("Llama: num_attention_heads " + std::to_string(c.num_attention_heads) +
                      " does not split over sequence_parallel_size " + std::to_string(sp) +
                      "; use a size that divides the heads");
  }
  const int64_t kv = c.num_key_value_heads;
  if (kv % sp != 0 && sp % kv != 0) {
    throw ConfigError("Llama: num_key_value_heads " + std::to_string(kv) + " and sequence_parallel_size " +
                      std::to_string(sp) + ": one must divide the other (fewer key/value heads than ranks are "
                      "repeated, as DeepSpeed's Ulysses does)");
  }
  if (ctx > 0 && ctx % sp != 0) {
    throw ConfigError("Llama: a context of " + std::to_string(ctx) + " tokens does not split over sequence_parallel_size " +
                      std::to_string(sp) + "; use a context that is a multiple of " + std::to_string(sp));
  }
}

void LlamaModelImpl::sequence_parallel(const zero::sp::Group& sp) {
  // With tensor parallelism (AutoTP first) each rank's attention holds its
  // share of the heads: those are what split over the sp ranks.
  LlamaConfig local = config_;
  if (!layers->is_empty()) {
    const auto& attention = layer(0)->inner()->self_attn;
    local.num_attention_heads = attention->q_proj->weight.size(0) / config_.head_dim;
    local.num_key_value_heads = attention->k_proj->weight.size(0) / config_.head_dim;
  }
  check_sequence_parallel(local, sp ? sp->size() : 1);
  sp_ = sp;
  for (size_t i = 0; i < layers->size(); ++i) layer(i)->inner()->self_attn->sp = sp;
}

std::vector<at::Tensor> LlamaForCausalLMImpl::head_parameters() {
  if (config_.tie_word_embeddings) return {model->embedding_weight()};
  return vocab_head ? vocab_head->parameters() : lm_head->parameters();
}

at::Tensor LlamaForCausalLMImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  if (loss_tiles_ <= 1) return zero::sp::cross_entropy(forward(tokens), targets, sp_);
  // Tiled: each slice's logits and the sum of its token losses, the slice
  // recomputed in backward; the mean as zero::sp::cross_entropy takes it.
  namespace F = torch::nn::functional;
  // Kept by value: backward calls it again, after the caller's tensors are gone.
  auto summed = [this, targets](const at::Tensor& tile, int64_t start) {
    at::Tensor logits = logits_of(tile).to(torch::kFloat);
    return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.narrow(1, start, tile.size(1)).reshape({-1}),
                            F::CrossEntropyFuncOptions().reduction(torch::kSum));
  };
  at::Tensor sum = zero::tiled_compute(summed, model(tokens), head_parameters(), loss_tiles_);
  return zero::sp::mean_over(sum, (targets != -100).sum().to(torch::kFloat), sp_);
}

void LlamaForCausalLMImpl::blockwise_attention(int64_t rows) {
  if (rows < 0) throw ConfigError("Llama: an attention block of " + std::to_string(rows) + " rows; 0 (eager) or more");
  for (size_t i = 0; i < model->layers->size(); ++i) model->layer(i)->inner()->self_attn->attention_block = rows;
}

void LlamaForCausalLMImpl::tiled(int64_t mlp_tiles, int64_t loss_tiles) {
  if (mlp_tiles < 1 || loss_tiles < 1) {
    throw ConfigError("Llama: tiles must be at least 1 (1: off); got " + std::to_string(mlp_tiles) + " for the MLP and " +
                      std::to_string(loss_tiles) + " for the loss");
  }
  for (size_t i = 0; i < model->layers->size(); ++i) model->layer(i)->inner()->mlp->tiles = mlp_tiles;
  loss_tiles_ = loss_tiles;
}

void LlamaForCausalLMImpl::sequence_parallel(const zero::sp::Group& sp) {
  model->sequence_parallel(sp);
  sp_ = sp;
}

}  // namespace zero::llama
