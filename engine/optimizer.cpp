#include "engine/optimizer.h"

#include "engine/host_optimizer.h"
#include "engine/lamb.h"
#include "engine/lr_schedule.h"
#include "zero/error.h"

#include <sstream>
#include <type_traits>

namespace zero::engine {
namespace {

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

// Sums the bytes of the tensors `fields(state)` returns for every state entry.
template <typename State, typename Fields>
int64_t bytes_of(torch::optim::Optimizer& optimizer, Fields fields) {
  int64_t bytes = 0;
  for (auto& entry : optimizer.state()) {
    for (const at::Tensor& t : fields(static_cast<State&>(*entry.second))) {
      if (t.defined()) bytes += t.nbytes();
    }
  }
  return bytes;
}

bool is_adam(const OptimizerConfig& c) { return c.type == "Adam" || c.type == "AdamW"; }

template <typename State>
State* find_state(torch::optim::Optimizer& optimizer, const at::Tensor& t) {
  auto it = optimizer.state().find(state_key(t));
  return it == optimizer.state().end() ? nullptr : static_cast<State*>(it->second.get());
}

template <typename State>
State& get_or_create_state(torch::optim::Optimizer& optimizer, const at::Tensor& t) {
  if (auto* s = find_state<State>(optimizer, t)) return *s;
  auto state = std::make_unique<State>();
  State& ref = *state;
  optimizer.state()[state_key(t)] = std::move(state);
  return ref;
}

// An Adam-family state tensor by name, made (zeros) when missing and `create`.
template <typename State>
at::Tensor adam_state(torch::optim::Optimizer& optimizer, const at::Tensor& t, const std::string& kind, bool create) {
  State* s = find_state<State>(optimizer, t);
  if (!s) {
    if (!create) return {};
    s = &get_or_create_state<State>(optimizer, t);
    s->exp_avg(torch::zeros_like(t));
    s->exp_avg_sq(torch::zeros_like(t));
  }
  if (kind == "exp_avg") return s->exp_avg();
  if (kind == "exp_avg_sq") return s->exp_avg_sq();
  if (kind == "max_exp_avg_sq") {
    if (!s->max_exp_avg_sq().defined() && create) s->max_exp_avg_sq(torch::zeros_like(t));
    return s->max_exp_avg_sq();
  }
  throw CheckpointError("optimizer state \"" + kind + "\" is not one of Adam's (exp_avg, exp_avg_sq, max_exp_avg_sq)");
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<OptimizerGroup>& groups,
                                                        const ShardLayout& layout, const HostStep& host) {
  const auto& p = config.params;
  if (host.enabled) {
    if (is_adam(config)) {
      if (p.amsgrad) throw ConfigError("offload_optimizer does not support amsgrad; set optimizer.params.amsgrad to false");
      if (config.decoupled_weight_decay()) {
        torch::optim::AdamWOptions o(p.lr);
        o.betas({p.betas[0], p.betas[1]}).eps(p.eps);
        return std::make_unique<CpuAdam>(param_groups(groups, o), true, host.elsewhere);
      }
      torch::optim::AdamOptions o(p.lr);
      o.betas({p.betas[0], p.betas[1]}).eps(p.eps);
      return std::make_unique<CpuAdam>(param_groups(groups, o), false, host.elsewhere);
    }
    if (config.type == "Adagrad") {
      torch::optim::AdagradOptions o(p.lr);
      o.lr_decay(p.lr_decay).eps(p.eps).initial_accumulator_value(p.initial_accumulator_value);
      return std::make_unique<CpuAdagrad>(param_groups(groups, o), host.elsewhere);
    }
    throw ConfigError("zero_optimization.offload_optimizer runs Adam, AdamW or Adagrad on the CPU; optimizer.type \"" +
                      config.type + "\" is not supported with it (use one of those, or set offload_optimizer.device to \"none\")");
  }
  if (is_adam(config)) {
    if (config.decoupled_weight_decay()) {
      torch::optim::AdamWOptions o(p.lr);
      o.betas({p.betas[0], p.betas[1]}).eps(p.eps).amsgrad(p.amsgrad);
      return std::make_unique<torch::optim::AdamW>(param_groups(groups, o), o);
    }
    torch::optim::AdamOptions o(p.lr);
    o.betas({p.betas[0], p.betas[1]}).eps(p.eps).amsgrad(p.amsgrad);
    return std::make_unique<torch::optim::Adam>(param_groups(groups, o), o);
  }
  if (config.type == "SGD") {
    torch::optim::SGDOptions o(p.lr);
    o.momentum(p.momentum).dampening(p.dampening).nesterov(p.nesterov);
    return std::make_unique<torch::optim::SGD>(param_groups(groups, o), o);
  }
  if (config.type == "Adagrad") {
    torch::optim::AdagradOptions o(p.lr);
    o.lr_decay(p.lr_decay).eps(p.eps).initial_accumulator_value(p.initial_accumulator_value);
    return std::make_unique<torch::optim::Adagrad>(param_groups(groups, o), o);
  }
  if (config.type == "Lamb") {
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
    return std::make_unique<Lamb>(std::move(lamb_groups), std::move(segments), layout.num_params,
                                  layout.all_reduce_sum, o);
  }
  if (config.type.empty()) {
    throw ConfigError("the config has no \"optimizer\" section; add e.g. {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}");
  }
  throw ConfigError("optimizer.type \"" + config.type + "\" is not supported by the engine yet; use Adam, AdamW, SGD, Adagrad or Lamb");
}

void set_hyperparameters(torch::optim::Optimizer& optimizer, double lr,
                         std::optional<double> momentum) {
  for (auto& group : optimizer.param_groups()) {
    group.options().set_lr(lr);
    if (!momentum) continue;
    if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&group.options())) {
      adamw->betas({*momentum, LrSchedule::kOneCycleBeta2});  // as DeepSpeed's OneCycle
    } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&group.options())) {
      adam->betas({*momentum, LrSchedule::kOneCycleBeta2});
    } else if (auto* lamb = dynamic_cast<LambParamOptions*>(&group.options())) {
      lamb->options.beta1 = *momentum;
      lamb->options.beta2 = LrSchedule::kOneCycleBeta2;
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&group.options())) {
      sgd->momentum(*momentum);
    }
  }
}

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer, const OptimizerConfig& config) {
  using namespace torch::optim;
  if (auto* lamb = dynamic_cast<Lamb*>(&optimizer)) return lamb->state_bytes();
  if (is_adam(config) && config.decoupled_weight_decay()) {
    return bytes_of<AdamWParamState>(optimizer, [](AdamWParamState& s) {
      return std::vector<at::Tensor>{s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()};
    });
  }
  if (is_adam(config)) {
    return bytes_of<AdamParamState>(optimizer, [](AdamParamState& s) {
      return std::vector<at::Tensor>{s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()};
    });
  }
  if (config.type == "SGD") {
    return bytes_of<SGDParamState>(optimizer, [](SGDParamState& s) { return std::vector<at::Tensor>{s.momentum_buffer()}; });
  }
  if (config.type == "Adagrad") {
    return bytes_of<AdagradParamState>(optimizer, [](AdagradParamState& s) { return std::vector<at::Tensor>{s.sum()}; });
  }
  return 0;
}

