#pragma once
// The optimizer the engine runs on each rank's fp32 master partition:
// torch::optim's implementations, configured from ds_config's "optimizer"
// with DeepSpeed's semantics (its "Adam" is AdamW unless adam_w_mode is false).
#include <torch/torch.h>

#include <memory>
#include <array>
#include <functional>
#include <optional>
#include <vector>

#include "zero/config.h"

namespace zero::engine {

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

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<OptimizerGroup>& groups,
                                                        const ShardLayout& layout);
// Sets every group's learning rate (and beta1 or momentum, when given).
void set_hyperparameters(torch::optim::Optimizer& optimizer, double lr,
                         std::optional<double> momentum);
// Bytes of the optimizer's state tensors (moments, momentum buffers, sums).
int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer, const OptimizerConfig& config);

}  // namespace zero::engine
