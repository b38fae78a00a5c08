// The Llama family (zero/llama.h): config.json read and checked, the
// parameter shapes it implies, and the modules in transformers' order
// (the long-context switches and the loss: long_context.cpp).
// One concept over 400 lines: one model family, its config and its modules,
// read top to bottom as transformers' modeling_llama.py is.
#include "zero/llama.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "zero/error.h"

namespace zero::llama {

namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& where, const std::string& message) {
  throw ConfigError(where + ": " + message);
}

int64_t positive(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0)
    refuse(where, std::string("\"") + key + "\" must be a positive integer" +
                      (j.contains(key) ? ", found " + j[key].dump() : ", and it is missing"));
  return j[key].get<int64_t>();
}

double number(const json& j, const char* key, double fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) refuse(where, std::string("\"") + key + "\" must be a number, found " + j[key].dump());
  return j[key].get<double>();
}

bool flag(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return false;
  if (!j[key].is_boolean()) refuse(where, std::string("\"") + key + "\" must be true or false, found " + j[key].dump());
  return j[key].get<bool>();
}

constexpr double kInitStd = 0.02;  // transformers' initializer_range default

void init_linear(torch::nn::LinearImpl& linear, double std) {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(linear.weight, 0.0, std);
  if (linear.bias.defined()) torch::nn::init::zeros_(linear.bias);
}

zero::tp::Linear linear(int64_t in, int64_t out, bool bias, double std) {
  zero::tp::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
  init_linear(*l, std);
  return l;
}

bool vocab_parallel(const LlamaConfig& c, const zero::tp::Group& tp);

// [.., D] -> [.., D] with the halves swapped and the second negated.
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

// [B,KV,T,D] -> [B,KV*n,T,D], each key/value head repeated for n query heads.
at::Tensor repeat_kv(const at::Tensor& x, int64_t n) {
  if (n == 1) return x;
  const int64_t B = x.size(0), KV = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, KV, n, T, D}).reshape({B, KV * n, T, D});
}

}  // namespace

LlamaConfig LlamaConfig::from_json_text(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    refuse(where, std::string("not JSON (") + e.what() + ")");
  }
  if (!j.is_object()) refuse(where, "not a JSON object");
  const std::string type = j.value("model_type", std::string());
  if (type != "llama")
    refuse(where, "\"model_type\" is \"" + type + "\"; this model builds \"llama\" (LlamaForCausalLM)");
  LlamaConfig c;
  c.vocab_size = positive(j, "vocab_size", where);
  c.hidden_size = positive(j, "hidden_size", where);
  c.intermediate_size = positive(j, "intermediate_size", where);
  c.num_hidden_layers = positive(j, "num_hidden_layers", where);
  c.num_attention_heads = positive(j, "num_attention_heads", where);
  c.num_key_value_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                              ? positive(j, "num_key_value_heads", where)
                              : c.num_attention_heads;
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? positive(j, "head_dim", where)
                                                                   : c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = positive(j, "max_position_embeddings", where);
  c.rms_norm_eps = number(j, "rms_norm_eps", 1e-6, where);
  c.tie_word_embeddings = flag(j, "tie_word_embeddings", where);
  c.attention_bias = flag(j, "attention_bias", where);
  c.mlp_bias = flag(j, "mlp_bias", where);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    refuse(where, "\"num_attention_heads\" (" + std::to_string(c.num_attention_heads) +
                      ") must be a multiple of \"num_key_value_heads\" (" + std::to_string(c.num_key_value_heads) + ")");
  if (c.head_dim % 2 != 0) refuse(where, "\"head_dim\" (" + std::to_string(c.head_dim) + ") must be even for rotary embeddings");
  // Keys that would change the computation in ways not built here.
  if (j.value("hidden_act", std::string("silu")) != "silu")
    refuse(where, "\"hidden_act\" is " + j["hidden_act"].dump() + "; Llama's MLP here is SwiGLU (silu)");
  for (const char* key : {"sliding_window", "use_sliding_window"})
    if (j.contains(key) && !j[key].is_null() && j[key] != false)
      refuse(where, std::string("\"") + key + "\" is set (" + j[key].dump() + "); sliding-window attention is not supported");
  if (number(j, "attention_dropout", 0.0, where) != 0.0)
    refuse(where, "\"attention_dropout\" is " + j["attention_dropout"].dump() + "; attention dropout is not supported");
  if (j.contains("pretraining_tp") && j["pretraining_tp"].is_number_integer() && j["pretraining_tp"].get<int64_t>() != 1)
    refuse(where, "\"pretraining_tp\" is " + j["pretraining_tp"].dump() + "; only 1 (transformers' default) is supported");
  // RoPE: transformers 5 writes "rope_parameters"; older files "rope_theta" and "rope_scaling".
  json rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"] : json::object();
  if (rope.empty()) {
    if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) rope = j["rope_scaling"];
    if (j.contains("rope_theta")) rope["rope_theta"] = j["rope_theta"];
  }
  const std::string rope_where = where + ": rope_parameters";
  c.rope_theta = number(rope, "rope_theta", 10000.0, rope_where);
  if (number(rope, "partial_rotary_factor", 1.0, rope_where) != 1.0)
    refuse(rope_where, "\"partial_rotary_factor\" must be 1 (partial rotary embeddings are not supported)");
  const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (rope_type == "llama3") {
    c.llama3_rope = true;
    c.rope_factor = number(rope, "factor", 8.0, rope_where);
    c.low_freq_factor = number(rope, "low_freq_factor", 1.0, rope_where);
    c.high_freq_factor = number(rope, "high_freq_factor", 4.0, rope_where);
    c.original_max_position_embeddings = positive(rope, "original_max_position_embeddings", rope_where);
  } else if (rope_type != "default") {
    refuse(rope_where, "\"rope_type\" is \"" + rope_type + "\"; supported: default, llama3");
  }
  return c;
}

