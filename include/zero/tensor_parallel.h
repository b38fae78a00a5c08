#pragma once
// Megatron-style tensor parallelism (TP) for LibTorch modules: layers whose
// weights are split over the ranks of a tensor-parallel group, and the four
// autograd mappings between replicated and split activations.
//
//   zero::Mesh mesh(zero::comm::init_process_group(), /*tp=*/2, /*pp=*/1);
//   auto fc = zero::tp::ColumnParallelLinear(C, 4 * C, mesh.tp_group());  // out split
//   auto proj = zero::tp::RowParallelLinear(4 * C, C, mesh.tp_group());   // in split
//   at::Tensor y = proj(torch::gelu(fc(x)));   // one all-reduce forward, one backward
//
// Seeded like the model at TP 1: each layer draws its full weight exactly as
// the torch::nn layer it replaces (torch::nn::Linear, torch::nn::Embedding)
// and keeps its slice, so a model built at TP 2 with a seed holds the slices
// of the same model built at TP 1 with that seed (the full weight exists
// for a moment on each rank while the layer is built).
//
// What is split is described by tensor_parallel_splits(model): the engine
// uses it to count a replicated parameter's gradient once in the global
// norm, and checkpoints use it to record each parameter's full shape.
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "zero/comm.h"

namespace zero::tp {

using Group = std::shared_ptr<comm::ProcessGroup>;

// The mappings (Megatron's f and g and their companions). Each is the
// identity on a group of one.
// Identity forward, all-reduce (sum) of the gradient backward: the input
// of a column-parallel layer.
at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const Group& group);
// All-reduce (sum) forward, identity backward: the output of a
// row-parallel layer.
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const Group& group);
// All-gather along the last dimension forward, this rank's slice of the
// gradient backward.
at::Tensor gather_from_tensor_parallel(const at::Tensor& x, const Group& group);
// This rank's slice of the last dimension forward, all-gather backward.
at::Tensor scatter_to_tensor_parallel(const at::Tensor& x, const Group& group);

// How a parameter is split: slice `rank` of `size` equal slices along
// `dim` of a tensor of `full_shape`. With parts > 1 (a fused qkv
// projection: 3) the dimension holds `parts` equal blocks, each split
// alike, and the rank holds its slice of every block, in block order.
struct Split {
  int dim = 0;
  int rank = 0, size = 1;
  std::vector<int64_t> full_shape;
  int parts = 1;
};

// This rank's slice of `full` as `split` describes it.
at::Tensor slice_of(const at::Tensor& full, const Split& split);

// Where elements of this rank's slice lie in the full tensor, both
// flattened: elements [offset, offset + length) of the slice are the runs
// [full_offset, full_offset + length) of the full tensor, one run per
// contiguous stretch (one for a slice of rows, one per row for a slice of
// columns). Checkpoints store the full tensor's coordinates, so a slice is
// just fragments of it.
struct FullRange {
  int64_t full_offset = 0, offset = 0, length = 0;  // offset: in the slice
};
std::vector<FullRange> full_ranges(const Split& split, int64_t offset, int64_t length);

// A module holding split parameters. Its parameters not named by split()
// are replicated over the group.
class SplitModule {
 public:
  virtual ~SplitModule() = default;
  // The split of the module's own parameter `name` (as registered), or
  // nullopt when it is replicated.
  virtual std::optional<Split> split(const std::string& name) const = 0;
  virtual const Group& group() const = 0;
};

// Every split parameter of `model`, by its name in model.named_parameters().
std::map<std::string, Split> tensor_parallel_splits(const torch::nn::Module& model);

// y = x W^T + b with W's output rows split: each rank computes its slice of
// y (all of it with gather_output).
class ColumnParallelLinearImpl : public torch::nn::Module, public SplitModule {
 public:
  ColumnParallelLinearImpl(int64_t in, int64_t out, Group group, bool bias = true, bool gather_output = false);
  at::Tensor forward(const at::Tensor& x);
  std::optional<Split> split(const std::string& name) const override;
  const Group& group() const override { return group_; }

  at::Tensor weight;  // [out / tp, in]
  at::Tensor bias;    // [out / tp], or undefined

 private:
  Group group_;
  int64_t in_, out_;
  bool gather_output_;
};
TORCH_MODULE(ColumnParallelLinear);

