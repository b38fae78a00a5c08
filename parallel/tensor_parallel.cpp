// Tensor-parallel layers and mappings (include/zero/tensor_parallel.h).
#include "zero/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <fnmatch.h>

#include <string>

#include "parallel/autograd_group.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using parallel_detail::group_of;
using parallel_detail::GroupRef;
using parallel_detail::keep;
using parallel_detail::ref;

at::Tensor all_reduced(const at::Tensor& x, const Group& group) {
  at::Tensor out = x.contiguous().clone();
  group->all_reduce(out, comm::ReduceOp::Sum);
  return out;
}

// [..., d] on each rank -> [..., size * d], rank r's slice at r * d.
at::Tensor gathered_last_dim(const at::Tensor& x, const Group& group) {
  const int n = group->size();
  at::Tensor in = x.contiguous();
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor all = at::empty(shape, in.options());
  group->all_gather(all.view({-1}), in.view({-1}));
  std::vector<int64_t> out_shape(in.sizes().begin(), in.sizes().end());
  out_shape.back() *= n;
  return all.movedim(0, -2).reshape(out_shape);
}

at::Tensor own_slice_last_dim(const at::Tensor& x, const Group& group) {
  const int64_t d = x.size(-1);
  if (d % group->size() != 0) {
    throw PartitionError("tensor parallel: a last dimension of " + std::to_string(d) +
                         " does not split into " + std::to_string(group->size()) + " equal slices");
  }
  return x.chunk(group->size(), -1)[group->rank()].contiguous();
}

class CopyTo : public torch::autograd::Function<CopyTo> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupRef> g) {
    keep(ctx, g);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], group_of(ctx)), at::Tensor()};
  }
};

class ReduceFrom : public torch::autograd::Function<ReduceFrom> {
 public:
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, c10::intrusive_ptr<GroupRef> g) {
    return all_reduced(x, g->group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

class GatherFrom : public torch::autograd::Function<GatherFrom> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupRef> g) {
    keep(ctx, g);
    return gathered_last_dim(x, g->group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {own_slice_last_dim(grads[0], group_of(ctx)), at::Tensor()};
  }
};

class ScatterTo : public torch::autograd::Function<ScatterTo> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupRef> g) {
    keep(ctx, g);
    return own_slice_last_dim(x, g->group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gathered_last_dim(grads[0], group_of(ctx)), at::Tensor()};
  }
};

// Megatron's vocab-parallel cross-entropy: softmax statistics are agreed
// over the group, so no rank holds more than its slice of the logits.
class VocabCrossEntropy : public torch::autograd::Function<VocabCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            c10::intrusive_ptr<GroupRef> g) {
    const Group& group = g->group;
    const int64_t rows = logits.size(-1), first = group->rank() * rows;
    at::Tensor x = logits.to(at::kFloat);
    at::Tensor max = std::get<0>(x.max(-1)).contiguous();
    group->all_reduce(max, comm::ReduceOp::Max);
    at::Tensor shifted = x - max.unsqueeze(-1);
    at::Tensor outside = (targets < first).logical_or(targets >= first + rows);
    at::Tensor local = (targets - first).masked_fill(outside, 0);
    at::Tensor target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0).contiguous();
    at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(-1).contiguous();
    group->all_reduce(target_logit, comm::ReduceOp::Sum);
    group->all_reduce(sum_exp, comm::ReduceOp::Sum);
    exp.div_(sum_exp.unsqueeze(-1));  // this rank's slice of the softmax
    ctx->save_for_backward({exp, local, outside});
    ctx->saved_data["zero.tp.dtype"] = static_cast<int64_t>(logits.scalar_type());
    return sum_exp.log() - target_logit;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();  // d loss / d logit = softmax - one_hot(target)
    at::Tensor hit = saved[2].logical_not().to(grad.scalar_type()).unsqueeze(-1);
    grad.scatter_add_(-1, saved[1].unsqueeze(-1), -hit);
    grad.mul_(grads[0].unsqueeze(-1));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data.at("zero.tp.dtype").toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor()};
  }
};

// The two halves of Megatron's MLP, shared by the layers and by AutoTP's
// split Linear: x replicated in, this rank's output slice out; and this
// rank's input slice in, the summed output (plus the replicated bias) out.
at::Tensor column_parallel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Group& group) {
  return torch::nn::functional::linear(copy_to_tensor_parallel(x, group), weight, bias);
}
at::Tensor row_parallel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Group& group) {
  at::Tensor y = reduce_from_tensor_parallel(torch::nn::functional::linear(x, weight), group);
  return bias.defined() ? y + bias : y;
}

void check_divides(int64_t size, const Group& group, const std::string& what) {
  if (size % group->size() != 0) {
    throw ConfigError(what + " of " + std::to_string(size) + " does not divide by the tensor-parallel size " +
                      std::to_string(group->size()) + "; choose a tp_size that divides it");
  }
}

}  // namespace

