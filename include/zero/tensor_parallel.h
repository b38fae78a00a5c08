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
#include <torch/nn/pimpl.h>

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
// `dim` of a tensor of `full_shape`.
struct Split {
  int dim = 0;
  int rank = 0, size = 1;
  std::vector<int64_t> full_shape;
};

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

// Cross-entropy of logits split by vocabulary (the output of a
// column-parallel LM head, [..., vocab / tp], this rank's slice being
// rows [rank * vocab / tp, ...)) against `targets` [...], per token, in
// float32, without gathering the full logits: the max, the target's logit
// and the sum of exponentials are each all-reduced over the group.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, const Group& group);

}  // namespace zero::tp
