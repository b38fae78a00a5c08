#pragma once
// LAMB on a rank's partition of the fp32 master parameters (ZeRO), with the
// semantics of DeepSpeed's FusedLamb (csrc/lamb/fused_lamb_cuda_kernel.cu):
//
//   m = b1 m + (1-b1) g          v = b2 v + (1-b2) g^2
//   u = m / (sqrt(v) + eps) + wd w        (eps_inside_sqrt: m / sqrt(v + eps) + wd w)
//   ratio = clamp(||w_p|| / ||u_p||, min_coeff, max_coeff) if both norms != 0, else 1
//   w -= step_size * ratio * u,  step_size = lr * sqrt(1-b2^t) / (1-b1^t)   (lr without bias_correction)
//
// As in DeepSpeed, the moments in u are NOT bias-corrected: the bias
// correction is folded into step_size (so it does not enter the trust ratio).
// The norms are per PARAMETER: each rank sums the squares over its pieces of
// a parameter, the partials are summed across the ranks, then square-rooted.
//
// A shard tensor may hold pieces of several parameters and a parameter may be
// split across ranks; LambSegment says which piece of which parameter lies
// where. Elements no segment covers (padding) are never written.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace zero::optim {

// A piece of parameter `param` at [start, start + length) of a shard tensor.
struct LambSegment {
  int64_t param = 0;
  int64_t start = 0;
  int64_t length = 0;
};

struct LambOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool bias_correction = true;
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  bool eps_inside_sqrt = false;
};

// The per-group options a Lamb's param groups carry.
class LambParamOptions : public torch::optim::OptimizerCloneableOptions<LambParamOptions> {
 public:
  LambParamOptions() = default;
  explicit LambParamOptions(const LambOptions& o) : options(o) {}
  double get_lr() const override { return options.lr; }
  void set_lr(const double lr) override { options.lr = lr; }
  LambOptions options;
};

class Lamb : public torch::optim::Optimizer {
 public:
  // groups: param groups of 1-D fp32 shard tensors whose options are
  //   LambParamOptions (a group without options gets `defaults`).
  // segments[t]: the pieces in shard tensor t, tensors numbered in the order
  //   of the groups' params, group by group.
  // num_params: the number of (whole) parameters; LambSegment::param < it.
  // all_reduce_sum: sums a double tensor across the ranks in place (identity
  //   on one rank); called once per step with a [num_params, 2] tensor on the
  //   shards' device.
  Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, std::vector<std::vector<LambSegment>> segments,
       int64_t num_params, std::function<void(at::Tensor&)> all_reduce_sum,
       const LambOptions& defaults = LambOptions());

  // partial_norms() + all_reduce_sum + apply().
  torch::Tensor step(LossClosure closure = nullptr) override;

  // The two phases of step(), for callers that reduce the norms themselves.
  // partial_norms() advances the step count, updates the moments from the
  // grads and returns this rank's partial squares, a [num_params, 2] double
  // tensor on the shards' device: column 0 sum w^2, column 1 sum u^2.
  // apply() takes the totals over all ranks (same shape, any device) and
  // updates the weights. Each partial_norms() must be followed by one apply().
  at::Tensor partial_norms();
  void apply(const at::Tensor& total_norms);

  // The trust ratios the last apply() used, one per parameter (1 for a
  // parameter with no piece on this rank).
  const std::vector<double>& lamb_coeffs() const { return coeffs_; }
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  // Shard tensor t's "exp_avg" or "exp_avg_sq" (undefined before the first
  // step unless `create`, which makes zeros), for checkpoints.
  at::Tensor moment(size_t t, bool second, bool create);
  // The index of the shard tensor `param` among this optimizer's, or -1.
  int64_t slot_of(const at::Tensor& param) const;

  // Writes/reads the step count and the moments (this rank's shards).
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // Bytes of the state tensors (exp_avg, exp_avg_sq of every shard).
  int64_t state_bytes() const;

 private:
  struct Slot {  // one shard tensor
    at::Tensor param;
    size_t group = 0;
    at::Tensor exp_avg, exp_avg_sq;
    std::vector<LambSegment> segments;
  };
  const LambOptions& group_options(size_t group) const;
  at::Tensor update_of(const Slot& slot, const LambOptions& o) const;

  std::vector<Slot> slots_;
  int64_t num_params_ = 0;
  std::function<void(at::Tensor&)> all_reduce_sum_;
  int64_t step_ = 0;
  bool pending_ = false;
  std::vector<double> coeffs_;
};

}  // namespace zero::optim