at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const Group& group) {
  return group->size() == 1 ? x : CopyTo::apply(x, ref(group));
}
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const Group& group) {
  return group->size() == 1 ? x : ReduceFrom::apply(x, ref(group));
}
at::Tensor gather_from_tensor_parallel(const at::Tensor& x, const Group& group) {
  return group->size() == 1 ? x : GatherFrom::apply(x, ref(group));
}
at::Tensor scatter_to_tensor_parallel(const at::Tensor& x, const Group& group) {
  return group->size() == 1 ? x : ScatterTo::apply(x, ref(group));
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, const Group& group) {
  return VocabCrossEntropy::apply(logits, targets, ref(group));
}

at::Tensor slice_of(const at::Tensor& full, const Split& split) {
  std::vector<at::Tensor> mine;
  for (const at::Tensor& block : full.chunk(split.parts, split.dim)) {
    mine.push_back(block.chunk(split.size, split.dim)[split.rank]);
  }
  return mine.size() == 1 ? mine[0] : torch::cat(mine, split.dim);
}

// The slice is `outer` x (parts x rows) x `inner` of a full tensor that
// is `outer` x (parts x size x rows) x `inner` along the split dimension:
// each run of rows x inner elements of the slice is contiguous in both.
std::vector<FullRange> full_ranges(const Split& split, int64_t offset, int64_t length) {
  int64_t inner = 1;
  for (size_t d = split.dim + 1; d < split.full_shape.size(); ++d) inner *= split.full_shape[d];
  const int64_t along = split.full_shape[split.dim];
  const int64_t rows = along / (static_cast<int64_t>(split.parts) * split.size);
  const int64_t run = rows * inner;  // contiguous in both
  std::vector<FullRange> out;
  for (int64_t at = offset; at < offset + length;) {
    const int64_t k = at / run, within = at % run;  // run k of the slice
    const int64_t outer = k / split.parts, part = k % split.parts;
    const int64_t full_row = part * split.size * rows + static_cast<int64_t>(split.rank) * rows;
    const int64_t n = std::min(run - within, offset + length - at);
    out.push_back({(outer * along + full_row) * inner + within, at, n});
    at += n;
  }
  return out;
}

std::map<std::string, Split> tensor_parallel_splits(const torch::nn::Module& model) {
  std::map<std::string, Split> out;
  auto add = [&out](const std::string& prefix, const torch::nn::Module& m) {
    const auto* split_module = dynamic_cast<const SplitModule*>(&m);
    if (!split_module) return;
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (auto s = split_module->split(p.key())) out[prefix.empty() ? p.key() : prefix + "." + p.key()] = *s;
    }
  };
  add("", model);  // the model itself need not live in a shared_ptr
  for (const auto& m : model.named_modules("", /*include_self=*/false)) add(m.key(), *m.value());
  return out;
}

// The full layer is drawn as torch::nn::Linear draws it (same generator
// calls, same order), then this rank's slice kept.
ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in, int64_t out, Group group, bool bias, bool gather_output)
    : group_(std::move(group)), in_(in), out_(out), gather_output_(gather_output) {
  check_divides(out, group_, "a column-parallel Linear's output size");
  torch::NoGradGuard no_grad;
  torch::nn::Linear full(torch::nn::LinearOptions(in, out).bias(bias));
  const int n = group_->size(), r = group_->rank();
  weight = register_parameter("weight", full->weight.chunk(n, 0)[r].clone());
  if (bias) this->bias = register_parameter("bias", full->bias.chunk(n, 0)[r].clone());
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = column_parallel(x, weight, bias, group_);
  return gather_output_ ? gather_from_tensor_parallel(y, group_) : y;
}

std::optional<Split> ColumnParallelLinearImpl::split(const std::string& name) const {
  if (name == "weight") return Split{0, group_->rank(), group_->size(), {out_, in_}};
  if (name == "bias") return Split{0, group_->rank(), group_->size(), {out_}};
  return std::nullopt;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in, int64_t out, Group group, bool bias, bool input_is_parallel)
    : group_(std::move(group)), in_(in), out_(out), input_is_parallel_(input_is_parallel) {
  check_divides(in, group_, "a row-parallel Linear's input size");
  torch::NoGradGuard no_grad;
  torch::nn::Linear full(torch::nn::LinearOptions(in, out).bias(bias));
  weight = register_parameter("weight", full->weight.chunk(group_->size(), 1)[group_->rank()].clone());
  if (bias) this->bias = register_parameter("bias", full->bias.clone());
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  return row_parallel(input_is_parallel_ ? x : scatter_to_tensor_parallel(x, group_), weight, bias, group_);
}

