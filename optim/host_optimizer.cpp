#include "optim/host_optimizer.h"

#include <cmath>
#include <string>

#include "optim/optimizer.h"
#include "offload/cpu_optimizer.h"
#include "offload/host_tensors.h"
#include "zero/error.h"

namespace zero::optim {
namespace {

void check_host_fp32(const at::Tensor& t, const char* what) {
  if (!t.is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous()) {
    throw OffloadError(std::string(what) + ": offloaded optimizer tensors must be contiguous fp32 host tensors");
  }
}

// The gradient of `p` as the kernels read it: contiguous fp32, fp16 or bf16 in host memory.
offload::GradArray host_grad(const at::Tensor& p, const char* what) {
  if (auto g = offload::grad_array(p.grad()); g && p.grad().numel() == p.numel()) return *g;
  throw OffloadError(std::string(what) + ": the gradient must be a contiguous fp32, fp16 or bf16 host tensor of " +
                     std::to_string(p.numel()) + " elements");
}

// The fused kernels write fp16/bf16 targets; an fp32 target is copied after.
std::pair<uint16_t*, offload::CopyDtype> fused_copy(const at::Tensor& p, const at::Tensor& target) {
  if (!target.defined()) return {nullptr, offload::CopyDtype::kNone};
  const auto t = target.scalar_type();
  if (!target.is_cpu() || !target.is_contiguous() || target.numel() != p.numel() ||
      (t != at::kHalf && t != at::kBFloat16 && t != at::kFloat)) {
    throw OffloadError("an updated parameter's target must be a contiguous fp16/bf16/fp32 host tensor of " +
                       std::to_string(p.numel()) + " elements");
  }
  if (t == at::kFloat) return {nullptr, offload::CopyDtype::kNone};
  return {static_cast<uint16_t*>(target.data_ptr()),
          t == at::kHalf ? offload::CopyDtype::kHalf : offload::CopyDtype::kBFloat16};
}

void finish_fp32_copy(const at::Tensor& p, const at::Tensor& target) {
  if (target.defined() && target.scalar_type() == at::kFloat) target.copy_(p);
}

at::Tensor run_closure(torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace

// ---- HostOptimizer ----

HostOptimizer::HostOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                             std::unique_ptr<torch::optim::OptimizerOptions> defaults,
                             const std::vector<at::Tensor>& elsewhere)
    : Optimizer(groups, std::move(defaults)) {
  compat::keep_group_options(*this, groups);
  for (const auto& t : elsewhere) elsewhere_.insert(t.unsafeGetTensorImpl());
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    for (size_t j = 0; j < param_groups_[g].params().size(); ++j) {
      if (on_host(param_groups_[g].params()[j])) check_host_fp32(param_groups_[g].params()[j], "offload_optimizer");
      flat_.emplace_back(g, j);
    }
  }
}

// Host states get huge pages: the kernels stream through them every step.
at::Tensor HostOptimizer::state_like(const at::Tensor& p, double value) const {
  if (!on_host(p)) return at::full_like(p, value);
  return offload::empty_with_huge_pages(p.numel(), p.options()).fill_(value);
}

void HostOptimizer::update_tensor(size_t i, const at::Tensor& target) {
  if (i >= flat_.size()) throw OffloadError("internal: the host optimizer has no tensor " + std::to_string(i));
  auto& group = param_groups_[flat_[i].first];
  at::Tensor& p = group.params()[flat_[i].second];
  if (!p.grad().defined()) {
    throw OffloadError("offloaded tensor " + std::to_string(i) + " has no gradient; its target would not be written");
  }
  if (on_host(p)) {
    update(group, p, target);
  } else {
    update_elsewhere(group, p);
    if (target.defined()) target.copy_(p);
  }
}

// Partial offload: torch::optim's step over `p` alone, with the group's
// current options and p's state lent to it for the step (Note [One
// optimizer interface] in optim/optimizer.h). One bucket's gradient is
// widened at a time and scaled as the kernels scale theirs (in place when
// widening made a copy; the gradient itself is left alone).
void HostOptimizer::update_elsewhere(torch::optim::OptimizerParamGroup& group, at::Tensor& p) {
  auto& inner = elsewhere_optimizers_[p.unsafeGetTensorImpl()];
  if (!inner) inner = optimizer_for(p);
  inner->param_groups().front().set_options(group.options().clone());
  const auto key = optimizer_state_key(p);
  if (auto own = state_.find(key); own != state_.end()) inner->state()[key] = std::move(own->second);
  const at::Tensor grad = p.grad();
  at::Tensor wide = grad.to(at::kFloat);
  if (grad_scale_ != 1.0f) wide = wide.is_same(grad) ? wide.mul(grad_scale_) : wide.mul_(grad_scale_);
  p.mutable_grad() = wide;
  try {
    inner->step();
  } catch (...) {
    p.mutable_grad() = grad;
    throw;
  }
  p.mutable_grad() = grad;
  auto lent = inner->state().find(key);
  state_[key] = std::move(lent->second);
  inner->state().erase(lent);
}

torch::Tensor HostOptimizer::step(LossClosure closure) {
  at::Tensor loss = run_closure(closure);
  for (size_t i = 0; i < flat_.size(); ++i) {
    if (param_groups_[flat_[i].first].params()[flat_[i].second].grad().defined()) update_tensor(i, at::Tensor());
  }
  return loss;
}

// ---- CpuAdam ----

CpuAdam::CpuAdam(std::vector<torch::optim::OptimizerParamGroup> groups, bool decoupled,
                 const std::vector<at::Tensor>& elsewhere)
    : HostOptimizer(groups,
                    decoupled ? std::unique_ptr<torch::optim::OptimizerOptions>(std::make_unique<torch::optim::AdamWOptions>())
                              : std::make_unique<torch::optim::AdamOptions>(),
                    elsewhere),
      decoupled_(decoupled) {}

void CpuAdam::make_states_of(const at::Tensor& p) {
  auto key = optimizer_state_key(p);
  if (state_.count(key)) return;
  if (decoupled_) {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->exp_avg(state_like(p, 0.0)).exp_avg_sq(state_like(p, 0.0));
    state_[key] = std::move(s);
  } else {
    auto s = std::make_unique<torch::optim::AdamParamState>();
    s->exp_avg(state_like(p, 0.0)).exp_avg_sq(state_like(p, 0.0));
    state_[key] = std::move(s);
  }
}

std::unique_ptr<torch::optim::Optimizer> CpuAdam::optimizer_for(const at::Tensor& p) const {
  if (decoupled_) return std::make_unique<torch::optim::AdamW>(std::vector<at::Tensor>{p});
  return std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{p});
}

