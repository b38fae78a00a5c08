#include "engine/host_optimizer.h"

#include <chrono>
#include <cmath>
#include <sstream>

#include "engine/optimizer.h"
#include "offload/cpu_optimizer.h"
#include "offload/host_tensors.h"
#include "zero/error.h"

namespace zero::engine {
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
  for (const auto& g : param_groups_) {
    for (const auto& p : g.params()) {
      if (on_host(p)) check_host_fp32(p, "offload_optimizer");
    }
  }
}

// Host states get huge pages: the kernels stream through them every step.
at::Tensor HostOptimizer::state_like(const at::Tensor& p, double value) const {
  if (!on_host(p)) return at::full_like(p, value);
  return offload::empty_with_huge_pages(p.numel(), p.options()).fill_(value);
}

void HostOptimizer::update_one(torch::optim::OptimizerParamGroup& group, at::Tensor& p, size_t i) {
  at::Tensor target;
  if (out_) {
    if (!p.grad().defined()) {
      throw OffloadError("offloaded tensor " + std::to_string(i) + " has no gradient; its target would not be written");
    }
    target = out_->update_target(i);
  }
  if (on_host(p)) {
    update(group, p, target);
  } else if (p.grad().defined()) {
    update_elsewhere(group, p);
    if (target.defined()) target.copy_(p);
  }
  if (out_) out_->send_updated(i);
}

// Partial offload: torch::optim's step over `p` alone, with the group's
// current options and p's state lent to it for the step (Note [One
// optimizer interface] in engine/optimizer.h). One bucket's gradient is
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

void HostOptimizer::use_store(std::unique_ptr<offload::SwappedTensors> store, std::vector<std::vector<int>> ids,
                              int64_t sub_group_numel) {
  store_ = std::move(store);
  ids_ = std::move(ids);
  sub_group_numel_ = std::max<int64_t>(sub_group_numel, 1);
}

HostTiming HostOptimizer::take_timing() {
  HostTiming t = timing_;
  timing_ = HostTiming();
  return t;
}

void HostOptimizer::step_into(partition::MasterStore* out) {
  out_ = out;
  try {
    step();
  } catch (...) {
    out_ = nullptr;
    throw;
  }
  out_ = nullptr;
}

torch::Tensor HostOptimizer::step(LossClosure closure) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  at::Tensor loss = run_closure(closure);
  // Flat parameter list, group by group.
  std::vector<std::pair<torch::optim::OptimizerParamGroup*, at::Tensor*>> flat;
  for (auto& group : param_groups_) {
    for (auto& p : group.params()) flat.emplace_back(&group, &p);
  }
  // Partial offload: the updates elsewhere are queued first (asynchronous
  // on an accelerator), so they run while the host kernels run.
  std::vector<size_t> host;
  for (size_t i = 0; i < flat.size(); ++i) {
    if (on_host(*flat[i].second)) {
      host.push_back(i);
    } else {
      update_one(*flat[i].first, *flat[i].second, i);
    }
  }
  if (!store_) {
    const auto start = Clock::now();
    for (size_t i : host) update_one(*flat[i].first, *flat[i].second, i);
    timing_.compute_s += since(start);
    return loss;
  }
  if (!host.empty()) step_through_store(flat, host);
  return loss;
}

// NVMe offload: sub-groups of consecutive parameters of about
// sub_group_numel elements, read ahead one sub-group and written behind
// one, so that at most three are resident.
void HostOptimizer::step_through_store(const std::vector<std::pair<torch::optim::OptimizerParamGroup*, at::Tensor*>>& flat,
                                       const std::vector<size_t>& host) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  std::vector<std::vector<size_t>> sub_groups(1);
  int64_t filled = 0;
  for (size_t i : host) {
    if (filled > 0 && filled + flat[i].second->numel() > sub_group_numel_) {
      sub_groups.emplace_back();
      filled = 0;
    }
    sub_groups.back().push_back(i);
    filled += flat[i].second->numel();
  }
  auto ids_of = [&](size_t s) {
    std::vector<int> ids;
    for (size_t i : sub_groups[s]) ids.insert(ids.end(), ids_[i].begin(), ids_[i].end());
    return ids;
  };
  auto wait = Clock::now();
  store_->swap_in(ids_of(0));
  timing_.nvme_wait_s += since(wait);
  for (size_t s = 0; s < sub_groups.size(); ++s) {
    wait = Clock::now();
    if (s + 1 < sub_groups.size()) store_->swap_in(ids_of(s + 1));
    store_->wait_in(ids_of(s));
    timing_.nvme_wait_s += since(wait);
    const auto start = Clock::now();
    for (size_t i : sub_groups[s]) update_one(*flat[i].first, *flat[i].second, i);
    timing_.compute_s += since(start);
    wait = Clock::now();
    store_->swap_out(ids_of(s));
    if (s > 0) store_->wait_out(ids_of(s - 1));
    timing_.nvme_wait_s += since(wait);
  }
  wait = Clock::now();
  store_->wait_out(ids_of(sub_groups.size() - 1));
  timing_.nvme_wait_s += since(wait);
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
  bool amsgrad;
  if (decoupled_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    lr = o.lr(), b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas()), eps = o.eps(), wd = o.weight_decay(), amsgrad = o.amsgrad();
  } else {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
    lr = o.lr(), b1 = std::get<0>(o.betas()), b2 = std::get<1>(o.betas()), eps = o.eps(), wd = o.weight_decay(), amsgrad = o.amsgrad();
  }
  if (amsgrad) throw OffloadError("offload_optimizer does not support amsgrad; set optimizer.params.amsgrad false");
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

}  // namespace zero::engine
