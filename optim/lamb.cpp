#include "optim/lamb.h"

#include "core/torch_compat.h"

#include <cmath>
#include <string>
#include <utility>

#include "zero/error.h"

namespace zero::optim {
namespace {
// Lamb's checks raise zero::EngineError, as every error zero raises derives
// from zero::Error; the message is put together as TORCH_CHECK would.
template <typename... Message>
void check(bool ok, const Message&... message) {
  if (!ok) throw EngineError(c10::str(message...));
}
}  // namespace

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, std::vector<std::vector<LambSegment>> segments,
           int64_t num_params, std::function<void(at::Tensor&)> all_reduce_sum, const LambOptions& defaults)
    : torch::optim::Optimizer(groups, std::make_unique<LambParamOptions>(defaults)),
      num_params_(num_params),
      all_reduce_sum_(std::move(all_reduce_sum)),
      coeffs_(static_cast<size_t>(num_params), 1.0) {
  check(num_params_ >= 0, "Lamb: num_params must be >= 0");
  check(static_cast<bool>(all_reduce_sum_), "Lamb: all_reduce_sum must be set (an identity on one rank)");
  compat::keep_group_options(*this, groups);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    check(dynamic_cast<const LambParamOptions*>(&param_groups_[g].options()) != nullptr,
                "Lamb: param group ", g, " has options other than LambParamOptions");
    for (const at::Tensor& p : param_groups_[g].params()) {
      Slot slot;
      slot.param = p;
      slot.group = g;
      slots_.push_back(std::move(slot));
    }
  }
  check(segments.size() == slots_.size(), "Lamb: ", segments.size(), " segment lists for ", slots_.size(),
              " shard tensors");
  for (size_t t = 0; t < slots_.size(); ++t) {
    const at::Tensor& p = slots_[t].param;
    check(p.dim() == 1 && p.is_contiguous(), "Lamb: shard tensor ", t, " must be 1-D and contiguous");
    check(p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble, "Lamb: shard tensor ", t,
                " must be fp32 (or fp64), got ", p.scalar_type());
    for (const LambSegment& s : segments[t]) {
      check(s.param >= 0 && s.param < num_params_, "Lamb: segment of parameter ", s.param, " in tensor ", t,
                  " but num_params is ", num_params_);
      check(s.start >= 0 && s.length >= 0 && s.start + s.length <= p.numel(), "Lamb: segment [", s.start, ", ",
                  s.start + s.length, ") is outside shard tensor ", t, " of ", p.numel(), " elements");
    }
    slots_[t].segments = std::move(segments[t]);
  }
}

const LambOptions& Lamb::group_options(size_t group) const {
  return static_cast<const LambParamOptions&>(param_groups_[group].options()).options;
}

// The unscaled update m / (sqrt(v) + eps) + wd w over the whole shard tensor.
at::Tensor Lamb::update_of(const Slot& slot, const LambOptions& o) const {
  at::Tensor denom = o.eps_inside_sqrt ? (slot.exp_avg_sq + o.eps).sqrt_() : slot.exp_avg_sq.sqrt().add_(o.eps);
  at::Tensor u = slot.exp_avg / denom;
  if (o.weight_decay != 0) u.add_(slot.param, o.weight_decay);
  return u;
}

at::Tensor Lamb::partial_norms() {
  check(!pending_, "Lamb: partial_norms() called twice without apply()");
  torch::NoGradGuard no_grad;
  const at::Device device = slots_.empty() ? at::Device(at::kCPU) : slots_.front().param.device();
  at::Tensor partial = at::zeros({num_params_, 2}, at::TensorOptions().dtype(at::kDouble).device(device));
  std::vector<at::Tensor> sums;
  std::vector<int64_t> index;
  for (Slot& slot : slots_) {
    const at::Tensor& grad = slot.param.grad();
    check(grad.defined(), "Lamb: a shard tensor has no grad; every rank must step every shard");
    if (!slot.exp_avg.defined()) {
      slot.exp_avg = at::zeros_like(slot.param, at::MemoryFormat::Contiguous);
      slot.exp_avg_sq = at::zeros_like(slot.param, at::MemoryFormat::Contiguous);
    }
    const LambOptions& o = group_options(slot.group);
    slot.exp_avg.mul_(o.beta1).add_(grad, 1 - o.beta1);
    slot.exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
    if (slot.segments.empty()) continue;
    const at::Tensor w2 = slot.param.square();
    const at::Tensor u2 = update_of(slot, o).square_();
    for (const LambSegment& s : slot.segments) {
      sums.push_back(at::stack({w2.narrow(0, s.start, s.length).sum(at::kDouble),
                                u2.narrow(0, s.start, s.length).sum(at::kDouble)}));
      index.push_back(s.param);
    }
  }
  if (!sums.empty()) {
    at::Tensor idx = at::tensor(index, at::kLong).to(device);
    partial.index_add_(0, idx, at::stack(sums));
  }
  ++step_;
  pending_ = true;
  return partial;
}

