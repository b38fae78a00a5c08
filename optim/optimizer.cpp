// The optimizers behind MasterOptimizer (Note [One optimizer interface]).
#include "optim/optimizer.h"

#include <algorithm>

#include "optim/host_optimizer.h"
#include "optim/lamb.h"
#include "optim/lr_schedule.h"
#include "partition/master_store.h"
#include "zero/error.h"

namespace zero::optim {

int64_t MasterOptimizer::state_bytes() {
  int64_t bytes = 0;
  for (const auto& t : tensors_) {
    for (const auto& name : state_names_) {
      const at::Tensor s = state(t, name, /*create=*/false);
      if (s.defined()) bytes += s.nbytes();
    }
  }
  return bytes;
}

namespace {

std::vector<at::Tensor> all_params(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> out;
  for (const auto& group : optimizer.param_groups()) out.insert(out.end(), group.params().begin(), group.params().end());
  return out;
}

void check_name(const std::vector<std::string>& names, const std::string& name) {
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string known;
    for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
    throw EngineError("the optimizer has no state \"" + name + "\" (it has: " + (known.empty() ? "none" : known) + ")");
  }
}

void scale_grads(const std::vector<at::Tensor>& tensors, double scale) {
  if (scale == 1.0) return;
  for (const auto& t : tensors) {
    if (t.grad().defined()) t.grad().mul_(scale);
  }
}

// The named tensors and the step count of each torch::optim state type.
template <typename State>
struct AdamStates {
  static at::Tensor get(const State& s, const std::string& name) {
    if (name == "exp_avg") return s.exp_avg();
    if (name == "exp_avg_sq") return s.exp_avg_sq();
    return s.max_exp_avg_sq();
  }
  static void make(State& s, const at::Tensor& like, const std::string& name) {
    if (!s.exp_avg().defined()) s.exp_avg(torch::zeros_like(like)).exp_avg_sq(torch::zeros_like(like));
    if (name == "max_exp_avg_sq" && !s.max_exp_avg_sq().defined()) s.max_exp_avg_sq(torch::zeros_like(like));
  }
  static int64_t step(const State& s) { return s.step(); }
  static void set_step(State& s, int64_t step) { s.step(step); }
};
template <typename State>
struct States;
template <>
struct States<torch::optim::AdamParamState> : AdamStates<torch::optim::AdamParamState> {};
template <>
struct States<torch::optim::AdamWParamState> : AdamStates<torch::optim::AdamWParamState> {};
template <>
struct States<torch::optim::SGDParamState> {
  using State = torch::optim::SGDParamState;
  static at::Tensor get(const State& s, const std::string&) { return s.momentum_buffer(); }
  static void make(State& s, const at::Tensor& like, const std::string&) {
    if (!s.momentum_buffer().defined()) s.momentum_buffer(torch::zeros_like(like));
  }
  static int64_t step(const State&) { return 0; }  // SGD counts no steps
  static void set_step(State&, int64_t) {}
};
template <>
struct States<torch::optim::AdagradParamState> {
  using State = torch::optim::AdagradParamState;
  static at::Tensor get(const State& s, const std::string&) { return s.sum(); }
  // torch::optim::Adagrad and CpuAdagrad make every sum as they are built.
  static void make(State&, const at::Tensor&, const std::string&) {}
  static int64_t step(const State& s) { return s.step(); }
  static void set_step(State& s, int64_t step) { s.step(step); }
};

// OneCycle's momentum: beta1 (beta2 as DeepSpeed's OneCycle) or SGD's momentum.
void set_momentum(torch::optim::AdamOptions& o, double m) { o.betas({m, LrSchedule::kOneCycleBeta2}); }
void set_momentum(torch::optim::AdamWOptions& o, double m) { o.betas({m, LrSchedule::kOneCycleBeta2}); }
void set_momentum(torch::optim::SGDOptions& o, double m) { o.momentum(m); }
void set_momentum(torch::optim::AdagradOptions&, double) {}  // Adagrad has none

// A torch::optim optimizer, or a host optimizer with torch::optim's options
// and states.
template <typename Options, typename State>
class TorchOptimizer final : public MasterOptimizer {
 public:
  TorchOptimizer(std::shared_ptr<torch::optim::Optimizer> inner, std::vector<std::string> names, HostOptimizer* host)
      : MasterOptimizer(std::move(names), all_params(*inner)), inner_(std::move(inner)), host_(host) {}

