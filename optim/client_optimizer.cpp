// A client optimizer read as a config section (client_optimizer.h).
#include "optim/client_optimizer.h"

#include <c10/util/Type.h>

#include <string>
#include <tuple>
#include <typeinfo>

#include "zero/error.h"

namespace zero::optim {
namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw EngineError("zero::initialize: InitOptions::optimizer " + why);
}

// Options that decide which states exist must be the same in every group:
// a checkpoint names one set of states for the whole partition.
template <typename Options, typename Get>
void same_in_every_group(const torch::optim::Optimizer& client, const char* option, Get get) {
  const auto& groups = client.param_groups();
  const auto first = get(static_cast<const Options&>(groups[0].options()));
  for (size_t g = 1; g < groups.size(); ++g) {
    if (get(static_cast<const Options&>(groups[g].options())) != first) {
      refuse("has groups that differ in " + std::string(option) + " (group 0 and group " + std::to_string(g) +
             "), which decides the states it keeps; zero saves one set of states for the partition: make " + option +
             " the same in every group");
    }
  }
}

template <typename Options>
void adam_params(const torch::optim::Optimizer& client, OptimizerParams& p) {
  const auto& o = static_cast<const Options&>(client.param_groups()[0].options());
  p.lr = o.lr();
  p.betas = {std::get<0>(o.betas()), std::get<1>(o.betas())};
  p.eps = o.eps();
  p.weight_decay = o.weight_decay();
  p.amsgrad = o.amsgrad();
  p.torch_adam = true;  // torch::optim's own arithmetic steps it
  same_in_every_group<Options>(client, "amsgrad", [](const Options& g) { return g.amsgrad(); });
}

// Adam, AdamW and SGD make their states at the first step; Adagrad makes
// its sums as it is built, and counts steps in them.
bool has_stepped(const torch::optim::Optimizer& client) {
  if (!dynamic_cast<const torch::optim::Adagrad*>(&client)) return !client.state().empty();
  for (const auto& entry : client.state()) {
    if (static_cast<const torch::optim::AdagradParamState&>(*entry.second).step() > 0) return true;
  }
  return false;
}

}  // namespace

OptimizerConfig client_optimizer_config(const torch::optim::Optimizer& client) {
  using namespace torch::optim;
  const std::string type = c10::demangle(typeid(client).name());
  if (dynamic_cast<const LBFGS*>(&client)) {
    refuse("is an LBFGS, which steps through a closure that re-evaluates the loss over the whole model; "
           "a rank holds only its partition of it: use Adam, AdamW, SGD or Adagrad");
  }
  const bool known = dynamic_cast<const AdamW*>(&client) || dynamic_cast<const Adam*>(&client) ||
                     dynamic_cast<const SGD*>(&client) || dynamic_cast<const Adagrad*>(&client);
  if (!known) {
    refuse("is a " + type + "; zero steps a client torch::optim::Adam, AdamW, SGD or Adagrad, whose states its "
           "checkpoints know by name; for Lamb, or another of those, give the config an \"optimizer\" section instead");
  }
  if (client.param_groups().empty()) refuse("has no parameter groups; build it over the model's parameters");
  if (has_stepped(client)) {
    refuse("has stepped already: its states are for whole parameters, and zero makes them for this rank's partition; "
           "pass an optimizer that has not stepped (to resume, load a checkpoint into the engine)");
  }
  OptimizerConfig c;
  OptimizerParams& p = c.params;
  if (dynamic_cast<const AdamW*>(&client)) {
    c.type = "AdamW";
    adam_params<AdamWOptions>(client, p);
  } else if (dynamic_cast<const Adam*>(&client)) {
    c.type = "Adam";
    p.adam_w_mode = false;  // torch's Adam adds weight decay to the gradient
    adam_params<AdamOptions>(client, p);
  } else if (dynamic_cast<const SGD*>(&client)) {
    c.type = "SGD";
    const auto& o = static_cast<const SGDOptions&>(client.param_groups()[0].options());
    p.lr = o.lr(), p.momentum = o.momentum(), p.dampening = o.dampening(), p.nesterov = o.nesterov();
    p.weight_decay = o.weight_decay();
    same_in_every_group<SGDOptions>(client, "momentum (0 or not)", [](const SGDOptions& g) { return g.momentum() != 0; });
  } else {
    c.type = "Adagrad";
    const auto& o = static_cast<const AdagradOptions&>(client.param_groups()[0].options());
    p.lr = o.lr(), p.lr_decay = o.lr_decay(), p.eps = o.eps(), p.weight_decay = o.weight_decay();
    p.initial_accumulator_value = static_cast<const AdagradOptions&>(client.defaults()).initial_accumulator_value();
  }
  return c;
}

}  // namespace zero::optim