std::optional<Split> RowParallelLinearImpl::split(const std::string& name) const {
  if (name == "weight") return Split{1, group_->rank(), group_->size(), {out_, in_}};
  return std::nullopt;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, Group group)
    : group_(std::move(group)), vocab_(vocab), dim_(dim) {
  check_divides(vocab, group_, "a vocab-parallel Embedding's vocabulary");
  torch::NoGradGuard no_grad;
  torch::nn::Embedding full(vocab, dim);
  weight = register_parameter("weight", full->weight.chunk(group_->size(), 0)[group_->rank()].clone());
  first_ = group_->rank() * (vocab / group_->size());
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& tokens) {
  if (group_->size() == 1) return torch::embedding(weight, tokens);
  const int64_t rows = weight.size(0);
  at::Tensor outside = (tokens < first_).logical_or(tokens >= first_ + rows);
  at::Tensor rows_here = torch::embedding(weight, (tokens - first_).masked_fill(outside, 0));
  rows_here = rows_here.masked_fill(outside.unsqueeze(-1), 0);
  return reduce_from_tensor_parallel(rows_here, group_);
}

std::optional<Split> VocabParallelEmbeddingImpl::split(const std::string& name) const {
  if (name == "weight") return Split{0, group_->rank(), group_->size(), {vocab_, dim_}};
  return std::nullopt;
}

void LinearImpl::split_over(const Group& group, Kind kind, int parts) {
  if (split_forward_) throw ConfigError("tensor parallel: this Linear is split already");
  const int n = group->size(), r = group->rank();
  const std::vector<int64_t> full(weight.sizes().begin(), weight.sizes().end());
  const int dim = kind == Kind::Column ? 0 : 1;
  const int64_t along = full[dim];
  if (along % (static_cast<int64_t>(parts) * n) != 0) {
    throw ConfigError(std::string(kind == Kind::Column ? "a column-parallel Linear's output size" :
                                                         "a row-parallel Linear's input size") +
                      " of " + std::to_string(along) + (parts > 1 ? " in " + std::to_string(parts) + " parts" : "") +
                      " does not divide by the tensor-parallel size " + std::to_string(n) +
                      "; choose a tp_size that divides it");
  }
  torch::NoGradGuard no_grad;
  group_ = group;
  weight_split_ = Split{dim, r, n, full, kind == Kind::Column ? parts : 1};
  weight.set_data(slice_of(weight, *weight_split_).clone());  // the same parameter, now its slice
  if (kind == Kind::Column && bias.defined()) {
    bias_split_ = Split{0, r, n, {bias.size(0)}, parts};
    bias.set_data(slice_of(bias, *bias_split_).clone());
  }
  if (kind == Kind::Column) {
    split_forward_ = [this](const at::Tensor& x) { return column_parallel(x, weight, bias, group_); };
  } else {
    split_forward_ = [this](const at::Tensor& x) { return row_parallel(x, weight, bias, group_); };
  }
}

std::vector<AutoTpRule> gpt_rules() {
  using Kind = LinearImpl::Kind;
  return {{"*.attn.qkv", Kind::Column, 3}, {"*.attn.proj", Kind::Row, 1}, {"*.mlp.fc", Kind::Column, 1},
          {"*.mlp.proj", Kind::Row, 1}};
}

std::vector<AutoTpRule> llama_rules() {
  using Kind = LinearImpl::Kind;
  return {{"*.self_attn.q_proj", Kind::Column, 1}, {"*.self_attn.k_proj", Kind::Column, 1},
          {"*.self_attn.v_proj", Kind::Column, 1}, {"*.self_attn.o_proj", Kind::Row, 1},
          {"*.mlp.gate_proj", Kind::Column, 1},    {"*.mlp.up_proj", Kind::Column, 1},
          {"*.mlp.down_proj", Kind::Row, 1}};
}

std::vector<AutoTpRule> default_rules() {
  std::vector<AutoTpRule> rules = gpt_rules();
  for (auto& r : llama_rules()) rules.push_back(r);
  return rules;
}

int auto_tensor_parallel(torch::nn::Module& model, const Group& group, const std::vector<AutoTpRule>& rules) {
  int split = 0;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    const AutoTpRule* rule = nullptr;
    for (const auto& candidate : rules) {
      if (fnmatch(candidate.pattern.c_str(), name.c_str(), 0) == 0) {
        rule = &candidate;
        break;
      }
    }
    if (!rule) continue;
    if (auto* linear = dynamic_cast<LinearImpl*>(item.value().get())) {
      linear->split_over(group, rule->kind, rule->parts);
      ++split;
    } else if (dynamic_cast<torch::nn::LinearImpl*>(item.value().get())) {
      throw ConfigError("AutoTP: " + name + " matches the rule \"" + rule->pattern +
                        "\" but is a torch::nn::Linear, which LibTorch calls directly so it cannot be split in "
                        "place; declare it as zero::tp::Linear (a drop-in, include/zero/tensor_parallel.h)");
    }
  }
  if (split == 0) {
    std::string patterns;
    for (const auto& r : rules) patterns += (patterns.empty() ? "" : ", ") + r.pattern;
    throw ConfigError("AutoTP: no zero::tp::Linear of the model matches the rules (" + patterns +
                      "); declare the Linear modules to split as zero::tp::Linear, or build the model from "
                      "tensor-parallel layers on the mesh's tp_group()");
  }
  return split;
}

}  // namespace zero::tp
