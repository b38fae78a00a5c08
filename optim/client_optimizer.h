#pragma once
// DeepSpeed's client optimizer: a torch::optim object the user built, read
// as a ds_config "optimizer" section would say it (client_optimizer.cpp).
// The engine steps the object itself over the master partition
// (wrap_client_optimizer in optim/optimizer.h; Note [Client optimizer] in
// engine/client_optimizer.h).
#include <torch/torch.h>

#include "zero/config.h"

namespace zero::optim {

// The "optimizer" section that says what `client` does: its type (Adam,
// AdamW, SGD or Adagrad) and its first group's options, for what reads the
// config (the checkpoint's manifest, the schedule's base rate, the memory
// estimate). An EngineError names what the engine cannot honour and why:
// another type (its states have no names a checkpoint could keep), an
// optimizer that has stepped (its states are for whole parameters), no
// groups, or groups that disagree on which states exist (Adam's amsgrad,
// SGD's momentum 0 or not).
OptimizerConfig client_optimizer_config(const torch::optim::Optimizer& client);

}  // namespace zero::optim
