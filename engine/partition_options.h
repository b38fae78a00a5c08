#pragma once
// The partition's options from the config (partition_options.cpp): the
// stage's buckets and thresholds, offload and its NVMe files, and ZeRO++'s
// per-node parts.
#include <torch/torch.h>

#include <memory>

#include "partition/partition.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/mesh.h"

namespace zero::engine {

// ZeRO++'s parts that work per node: hpZ's secondary group and qgZ's
// two-level reduce-scatter, from the mesh's node groups (Note [Node groups]
// in parallel/mesh.cpp), with the config's sizes checked against them.
void set_node_groups(const Config& config, const Mesh& mesh, partition::Options& options);

// The partition's options; `world`: the norm group, and its rank names
// offload_param's NVMe files.
partition::Options partition_options(const Config& config, at::ScalarType dtype,
                                     std::shared_ptr<comm::ProcessGroup> world);

}  // namespace zero::engine