LlamaConfig LlamaConfig::from_file(const std::string& path) {
  // A FIFO would block the read and a device never end: a regular file of
  // a config's size only (not a zero::Error: the example model's own input).
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error) throw ConfigError("cannot read " + path + " (" + error.message() + ")");
  if (!std::filesystem::is_regular_file(status))
    throw ConfigError("cannot read " + path + ": it is not a regular file (a config.json is one)");
  if (std::filesystem::file_size(path, error) > (uint64_t{64} << 20))
    throw ConfigError("cannot read " + path + ": over 64 MiB, no config.json is that large");
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
}

// ---- rotary embeddings ------------------------------------------------------

at::Tensor rope_inv_freq(const LlamaConfig& c) {
  const double dim = static_cast<double>(c.head_dim);
  at::Tensor exponents = torch::arange(0, c.head_dim, 2, torch::kLong).to(torch::kFloat) / dim;
  at::Tensor inv_freq = 1.0 / torch::pow(c.rope_theta, exponents);
  if (!c.llama3_rope) return inv_freq;
  // Llama 3.1: long wavelengths divided by factor, a smooth blend between.
  const double old_len = static_cast<double>(c.original_max_position_embeddings);
  const double low_wavelen = old_len / c.low_freq_factor, high_wavelen = old_len / c.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = torch::where(wavelen > low_wavelen, inv_freq / c.rope_factor, inv_freq);
  at::Tensor smooth = (old_len / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
  at::Tensor medium = (wavelen < high_wavelen).logical_not() * (wavelen > low_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

std::pair<at::Tensor, at::Tensor> rope_cos_sin(const at::Tensor& inv_freq, int64_t batch, int64_t time,
                                               at::ScalarType dtype, const at::Device& device, int64_t first) {
  at::Tensor positions = torch::arange(first, first + time, torch::TensorOptions().dtype(torch::kLong).device(device))
                             .unsqueeze(0)
                             .expand({batch, time});
  at::Tensor freqs = positions.unsqueeze(-1).to(torch::kFloat) * inv_freq.to(device);  // [B,T,D/2]
  at::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

// ---- RMSNorm --------------------------------------------------------------

int64_t elements(const std::vector<int64_t>& shape) {
  constexpr int64_t kCap = int64_t{1} << 62;
  int64_t n = 1;
  for (int64_t d : shape) n = d > 0 && n > kCap / d ? kCap : n * d;
  return n;
}

std::vector<ParameterShape> parameter_shapes(const LlamaConfig& c, int64_t layers) {
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const int64_t q = elements({c.num_attention_heads, c.head_dim}), kv = elements({c.num_key_value_heads, c.head_dim});
  const std::string q_keys = "num_attention_heads, head_dim, hidden_size", kv_keys = "num_key_value_heads, head_dim, hidden_size";
  const std::string mlp_keys = "intermediate_size, hidden_size";
  std::vector<ParameterShape> shapes{{"model.embed_tokens.weight", {V, H}, "vocab_size, hidden_size"}};
  for (int64_t i = 0; i < std::min(layers, c.num_hidden_layers); ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    const auto add = [&](const std::string& name, std::vector<int64_t> shape, const std::string& keys, bool bias) {
      shapes.push_back({layer + name + ".weight", shape, keys});
      if (bias) shapes.push_back({layer + name + ".bias", {shape[0]}, keys});
    };
    add("self_attn.q_proj", {q, H}, q_keys, c.attention_bias);
    add("self_attn.k_proj", {kv, H}, kv_keys, c.attention_bias);
    add("self_attn.v_proj", {kv, H}, kv_keys, c.attention_bias);
    add("self_attn.o_proj", {H, q}, q_keys, c.attention_bias);
    add("mlp.gate_proj", {I, H}, mlp_keys, c.mlp_bias);
    add("mlp.up_proj", {I, H}, mlp_keys, c.mlp_bias);
    add("mlp.down_proj", {H, I}, mlp_keys, c.mlp_bias);
    shapes.push_back({layer + "input_layernorm.weight", {H}, "hidden_size"});
    shapes.push_back({layer + "post_attention_layernorm.weight", {H}, "hidden_size"});
  }
  shapes.push_back({"model.norm.weight", {H}, "hidden_size"});
  if (!c.tie_word_embeddings) shapes.push_back({"lm_head.weight", {V, H}, "vocab_size, hidden_size"});
  return shapes;
}

int64_t parameter_count(const LlamaConfig& c) {
  constexpr int64_t kCap = int64_t{1} << 62;
  const auto add = [&](int64_t a, int64_t b) { return a > kCap - b ? kCap : a + b; };
  int64_t whole = 0, layer = 0;
  for (const auto& p : parameter_shapes(c, 1)) {
    if (p.name.rfind("model.layers.", 0) == 0) layer = add(layer, elements(p.shape));
    else whole = add(whole, elements(p.shape));
  }
  return add(whole, elements({layer, c.num_hidden_layers}));
}

RMSNormImpl::RMSNormImpl(int64_t size, double eps) : eps_(eps) { weight = register_parameter("weight", torch::ones({size})); }

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const auto dtype = x.scalar_type();
  at::Tensor h = x.to(torch::kFloat);
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps_);
  return weight * h.to(dtype);
}

// ---- attention ------------------------------------------------------------

AttentionImpl::AttentionImpl(const LlamaConfig& c) : head_dim_(c.head_dim) {
  q_proj = register_module("q_proj", linear(c.hidden_size, c.num_attention_heads * c.head_dim, c.attention_bias, kInitStd));
  k_proj = register_module("k_proj", linear(c.hidden_size, c.num_key_value_heads * c.head_dim, c.attention_bias, kInitStd));
  v_proj = register_module("v_proj", linear(c.hidden_size, c.num_key_value_heads * c.head_dim, c.attention_bias, kInitStd));
  o_proj = register_module("o_proj", linear(c.num_attention_heads * c.head_dim, c.hidden_size, c.attention_bias, kInitStd));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t B = x.size(0), D = head_dim_;
  // [B,T,H*D] -> [B,T,H,D]; with tensor parallelism the projections give
  // this rank's heads, so the head counts come from their widths.
  at::Tensor q = q_proj(x).view({B, x.size(1), -1, D});
  at::Tensor k = k_proj(x).view({B, x.size(1), -1, D});
  at::Tensor v = v_proj(x).view({B, x.size(1), -1, D});
  const at::Tensor c = cos.unsqueeze(2), s = sin.unsqueeze(2);
  q = q * c + rotate_half(q) * s;
  k = k * c + rotate_half(k) * s;
  // Ulysses: rotated at their own positions, then all tokens of this rank's heads.
  q = zero::sp::seq_to_heads(q, sp).transpose(1, 2);  // [B,H,T,D]
  k = zero::sp::seq_to_heads(zero::sp::kv_for_heads(k, sp), sp).transpose(1, 2);
  v = zero::sp::seq_to_heads(zero::sp::kv_for_heads(v, sp), sp).transpose(1, 2);
  const int64_t T = q.size(2);
  const int64_t groups = q.size(1) / k.size(1);
  k = repeat_kv(k, groups);
  v = repeat_kv(v, groups);
  if (attention_block > 0) {
    at::Tensor y = blockwise_causal_attention(q, k, v, attention_block).transpose(1, 2);  // [B,T,H,D]
    y = zero::sp::heads_to_seq(y, sp).contiguous();
    return o_proj(y.reshape({B, y.size(1), -1}));
  }
  at::Tensor scores = torch::matmul(q, k.transpose(2, 3)) * std::pow(static_cast<double>(D), -0.5);
  // The causal mask as transformers adds it: the dtype's lowest value above the diagonal.
  at::Tensor future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  at::Tensor probs = torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
  at::Tensor y = zero::sp::heads_to_seq(torch::matmul(probs, v).transpose(1, 2), sp).contiguous();  // [B,T,H,D]
  return o_proj(y.reshape({B, y.size(1), -1}));
}

// ---- MLP ------------------------------------------------------------------

MLPImpl::MLPImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias, kInitStd));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias, kInitStd));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size, c.mlp_bias, kInitStd));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  auto mlp = [this](const at::Tensor& tile, int64_t) { return down_proj(torch::silu(gate_proj(tile)) * up_proj(tile)); };
  if (tiles <= 1) return mlp(x, 0);
  return zero::tiled_compute(mlp, x, parameters(), tiles);
}

