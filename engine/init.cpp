// zero::Init (include/zero/init.h): partitioned construction from a
// config, over the parts of partition/construction.h.
#include "zero/init.h"

#include <optional>

#include "engine/rank_agreement.h"
#include "offload/swapper.h"
#include "partition/construction.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero {

using partition::ConstructionParts;

Init::Init(const Config& config, PartitionedInitOptions options) {
  const int64_t tp = config.parallelism.tensor_parallel(), pp = config.parallelism.pipeline_parallel();
  if (tp > 1 || pp > 1) {
    throw ConfigError("zero::Init: partitioned construction works with data parallelism alone, but the config asks "
                      "for tensor parallel " + std::to_string(tp) + " and pipeline " + std::to_string(pp) +
                      "; build the model without zero::Init");
  }
  const auto& offload_param = config.zero_optimization.offload_param;
  const std::string& named = options.remote_device.empty() ? offload_param.device : options.remote_device;
  std::optional<OffloadDevice> device = offload_device_named(named);
  if (device == OffloadDevice::none) device = OffloadDevice::cpu;
  if (!device) throw ConfigError("zero::Init: remote_device \"" + named + "\" is not one of \"cpu\", \"nvme\"");
  std::shared_ptr<comm::ProcessGroup> group = options.group;
  for (const auto& live : ConstructionParts::live()) {  // an earlier zero::Init's parts still wait: its group
    if (!group) group = live->group();
  }
  if (!group) group = engine::join(config);
  std::optional<offload::SwapOptions> nvme;
  if (device == OffloadDevice::nvme) {
    if (offload_param.nvme_path.empty()) {
      throw ConfigError("zero::Init: remote_device \"nvme\" keeps the parts under "
                        "zero_optimization.offload_param.nvme_path, which is not set");
    }
    offload::SwapOptions swap;
    swap.nvme_path = offload_param.nvme_path;
    swap.rank = group->rank();
    swap.block_size = config.aio.block_size;
    swap.queue_depth = config.aio.queue_depth;
    swap.buffer_count = offload_param.buffer_count;
    nvme = swap;
  }
  if (config.zero_optimization.stage != 3) {
    log::warn_once("init:stage", "init",
                   "zero::Init partitions units as they are built, but at ZeRO stage " +
                       std::to_string(config.zero_optimization.stage) +
                       " initialize gathers every parameter whole again; it saves memory at stage 3");
  }
  parts_ = std::make_shared<ConstructionParts>(std::move(group), nvme);
  ConstructionParts::keep(parts_);
  previous_ = ConstructionParts::current();
  ConstructionParts::set_current(parts_.get());
}

Init::~Init() { ConstructionParts::set_current(previous_); }

const std::shared_ptr<comm::ProcessGroup>& Init::group() const { return parts_->group(); }
int64_t Init::part_bytes() const { return parts_->bytes(); }
int64_t Init::partitioned_params() const { return parts_->held(); }

}  // namespace zero