void CpuAdam::update(torch::optim::OptimizerParamGroup& group, at::Tensor& p, const at::Tensor& target) {
  if (!p.grad().defined()) return;
  const offload::GradArray grad = host_grad(p, "CpuAdam");
  offload::AdamStep h;
  double lr, b1, b2, eps, wd;
  if (decoupled_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    lr = o.lr(), b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas()), eps = o.eps(), wd = o.weight_decay();
  } else {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
    lr = o.lr(), b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas()), eps = o.eps(), wd = o.weight_decay();
  }
  h.lr = static_cast<float>(lr), h.beta1 = static_cast<float>(b1), h.beta2 = static_cast<float>(b2);
  h.eps = static_cast<float>(eps), h.weight_decay = static_cast<float>(wd), h.decoupled_weight_decay = decoupled_;
  h.grad_scale = grad_scale_;
  make_states_of(p);  // the first step: zeros, as torch::optim makes them
  at::Tensor m, v;
  auto& s = *state_.at(optimizer_state_key(p));
  if (decoupled_) {
    auto& a = static_cast<torch::optim::AdamWParamState&>(s);
    a.step(a.step() + 1);
    h.step = a.step(), m = a.exp_avg(), v = a.exp_avg_sq();
  } else {
    auto& a = static_cast<torch::optim::AdamParamState&>(s);
    a.step(a.step() + 1);
    h.step = a.step(), m = a.exp_avg(), v = a.exp_avg_sq();
  }
  const auto [copy, copy_dtype] = fused_copy(p, target);
  offload::adam_step(h, p.numel(), p.data_ptr<float>(), grad, m.data_ptr<float>(), v.data_ptr<float>(), copy,
                     copy_dtype);
  finish_fp32_copy(p, target);
}

// ---- CpuAdagrad ----

CpuAdagrad::CpuAdagrad(std::vector<torch::optim::OptimizerParamGroup> groups, const std::vector<at::Tensor>& elsewhere)
    : HostOptimizer(groups, std::make_unique<torch::optim::AdagradOptions>(), elsewhere) {
  for (auto& group : param_groups_) {  // torch::optim::Adagrad makes its state up front
    const auto& o = static_cast<const torch::optim::AdagradOptions&>(group.options());
    for (auto& p : group.params()) {
      auto s = std::make_unique<torch::optim::AdagradParamState>();
      s->step(0);
      s->sum(state_like(p, o.initial_accumulator_value()));
      state_[optimizer_state_key(p)] = std::move(s);
    }
  }
}

std::unique_ptr<torch::optim::Optimizer> CpuAdagrad::optimizer_for(const at::Tensor& p) const {
  return std::make_unique<torch::optim::Adagrad>(std::vector<at::Tensor>{p});
}

void CpuAdagrad::update(torch::optim::OptimizerParamGroup& group, at::Tensor& p, const at::Tensor& target) {
  if (!p.grad().defined()) return;
  const offload::GradArray grad = host_grad(p, "CpuAdagrad");
  const auto& o = static_cast<const torch::optim::AdagradOptions&>(group.options());
  offload::AdagradStep h;
  h.lr = static_cast<float>(o.lr()), h.lr_decay = static_cast<float>(o.lr_decay());
  h.eps = static_cast<float>(o.eps()), h.weight_decay = static_cast<float>(o.weight_decay());
  h.grad_scale = grad_scale_;
  auto& s = static_cast<torch::optim::AdagradParamState&>(*state_.at(optimizer_state_key(p)));
  s.step(s.step() + 1);
  h.step = s.step();
  const auto [copy, copy_dtype] = fused_copy(p, target);
  offload::adagrad_step(h, p.numel(), p.data_ptr<float>(), grad, s.sum().data_ptr<float>(), copy, copy_dtype);
  finish_fp32_copy(p, target);
}

}  // namespace zero::optim
