#pragma once
// zero::Init: partitioned construction, as DeepSpeed's zero.Init. While one
// lives, each zero::Unit built on this thread keeps only this rank's part
// of its trainable parameters as soon as its constructor returns, in host
// memory or on NVMe, so no rank ever holds more than one unit whole beyond
// its parts:
//
//   auto config = zero::Config::from_file("configs/zero3.json");
//   GPT model{nullptr};
//   {
//     zero::Init init(config);           // joins the ranks, as initialize would
//     model = GPT(options);              // each block: built, then partitioned
//   }
//   auto engine = zero::initialize(config, model);   // lays the parts out
//
// With the same seed, the weights initialize ends with are bitwise those of
// the model built whole, and the random number generator has moved as far
// (Note [Partitioned construction] in partition/construction.h). The rules:
//  - A unit sets its weights in its constructor. A parameter of a unit
//    written after the unit was built (an init function run over the whole
//    model later) makes initialize fail naming it.
//  - Parameters outside every unit, frozen parameters and buffers are built
//    whole; initialize partitions them as without zero::Init. Wrap large
//    ones (an embedding) in a zero::Unit to partition them as built.
//  - A parameter shared by units is taken with the first unit built.
//  - Once one unit of a model is built under zero::Init, all must be:
//    initialize names a unit built outside it.
//  - Between construction and initialize, a partitioned unit's parameters
//    have their shapes but no values: do not run the model.
//  - Data parallelism only (tensor_parallel and pipeline sizes 1). It saves
//    memory at stage 3; at stages 0-2 initialize gathers every parameter.
#include <cstdint>
#include <memory>
#include <string>

#include "zero/comm.h"
#include "zero/config.h"

namespace zero {

namespace partition {
class ConstructionParts;
}

struct PartitionedInitOptions {
  // Where the parts wait for initialize: "cpu" (host memory) or "nvme"
  // (files under zero_optimization.offload_param.nvme_path). Empty: the
  // config's offload_param.device, "none" meaning "cpu".
  std::string remote_device;
  // Empty: the ranks joined from the launch environment, as initialize
  // does; initialize then uses the same group.
  std::shared_ptr<comm::ProcessGroup> group;
};

class Init {
 public:
  explicit Init(const Config& config, PartitionedInitOptions options = {});
  ~Init();  // units built after it are whole again; the parts wait for initialize
  Init(const Init&) = delete;
  Init& operator=(const Init&) = delete;

  const std::shared_ptr<comm::ProcessGroup>& group() const;
  // Bytes of parts this rank keeps now (in host memory or on NVMe).
  int64_t part_bytes() const;
  // Parameters partitioned so far, and not yet taken by initialize.
  int64_t partitioned_params() const;

 private:
  std::shared_ptr<partition::ConstructionParts> parts_;
  partition::ConstructionParts* previous_ = nullptr;
};

}  // namespace zero
