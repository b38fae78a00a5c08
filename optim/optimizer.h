#pragma once
// The optimizer of a rank's fp32 master partition, behind one interface
// whichever runs it (Note [One optimizer interface]):
// - torch::optim's Adam, AdamW, SGD and Adagrad, where the parameters are;
// - Lamb (optim/lamb.h), whose trust ratios need norms across the ranks;
// - with offload_optimizer, the host optimizers (optim/host_optimizer.h)
//   over offload/'s fused kernels.
// Configured from ds_config's "optimizer" with DeepSpeed's semantics (its
// "Adam" is AdamW unless adam_w_mode is false); make_optimizer is the one
// place that reads the type.
#include <torch/torch.h>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/torch_compat.h"
#include "partition/step.h"
#include "zero/config.h"

namespace zero::partition {
class MasterStore;
}

namespace zero::optim {

// Note [One optimizer interface]: the engine schedules, checkpoints and
// measures its optimizer through MasterOptimizer alone, and the partition
// drives it as a BucketOptimizer (Note [The step] in partition/step.cpp):
// no type names, no casts. Its tensors are the master tensors in bucket order.
// The arithmetic of each optimizer exists once per place it runs:
// torch::optim's where the parameters are (also for the buckets partial
// offload keeps there), offload/'s kernels on the host. States are named as
// torch::optim names them, so checkpoints read the same whichever ran.

// torch::optim's state is keyed as compat::optimizer_state_key says (Note
// [LibTorch 1.13 and 2.x] in core/torch_compat.h).
using compat::optimizer_state_key;

class MasterOptimizer : public partition::BucketOptimizer {
 public:
  // Every group's learning rate, and with `momentum` beta1 (Adam, AdamW,
  // Lamb; beta2 becomes LrSchedule::kOneCycleBeta2) or SGD's momentum.
  virtual void set_hyperparameters(double lr, std::optional<double> momentum) = 0;

  // The per-element states of each master tensor, by torch::optim's names:
  // "exp_avg", "exp_avg_sq" (+ "max_exp_avg_sq" with amsgrad) for Adam,
  // AdamW and Lamb; "sum" for Adagrad; "momentum_buffer" for SGD with
  // momentum; none for plain SGD.
  const std::vector<std::string>& state_names() const { return state_names_; }
  // State `name` of master tensor `master` (fp32, shaped like it), or
  // undefined before its first step; `create` makes a missing one (zeros)
  // so that a checkpoint can be loaded into it.
  virtual at::Tensor state(const at::Tensor& master, const std::string& name, bool create) = 0;
  // The update count (Adam's, Adagrad's and Lamb's `step`; 0 for SGD).
  virtual int64_t step_count() = 0;
  virtual void set_step_count(int64_t step) = 0;
  // Bytes of every state tensor that exists.
  int64_t state_bytes();
  // The master tensors it updates, in bucket order (so group by group).
  const std::vector<at::Tensor>& tensors() const { return tensors_; }

 protected:
  MasterOptimizer(std::vector<std::string> state_names, std::vector<at::Tensor> tensors)
      : state_names_(std::move(state_names)), tensors_(std::move(tensors)) {}

 private:
  std::vector<std::string> state_names_;
  std::vector<at::Tensor> tensors_;
};

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

// The optimizer runs on the host's fused kernels: with offload_optimizer,
// or on CPU ranks (Note [Fused step on CPU ranks] in engine/master_optimizer.h).
struct HostStep {
  bool enabled = false;
  // Partial offload: the tensors updated where they live, not by the host kernels.
  std::vector<at::Tensor> elsewhere;
  // offload_optimizer "nvme" (ZeRO-Infinity): the master weights, already in
  // files, whose states join them there; the partition's step brings them
  // back sub-group by sub-group (Note [The step]).
  partition::MasterStore* nvme_masters = nullptr;
};

std::unique_ptr<MasterOptimizer> make_optimizer(const OptimizerConfig& config, const std::vector<OptimizerGroup>& groups,
                                                const ShardLayout& layout, const HostStep& host = {});

// A client optimizer over the master tensors: its param group g's params
// become group_tensors[g] (the partition of the engine's group g), its
// options stay. `config`: what client_optimizer_config
// (optim/client_optimizer.h) said of it, which refuses what cannot be honoured.
std::unique_ptr<MasterOptimizer> wrap_client_optimizer(std::shared_ptr<torch::optim::Optimizer> client,
                                                       const OptimizerConfig& config,
                                                       const std::vector<std::vector<at::Tensor>>& group_tensors);

}  // namespace zero::optim
