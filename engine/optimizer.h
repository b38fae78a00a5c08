#pragma once
// The optimizer the engine runs on each rank's fp32 master partition:
// torch::optim's implementations, configured from ds_config's "optimizer"
// with DeepSpeed's semantics (its "Adam" is AdamW unless adam_w_mode is false).
#include <torch/torch.h>

#include <memory>
#include <array>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "zero/config.h"

namespace zero::engine {

// torch::optim keys its state by the parameter's TensorImpl: as a string in
// LibTorch 1.13, as the pointer itself in LibTorch 2.x.
using OptimizerStateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
template <typename Key = OptimizerStateMap::key_type>
Key state_key(const at::Tensor& t) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << t.unsafeGetTensorImpl();
    return key.str();
  } else {
    return t.unsafeGetTensorImpl();
  }
}

struct OptimizerGroup {
  std::vector<at::Tensor> tensors;
  double weight_decay = 0.0;
};

// Whole-parameter structure of the shards, for Lamb's per-parameter norms.
struct ShardLayout {
  std::vector<std::vector<std::array<int64_t, 3>>> pieces;  // per tensor: {param, start, length}
  int64_t num_params = 0;
  std::function<void(at::Tensor&)> all_reduce_sum;        // across the ranks that share the parameters
};

// offload_optimizer: the optimizer runs on the host (engine/host_optimizer.h);
// the engine gives it the UpdateSink that takes its results to the parameters.
struct HostStep {
  bool enabled = false;
  // Partial offload: the tensors updated where they live, not by the host kernels.
  std::vector<at::Tensor> elsewhere;
};

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<OptimizerGroup>& groups,
                                                        const ShardLayout& layout, const HostStep& host = {});
// Sets every group's learning rate (and beta1 or momentum, when given).
void set_hyperparameters(torch::optim::Optimizer& optimizer, double lr,
                         std::optional<double> momentum);
// Bytes of the optimizer's state tensors (moments, momentum buffers, sums).
int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer, const OptimizerConfig& config);

// Checkpoint access to the per-element state of the optimizer (torch::optim's
// names): "exp_avg", "exp_avg_sq" (+ "max_exp_avg_sq" with amsgrad) for Adam,
// AdamW and Lamb; "sum" for Adagrad; "momentum_buffer" for SGD with momentum.
std::vector<std::string> state_kinds(const OptimizerConfig& config);
// The state `kind` of master tensor `tensor` (shaped like it, fp32), or an
// undefined tensor when the optimizer has none yet (before its first step).
// With `create`, a missing state is made (zeros) so that a checkpoint can be
// loaded into it.
at::Tensor state_tensor(torch::optim::Optimizer& optimizer, const OptimizerConfig& config,
                        const at::Tensor& tensor, const std::string& kind, bool create);
// The update count the optimizer keeps (Adam's and Adagrad's `step`; 0 for SGD).
int64_t step_count(torch::optim::Optimizer& optimizer, const OptimizerConfig& config,
                   const std::vector<at::Tensor>& tensors);
void set_step_count(torch::optim::Optimizer& optimizer, const OptimizerConfig& config,
                    const std::vector<at::Tensor>& tensors, int64_t step);

}  // namespace zero::engine
