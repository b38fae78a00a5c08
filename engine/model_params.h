#pragma once
// The model's parameters as the engine trains them (model_params.cpp):
// which train, in which groups and stage-3 units, which are replicas
// across tensor and pipeline parallelism, and the checks on a model
// partitioned as it was built (zero::Init).
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "partition/construction.h"
#include "partition/partition.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/mesh_shape.h"
#include "zero/tensor_parallel.h"
#include "zero/unit.h"

namespace zero::engine {

struct ModelParams {
  std::vector<partition::ShardedParams::Group> groups;  // the trainable parameters, by group
  std::vector<double> weight_decays;                    // per group
  std::vector<size_t> user_group;                       // per group: the InitOptions (or client optimizer) group it came from
  std::vector<UnitBase*> units;                         // stage 3: the model's zero::Units
  int64_t frozen_bytes = 0;                             // parameters that do not train, in the training dtype
};
// Partitioned construction (zero::Init, Note [Partitioned construction]):
// the parts holding the model's parameters, or none. Throws when they come
// from two zero::Init.
std::shared_ptr<partition::ConstructionParts> construction_parts_of(torch::nn::Module& module);
// Checks a model partitioned as built before initialize lays it out: every
// unit built under zero::Init, data parallelism alone, the group it was
// built over.
void check_partitioned(torch::nn::Module& module, const partition::ConstructionParts& parts, const MeshShape& mesh,
                       const comm::ProcessGroup& pg);

// The model's zero::Units, in module order (outer before inner).
std::vector<UnitBase*> units_of(torch::nn::Module& module);

// The model's parameters in the user's groups (empty: one group of every
// trainable parameter); checks that each trainable one is in exactly one.
ModelParams model_params(torch::nn::Module& module, std::vector<ParamGroup> param_groups, const Config& config,
                         at::ScalarType dtype);

// Note [Gradient norm] with tensor or pipeline parallelism: each trainable
// parameter's replicas outside the data-parallel group (Group::replicas:
// tp for a parameter every rank of a tp group holds whole, 1 for a split
// one), from which the partition weighs its squares. `splits`:
// tp::tensor_parallel_splits of the model. Checks that split layers are
// split over the mesh's tp group. A no-op on a mesh of data parallelism
// alone. `copies`: a pipeline's tied parameters, by name, with the number
// of stages holding each (their gradients are summed over those stages, so
// each stage's copy is a replica too).
void set_replicas(ModelParams& params, torch::nn::Module& module, const std::map<std::string, tp::Split>& splits,
                  const MeshShape& mesh, const std::map<std::string, int>& copies = {});
// Moves the parameters named in `names` each into a group of its own (with
// its group's weight decay), so each gets a gradient bucket of its own.
void isolate_params(ModelParams& params, const std::map<std::string, int>& names);

}  // namespace zero::engine