std::vector<std::string> state_kinds(const OptimizerConfig& config) {
  if (is_adam(config)) {
    if (config.params.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    return {"exp_avg", "exp_avg_sq"};
  }
  if (config.type == "Lamb") return {"exp_avg", "exp_avg_sq"};
  if (config.type == "Adagrad") return {"sum"};
  if (config.type == "SGD" && config.params.momentum != 0) return {"momentum_buffer"};
  return {};
}

at::Tensor state_tensor(torch::optim::Optimizer& optimizer, const OptimizerConfig& config, const at::Tensor& tensor,
                        const std::string& kind, bool create) {
  using namespace torch::optim;
  if (auto* lamb = dynamic_cast<Lamb*>(&optimizer)) {
    const int64_t t = lamb->slot_of(tensor);
    if (t < 0) throw EngineError("Lamb has no state for this tensor");
    return lamb->moment(static_cast<size_t>(t), kind == "exp_avg_sq", create);
  }
  if (is_adam(config) && config.decoupled_weight_decay()) return adam_state<AdamWParamState>(optimizer, tensor, kind, create);
  if (is_adam(config)) return adam_state<AdamParamState>(optimizer, tensor, kind, create);
  if (config.type == "Adagrad") {  // made at construction
    auto* s = find_state<AdagradParamState>(optimizer, tensor);
    return s ? s->sum() : at::Tensor();
  }
  if (config.type == "SGD") {
    auto* s = find_state<SGDParamState>(optimizer, tensor);
    if (!s && create) {
      s = &get_or_create_state<SGDParamState>(optimizer, tensor);
      s->momentum_buffer(torch::zeros_like(tensor));
    }
    return s ? s->momentum_buffer() : at::Tensor();
  }
  return {};
}

int64_t step_count(torch::optim::Optimizer& optimizer, const OptimizerConfig& config,
                   const std::vector<at::Tensor>& tensors) {
  using namespace torch::optim;
  if (auto* lamb = dynamic_cast<Lamb*>(&optimizer)) return lamb->step_count();
  for (const auto& t : tensors) {  // every tensor is updated together: the first one with state says
    if (is_adam(config) && config.decoupled_weight_decay()) {
      if (auto* s = find_state<AdamWParamState>(optimizer, t)) return s->step();
    } else if (is_adam(config)) {
      if (auto* s = find_state<AdamParamState>(optimizer, t)) return s->step();
    } else if (config.type == "Adagrad") {
      if (auto* s = find_state<AdagradParamState>(optimizer, t)) return s->step();
    }
  }
  return 0;
}

void set_step_count(torch::optim::Optimizer& optimizer, const OptimizerConfig& config,
                    const std::vector<at::Tensor>& tensors, int64_t step) {
  using namespace torch::optim;
  if (auto* lamb = dynamic_cast<Lamb*>(&optimizer)) {
    lamb->set_step_count(step);
    return;
  }
  for (const auto& t : tensors) {
    if (is_adam(config) && config.decoupled_weight_decay()) {
      if (auto* s = find_state<AdamWParamState>(optimizer, t)) s->step(step);
    } else if (is_adam(config)) {
      if (auto* s = find_state<AdamParamState>(optimizer, t)) s->step(step);
    } else if (config.type == "Adagrad") {
      if (auto* s = find_state<AdagradParamState>(optimizer, t)) s->step(step);
    }
  }
}

}  // namespace zero::engine
