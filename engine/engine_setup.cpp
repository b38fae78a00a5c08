#include "engine/engine_setup.h"

#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "zero/error.h"
#include "zero/log.h"
#include "zero/tensor_parallel.h"

namespace zero::engine {
namespace {

using TensorKey = const void*;
TensorKey key_of(const at::Tensor& t) { return t.unsafeGetTensorImpl(); }

// Stage 3 units (zero::Unit): each parameter belongs to the innermost unit
// that holds it; one shared by units that do not nest (a tied weight)
// belongs to none and stays gathered, as do parameters outside every unit.
std::unordered_map<TensorKey, int> assign_units(torch::nn::Module& module, std::vector<UnitBase*>& units) {
  // Registrations per tensor, in the whole model and in each unit: a
  // tensor also registered outside its unit is used there too.
  std::unordered_map<TensorKey, int> registrations;
  for (const auto& p : module.named_parameters()) ++registrations[key_of(p.value())];
  units = units_of(module);
  std::vector<std::unordered_map<TensorKey, int>> held;
  for (auto* unit : units) {
    held.emplace_back();
    for (const auto& p : unit->named_parameters()) ++held.back()[key_of(p.value())];
  }
  auto nests = [&](int a, int b) {  // unit b inside unit a
    for (const auto& p : held[b]) {
      if (!held[a].count(p.first)) return false;
    }
    return true;
  };
  std::unordered_map<TensorKey, int> unit_of;
  for (const auto& [tensor, count] : registrations) {
    int best = -1;
    bool shared = false;
    for (int u = 0; u < static_cast<int>(units.size()); ++u) {
      if (!held[u].count(tensor)) continue;
      if (best < 0 || nests(best, u)) {
        best = u;
      } else if (!nests(u, best)) {
        shared = true;
      }
    }
    if (best >= 0 && !shared && held[best][tensor] == count) unit_of[tensor] = best;
  }
  if (units.empty()) {
    log::warn("stage3", "the model has no zero::Unit: its parameters stay gathered, so stage 3 saves no "
                        "parameter memory; wrap its blocks in zero::Unit (see include/zero/unit.h)");
  }
  return unit_of;
}

// The user's groups as the partition takes them: names, tensors and units.
void group_params(ModelParams& out, const std::vector<ParamGroup>& param_groups,
                  const std::unordered_map<TensorKey, std::string>& names,
                  const std::unordered_map<TensorKey, int>& unit_of, double default_decay) {
  std::set<TensorKey> grouped;
  for (size_t g = 0; g < param_groups.size(); ++g) {
    partition::ShardedParams::Group group;
    for (const auto& p : param_groups[g].params) {
      auto it = names.find(key_of(p));
      if (it == names.end()) throw EngineError("parameter group " + std::to_string(g) + " holds a tensor that is not a parameter of the model");
      if (!p.requires_grad()) continue;  // frozen: left alone
      if (!grouped.insert(key_of(p)).second) {
        throw EngineError("parameter " + it->second + " appears in more than one parameter group");
      }
      group.names.push_back(it->second);
      group.params.push_back(p);
      auto unit = unit_of.find(key_of(p));
      group.units.push_back(unit == unit_of.end() ? -1 : unit->second);
    }
    out.groups.push_back(std::move(group));
    out.weight_decays.push_back(param_groups[g].weight_decay.value_or(default_decay));
  }
}

}  // namespace

std::shared_ptr<comm::ProcessGroup> join(const Config& config) {
  // One rendezvous while the ranks are joined: a zero::Init and the
  // initialize after it, or an engine and a zero::Init beside it, share the
  // group joined first for as long as anything holds it.
  static std::mutex mutex;
  static std::weak_ptr<comm::ProcessGroup> joined;
  std::lock_guard<std::mutex> lock(mutex);
  if (std::shared_ptr<comm::ProcessGroup> world = joined.lock()) return world;
  comm::GroupOptions options;
  if (!env::is_set("ZERO_COMM_TIMEOUT")) options.timeout = std::chrono::seconds(config.zero.comm_timeout_s);
  if (!env::is_set("ZERO_CUDA_BACKEND")) options.cuda_backend = config.zero.cuda_comm_backend;
  std::shared_ptr<comm::ProcessGroup> world = comm::init_process_group(options);
  joined = world;
  return world;
}

std::shared_ptr<partition::ConstructionParts> construction_parts_of(torch::nn::Module& module) {
  const auto live = partition::ConstructionParts::live();
  if (live.empty()) return nullptr;
  std::shared_ptr<partition::ConstructionParts> found;
  for (const auto& p : module.parameters()) {
    for (const auto& parts : live) {
      if (!parts->holds(p)) continue;
      if (found && found != parts) {
        throw EngineError("zero::initialize: the model's units were built under two zero::Init; build them under one");
      }
      found = parts;
    }
  }
  return found;
}

void check_partitioned(torch::nn::Module& module, const partition::ConstructionParts& parts, const MeshShape& mesh,
                       const comm::ProcessGroup& pg) {
  if (mesh.tp > 1 || mesh.pp > 1) {
    throw ConfigError("zero::initialize: the model was partitioned as it was built (zero::Init), which works with "
                      "data parallelism alone, but the config asks for tensor parallel " + std::to_string(mesh.tp) +
                      " and pipeline " + std::to_string(mesh.pp) + "; build the model without zero::Init");
  }
  if (parts.group().get() != &pg) {
    throw EngineError("zero::initialize: the model was partitioned over the group of its zero::Init, not the one "
                      "given; pass InitOptions::group = init.group(), or none");
  }
  for (const auto& named : module.named_modules("", /*include_self=*/false)) {
    auto* unit = dynamic_cast<UnitBase*>(named.value().get());
    if (!unit) continue;
    bool trains = false, held = false;
    for (const auto& p : unit->parameters()) {
      if (!p.requires_grad() || p.numel() == 0) continue;
      trains = true;
      held = held || parts.holds(p);
    }
    if (trains && !held) {
      throw EngineError("zero::initialize: unit " + named.key() +
                        " was built outside zero::Init, but other units of the model were partitioned as they were "
                        "built; build every unit under one zero::Init (or none)");
    }
  }
}

std::vector<UnitBase*> units_of(torch::nn::Module& module) {
  std::vector<UnitBase*> units;
  for (const auto& m : module.modules(/*include_self=*/true)) {
    if (auto* unit = dynamic_cast<UnitBase*>(m.get())) units.push_back(unit);
  }
  return units;
}

ModelParams model_params(torch::nn::Module& module, std::vector<ParamGroup> param_groups, const Config& config,
                         at::ScalarType dtype) {
  ModelParams out;
  // Every parameter once (a tied weight is registered under several names).
  std::unordered_map<TensorKey, std::string> names;
  std::vector<at::Tensor> trainable;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!names.emplace(key_of(p), item.key()).second) continue;
    if (p.requires_grad()) {
      trainable.push_back(p);
    } else {  // frozen floating weights follow the training dtype
      const auto kept = at::isFloatingType(p.scalar_type()) ? dtype : p.scalar_type();
      out.frozen_bytes += p.numel() * static_cast<int64_t>(c10::elementSize(kept));
    }
  }
  if (param_groups.empty()) param_groups.push_back(ParamGroup{trainable, std::nullopt});
  std::unordered_map<TensorKey, int> unit_of;
  if (config.zero_optimization.stage == 3) unit_of = assign_units(module, out.units);
  group_params(out, param_groups, names, unit_of, config.optimizer.params.weight_decay);
  std::set<TensorKey> grouped;
  for (const auto& group : out.groups) {
    for (const auto& p : group.params) grouped.insert(key_of(p));
  }
  for (const auto& p : trainable) {
    if (!grouped.count(key_of(p))) {
      throw EngineError("parameter " + names[key_of(p)] +
                        " requires grad but is in no parameter group; add it to one or set requires_grad(false)");
    }
  }
  return out;
}

