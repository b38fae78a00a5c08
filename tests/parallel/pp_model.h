#pragma once
// A pipeline model for the tests (include/zero/pipeline.h): a tied
// embedding, kDepth tensor-parallel blocks (tp_model.h), a final norm and
// the LM head sharing the embedding's weight, with a counter of the
// micro-batches alive on this rank's stage. On a mesh of one rank it is
// the reference model, with the same weights for the same seed.
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "tp_model.h"
#include "zero/pipeline.h"

namespace pp_test {

using tp_test::kContext;
using tp_test::kVocab;
using tp_test::kWidth;
constexpr int kDepth = 4;

// Micro-batches alive on this rank's stage: counted up by the forward of
// the stage's first layer, down when backward reaches that layer's output.
inline std::atomic<int> g_alive{0}, g_most_alive{0};
inline int g_first_layer = 0;  // of this rank's stage, set once the module is built

inline at::Tensor counted(int layer, const at::Tensor& y) {
  if (layer != g_first_layer || !y.requires_grad()) return y;
  const int now = ++g_alive;
  g_most_alive = std::max(g_most_alive.load(), now);
  y.register_hook([](const at::Tensor& g) {
    --g_alive;
    return g;
  });
  return y;
}

// A layer built by `make` whose forward is counted.
inline zero::pipe::Layer layer(int index, std::function<torch::nn::AnyModule()> make) {
  auto held = std::make_shared<torch::nn::AnyModule>();
  zero::pipe::Layer l([held, make] {
    *held = make();
    return *held;
  });
  l.forward = [held, index](torch::nn::Module&, const at::Tensor& x) { return counted(index, held->forward(x)); };
  return l;
}

// Tied embedding, kDepth tensor-parallel blocks, a final norm, and the LM
// head sharing the embedding's weight.
inline std::shared_ptr<zero::pipe::PipelineModule> pipe_net(const std::shared_ptr<zero::Mesh>& mesh,
                                                     const std::string& partition = "parameters") {
  torch::manual_seed(0);
  const auto group = mesh->tp_group();
  std::vector<zero::pipe::Layer> layers;
  layers.push_back(zero::pipe::Layer::tied(
      "embed", [] { return torch::nn::AnyModule(torch::nn::Embedding(kVocab, kWidth)); },
      [](torch::nn::Module& embed, const at::Tensor& x) {
        return counted(0, torch::embedding(embed.named_parameters()["weight"], x));
      }));
  for (int i = 0; i < kDepth; ++i) {
    layers.push_back(layer(1 + i, [group] { return torch::nn::AnyModule(tp_test::TpBlock(group)); }));
  }
  layers.push_back(layer(kDepth + 1, [] {
    return torch::nn::AnyModule(torch::nn::LayerNorm(torch::nn::LayerNormOptions({kWidth})));
  }));
  layers.push_back(zero::pipe::Layer::tied("embed", nullptr, [](torch::nn::Module& embed, const at::Tensor& x) {
    return counted(kDepth + 2, torch::matmul(x, embed.named_parameters()["weight"].t()));
  }));
  zero::pipe::PipelineOptions o;
  o.partition = partition;
  o.loss = [](const at::Tensor& logits, const at::Tensor& labels) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), labels.reshape({-1}));
  };
  auto model = std::make_shared<zero::pipe::PipelineModule>(std::move(layers), mesh, o);
  g_first_layer = model->stage_bounds()[model->stage()];
  return model;
}

}  // namespace pp_test
