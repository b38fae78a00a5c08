#include "partition/grad_norm.h"

#include "offload/cpu_optimizer.h"
#include "offload/host_tensors.h"

namespace zero::partition {

void GradSquares::reset() {
  device_sum_ = at::Tensor();
  host_sum_ = 0.0;
  total_.reset();
}

void GradSquares::add(const at::Tensor& grad, double weight) {
  if (!grad.defined()) return;
  total_.reset();
  if (auto host = offload::grad_array(grad)) {
    host_sum_ += weight * offload::sum_of_squares(*host, grad.numel());
  } else {
    add_device_sum(on_device(grad), weight);
  }
}

void GradSquares::add_host_sum(double sum, double weight) {
  total_.reset();
  host_sum_ += weight * sum;
}

void GradSquares::add_device_sum(const at::Tensor& sum, double weight) {
  total_.reset();
  const at::Tensor weighted = weight == 1.0 ? sum : sum * weight;
  device_sum_ = device_sum_.defined() ? device_sum_ + weighted.to(device_sum_.device()) : weighted;
}

double GradSquares::total() {
  if (!total_) total_ = host_sum_ + (device_sum_.defined() ? device_sum_.item<double>() : 0.0);
  return *total_;
}

at::Tensor GradSquares::on_device(const at::Tensor& grad) {
  constexpr int64_t kPiece = int64_t{1} << 24;
  const at::Tensor flat = grad.reshape({-1});
  at::Tensor sum = at::zeros({}, grad.options().dtype(at::kDouble));
  for (int64_t start = 0; start < flat.numel(); start += kPiece) {
    const at::Tensor piece = flat.slice(0, start, std::min(flat.numel(), start + kPiece)).to(at::kDouble);
    sum += piece.mul(piece).sum();
  }
  return sum;
}

}  // namespace zero::partition