// ---- decoder layer ----------------------------------------------------------

DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& c) {
  self_attn = register_module("self_attn", Attention(c));
  mlp = register_module("mlp", MLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor h = x + self_attn(input_layernorm(x), cos, sin);
  return h + mlp(post_attention_layernorm(h));
}

PipeDecoderLayerImpl::PipeDecoderLayerImpl(const LlamaConfig& c, zero::sp::Group sp)
    : DecoderLayerImpl(c), inv_freq_(rope_inv_freq(c)), sp_(std::move(sp)) {
  self_attn->sp = sp_;
}

at::Tensor PipeDecoderLayerImpl::forward(const at::Tensor& x) {
  const auto [cos, sin] = rope_cos_sin(inv_freq_, x.size(0), x.size(1), x.scalar_type(), x.device(),
                                       zero::sp::first_position(x.size(1), sp_));
  return DecoderLayerImpl::forward(x, cos, sin);
}

// ---- model ------------------------------------------------------------------

namespace {
bool vocab_parallel(const LlamaConfig& c, const zero::tp::Group& tp) {
  return tp && tp->size() > 1 && c.vocab_size % tp->size() == 0;
}
}  // namespace

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c, zero::tp::Group tp) : config_(c) {
  if (vocab_parallel(c, tp)) {
    vocab_embed = register_module("embed_tokens", zero::tp::VocabParallelEmbedding(c.vocab_size, c.hidden_size, tp));
  } else {
    embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  }
  {
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(vocab_embed ? vocab_embed->weight : embed_tokens->weight, 0.0, kInitStd);
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(zero::Unit<DecoderLayer>(DecoderLayer(c)));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  inv_freq_ = rope_inv_freq(c);
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.scalar_type() != torch::kLong) throw EngineError("Llama: tokens must be [batch, time] int64");
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const int64_t P = sp_ ? sp_->size() : 1;  // with sequence parallelism, tokens are this rank's T of T x P
  if (T * P > config_.max_position_embeddings) {
    throw EngineError("Llama: " + std::to_string(T * P) + " positions exceed max_position_embeddings " +
                      std::to_string(config_.max_position_embeddings));
  }
  at::Tensor x = vocab_embed ? vocab_embed(tokens) : embed_tokens(tokens);
  const auto [cos, sin] =
      rope_cos_sin(inv_freq_, B, T, x.scalar_type(), x.device(), zero::sp::first_position(T, sp_));
  for (size_t i = 0; i < layers->size(); ++i) x = layer(i)->call(x, cos, sin);
  return norm(x);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c, zero::tp::Group tp) : config_(c) {
  model = register_module("model", LlamaModel(c, tp));
  if (vocab_parallel(c, tp)) tp_ = tp;
  if (!c.tie_word_embeddings && tp_) {
    vocab_head = register_module("lm_head", zero::tp::ColumnParallelLinear(c.hidden_size, c.vocab_size, tp_, /*bias=*/false,
                                                                           /*gather_output=*/true));
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(vocab_head->weight, 0.0, kInitStd);
  } else if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
    init_linear(*lm_head, kInitStd);
  }
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& tokens) { return logits_of(model(tokens)); }

