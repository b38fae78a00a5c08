#pragma once
// The ranks joined, and what every rank must share before training
// starts (rank_agreement.cpp): the resolved config, and the model's
// parameters and groups, compared through comm::disagreement.
#include <torch/torch.h>

#include <memory>

#include "engine/model_params.h"
#include "zero/comm.h"
#include "zero/config.h"

namespace zero::engine {

// The ranks joined from the launch environment, with the config's comm
// timeout and CUDA backend unless the environment sets them; while a group
// joined here is alive, that group (its timeout and backend) again.
std::shared_ptr<comm::ProcessGroup> join(const Config& config);

// What every rank must share (comm::disagreement): the resolved config key
// by key; and every rank of a pipeline stage, every parameter's and
// buffer's shape, dtype and trainability, and each trainable parameter's group.
comm::Facts config_facts(const Config& config);
comm::Facts model_facts(torch::nn::Module& module, const ModelParams& params);

}  // namespace zero::engine
