#pragma once
// The optimizers of offload_optimizer: torch::optim's Adam, AdamW and
// Adagrad semantics, state and options (so schedules, checkpoints and the
// memory report treat them like the torch ones), stepped by the fused SIMD
// kernels of offload/cpu_optimizer.h on host-resident fp32 tensors, whose
// gradients may be fp32, fp16 or bf16 (the training dtype). Stepped into
// the partition's MasterStore (step_into), the step writes each updated
// bucket in the training dtype where the store says, in the same pass, and
// sends it on as each one is done (Note [Offload copies] in
// partition/master_store.h); tensor i is bucket i's master.
#include <torch/torch.h>

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/optimizer.h"
#include "offload/swapped_tensors.h"

namespace zero::engine {

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
  torch::Tensor step(LossClosure closure = nullptr) override;
  // step() that writes each updated tensor i where out->update_target(i)
  // says and calls out->send_updated(i) as soon as it is done.
  void step_into(partition::MasterStore* out);

  // The state tensors of `p`, made now (zeros, or what torch::optim starts
  // from) instead of at its first update.
  virtual void make_states_of(const at::Tensor& p) = 0;

  // NVMe offload: the parameters and their states live in `store`
  // (ids[i]: the store ids of flat parameter i's tensors). step() walks
  // sub-groups of about `sub_group_numel` elements, reading the next one and
  // writing back the previous one while it updates the current one.
  void use_store(std::unique_ptr<offload::SwappedTensors> store, std::vector<std::vector<int>> ids,
                 int64_t sub_group_numel);
  offload::SwappedTensors* nvme_store() { return store_.get(); }

  // The factor every gradient element is multiplied by as the next steps
  // read it (the loss scale's inverse times the clipping coefficient).
  void set_grad_scale(double scale) { grad_scale_ = static_cast<float>(scale); }

  // Seconds spent in the kernels and waiting for NVMe since the last call.
  HostTiming take_timing();

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
  void update_one(torch::optim::OptimizerParamGroup& group, at::Tensor& p, size_t i);
  void update_elsewhere(torch::optim::OptimizerParamGroup& group, at::Tensor& p);
  void step_through_store(const std::vector<std::pair<torch::optim::OptimizerParamGroup*, at::Tensor*>>& flat,
                          const std::vector<size_t>& host);
  std::unordered_set<const void*> elsewhere_;
  std::unordered_map<const void*, std::unique_ptr<torch::optim::Optimizer>> elsewhere_optimizers_;
  partition::MasterStore* out_ = nullptr;  // during step_into
  std::unique_ptr<offload::SwappedTensors> store_;
  HostTiming timing_;
  std::vector<std::vector<int>> ids_;
  int64_t sub_group_numel_ = 0;
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

}  // namespace zero::engine