void isolate_params(ModelParams& params, const std::map<std::string, int>& names) {
  std::vector<partition::ShardedParams::Group> alone_groups;
  std::vector<double> alone_decays;
  for (size_t g = 0; g < params.groups.size(); ++g) {
    auto& group = params.groups[g];
    for (size_t i = 0; i < group.params.size();) {
      if (!names.count(group.names[i])) {
        ++i;
        continue;
      }
      partition::ShardedParams::Group alone;
      alone.names = {group.names[i]};
      alone.params = {group.params[i]};
      if (!group.units.empty()) alone.units = {group.units[i]};
      group.names.erase(group.names.begin() + i);
      group.params.erase(group.params.begin() + i);
      if (!group.units.empty()) group.units.erase(group.units.begin() + i);
      alone_groups.push_back(std::move(alone));
      alone_decays.push_back(params.weight_decays[g]);
    }
  }
  for (auto& g : alone_groups) params.groups.push_back(std::move(g));
  for (double d : alone_decays) params.weight_decays.push_back(d);
}

void set_replicas(ModelParams& params, torch::nn::Module& module, const std::map<std::string, tp::Split>& splits,
                  const MeshShape& mesh, const std::map<std::string, int>& copies) {
  if (mesh.tp * mesh.pp == 1) return;
  std::set<TensorKey> split;
  for (const auto& p : module.named_parameters()) {
    auto it = splits.find(p.key());
    if (it == splits.end()) continue;
    if (it->second.size != mesh.tp) {
      throw EngineError("parameter " + p.key() + " is split over " + std::to_string(it->second.size) +
                        " rank(s) but the tensor-parallel size is " + std::to_string(mesh.tp) +
                        "; build the model's layers on the mesh's tp_group()");
    }
    split.insert(key_of(p.value()));
  }
  for (auto& group : params.groups) {
    group.replicas.clear();
    for (size_t i = 0; i < group.params.size(); ++i) {
      const auto held = copies.find(group.names[i]);  // a pipeline's tied parameter: on several stages
      const int stages = held == copies.end() ? 1 : held->second;
      group.replicas.push_back(stages * (split.count(key_of(group.params[i])) ? 1 : mesh.tp));
    }
  }
}