at::Tensor LlamaForCausalLMImpl::logits_of(const at::Tensor& h) {
  if (!config_.tie_word_embeddings) return vocab_head ? vocab_head(h) : lm_head(h);
  if (!tp_) return torch::linear(h, model->embedding_weight());
  // The tied head over this rank's vocabulary rows, the logits gathered.
  at::Tensor local = torch::linear(zero::tp::copy_to_tensor_parallel(h, tp_), model->embedding_weight());
  return zero::tp::gather_from_tensor_parallel(local, tp_);
}

// ---- pipeline layer list ------------------------------------------------------

std::vector<zero::pipe::Layer> pipeline_layers(const LlamaConfig& c, const zero::sp::Group& sp) {
  using zero::pipe::Layer;
  if (sp) check_sequence_parallel(c, sp->size());
  std::vector<Layer> layers;
  auto embedding = [c] {
    torch::nn::Embedding e(c.vocab_size, c.hidden_size);
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(e->weight, 0.0, kInitStd);
    return torch::nn::AnyModule(e);
  };
  if (c.tie_word_embeddings) {
    layers.push_back(Layer::tied("embed", embedding, [](torch::nn::Module& e, const at::Tensor& ids) {
      return torch::embedding(e.named_parameters()["weight"], ids);
    }));
  } else {
    layers.emplace_back(embedding);
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers.emplace_back([c, sp] { return torch::nn::AnyModule(PipeDecoderLayer(c, sp)); });
  layers.emplace_back([c] { return torch::nn::AnyModule(RMSNorm(c.hidden_size, c.rms_norm_eps)); });
  if (c.tie_word_embeddings) {
    layers.push_back(Layer::tied("embed", nullptr, [](torch::nn::Module& e, const at::Tensor& h) {
      return torch::linear(h, e.named_parameters()["weight"]);
    }));
  } else {
    layers.emplace_back([c] {
      torch::nn::Linear head(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false));
      init_linear(*head, kInitStd);
      return torch::nn::AnyModule(head);
    });
  }
  return layers;
}

std::string hf_name(const LlamaConfig& c, const std::string& name) {
  if (name.rfind("tied_embed.", 0) == 0) return "model.embed_tokens." + name.substr(11);
  const size_t dot = name.find('.');
  const int64_t layer = std::stoll(name.substr(0, dot));
  const std::string rest = name.substr(dot + 1);
  if (layer == 0) return "model.embed_tokens." + rest;
  if (layer <= c.num_hidden_layers) return "model.layers." + std::to_string(layer - 1) + "." + rest;
  if (layer == c.num_hidden_layers + 1) return "model.norm." + rest;
  return "lm_head." + rest;
}

at::Tensor pipeline_loss(const at::Tensor& logits, const at::Tensor& labels) {
  at::Tensor l = logits.to(torch::kFloat);
  return torch::nn::functional::cross_entropy(l.reshape({-1, l.size(-1)}), labels.reshape({-1}));
}

zero::pipe::LossFn pipeline_loss_over(const zero::sp::Group& sp) {
  return [sp](const at::Tensor& logits, const at::Tensor& labels) { return zero::sp::cross_entropy(logits, labels, sp); };
}

}  // namespace zero::llama
