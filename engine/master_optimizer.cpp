// The optimizer over the partition's master weights (master_optimizer.h).
#include "engine/master_optimizer.h"

#include <algorithm>
#include <sstream>

#include "partition/master_store.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::engine {
namespace {
// Note [Fused step on CPU ranks] in master_optimizer.h.
bool fused_step_on_host(const Config& config, bool params_on_host) {
  const auto& o = config.optimizer;
  const auto kind = o.kind();
  return params_on_host && kind && is_adam(*kind) && !o.params.torch_adam && !o.params.amsgrad;
}

// Lamb's view of the partition: the pieces of whole parameters in each master tensor.
optim::ShardLayout shard_layout(const partition::ShardedParams& params, std::shared_ptr<comm::ProcessGroup> pg) {
  optim::ShardLayout layout;
  for (const auto& pieces : params.master_pieces()) {
    layout.pieces.emplace_back();
    for (const auto& piece : pieces) layout.pieces.back().push_back({piece.param, piece.start, piece.length});
  }
  layout.num_params = params.num_params();
  const bool shared = params.owners() > 1;
  layout.all_reduce_sum = [pg, shared](at::Tensor& t) {
    if (shared) pg->all_reduce(t, comm::ReduceOp::Sum);
  };
  return layout;
}

// The master tensors updated where they live (Note [Partial offload] in
// partition/master_store.h); the split falls at bucket boundaries, so the
// log says where.
std::vector<at::Tensor> kept_on_device(const partition::ShardedParams& params, double ratio) {
  std::vector<at::Tensor> elsewhere;
  int64_t offloaded = 0;
  for (size_t k = 0; k < params.num_buckets(); ++k) {
    if (params.masters().on_host(k)) {
      offloaded += params.layout().buckets()[k].shard_numel;
    } else {
      elsewhere.push_back(params.masters().tensors()[k]);
    }
  }
  if (ratio < 1.0) {
    std::ostringstream line;
    line.setf(std::ios::fixed);
    line.precision(1);
    line << "partial offload (ratio " << ratio << "): " << 100.0 * offloaded / std::max<int64_t>(params.partition_numel(), 1)
         << "% of this rank's partition is offloaded (" << offloaded << " of " << params.partition_numel()
         << " elements: whole buckets, and a smaller reduce_bucket_size splits finer, down to one parameter)";
    log::info("offload", line.str());
  }
  return elsewhere;
}

}  // namespace

std::unique_ptr<optim::MasterOptimizer> master_optimizer(const Config& config, partition::ShardedParams& params,
                                                  const std::vector<double>& weight_decays,
                                                  std::shared_ptr<comm::ProcessGroup> dp,
                                                  bool params_on_host) {
  // The optimizer's tensors are the master tensors group by group, which is
  // bucket order (Note [Flat layout]): tensor k is bucket k's.
  std::vector<optim::OptimizerGroup> groups;
  const auto& by_group = params.masters().by_group();
  for (size_t g = 0; g < by_group.size(); ++g) groups.push_back({by_group[g], weight_decays[g]});
  size_t k = 0;
  for (const auto& group : by_group) {
    for (const auto& t : group) {
      if (!t.is_same(params.masters().tensors()[k++])) throw EngineError("internal: master tensors out of bucket order");
    }
  }
  const bool offloaded = params.options().offload_optimizer;
  optim::HostStep host;
  host.enabled = offloaded || fused_step_on_host(config, params_on_host);
  // Without offload every master is already in host memory (Note [Fused step on CPU ranks]).
  if (offloaded) host.elsewhere = kept_on_device(params, params.options().offload_ratio);
  // offload_optimizer "nvme": the master weights went to files as they were made; their states join them.
  if (params.masters().nvme_store()) host.nvme_masters = &params.masters();
  return optim::make_optimizer(config.optimizer, groups, shard_layout(params, dp), std::move(host));
}

}  // namespace zero::engine
