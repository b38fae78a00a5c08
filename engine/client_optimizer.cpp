// A client optimizer and LR scheduler (Note [Client optimizer] in client_optimizer.h).
#include "engine/client_optimizer.h"

#include <string>
#include <vector>

#include "optim/client_optimizer.h"
#include "zero/error.h"

namespace zero::engine {
namespace {

// A load steps the scheduler this many times at most (about a second of
// LibTorch's scheduler steps); a count beyond it is not a run's.
constexpr int64_t kMostSchedulerSteps = 100'000'000;

void set_lrs(torch::optim::Optimizer& optimizer, const std::vector<double>& lrs) {
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(lrs[g]);
}

}  // namespace

std::unique_ptr<ClientOptimizer> ClientOptimizer::take(Config& config, InitOptions& options) {
  if (!options.optimizer) {
    if (options.lr_scheduler) {
      throw EngineError("zero::initialize: InitOptions::lr_scheduler is given without InitOptions::optimizer; a "
                        "torch::optim::LRScheduler sets the rates of the optimizer it was built on, which the engine "
                        "would not step: pass that optimizer as InitOptions::optimizer, or use the config's \"scheduler\"");
    }
    return nullptr;
  }
  if (!config.optimizer.type.empty()) {
    throw EngineError("zero::initialize: the config has an \"optimizer\" section (" + config.optimizer.type +
                      ") and InitOptions::optimizer is given; both say how to step: remove the section to step your "
                      "optimizer, or leave InitOptions::optimizer empty");
  }
  if (!options.param_groups.empty()) {
    throw EngineError("zero::initialize: InitOptions::param_groups and InitOptions::optimizer are both given; the "
                      "optimizer's own parameter groups are the engine's: leave param_groups empty");
  }
  if (options.lr_scheduler && !config.scheduler.type.empty()) {
    throw EngineError("zero::initialize: the config's \"scheduler\" (" + config.scheduler.type +
                      ") and InitOptions::lr_scheduler both set the rates; keep one");
  }
  if (config.zero_optimization.offload_optimizer.where() != OffloadDevice::none) {
    throw EngineError("zero::initialize: InitOptions::optimizer with offload_optimizer (device \"" +
                      config.zero_optimization.offload_optimizer.device +
                      "\"): the offloaded step runs offload's fused host kernels, configured from the config's "
                      "\"optimizer\" section (DeepSpeed refuses a client optimizer here too, zero_force_ds_cpu_optimizer); "
                      "give the optimizer there (type and params) instead of as an object");
  }
  config.optimizer = optim::client_optimizer_config(*options.optimizer);
  for (const auto& group : options.optimizer->param_groups()) {
    // The weight decay travels in the object's options; the groups carry the tensors.
    options.param_groups.push_back(ParamGroup{group.params(), std::nullopt});
  }
  auto client = std::unique_ptr<ClientOptimizer>(new ClientOptimizer);
  client->optimizer_ = options.optimizer;
  client->scheduler_ = options.lr_scheduler;
  client->initial_lrs_ = client->lrs();
  client->engine_schedules_ = !config.scheduler.type.empty();
  return client;
}

std::unique_ptr<optim::MasterOptimizer> ClientOptimizer::wrap(partition::ShardedParams& params,
                                                              const std::vector<size_t>& user_group, const Config& config) {
  const auto& by_group = params.masters().by_group();
  std::vector<std::vector<at::Tensor>> tensors(optimizer_->param_groups().size());
  for (size_t g = 0; g < by_group.size(); ++g) {
    auto& mine = tensors.at(user_group.at(g));
    mine.insert(mine.end(), by_group[g].begin(), by_group[g].end());
  }
  return optim::wrap_client_optimizer(optimizer_, config.optimizer, tensors);
}

double ClientOptimizer::lr() const { return optimizer_->param_groups()[0].options().get_lr(); }

std::vector<double> ClientOptimizer::lrs() const {
  std::vector<double> out;
  for (const auto& group : optimizer_->param_groups()) out.push_back(group.options().get_lr());
  return out;
}

void ClientOptimizer::stepped() {
  if (!scheduler_) return;
  scheduler_->step();
  ++scheduler_steps_;
}

void ClientOptimizer::check_loadable(int64_t scheduler_steps, const std::vector<double>& saved_lrs,
                                     const std::string& where) const {
  if (scheduler_ && scheduler_steps_ > 0) {
    throw CheckpointError("load_checkpoint(" + where + "): the client lr_scheduler has stepped " +
                          std::to_string(scheduler_steps_) +
                          " time(s) since initialize, and a torch::optim::LRScheduler cannot be set back (it has no "
                          "state_dict); load before the first step, or initialize again with a new optimizer and scheduler");
  }
  if (scheduler_ && scheduler_steps > kMostSchedulerSteps) {
    throw CheckpointError("load_checkpoint(" + where + "): its scheduler step count " + std::to_string(scheduler_steps) +
                          " is more than a load steps a client lr_scheduler through (" +
                          std::to_string(kMostSchedulerSteps) + "); use the config's \"scheduler\" for such a run");
  }
  const size_t groups = optimizer_->param_groups().size();
  if (!saved_lrs.empty() && saved_lrs.size() != groups) {
    throw CheckpointError("load_checkpoint(" + where + "): it saved the rates of " + std::to_string(saved_lrs.size()) +
                          " parameter group(s), and the client optimizer has " + std::to_string(groups) +
                          "; build it with the groups it was saved with");
  }
}

void ClientOptimizer::restore(int64_t scheduler_steps, const std::vector<double>& saved_lrs) {
  if (scheduler_) {
    set_lrs(*optimizer_, initial_lrs_);
    for (int64_t i = 0; i < scheduler_steps; ++i) scheduler_->step();
    scheduler_steps_ = scheduler_steps;
  }
  if (!saved_lrs.empty()) set_lrs(*optimizer_, saved_lrs);
}

}  // namespace zero::engine
