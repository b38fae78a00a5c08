#pragma once
// Pipeline parallelism (PP): a model given as a sequence of layers, split
// into consecutive stages over the ranks of the mesh's pipeline groups, as
// DeepSpeed's PipelineModule.
//
//   zero::Mesh mesh(world, /*tp=*/1, /*pp=*/2);
//   std::vector<zero::pipe::Layer> layers;
//   layers.push_back(zero::pipe::Layer::tied("embed", [] { return torch::nn::AnyModule(torch::nn::Embedding(V, C)); }));
//   for (int i = 0; i < 8; ++i) layers.emplace_back([] { return torch::nn::AnyModule(Block(C)); });
//   layers.push_back(zero::pipe::Layer::tied("embed", nullptr, [](torch::nn::Module& e, const at::Tensor& x) {
//     return at::matmul(x, e.named_parameters()["weight"].t());  // the LM head shares the embedding
//   }));
//   zero::pipe::PipelineOptions o;
//   o.loss = [](const at::Tensor& logits, const at::Tensor& labels) { return cross_entropy(logits, labels); };
//   auto model = std::make_shared<zero::pipe::PipelineModule>(std::move(layers), mesh_ptr, o);
//   auto engine = zero::initialize(config, model, {.mesh = mesh_ptr});
//   double loss = engine.train_batch(next_batch);  // gradient_accumulation_steps micro-batches, 1F1B
//
// Each rank builds every layer in order with the same random state and keeps
// those of its stage, so a model built at pp 2 holds exactly the layers of
// the model built at pp 1 with the same seed (the whole model exists on each
// rank for a moment while it is built, as the partition weighs every layer). Layer i's parameters are named
// "<i>.<name>" on every layout, tied modules "tied_<key>.<name>", so a
// checkpoint of one layout loads in another.
//
// Tied layers (the embedding and the LM head sharing one weight) hold one
// module per key on each stage that uses it; the stages' gradients of it
// are summed before the optimizer step, so their copies stay equal.
// Activations between stages are one tensor per micro-batch.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/mesh.h"

namespace zero::pipe {

// One layer of the sequence.
struct Layer {
  using Build = std::function<torch::nn::AnyModule()>;
  using Forward = std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)>;
  using Function = std::function<at::Tensor(const at::Tensor&)>;

  // A module, built by `build` (its forward is the layer's).
  Layer(Build build) : build(std::move(build)) {}  // NOLINT: a layer is its builder
  // A module shared by every layer of `key`: the first one builds it, each
  // may give its own forward on it (empty: the module's forward).
  static Layer tied(std::string key, Build build, Forward forward = {});
  // A function without parameters (a reshape, an activation).
  static Layer function(Function f);

  Build build;
  std::string tied_key;
  Forward forward;
  Function function_only;
};

using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& labels)>;

struct PipelineOptions {
  // How layers are shared among stages (DeepSpeed's partition_method):
  // "parameters" balances trainable parameter counts, "uniform" layer
  // counts, "type:<regex>" the number of layers whose module type matches
  // the regex (case-insensitive, e.g. "type:Block").
  std::string partition = "parameters";
  // The last stage's loss of its output and the micro-batch's labels.
  LossFn loss;
};

// Splits weights into `parts` consecutive non-empty ranges, minimising the
// largest sum; returns parts + 1 boundaries. Throws ConfigError when there
// are fewer weights than parts.
std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int parts);

class PipelineModule : public torch::nn::Module {
 public:
  // A collective over the mesh's world (the tied layers' groups are made here).
  PipelineModule(std::vector<Layer> layers, std::shared_ptr<Mesh> mesh, PipelineOptions options);

  // This stage's layers applied in order.
  at::Tensor forward(const at::Tensor& x);
  at::Tensor loss(const at::Tensor& output, const at::Tensor& labels) const;

  int stage() const { return stage_; }
  int num_stages() const { return static_cast<int>(bounds_.size()) - 1; }
  bool is_first_stage() const { return stage_ == 0; }
  bool is_last_stage() const { return stage_ == num_stages() - 1; }
  // Layers [bounds[s], bounds[s + 1]) run on stage s.
  const std::vector<int>& stage_bounds() const { return bounds_; }
  const std::shared_ptr<Mesh>& mesh() const { return mesh_; }

  // A tied module held on more than one stage: its parameters, and the
  // group of the ranks holding it (same tp and dp coordinates).
  struct Tie {
    std::string key;
    std::vector<at::Tensor> params;
    std::vector<std::string> names;  // as named_parameters() gives them
    std::shared_ptr<comm::ProcessGroup> group;
  };
  const std::vector<Tie>& shared_ties() const { return ties_; }

 private:
  struct Local {
    int index;
    std::shared_ptr<torch::nn::Module> module;  // null for a function
    torch::nn::AnyModule any;                   // its own forward, when it has one
    Layer::Forward forward;
    Layer::Function function_only;
  };
  std::shared_ptr<Mesh> mesh_;
  PipelineOptions options_;
  int stage_ = 0;
  std::vector<int> bounds_;
  std::vector<Local> local_;
  std::vector<Tie> ties_;
};

}  // namespace zero::pipe