void Lamb::apply(const at::Tensor& total_norms) {
  check(pending_, "Lamb: apply() without partial_norms()");
  check(total_norms.dim() == 2 && total_norms.size(0) == num_params_ && total_norms.size(1) == 2,
              "Lamb: apply() expects [", num_params_, ", 2] norms, got ", total_norms.sizes());
  pending_ = false;
  torch::NoGradGuard no_grad;
  const at::Tensor totals = total_norms.to(at::kCPU, at::kDouble).contiguous();
  const double* sq = totals.data_ptr<double>();
  std::fill(coeffs_.begin(), coeffs_.end(), 1.0);
  for (Slot& slot : slots_) {
    if (slot.segments.empty()) continue;
    const LambOptions& o = group_options(slot.group);
    double step_size = o.lr;
    if (o.bias_correction) {
      const double t = static_cast<double>(step_);
      step_size = o.lr * std::sqrt(1 - std::pow(o.beta2, t)) / (1 - std::pow(o.beta1, t));
    }
    const at::Tensor u = update_of(slot, o);
    for (const LambSegment& s : slot.segments) {
      const double w_norm = std::sqrt(sq[2 * s.param]);
      const double u_norm = std::sqrt(sq[2 * s.param + 1]);
      double coeff = 1.0;  // DeepSpeed: 1 unless both norms are nonzero
      if (w_norm != 0 && u_norm != 0) {
        coeff = w_norm / u_norm;
        if (coeff > o.max_coeff) coeff = o.max_coeff;
        if (coeff < o.min_coeff) coeff = o.min_coeff;
      }
      coeffs_[static_cast<size_t>(s.param)] = coeff;
      slot.param.narrow(0, s.start, s.length).add_(u.narrow(0, s.start, s.length), -step_size * coeff);
    }
  }
}

torch::Tensor Lamb::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::Tensor norms = partial_norms();
  all_reduce_sum_(norms);
  apply(norms);
  return loss;
}

void Lamb::save(torch::serialize::OutputArchive& archive) const {
  archive.write("lamb.step", at::tensor(step_, at::kLong));
  archive.write("lamb.num_shards", at::tensor(static_cast<int64_t>(slots_.size()), at::kLong));
  for (size_t t = 0; t < slots_.size(); ++t) {
    if (!slots_[t].exp_avg.defined()) continue;
    archive.write("lamb.exp_avg." + std::to_string(t), slots_[t].exp_avg, /*is_buffer=*/true);
    archive.write("lamb.exp_avg_sq." + std::to_string(t), slots_[t].exp_avg_sq, /*is_buffer=*/true);
  }
}

void Lamb::load(torch::serialize::InputArchive& archive) {
  at::Tensor value;
  archive.read("lamb.num_shards", value);
  check(value.item<int64_t>() == static_cast<int64_t>(slots_.size()), "Lamb::load: the archive has ",
              value.item<int64_t>(), " shard tensors, this optimizer ", slots_.size());
  archive.read("lamb.step", value);
  const int64_t step = value.item<int64_t>();
  std::vector<std::pair<at::Tensor, at::Tensor>> moments(slots_.size());
  for (size_t t = 0; t < slots_.size(); ++t) {
    at::Tensor m, v;
    const bool has_m = archive.try_read("lamb.exp_avg." + std::to_string(t), m, /*is_buffer=*/true);
    const bool has_v = archive.try_read("lamb.exp_avg_sq." + std::to_string(t), v, /*is_buffer=*/true);
    check(has_m == has_v, "Lamb::load: shard ", t, " has only one of its moments");
    if (!has_m) continue;
    const at::Tensor& p = slots_[t].param;
    check(m.sizes() == p.sizes() && v.sizes() == p.sizes(), "Lamb::load: shard ", t, " moments of shape ",
                m.sizes(), ", the shard is ", p.sizes());
    moments[t] = {m.to(p.options()).contiguous(), v.to(p.options()).contiguous()};
  }
  for (size_t t = 0; t < slots_.size(); ++t) {
    slots_[t].exp_avg = moments[t].first;
    slots_[t].exp_avg_sq = moments[t].second;
  }
  step_ = step;
  pending_ = false;
}

at::Tensor Lamb::moment(size_t t, bool second, bool create) {
  Slot& slot = slots_.at(t);
  if (!slot.exp_avg.defined() && create) {
    slot.exp_avg = torch::zeros_like(slot.param);
    slot.exp_avg_sq = torch::zeros_like(slot.param);
  }
  return second ? slot.exp_avg_sq : slot.exp_avg;
}

int64_t Lamb::slot_of(const at::Tensor& param) const {
  for (size_t t = 0; t < slots_.size(); ++t) {
    if (slots_[t].param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return static_cast<int64_t>(t);
  }
  return -1;
}

int64_t Lamb::state_bytes() const {
  int64_t bytes = 0;
  for (const Slot& slot : slots_) {
    if (slot.exp_avg.defined()) bytes += static_cast<int64_t>(slot.exp_avg.nbytes());
    if (slot.exp_avg_sq.defined()) bytes += static_cast<int64_t>(slot.exp_avg_sq.nbytes());
  }
  return bytes;
}

}  // namespace zero::optim
