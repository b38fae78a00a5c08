#include "gpt/gpt.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace zero_examples {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("GPTOptions: " + message);
}

torch::nn::LayerNorm layer_norm(int64_t width) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({width}));
}

// GPT-2's initialisation: N(0, 0.02), residual projections scaled by
// 1/sqrt(number of residual adds).
constexpr double kInitStd = 0.02;
double residual_std(const GPTOptions& o) { return kInitStd / std::sqrt(2.0 * static_cast<double>(o.depth)); }

void init_linear(torch::nn::LinearImpl& linear, double std) {
  torch::nn::init::normal_(linear.weight, 0.0, std);
  if (linear.bias.defined()) torch::nn::init::zeros_(linear.bias);
}

void init_layer_norm(torch::nn::LayerNorm& ln) {
  torch::nn::init::ones_(ln->weight);
  torch::nn::init::zeros_(ln->bias);
}

}  // namespace

void GPTOptions::validate() const {
  require(vocab_size > 0, "vocab_size must be > 0 (got " + std::to_string(vocab_size) + ")");
  require(context > 0, "context must be > 0 (got " + std::to_string(context) + ")");
  require(depth > 0, "depth must be > 0 (got " + std::to_string(depth) + ")");
  require(width > 0, "width must be > 0 (got " + std::to_string(width) + ")");
  require(heads > 0 && width % heads == 0, "width (" + std::to_string(width) +
                                               ") must be a positive multiple of heads (" +
                                               std::to_string(heads) + ")");
  require(mlp_ratio > 0, "mlp_ratio must be > 0 (got " + std::to_string(mlp_ratio) + ")");
  require(dropout >= 0.0 && dropout < 1.0, "dropout must be in [0, 1) (got " + std::to_string(dropout) + ")");
}

// ---- attention ----------------------------------------------------------

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTOptions& o) : heads_(o.heads) {
  qkv = register_module("qkv", zero::tp::Linear(o.width, 3 * o.width));
  proj = register_module("proj", zero::tp::Linear(o.width, o.width));
  attn_drop = register_module("attn_drop", torch::nn::Dropout(o.dropout));
  resid_drop = register_module("resid_drop", torch::nn::Dropout(o.dropout));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const int64_t D = C / heads_;
  // [B,T,3C] -> three [B,H,T,D]. With tensor parallelism (AutoTP) qkv
  // yields this rank's heads only, so H is read from its width.
  at::Tensor fused = qkv(x);
  if (fused.size(2) % (3 * D) != 0) {
    throw std::invalid_argument("GPT attention: this rank's share of the qkv projection (" +
                                std::to_string(fused.size(2) / 3) + " of " + std::to_string(C) +
                                " per q, k, v) is not whole heads of " + std::to_string(D) +
                                "; the tensor-parallel size must divide heads (" + std::to_string(heads_) + ")");
  }
  const int64_t H = fused.size(2) / (3 * D);
  auto qkv_out = fused.view({B, T, 3, H, D}).permute({2, 0, 3, 1, 4});
  at::Tensor q = qkv_out[0], k = qkv_out[1], v = qkv_out[2];
  // Scale q before the product so that half-precision scores stay small.
  at::Tensor scores = (q * (1.0 / std::sqrt(static_cast<double>(D)))).matmul(k.transpose(-2, -1));  // [B,H,T,T]
  // Causal mask: position t attends to positions <= t only.
  at::Tensor future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  at::Tensor probs = torch::softmax(scores, -1, torch::kFloat).to(v.scalar_type());
  probs = attn_drop(probs);
  at::Tensor y = probs.matmul(v);                          // [B,H,T,D]
  y = y.transpose(1, 2).contiguous().view({B, T, H * D});  // [B,T,C] (C / tp with AutoTP)
  return resid_drop(proj(y));
}

// ---- MLP ----------------------------------------------------------------

MLPImpl::MLPImpl(const GPTOptions& o) {
  fc = register_module("fc", zero::tp::Linear(o.width, o.mlp_ratio * o.width));
  proj = register_module("proj", zero::tp::Linear(o.mlp_ratio * o.width, o.width));
  drop = register_module("drop", torch::nn::Dropout(o.dropout));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) { return drop(proj(torch::gelu(fc(x)))); }

// ---- block --------------------------------------------------------------