  // The host kernels update one tensor at a time; torch::optim's step takes them all.
  bool per_bucket() const override { return host_ != nullptr; }
  bool reads_training_dtype() const override { return host_ != nullptr; }
  void begin_step(double grad_scale) override {
    if (host_) {
      host_->set_grad_scale(grad_scale);  // applied as the kernels read the gradients
      return;
    }
    scale_grads(tensors(), grad_scale);
    inner_->step();
  }
  void update(size_t k, const at::Tensor& target) override {
    if (!host_) throw EngineError("internal: torch::optim updates every tensor in begin_step");
    host_->update_tensor(k, target);
  }
  void set_hyperparameters(double lr, std::optional<double> momentum) override {
    for (auto& group : inner_->param_groups()) {
      auto& options = static_cast<Options&>(group.options());
      options.lr(lr);
      if (momentum) set_momentum(options, *momentum);
    }
  }
  at::Tensor state(const at::Tensor& master, const std::string& name, bool create) override {
    check_name(state_names(), name);
    State* s = find(master);
    if (!s && !create) return {};
    if (!s) {
      auto made = std::make_unique<State>();
      s = made.get();
      inner_->state()[optimizer_state_key(master)] = std::move(made);
    }
    if (create) States<State>::make(*s, master, name);
    return States<State>::get(*s, name);
  }
  // Every tensor is updated together: the first one with a state says.
  int64_t step_count() override {
    for (const auto& t : tensors()) {
      if (const State* s = find(t)) return States<State>::step(*s);
    }
    return 0;
  }
  void set_step_count(int64_t step) override {
    for (const auto& t : tensors()) {
      if (State* s = find(t)) States<State>::set_step(*s, step);
    }
  }

 private:
  State* find(const at::Tensor& t) {
    auto it = inner_->state().find(optimizer_state_key(t));
    return it == inner_->state().end() ? nullptr : static_cast<State*>(it->second.get());
  }
  std::shared_ptr<torch::optim::Optimizer> inner_;  // shared with its user when it is a client optimizer
  HostOptimizer* host_;  // inner_ itself, with offload
};

class LambOptimizer final : public MasterOptimizer {
 public:
  explicit LambOptimizer(std::unique_ptr<Lamb> lamb)
      : MasterOptimizer({"exp_avg", "exp_avg_sq"}, all_params(*lamb)), lamb_(std::move(lamb)) {}

  // The trust ratios need every tensor's norms, all-reduced across the ranks.
  bool per_bucket() const override { return false; }
  bool reads_training_dtype() const override { return false; }
  void begin_step(double grad_scale) override {
    scale_grads(tensors(), grad_scale);
    lamb_->step();
  }
  void update(size_t, const at::Tensor&) override {
    throw EngineError("internal: Lamb updates every tensor in begin_step");
  }
  void set_hyperparameters(double lr, std::optional<double> momentum) override {
    for (auto& group : lamb_->param_groups()) {
      auto& o = static_cast<LambParamOptions&>(group.options()).options;
      o.lr = lr;
      if (momentum) o.beta1 = *momentum, o.beta2 = LrSchedule::kOneCycleBeta2;
    }
  }
  at::Tensor state(const at::Tensor& master, const std::string& name, bool create) override {
    check_name(state_names(), name);
    const int64_t slot = lamb_->slot_of(master);
    if (slot < 0) throw EngineError("Lamb has no state for this tensor");
    return lamb_->moment(static_cast<size_t>(slot), name == "exp_avg_sq", create);
  }
  int64_t step_count() override { return lamb_->step_count(); }
  void set_step_count(int64_t step) override { lamb_->set_step_count(step); }

