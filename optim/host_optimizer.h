#pragma once
// The optimizers of offload_optimizer: torch::optim's Adam, AdamW and
// Adagrad semantics, state and options (so schedules, checkpoints and the
// memory report treat them like the torch ones), run by the fused SIMD
// kernels of offload/cpu_optimizer.h on host-resident fp32 tensors, whose
// gradients may be fp32, fp16 or bf16 (the training dtype). Each is a
// kernel per tensor: the partition's step drives it bucket by bucket
// (Note [The step] in partition/step.cpp), and update_tensor(i, target)
// writes tensor i's new values in the training dtype where the partition
// says, in the same pass; tensor i is bucket i's master.
#include <torch/torch.h>

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "optim/optimizer.h"

namespace zero::optim {

// What CpuAdam and CpuAdagrad share: the targets, the walk over the tensors
// and, with NVMe offload, the pipeline over sub-groups.
//
// Partial offload (Note [Partial offload] in partition/master_store.h): the tensors
// listed in `elsewhere` stay where they are (usually the accelerator) and
// are updated there by torch::optim's own optimizer of the same kind, before
// the host kernels update the rest, so that both run at once.
class HostOptimizer : public torch::optim::Optimizer {
 public:
  HostOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                std::unique_ptr<torch::optim::OptimizerOptions> defaults, const std::vector<at::Tensor>& elsewhere);
  // Updates every tensor that has a gradient (torch::optim's interface).
  torch::Tensor step(LossClosure closure = nullptr) override;
  // Updates tensor i (in group order) from its gradient, and writes its new
  // values to `target` (fp16, bf16 or fp32 host memory) when defined.
  void update_tensor(size_t i, const at::Tensor& target);

  // The state tensors of `p`, made now (zeros, or what torch::optim starts
  // from) instead of at its first update.
  virtual void make_states_of(const at::Tensor& p) = 0;

  // The factor every gradient element is multiplied by as the next steps
  // read it (the loss scale's inverse times the clipping coefficient).
  void set_grad_scale(double scale) { grad_scale_ = static_cast<float>(scale); }

  // Whether the host kernels update `p` (its states live in host memory).
  bool on_host(const at::Tensor& p) const { return elsewhere_.count(p.unsafeGetTensorImpl()) == 0; }

 protected:
  // Updates `p` of `group`, writing its new value to `target` when defined.
  virtual void update(torch::optim::OptimizerParamGroup& group, at::Tensor& p, const at::Tensor& target) = 0;
  // torch::optim's optimizer of this kind over `p` alone (default options):
  // it updates the tensors the host kernels do not.
  virtual std::unique_ptr<torch::optim::Optimizer> optimizer_for(const at::Tensor& p) const = 0;
  // A state tensor like `p` filled with `value`, where p's states live.
  at::Tensor state_like(const at::Tensor& p, double value) const;
  float grad_scale_ = 1.0f;

 private:
  void update_elsewhere(torch::optim::OptimizerParamGroup& group, at::Tensor& p);
  std::unordered_set<const void*> elsewhere_;
  std::unordered_map<const void*, std::unique_ptr<torch::optim::Optimizer>> elsewhere_optimizers_;
  std::vector<std::pair<size_t, size_t>> flat_;  // tensor i: its group and its place in the group
};

class CpuAdam : public HostOptimizer {
 public:
  // groups carry AdamWOptions (decoupled weight decay) or AdamOptions (L2).
  CpuAdam(std::vector<torch::optim::OptimizerParamGroup> groups, bool decoupled,
          const std::vector<at::Tensor>& elsewhere = {});
  void make_states_of(const at::Tensor& p) override;

 protected:
  void update(torch::optim::OptimizerParamGroup& group, at::Tensor& p, const at::Tensor& target) override;
  std::unique_ptr<torch::optim::Optimizer> optimizer_for(const at::Tensor& p) const override;

 private:
  bool decoupled_;
};

class CpuAdagrad : public HostOptimizer {
 public:
  explicit CpuAdagrad(std::vector<torch::optim::OptimizerParamGroup> groups,
                      const std::vector<at::Tensor>& elsewhere = {});
  void make_states_of(const at::Tensor&) override {}  // made up front, as torch::optim::Adagrad does

 protected:
  void update(torch::optim::OptimizerParamGroup& group, at::Tensor& p, const at::Tensor& target) override;
  std::unique_ptr<torch::optim::Optimizer> optimizer_for(const at::Tensor& p) const override;
};

}  // namespace zero::optim