BlockImpl::BlockImpl(const GPTOptions& o) {
  ln1 = register_module("ln1", layer_norm(o.width));
  attn = register_module("attn", CausalSelfAttention(o));
  ln2 = register_module("ln2", layer_norm(o.width));
  mlp = register_module("mlp", MLP(o));
  // A block sets its own weights, so that it is whole when its constructor
  // returns: under zero::Init (include/zero/init.h) it is partitioned then.
  init_weights(kInitStd, residual_std(o));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = x + attn(ln1(x));
  return h + mlp(ln2(h));
}

void BlockImpl::init_weights(double std, double residual_std) {
  init_layer_norm(ln1);
  init_linear(*attn->qkv, std);
  init_linear(*attn->proj, residual_std);
  init_layer_norm(ln2);
  init_linear(*mlp->fc, std);
  init_linear(*mlp->proj, residual_std);
}

// ---- GPT ----------------------------------------------------------------

GPTImpl::GPTImpl(const GPTOptions& o) : options_(o) {
  options_.validate();
  wte = register_module("wte", torch::nn::Embedding(o.vocab_size, o.width));
  wpe = register_module("wpe", torch::nn::Embedding(o.context, o.width));
  drop = register_module("drop", torch::nn::Dropout(o.dropout));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.depth; ++i) {
    // Note [Stage-3 units]: each Block is a zero::Unit: at ZeRO stage 3 its
    // parameters are gathered before its forward and backward and released
    // after; at stages 0-2, or without an engine, the unit is a
    // pass-through and the parameter names are those of the bare Block.
    // Everything outside the blocks (wte, wpe, ln_f, the tied head) stays
    // gathered.
    blocks->push_back(zero::Unit<Block>(Block(o)));
  }
  ln_f = register_module("ln_f", layer_norm(o.width));
  if (!o.tie_embeddings) {
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(o.width, o.vocab_size).bias(false)));
  }
  init_weights();
}

void GPTImpl::init_weights() {
  torch::NoGradGuard no_grad;
  // The blocks have set theirs (BlockImpl's constructor).
  torch::nn::init::normal_(wte->weight, 0.0, kInitStd);
  torch::nn::init::normal_(wpe->weight, 0.0, kInitStd);
  init_layer_norm(ln_f);
  if (lm_head) init_linear(*lm_head, kInitStd);
}

at::Tensor GPTImpl::forward(const at::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2, "GPT::forward: tokens must be [batch, time], got ", tokens.sizes());
  TORCH_CHECK(tokens.scalar_type() == torch::kLong, "GPT::forward: tokens must be int64, got ", tokens.scalar_type());
  const int64_t T = tokens.size(1);
  TORCH_CHECK(T >= 1 && T <= options_.context, "GPT::forward: sequence length ", T, " exceeds context ",
              options_.context);
  at::Tensor positions = torch::arange(T, tokens.options());
  at::Tensor x = drop(wte(tokens) + wpe(positions));  // [B,T,C] + [T,C]
  // Note [Stage-3 units]: the blocks run in order; a unit is called exactly
  // like a bare block.
  for (size_t i = 0; i < blocks->size(); ++i) x = block(i)->forward(x);
  x = ln_f(x);
  // The tied head uses wte->weight itself (looked up at every call, so an
  // engine that swaps the parameter's storage is seen here too).
  return options_.tie_embeddings ? torch::linear(x, wte->weight) : lm_head(x);
}

at::Tensor GPTImpl::loss(const at::Tensor& tokens, const at::Tensor& targets) {
  at::Tensor logits = forward(tokens);
  TORCH_CHECK(targets.sizes() == tokens.sizes(), "GPT::loss: targets ", targets.sizes(), " must match tokens ",
              tokens.sizes());
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

at::Tensor GPTImpl::generate(const at::Tensor& prompt, int64_t new_tokens) {
  torch::NoGradGuard no_grad;
  at::Tensor out = prompt;
  for (int64_t i = 0; i < new_tokens; ++i) {
    const int64_t T = out.size(1);
    at::Tensor window = T > options_.context ? out.slice(1, T - options_.context, T) : out;
    at::Tensor next = forward(window).select(1, window.size(1) - 1).argmax(-1, /*keepdim=*/true);
    out = torch::cat({out, next}, 1);
  }
  return out;
}

int64_t GPTImpl::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

const at::Tensor& GPTImpl::head_weight() const { return options_.tie_embeddings ? wte->weight : lm_head->weight; }

}  // namespace zero_examples