 private:
  std::unique_ptr<Lamb> lamb_;
};

// The states torch::optim keeps per tensor for Adam, AdamW, SGD and Adagrad
// (MasterOptimizer::state_names).
std::vector<std::string> torch_state_names(const OptimizerConfig& config) {
  const auto& p = config.params;
  switch (*config.kind()) {
  case OptimizerKind::adam:
  case OptimizerKind::adamw:
    if (p.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    return {"exp_avg", "exp_avg_sq"};
  case OptimizerKind::sgd:
    if (p.momentum != 0) return {"momentum_buffer"};
    return {};
  case OptimizerKind::adagrad:
    return {"sum"};
  case OptimizerKind::lamb:
    break;
  }
  throw EngineError("internal: torch_state_names for optimizer type " + config.type);
}

template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> param_groups(const std::vector<OptimizerGroup>& groups,
                                                            const Options& base) {
  std::vector<torch::optim::OptimizerParamGroup> out;
  for (const auto& g : groups) {
    auto options = std::make_unique<Options>(base);
    options->weight_decay(g.weight_decay);
    out.emplace_back(g.tensors, std::move(options));
  }
  return out;
}

template <typename Torch, typename Options, typename State>
std::unique_ptr<MasterOptimizer> torch_optimizer(const std::vector<OptimizerGroup>& groups, const Options& o,
                                                 std::vector<std::string> names) {
  const auto given = param_groups(groups, o);
  auto torch = std::make_unique<Torch>(given, o);
  compat::keep_group_options(*torch, given);
  return std::make_unique<TorchOptimizer<Options, State>>(std::move(torch), std::move(names), nullptr);
}

// ZeRO-Infinity: the states of every tensor the host kernels update join
// its master weights in their files (with partial offload, the others stay
// with the parameters). As they start they are registered by value and not
// written (MasterStore::add_nvme_state): a state larger than memory is
// never in it.
void swap_states_to_nvme(HostOptimizer& host, MasterOptimizer& optimizer, partition::MasterStore& masters) {
  const auto& tensors = optimizer.tensors();
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (!host.on_host(tensors[k])) continue;  // Note [Partial offload]: not swapped
    host.make_states_of(tensors[k]);
    for (const auto& name : optimizer.state_names()) {
      // A fresh state holds one value everywhere (0, or Adagrad's
      // initial_accumulator_value).
      const at::Tensor s = optimizer.state(tensors[k], name, false);
      masters.add_nvme_state(k, s, s.numel() > 0 ? s.reshape(-1)[0].item<double>() : 0.0);
    }
  }
  masters.nvme_states_added();
}

template <typename Options, typename State, typename Host, typename... Args>
std::unique_ptr<MasterOptimizer> host_optimizer(const HostStep& step, std::vector<std::string> names, Args&&... args) {
  auto host = std::make_unique<Host>(std::forward<Args>(args)..., step.elsewhere);
  Host* raw = host.get();
  auto optimizer = std::make_unique<TorchOptimizer<Options, State>>(std::move(host), std::move(names), raw);
  if (step.nvme_masters) swap_states_to_nvme(*raw, *optimizer, *step.nvme_masters);
  return optimizer;
}

std::unique_ptr<MasterOptimizer> make_host_optimizer(const OptimizerConfig& config, const std::vector<OptimizerGroup>& groups,
                                                     const HostStep& step) {
  using namespace torch::optim;
  const auto& p = config.params;
  const OptimizerKind kind = *config.kind();
  if (is_adam(kind)) {
    if (config.decoupled_weight_decay()) {
      AdamWOptions o(p.lr);
      o.betas({p.betas[0], p.betas[1]}).eps(p.eps);
      return host_optimizer<AdamWOptions, AdamWParamState, CpuAdam>(step, {"exp_avg", "exp_avg_sq"}, param_groups(groups, o), true);
    }
    AdamOptions o(p.lr);
    o.betas({p.betas[0], p.betas[1]}).eps(p.eps);
    return host_optimizer<AdamOptions, AdamParamState, CpuAdam>(step, {"exp_avg", "exp_avg_sq"}, param_groups(groups, o), false);
  }
  if (kind == OptimizerKind::adagrad) {
    AdagradOptions o(p.lr);
    o.lr_decay(p.lr_decay).eps(p.eps).initial_accumulator_value(p.initial_accumulator_value);
    return host_optimizer<AdagradOptions, AdagradParamState, CpuAdagrad>(step, {"sum"}, param_groups(groups, o));
  }
  // The config refuses other kinds with offload_optimizer (config_schema.cpp, check_offload).
  throw EngineError("internal: no host optimizer for optimizer.type \"" + config.type + "\"");
}

std::unique_ptr<MasterOptimizer> make_lamb(const OptimizerConfig& config, const std::vector<OptimizerGroup>& groups,
                                           const ShardLayout& layout) {
  const auto& p = config.params;
  LambOptions o;
  o.lr = p.lr;
  o.beta1 = p.betas[0];
  o.beta2 = p.betas[1];
  o.eps = p.eps;
  o.bias_correction = p.bias_correction;
  o.max_coeff = p.max_coeff;
  o.min_coeff = p.min_coeff;
  o.eps_inside_sqrt = p.eps_inside_sqrt;
  std::vector<torch::optim::OptimizerParamGroup> lamb_groups;
  for (const auto& g : groups) {
    LambOptions go = o;
    go.weight_decay = g.weight_decay;
    lamb_groups.emplace_back(g.tensors, std::make_unique<LambParamOptions>(go));
  }
  std::vector<std::vector<LambSegment>> segments;
  for (const auto& tensor : layout.pieces) {
    segments.emplace_back();
    for (const auto& piece : tensor) segments.back().push_back({piece[0], piece[1], piece[2]});
  }
  return std::make_unique<LambOptimizer>(
      std::make_unique<Lamb>(std::move(lamb_groups), std::move(segments), layout.num_params, layout.all_reduce_sum, o));
}

}  // namespace

