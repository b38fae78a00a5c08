#pragma once
// The optimizer over the partition's master weights (master_optimizer.cpp):
// which of optim/'s optimizers steps them, and where.
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "optim/optimizer.h"
#include "partition/partition.h"
#include "zero/comm.h"
#include "zero/config.h"

namespace zero::engine {

// Note [Fused step on CPU ranks]: when the trainable parameters are in host
// memory, Adam and AdamW (DeepSpeed's FusedAdam, unless optimizer.params.
// torch_adam is true, or amsgrad) run on the fused host kernels of
// offload_optimizer without offloading anything: they step the master
// weights in place, read the reduced gradients in the training dtype and
// write the 16-bit parameters in the same pass, on the rank's intra-op
// threads. torch::optim's AdamW makes a dozen passes over the partition;
// the kernel makes one (bench/README.md, cpu_adam and step_time). Results
// agree with torch::optim to about 1e-6 relative per step, not bitwise.
// master_optimizer chooses it.

// The optimizer of `params`' master partition, on the host with offload
// (its states joining the master weights' NVMe store with ZeRO-Infinity)
// or on CPU ranks (Note [Fused step on CPU ranks]). `dp`: the group params
// is sharded over; `params_on_host`: every trainable parameter is in host memory.
std::unique_ptr<optim::MasterOptimizer> master_optimizer(const Config& config, partition::ShardedParams& params,
                                                  const std::vector<double>& weight_decays,
                                                  std::shared_ptr<comm::ProcessGroup> dp, bool params_on_host);

}  // namespace zero::engine
