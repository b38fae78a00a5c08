// zero::tiled_compute (include/zero/activation_checkpointing.h): ALST's
// tiled compute (arXiv 2506.13996; DeepSpeed's TiledMLP and
// TiledFusedLogitsLoss). An autograd function whose forward runs the tiles
// one after another without a graph, keeping only its input, and whose
// backward runs each tile again with a graph and backward through it at
// once, so that at most one tile's intermediate tensors exist.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "activations/autograd_leaves.h"
#include "zero/activation_checkpointing.h"
#include "zero/error.h"

namespace zero {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Tiling : torch::CustomClassHolder {
  TileFn fn;
  int64_t tiles = 1;
  std::vector<at::Tensor> params;  // the module's own tensors, kept as they are (no version check)
  bool scalar = false;             // the tiles' results are summed, not concatenated
};

// Tile i of `length` positions: [start, start + size).
std::pair<int64_t, int64_t> tile_span(int64_t length, int64_t tiles, int64_t i) {
  const int64_t start = length * i / tiles, end = length * (i + 1) / tiles;
  return {start, end - start};
}

class Tiled : public torch::autograd::Function<Tiled> {
 public:
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs, c10::intrusive_ptr<Tiling> tiling) {
    const at::Tensor& x = inputs[0];
    const int64_t length = x.size(1);
    std::vector<at::Tensor> results;
    for (int64_t i = 0; i < tiling->tiles; ++i) {
      const auto [start, size] = tile_span(length, tiling->tiles, i);
      results.push_back(tiling->fn(x.narrow(1, start, size), start));
    }
    tiling->scalar = results.front().dim() == 0;
    at::Tensor out = tiling->scalar ? at::stack(results).sum() : at::cat(results, 1);
    tiling->params.assign(inputs.begin() + 1, inputs.end());
    ctx->save_for_backward({x});
    ctx->saved_data["zero.tiled"] = c10::IValue::make_capsule(tiling);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto tiling = c10::static_intrusive_pointer_cast<Tiling>(ctx->saved_data.at("zero.tiled").toCapsule());
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& grad_out = grad_outputs[0];
    const std::vector<at::Tensor>& params = tiling->params;
    const bool input_grad = x.requires_grad();
    const int64_t length = x.size(1);
    std::vector<at::Tensor> input_grads;
    std::vector<at::Tensor> param_grads(params.size());
    for (int64_t i = 0; i < tiling->tiles; ++i) {
      const auto [start, size] = tile_span(length, tiling->tiles, i);
      at::Tensor tile = x.narrow(1, start, size).detach();
      if (input_grad) tile.requires_grad_(true);
      at::Tensor result;
      {
        torch::AutoGradMode grad(true);
        result = tiling->fn(tile, start);
      }
      variable_list wanted;
      if (input_grad) wanted.push_back(tile);
      for (const auto& p : params) wanted.push_back(p);
      if (!result.requires_grad() || wanted.empty() || !grad_out.defined()) {
        if (input_grad) input_grads.push_back(torch::zeros_like(tile));
        continue;
      }
      const variable_list unlisted = unlisted_leaves({result}, wanted);
      if (!unlisted.empty()) {
        throw EngineError("zero::tiled_compute: the function reached " + std::to_string(unlisted.size()) +
                          " parameter(s) not listed in `params` (the first of " +
                          std::to_string(unlisted.front().numel()) +
                          " elements); list every parameter it uses, so that each gradient arrives once, summed "
                          "over the tiles");
      }
      const at::Tensor seed = tiling->scalar ? grad_out.expand_as(result) : grad_out.narrow(1, start, size);
      const variable_list grads = torch::autograd::grad({result}, wanted, {seed}, /*retain_graph=*/false,
                                                        /*create_graph=*/false, /*allow_unused=*/true);
      size_t next = 0;
      if (input_grad) {
        input_grads.push_back(grads[next].defined() ? grads[next] : torch::zeros_like(tile));
        ++next;
      }
      for (size_t k = 0; k < params.size(); ++k, ++next) {
        if (!grads[next].defined()) continue;
        param_grads[k] = param_grads[k].defined() ? param_grads[k].add_(grads[next]) : grads[next];
      }
    }
    variable_list result;
    result.push_back(input_grad ? at::cat(input_grads, 1) : at::Tensor());
    for (auto& g : param_grads) result.push_back(g);
    result.push_back(at::Tensor());  // the tiling
    return result;
  }
};

}  // namespace

at::Tensor tiled_compute(const TileFn& fn, const at::Tensor& x, const std::vector<at::Tensor>& params, int64_t tiles) {
  if (!fn) throw EngineError("zero::tiled_compute: no function to run");
  if (x.dim() < 2) {
    throw EngineError("zero::tiled_compute: tiles cut dimension 1 (the sequence); got a tensor of " +
                      std::to_string(x.dim()) + " dimension(s)");
  }
  const int64_t length = x.size(1);
  if (tiles < 1) throw EngineError("zero::tiled_compute: " + std::to_string(tiles) + " tiles; use at least 1");
  tiles = std::min(tiles, std::max<int64_t>(length, 1));
  // One tile, or nothing kept for backward anyway: the function itself.
  if (tiles == 1 || !at::GradMode::is_enabled()) {
    if (tiles == 1) return fn(x, 0);
    std::vector<at::Tensor> results;
    for (int64_t i = 0; i < tiles; ++i) {
      const auto [start, size] = tile_span(length, tiles, i);
      results.push_back(fn(x.narrow(1, start, size), start));
    }
    return results.front().dim() == 0 ? at::stack(results).sum() : at::cat(results, 1);
  }
  auto tiling = c10::make_intrusive<Tiling>();
  tiling->fn = fn;
  tiling->tiles = tiles;
  variable_list inputs{x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  // As a TensorList: autograd takes a std::vector argument for a non-tensor.
  return Tiled::apply(at::TensorList(inputs), tiling);
}

}  // namespace zero