std::unique_ptr<MasterOptimizer> wrap_client_optimizer(std::shared_ptr<torch::optim::Optimizer> client,
                                                       const OptimizerConfig& config,
                                                       const std::vector<std::vector<at::Tensor>>& group_tensors) {
  using namespace torch::optim;
  auto& groups = client->param_groups();
  if (groups.size() != group_tensors.size()) {
    throw EngineError("internal: " + std::to_string(group_tensors.size()) + " master groups for a client optimizer of " +
                      std::to_string(groups.size()) + " groups");
  }
  for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = group_tensors[g];
  std::vector<std::string> names = torch_state_names(config);
  switch (*config.kind()) {
  case OptimizerKind::adam:
  case OptimizerKind::adamw:
    if (config.decoupled_weight_decay()) {
      return std::make_unique<TorchOptimizer<AdamWOptions, AdamWParamState>>(std::move(client), names, nullptr);
    }
    return std::make_unique<TorchOptimizer<AdamOptions, AdamParamState>>(std::move(client), names, nullptr);
  case OptimizerKind::sgd:
    return std::make_unique<TorchOptimizer<SGDOptions, SGDParamState>>(std::move(client), names, nullptr);
  case OptimizerKind::adagrad: {
    // torch::optim::Adagrad made a sum for each whole parameter as it was
    // built: the partition's replace them, filled as its constructor fills them.
    client->state().clear();
    const double initial = static_cast<const AdagradOptions&>(client->defaults()).initial_accumulator_value();
    for (const auto& group : groups) {
      for (const auto& t : group.params()) {
        auto state = std::make_unique<AdagradParamState>();
        state->step(0);
        state->sum(torch::full_like(t, initial, at::MemoryFormat::Preserve));
        client->state()[optimizer_state_key(t)] = std::move(state);
      }
    }
    return std::make_unique<TorchOptimizer<AdagradOptions, AdagradParamState>>(std::move(client), names, nullptr);
  }
  case OptimizerKind::lamb:
    break;
  }
  throw EngineError("internal: client_optimizer_config gave optimizer type " + config.type);
}

std::unique_ptr<MasterOptimizer> make_optimizer(const OptimizerConfig& config, const std::vector<OptimizerGroup>& groups,
                                                const ShardLayout& layout, const HostStep& host) {
  using namespace torch::optim;
  const std::optional<OptimizerKind> kind = config.kind();
  if (!kind) {
    throw EngineError("internal: make_optimizer without an optimizer kind (Config::check_trainable comes first)");
  }
  if (host.enabled) return make_host_optimizer(config, groups, host);
  const auto& p = config.params;
  switch (*kind) {
  case OptimizerKind::adam:
  case OptimizerKind::adamw: {
    const std::vector<std::string> names = torch_state_names(config);
    if (config.decoupled_weight_decay()) {
      AdamWOptions o(p.lr);
      o.betas({p.betas[0], p.betas[1]}).eps(p.eps).amsgrad(p.amsgrad);
      return torch_optimizer<AdamW, AdamWOptions, AdamWParamState>(groups, o, names);
    }
    AdamOptions o(p.lr);
    o.betas({p.betas[0], p.betas[1]}).eps(p.eps).amsgrad(p.amsgrad);
    return torch_optimizer<Adam, AdamOptions, AdamParamState>(groups, o, names);
  }
  case OptimizerKind::sgd: {
    SGDOptions o(p.lr);
    o.momentum(p.momentum).dampening(p.dampening).nesterov(p.nesterov);
    return torch_optimizer<SGD, SGDOptions, SGDParamState>(groups, o, torch_state_names(config));
  }
  case OptimizerKind::adagrad: {
    AdagradOptions o(p.lr);
    o.lr_decay(p.lr_decay).eps(p.eps).initial_accumulator_value(p.initial_accumulator_value);
    return torch_optimizer<Adagrad, AdagradOptions, AdagradParamState>(groups, o, torch_state_names(config));
  }
  case OptimizerKind::lamb:
    return make_lamb(config, groups, layout);
  }
  throw EngineError(std::string("make_optimizer: optimizer kind ") + name(*kind) + " has no case");  // every kind has one above
}

}  // namespace zero::optim
