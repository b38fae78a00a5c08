#pragma once
// zero::Unit: the piece of a model that ZeRO stage 3 gathers and releases as
// a whole (the idea of FSDP's fully_shard(block)). Wrap each block once:
//
//   std::vector<zero::Unit<Block>> blocks;
//   blocks.push_back(zero::Unit<Block>(Block(options)));
//   register_module("blocks", ...);   // see examples/gpt
//   x = blocks[i](x);                 // call sites stay as they were
//   y = blocks[i]->call(x, mask);     // other forward signatures
//
// Stage 3 gathers the unit's parameters before its forward, releases them
// after, gathers them again when the gradient of its output arrives in
// backward, and reduce-scatters their gradients when its backward is done.
// At stages 0-2 (or before zero::initialize) a unit is a pass-through.
// A unit's parameters keep the names they have without the wrapper (the
// inner module's children are registered on the unit itself).
//
// Activation checkpointing: blocks[i]->checkpoint_activations(true), or the
// config's "activation_checkpointing": {"checkpoint_every": k} for every
// k-th unit, runs the block without keeping its activations and recomputes
// them in backward (activation_checkpointing.h). At stage 3 the recompute
// uses the parameters gathered for the unit's backward.
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "zero/activation_checkpointing.h"

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero {

// A unit's parameter at stage 3, between its unit's uses, is released: it
// holds no elements (sizes() is [0]), as DeepSpeed empties param.data.
// gathered_shape is the shape it has when gathered (DeepSpeed's ds_shape;
// inside engine.gather_parameters, in forward and in backward), and
// gathered_numel its element count (ds_numel). For any other tensor they
// are its own sizes() and numel().
std::vector<int64_t> gathered_shape(const at::Tensor& param);
int64_t gathered_numel(const at::Tensor& param);

class UnitBase;
// Partitioned construction (zero::Init, init.h): what a unit built on this
// thread hands its parameters to as its constructor returns. Internal: set
// by zero::Init while it lives, null otherwise.
using UnitBuiltHook = void (*)(UnitBase& unit);
inline UnitBuiltHook& unit_built_hook() {
  static thread_local UnitBuiltHook hook = nullptr;  // one per thread in the whole program (an inline function's static)
  return hook;
}

// What the engine does around a unit's forward (internal; set by initialize).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void pre_forward(int unit) = 0;
  virtual void post_forward(int unit, const at::Tensor& output) = 0;
};

class UnitBase : public torch::nn::Module {
 public:
  // Called by the engine at initialize (stage 3); id is the unit's number.
  void attach(std::shared_ptr<UnitHooks> hooks, int id) {
    hooks_ = std::move(hooks);
    id_ = id;
  }
  void detach() { hooks_.reset(); }

  // Recompute this unit's activations in backward instead of keeping them.
  // Set here, it wins over the config's choice.
  void checkpoint_activations(bool on) { chosen_ = on ? 1 : 0; }
  bool checkpoints_activations() const { return chosen_ >= 0 ? chosen_ == 1 : from_config_; }
  // The config's choice (the engine, at initialize), for a unit not set above.
  void set_config_checkpointing(bool on) { from_config_ = on; }

 protected:
  // Registers `inner`'s children and direct parameters and buffers on this
  // module, so that names do not change when a block becomes a unit.
  void adopt(torch::nn::Module& inner) {
    for (const auto& child : inner.named_children()) register_module(child.key(), child.value());
    for (const auto& p : inner.named_parameters(/*recurse=*/false)) register_parameter(p.key(), p.value());
    for (const auto& b : inner.named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  }

  template <typename F>
  at::Tensor run(F&& body) {
    if (!hooks_) return body();
    enter_forward();
    at::Tensor output = body();
    leave_forward(output);
    return output;
  }
  // The two halves of run(), for a unit whose forward runs elsewhere (a
  // Python module's forward hooks: python/csrc/python_model.h).
  void enter_forward() {
    if (hooks_) hooks_->pre_forward(id_);
  }
  void leave_forward(const at::Tensor& output) {
    if (hooks_) hooks_->post_forward(id_, output);
  }

 private:
  std::shared_ptr<UnitHooks> hooks_;
  int id_ = -1;
  int chosen_ = -1;  // -1: not chosen; 0 or 1
  bool from_config_ = false;
};

template <typename Inner>  // Inner: a module holder such as Block (TORCH_MODULE)
class UnitImpl : public UnitBase {
 public:
  explicit UnitImpl(Inner inner) : inner_(std::move(inner)) {
    adopt(*inner_);
    if (UnitBuiltHook hook = unit_built_hook()) hook(*this);  // under zero::Init: partitioned now
  }

  // x = unit(x): LibTorch's ModuleHolder needs one non-template forward.
  at::Tensor forward(const at::Tensor& x) { return call(x); }

  // Any other signature of the inner forward: unit->call(a, b, ...).
  template <typename... Args>
  at::Tensor call(Args&&... args) {
    using Result = decltype(inner_->forward(std::forward<Args>(args)...));
    static_assert(std::is_same<std::decay_t<Result>, at::Tensor>::value,
                  "zero::Unit supports modules whose forward returns one at::Tensor");
    if (!checkpoints_activations()) return run([&] { return inner_->forward(std::forward<Args>(args)...); });
    // The recompute calls the inner module alone: the hooks run once, around the forward.
    return run([&] {
      // The unit's parameters leave through the checkpoint: a unit called
      // twice gets one gradient per backward, the sum, as without it.
      return zero::checkpoint_with_params(trainable_parameters(parameters()),
                                          [inner = inner_](auto&&... a) mutable { return inner->forward(a...); },
                                          std::forward<Args>(args)...);
    });
  }

  Inner& inner() { return inner_; }

  // The inner module is not a registered child: keep its own training flag in step.
  void train(bool on = true) override {
    UnitBase::train(on);
    inner_->train(on);
  }

 private:
  Inner inner_;
};

template <typename Inner>
class Unit : public torch::nn::ModuleHolder<UnitImpl<Inner>> {
 public:
  using torch::nn::ModuleHolder<UnitImpl<Inner>>::ModuleHolder;
};

}  // namespace zero
