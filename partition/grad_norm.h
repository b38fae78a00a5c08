#pragma once
// Note [Gradient norm]: one sum of squares of the reduced gradients per
// step, shared by clipping and by fp16's overflow check. Each bucket's
// gradient is added once, where it is: a host array by the fused kernel of
// offload/ (no temporary), a tensor on an accelerator there as a 0-d fp64
// sum (read back once, in total()), and a sum an offloaded bucket's copy
// already took on the accelerator as it is (HostGrads::land). The squares
// are summed in fp64 from the elements widened to fp64, so the total is not
// finite exactly when an element is not: the overflow check needs no pass
// of its own. Each bucket's sum is multiplied by its norm weight (Note
// [Flat layout]): with tensor parallelism a parameter replicated over the tp
// ranks of a group counts 1/tp on each, so the sum over the world counts it
// once, and a split one counts 1 (its slices are distinct).
#include <torch/torch.h>

#include <optional>

namespace zero::partition {

class GradSquares {
 public:
  // Before a step's gradients are added.
  void reset();
  void add(const at::Tensor& grad, double weight = 1.0);
  // A host sum taken earlier by offload::sum_of_squares, as add() would.
  void add_host_sum(double sum, double weight = 1.0);
  // A 0-d fp64 sum taken earlier on an accelerator (on_device()).
  void add_device_sum(const at::Tensor& sum, double weight = 1.0);
  // This rank's sum; the first call of a step reads the accelerator's.
  double total();

  // A 0-d fp64 sum of squares of `grad`, on grad's device, in pieces of
  // 16 Mi elements so the fp64 temporary stays small.
  static at::Tensor on_device(const at::Tensor& grad);

 private:
  at::Tensor device_sum_;
  double host_sum_ = 0.0;
  std::optional<double> total_;
};

}  // namespace zero::partition
