#include "engine/optimizer.h"

#include "engine/lamb.h"
#include "engine/lr_schedule.h"
#include "zero/error.h"

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

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& config,
                                                        const std::vector<OptimizerGroup>& groups,
                                                        const ShardLayout& layout) {
  const auto& p = config.params;
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

}  // namespace zero::engine
