#pragma once
// The FLOPs profiler (DeepSpeed's "flops_profiler"): while it counts, every
// ATen operator the training thread runs in forward is seen through
// LibTorch's RecordFunction callbacks, with its inputs' shapes, and
//   - its FLOPs and MACs come from its shapes: matrix products (mm, addmm,
//     bmm, baddbmm, addbmm, convolution) exactly, 2 FLOPs per multiply-add;
//     layer_norm 5 per element, softmax, GELU, ReLU, tanh, sigmoid 1 per
//     element (DeepSpeed's counts); an operator inside a counted one is not
//     counted again (addmm inside linear is counted once);
//   - it belongs to a module by the parameters it reads: an operator with a
//     parameter among its inputs belongs to that parameter's module; one
//     without (attention's products, an activation) to the parent of the
//     last module that was; operators nested in another belong where it
//     does. LibTorch has no forward hooks; this reads the model's own
//     parameter names instead;
//   - its latency is the wall time of the outermost operator.
// Backward is not counted (paused by the engine); DeepSpeed's convention
// of backward = 2 x forward FLOPs gives the training figures.
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

namespace zero::profile {

struct ModuleProfile {
  std::string name;    // the model's own name ("" for the model itself)
  int depth = 0;       // 0 for the model, 1 for its children, ...
  int64_t params = 0;  // its own and its children's
  double flops = 0, macs = 0, latency_s = 0;           // forward, with its children's
  double own_flops = 0, own_macs = 0, own_latency_s = 0;  // its operators alone
};

class FlopsProfiler {
 public:
  explicit FlopsProfiler(const torch::nn::Module& model);
  ~FlopsProfiler();
  FlopsProfiler(const FlopsProfiler&) = delete;
  FlopsProfiler& operator=(const FlopsProfiler&) = delete;

  // Counting runs on the calling thread between start() and stop(), and
  // not while paused (backward).
  void start();
  void pause();
  void resume();
  void stop();
  bool counting() const;

  double flops() const;   // forward, every module
  double macs() const;
  // Every module, the model first, in the model's order.
  std::vector<ModuleProfile> modules() const;

  struct State;  // flops_profiler.cpp (its callbacks reach it too)

 private:
  std::unique_ptr<State> state_;
};

// DeepSpeed's profile summary and per-module tables, as text.
struct ProfileReport {
  int64_t step = 0;
  int world_size = 1, data_parallel_size = 1, model_parallel_size = 1;
  int64_t micro_batch = 0, micro_batches = 1;  // per rank, in the profiled step
  double forward_s = 0, backward_s = 0, step_s = 0, iteration_s = 0;
  double recompute_fwd_factor = 0;  // activation checkpointing recomputes this share of forward
  int module_depth = -1, top_modules = 1;
  bool detailed = true;
};
std::string format_report(const FlopsProfiler& profiler, const ProfileReport& r);

}  // namespace zero::profile