namespace {
// Note [Fused step on CPU ranks] in engine_setup.h.
bool fused_step_on_host(const Config& config, bool params_on_host) {
  const auto& o = config.optimizer;
  return params_on_host && (o.type == "Adam" || o.type == "AdamW") && !o.params.torch_adam && !o.params.amsgrad;
}

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
  const auto& dp = mesh.dp_group();
  const auto& node = mesh.dp_intra_node_group();
  const auto& across = mesh.dp_inter_node_group();
  if (z.zero_hpz_partition_size > 1) {
    const int64_t hpz = z.zero_hpz_partition_size;
    if (dp->size() % hpz != 0) {
      throw ConfigError("zero_optimization.zero_hpz_partition_size " + std::to_string(hpz) +
                        " does not divide the data-parallel size " + std::to_string(dp->size()) +
                        "; set it to the ranks per node");
    }
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
  o.offload_optimizer = offload.device == "cpu" || offload.device == "nvme";
  o.offload_ratio = offload.ratio;
  o.host_grad_copies = env::offload_host_grad_copies();  // for tests (Note [Offload copies])
  o.pin_memory = offload.pin_memory || z.offload_param.pin_memory;
  if (offload.device == "nvme") {
    o.master_swap = nvme_swap(config, offload.nvme_path, offload.buffer_count, world->rank());
    o.sub_group_numel = std::max<int64_t>(z.sub_group_size, 1);
  }
  o.offload_param = z.offload_param.device;
  if (z.offload_param.device == "nvme") {
    o.param_swap = nvme_swap(config, z.offload_param.nvme_path, z.offload_param.buffer_count, world->rank());
  }
  return o;
}

namespace {

// The config's leaves as "config.a.b" = value, in the order to_json writes them.
void flatten(const nlohmann::json& j, const std::string& path, comm::Facts& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), path + "." + it.key(), out);
  } else {
    out.emplace_back(path, j.dump());
  }
}

std::string tensor_fact(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << " " << t.scalar_type() << (t.requires_grad() ? " trainable" : " frozen");
  return out.str();
}

}  // namespace

comm::Facts config_facts(const Config& config) {
  comm::Facts facts;
  flatten(nlohmann::json::parse(config.to_json()), "config", facts);  // our own output: shallow
  return facts;
}

comm::Facts model_facts(torch::nn::Module& module, const ModelParams& params) {
  comm::Facts facts;
  for (const auto& p : module.named_parameters()) facts.emplace_back("parameter " + p.key(), tensor_fact(p.value()));
  for (const auto& b : module.named_buffers()) facts.emplace_back("buffer " + b.key(), tensor_fact(b.value()));
  for (size_t g = 0; g < params.groups.size(); ++g) {
    for (const auto& name : params.groups[g].names) facts.emplace_back("group of " + name, std::to_string(g));
  }
  return facts;
}

namespace {

// Lamb's view of the partition: the pieces of whole parameters in each master tensor.
ShardLayout shard_layout(const partition::ShardedParams& params, std::shared_ptr<comm::ProcessGroup> pg) {
  ShardLayout layout;
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

std::unique_ptr<MasterOptimizer> master_optimizer(const Config& config, partition::ShardedParams& params,
                                                  const std::vector<double>& weight_decays,
                                                  std::shared_ptr<comm::ProcessGroup> dp,
                                                  bool params_on_host) {
  // The optimizer's tensors are the master tensors group by group, which is
  // bucket order (Note [Flat layout]): tensor k is bucket k's.
  std::vector<OptimizerGroup> groups;
  const auto& by_group = params.masters().by_group();
  for (size_t g = 0; g < by_group.size(); ++g) groups.push_back({by_group[g], weight_decays[g]});
  size_t k = 0;
  for (const auto& group : by_group) {
    for (const auto& t : group) {
      if (!t.is_same(params.masters().tensors()[k++])) throw EngineError("internal: master tensors out of bucket order");
    }
  }
  const bool offloaded = params.options().offload_optimizer;
  HostStep host;
  host.enabled = offloaded || fused_step_on_host(config, params_on_host);
  // Without offload every master is already in host memory (Note [Fused step on CPU ranks]).
  if (offloaded) host.elsewhere = kept_on_device(params, params.options().offload_ratio);
  // offload_optimizer "nvme": the master weights went to files as they were made; their states join them.
  if (params.masters().nvme_store()) host.nvme_masters = &params.masters();
  return make_optimizer(config.optimizer, groups, shard_layout(params, dp), std::move(host));
}

}  // namespace zero::engine
