#pragma once
// From a config and a model to the engine's parts (engine_setup.cpp): which
// parameters train, in which groups and stage-3 units; the partition's
// options; the optimizer over the partition. The Engine only puts them
// together.
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "engine/optimizer.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/mesh.h"
#include "partition/construction.h"
#include "partition/partition.h"
#include "zero/tensor_parallel.h"
#include "zero/unit.h"

namespace zero::engine {

struct ModelParams {
  std::vector<partition::ShardedParams::Group> groups;  // the trainable parameters, by group
  std::vector<double> weight_decays;                    // per group
  std::vector<UnitBase*> units;                         // stage 3: the model's zero::Units
  int64_t frozen_bytes = 0;                             // parameters that do not train, in the training dtype
};
// The ranks joined from the launch environment, with the config's comm
// timeout and CUDA backend unless the environment sets them; while a group
// joined here is alive, that group (its timeout and backend) again.
std::shared_ptr<comm::ProcessGroup> join(const Config& config);

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

// What every rank must share (comm::disagreement): the resolved config key
// by key; and every rank of a pipeline stage, every parameter's and
// buffer's shape, dtype and trainability, and each trainable parameter's group.
comm::Facts config_facts(const Config& config);
comm::Facts model_facts(torch::nn::Module& module, const ModelParams& params);

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

// The partition's options; `world`: the norm group, and its rank names
// offload_param's NVMe files.
// ZeRO++'s parts that work per node: hpZ's secondary group and qgZ's
// two-level reduce-scatter, from the mesh's node groups (Note [Node groups]
// in parallel/mesh.cpp), with the config's sizes checked against them.
void set_node_groups(const Config& config, const Mesh& mesh, partition::Options& options);

partition::Options partition_options(const Config& config, at::ScalarType dtype,
                                     std::shared_ptr<comm::ProcessGroup> world);

// The optimizer of `params`' master partition, on the host with offload
// (its states joining the master weights' NVMe store with ZeRO-Infinity)
// or on CPU ranks (Note [Fused step on CPU ranks]). `dp`: the group params
// is sharded over; `params_on_host`: every trainable parameter is in host memory.
std::unique_ptr<MasterOptimizer> master_optimizer(const Config& config, partition::ShardedParams& params,
                                                  const std::vector<double>& weight_decays,
                                                  std::shared_ptr<comm::ProcessGroup> dp, bool params_on_host);

}  // namespace zero::engine
