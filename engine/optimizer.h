#pragma once
// The optimizer of a rank's fp32 master partition, behind one interface
// whichever runs it (Note [One optimizer interface]):
// - torch::optim's Adam, AdamW, SGD and Adagrad, where the parameters are;
// - Lamb (engine/lamb.h), whose trust ratios need norms across the ranks;
// - with offload_optimizer, the host optimizers (engine/host_optimizer.h)
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
#include "offload/swapped_tensors.h"
#include "zero/config.h"
#include "partition/partition.h"

namespace zero::engine {

// Note [One optimizer interface]: the engine schedules, checkpoints and
// measures its optimizer through MasterOptimizer alone, and the partition
// steps it as a BucketOptimizer (Note [The step] in partition/step.cpp): no
// type names, no casts. Its tensors are the master tensors in bucket order.
// The arithmetic of each optimizer exists once per place it runs:
// torch::optim's where the parameters are (also for the buckets partial
// offload keeps there), offload/'s kernels on the host. States are named as
// torch::optim names them, so checkpoints read the same whichever ran.

// torch::optim's state is keyed as compat::optimizer_state_key says (Note
// [LibTorch 1.13 and 2.x] in core/torch_compat.h).
using compat::optimizer_state_key;

// offload_optimizer: seconds in the host kernels and waiting for NVMe.
struct HostTiming {
  double compute_s = 0, nvme_wait_s = 0;
};

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
  // offload_optimizer: the host kernels' time since the last call (zeros
  // for torch::optim).
  virtual HostTiming take_timing() { return {}; }
  // offload_optimizer "nvme": the store its master weights and states live
  // in between steps; nullptr otherwise.
  virtual offload::SwappedTensors* nvme_store() { return nullptr; }

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
// or on CPU ranks (Note [Fused step on CPU ranks] in engine/engine_setup.h).
struct HostStep {
  bool enabled = false;
  // Partial offload: the tensors updated where they live, not by the host kernels.
  std::vector<at::Tensor> elsewhere;
  // offload_optimizer "nvme" (ZeRO-Infinity): the host tensors and their
  // states live in files under swap.nvme_path between steps, brought back
  // sub-group by sub-group of about sub_group_numel elements.
  std::optional<offload::SwapOptions> swap;
  int64_t sub_group_numel = 0;
  // The store the host tensors were written to as they were made (the
  // partition's master weights); their states join it. None: made here.
  std::unique_ptr<offload::SwappedTensors> store;
};

std::unique_ptr<MasterOptimizer> make_optimizer(const OptimizerConfig& config, const std::vector<OptimizerGroup>& groups,
                                                const ShardLayout& layout, HostStep host = {});

}  // namespace zero::engine
