#pragma once
// A client optimizer and LR scheduler given to initialize
// (InitOptions::optimizer, lr_scheduler): checked, taken into the config
// and the parameter groups, stepped over the partition (client_optimizer.cpp).
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "partition/partition.h"
#include "zero/config.h"
#include "zero/engine.h"

namespace zero::engine {

// Note [Client optimizer]: DeepSpeed takes the user's own torch.optim
// object and steps it over its flat fp32 partition. zero does the same
// with a torch::optim Adam, AdamW, SGD or Adagrad: its parameter groups
// become the engine's groups (one bucket layout, weight decay per group),
// their params are rewritten to this rank's fp32 master partition of each,
// and the engine calls the object's step() after it has reduced, unscaled
// and clipped the gradients. Each group's options (lr, betas, weight
// decay...) stay the object's and stay live: what the user or a scheduler
// writes into them applies at the next step. The config's "optimizer" is
// filled from the object (its type and first group), for the checkpoint's
// manifest, so that a checkpoint resumes either way. Refused, with the
// reason: another type, an object that has stepped, the config's
// "optimizer" section too (two answers to one question), param_groups too, and
// offload_optimizer (whose fused host kernels step from the config, as
// DeepSpeed's zero_force_ds_cpu_optimizer refuses a client optimizer).
// The rates: with the config's "scheduler" it sets every group's, as
// DeepSpeed's schedulers do; otherwise the object's stand, and a client
// lr_scheduler steps after each applied step. A checkpoint keeps each
// group's rate; LibTorch's schedulers have no state_dict, so a load steps
// a scheduler that has not stepped up to the saved count from the rates
// it started with, then puts the saved rates back. One that has stepped
// cannot be rewound: that load is refused before anything is read.
class ClientOptimizer {
 public:
  // Takes options.optimizer and options.lr_scheduler (null when neither is
  // given): fills config.optimizer and options.param_groups from the
  // optimizer, or refuses what cannot be honoured. Before config.resolve().
  static std::unique_ptr<ClientOptimizer> take(Config& config, InitOptions& options);

  // The object over the master partition: its group u gets the masters of
  // the engine's groups that came from it (user_group[g] == u).
  // `config`: the config take() filled.
  std::unique_ptr<optim::MasterOptimizer> wrap(partition::ShardedParams& params, const std::vector<size_t>& user_group,
                                               const Config& config);

  // False: the object's own rates stand (the config has no "scheduler").
  bool engine_schedules() const { return engine_schedules_; }
  double lr() const;                // its first group's, now
  std::vector<double> lrs() const;  // every group's, now
  // After an applied optimizer step (not a skipped fp16 one).
  void stepped();

  // Before a load reads anything: refuses when the scheduler has stepped
  // or `scheduler_steps` is beyond a run's, or when the checkpoint saved
  // the rates of another number of groups.
  void check_loadable(int64_t scheduler_steps, const std::vector<double>& saved_lrs, const std::string& where) const;
  // After a load that check_loadable passed: the scheduler at
  // `scheduler_steps`, then the saved rates (none saved: the rates the scheduler leaves).
  void restore(int64_t scheduler_steps, const std::vector<double>& saved_lrs);

 private:
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::shared_ptr<torch::optim::LRScheduler> scheduler_;
  std::vector<double> initial_lrs_;
  int64_t scheduler_steps_ = 0;  // the scheduler's steps since initialize
  bool engine_schedules_ = false;
};

}  // namespace zero::engine
