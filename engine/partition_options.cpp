// The partition's options from the config (partition_options.h).
#include "engine/partition_options.h"

#include <algorithm>
#include <string>

#include "core/env.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::engine {
namespace {
// NVMe offload's files under `nvme_path` with `buffer_count` bounce
// buffers (offload_optimizer's or offload_param's), as the aio section says.
offload::SwapOptions nvme_swap(const Config& config, const std::string& nvme_path, int64_t buffer_count, int rank) {
  offload::SwapOptions swap;
  swap.nvme_path = nvme_path;
  swap.rank = rank;
  swap.block_size = config.aio.block_size;
  swap.queue_depth = config.aio.queue_depth;
  swap.buffer_count = buffer_count;
  return swap;
}
}  // namespace

void set_node_groups(const Config& config, const Mesh& mesh, partition::Options& options) {
  const auto& z = config.zero_optimization;
  const auto& dp = mesh.zero_group();
  const auto& node = mesh.dp_intra_node_group();
  const auto& across = mesh.dp_inter_node_group();
  if (z.zero_hpz_partition_size > 1) {
    // Config::resolve refused a size that does not divide the data-parallel one.
    const int64_t hpz = z.zero_hpz_partition_size;
    if (!node || node->size() != hpz) {
      throw ConfigError("zero_optimization.zero_hpz_partition_size is " + std::to_string(hpz) + " but " +
                        (node ? std::to_string(node->size()) + " data-parallel ranks share this rank's node"
                              : std::string("the nodes hold different numbers of data-parallel ranks")) +
                        "; set it to the ranks per node (DeepSpeed's hpZ keeps the secondary partition within a node)");
    }
    options.secondary_group = node;
  }
  if (!z.zero_quantized_gradients) return;
  if (!across) {
    log::warn_once("qgZ one node", "engine",
                   "zero_optimization.zero_quantized_gradients: the data-parallel ranks " +
                       std::string(node ? "are all on one node, so no gradient crosses a node link and nothing is quantized"
                                        : "are spread unevenly over the nodes, so gradients are reduced exactly"));
    return;
  }
  // Note [Quantized gradients] numbers the ranks node by node, as launchers do.
  std::string error;
  if (dp->rank() != across->rank() * node->size() + node->rank()) {
    error = "zero_optimization.zero_quantized_gradients needs the data-parallel ranks numbered node by node; rank " +
            std::to_string(dp->rank()) + " is rank " + std::to_string(node->rank()) + " of node " +
            std::to_string(across->rank()) + " (launch the ranks of each node consecutively, as zero-run and torchrun do)";
  }
  error = comm::agreed_error(*dp, error, "zero::initialize");
  if (!error.empty()) throw ConfigError(error);
  options.quantized_gradients =
      std::make_shared<partition::QuantizedReduceScatter>(node, across, z.zero_quantization_block_size);
}

partition::Options partition_options(const Config& config, at::ScalarType dtype, std::shared_ptr<comm::ProcessGroup> world) {
  const auto& z = config.zero_optimization;
  partition::Options o;
  o.stage = z.stage;
  o.bucket_numel = z.reduce_bucket_size;
  o.dtype = dtype;
  o.overlap_comm = z.overlap_comm;
  o.persistence_threshold = z.stage3_param_persistence_threshold;
  o.prefetch_numel = z.stage3_prefetch_bucket_size;
  o.max_live_numel = z.stage3_max_live_parameters;
  o.max_reuse_numel = z.stage3_max_reuse_distance;
  o.quantized_weights_block = z.zero_quantized_weights ? z.zero_quantization_block_size : 0;
  const auto& offload = z.offload_optimizer;
  o.norm_group = world;
  const OffloadDevice optimizer_device = offload.where(), param_device = z.offload_param.where();
  o.offload_optimizer = optimizer_device != OffloadDevice::none;
  o.offload_ratio = offload.ratio;
  const env::Flag copies = env::offload_host_grad_copies();  // for tests (Note [Offload copies])
  if (!copies.error.empty()) throw EngineError(copies.error);
  o.host_grad_copies = copies.value;
  o.pin_memory = offload.pin_memory || z.offload_param.pin_memory;
  if (optimizer_device == OffloadDevice::nvme) {
    o.master_swap = nvme_swap(config, offload.nvme_path, offload.buffer_count, world->rank());
    o.sub_group_numel = std::max<int64_t>(z.sub_group_size, 1);
    o.grads_on_nvme = offload.nvme_gradients;
  }
  o.offload_param = param_device;
  if (param_device == OffloadDevice::nvme) {
    o.param_swap = nvme_swap(config, z.offload_param.nvme_path, z.offload_param.buffer_count, world->rank());
  }
  return o;
}

}  // namespace zero::engine