// y = x W^T + b with W's input columns split: each rank multiplies its
// slice of x (the output of a column-parallel layer, or its slice of a
// replicated x when !input_is_parallel) and the partial products are
// summed over the group. The bias is replicated and added once, after.
class RowParallelLinearImpl : public torch::nn::Module, public SplitModule {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, Group group, bool bias = true, bool input_is_parallel = true);
  at::Tensor forward(const at::Tensor& x);
  std::optional<Split> split(const std::string& name) const override;
  const Group& group() const override { return group_; }

  at::Tensor weight;  // [out, in / tp]
  at::Tensor bias;    // [out], or undefined

 private:
  Group group_;
  int64_t in_, out_;
  bool input_is_parallel_;
};
TORCH_MODULE(RowParallelLinear);

// An embedding table split by vocabulary rows: each rank looks up the
// tokens in its range and the rows are summed over the group.
class VocabParallelEmbeddingImpl : public torch::nn::Module, public SplitModule {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, Group group);
  at::Tensor forward(const at::Tensor& tokens);
  std::optional<Split> split(const std::string& name) const override;
  const Group& group() const override { return group_; }
  // The vocabulary rows [first, first + rows) this rank holds.
  int64_t first_row() const { return first_; }

  at::Tensor weight;  // [vocab / tp, dim]

 private:
  Group group_;
  int64_t vocab_, dim_, first_;
};
TORCH_MODULE(VocabParallelEmbedding);

// A drop-in for torch::nn::Linear (same options, initialisation and
// forward) that auto_tensor_parallel can split in place. LibTorch calls a
// torch::nn::Linear member directly, so no library can re-route one a
// model already holds; declaring the member as zero::tp::Linear is the one
// change AutoTP asks of a model. Until it is split it is a plain Linear.
class LinearImpl : public torch::nn::LinearImpl, public SplitModule {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  at::Tensor forward(const at::Tensor& x) { return split_forward_ ? split_forward_(x) : torch::nn::LinearImpl::forward(x); }
  std::optional<Split> split(const std::string& name) const override {
    if (name == "weight") return weight_split_;
    if (name == "bias") return bias_split_;
    return std::nullopt;
  }
  const Group& group() const override { return group_; }

  enum class Kind { Column, Row };
  // Keeps this rank's slice of the weight (and of the bias, when column)
  // in the same parameters and routes forward through the group
  // (auto_tensor_parallel calls it). `parts`: blocks of a fused output.
  void split_over(const Group& group, Kind kind, int parts = 1);

 private:
  Group group_;
  std::optional<Split> weight_split_, bias_split_;
  std::function<at::Tensor(const at::Tensor&)> split_forward_;
};
TORCH_MODULE(Linear);

// AutoTP: which Linear modules split how, by module name (a glob as
// fnmatch reads it, matched against names such as "blocks.3.attn.qkv").
struct AutoTpRule {
  std::string pattern;
  LinearImpl::Kind kind = LinearImpl::Kind::Column;
  int parts = 1;  // 3 for a fused q, k, v projection
};
// The GPT rules: *.attn.qkv column (fused, 3 parts), *.attn.proj row,
// *.mlp.fc column, *.mlp.proj row (Megatron's split of a transformer block:
// one all-reduce forward and one backward per attention and per MLP).
std::vector<AutoTpRule> gpt_rules();
// The Llama family's (Hugging Face's names, zero/llama.h): q_proj, k_proj,
// v_proj, gate_proj and up_proj column, o_proj and down_proj row, as
// DeepSpeed's AutoTP and Megatron split them. Grouped-query attention
// splits its key/value heads too: tp must divide num_key_value_heads.
std::vector<AutoTpRule> llama_rules();
// What AutoTP uses unless told otherwise: the GPT's rules and Llama's.
std::vector<AutoTpRule> default_rules();

// Splits every zero::tp::Linear of `model` that a rule names over `group`
// (first matching rule wins), keeping this rank's slices: a model built
// with a seed then holds exactly the slices of the model at tp 1. Returns
// how many modules were split; none is a ConfigError, and so is a rule
// matching a plain torch::nn::Linear. The engine calls it with default_rules()
// when tensor_parallel.autotp_size > 1 and the model has no split layer.
// Attention over the split qkv sees heads / tp heads on each rank, so the
// model must take the number of heads from its input's width (as the
// example GPT does), and heads must divide by tp.
int auto_tensor_parallel(torch::nn::Module& model, const Group& group,
                         const std::vector<AutoTpRule>& rules = default_rules());

// Cross-entropy of logits split by vocabulary (the output of a
// column-parallel LM head, [..., vocab / tp], this rank's slice being
// rows [rank * vocab / tp, ...)) against `targets` [...], per token, in
// float32, without gathering the full logits: the max, the target's logit
// and the sum of exponentials are each all-reduced over the group.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, const Group& group);

}  // namespace zero::tp
