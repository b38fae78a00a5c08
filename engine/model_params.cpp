// The model's parameters as the engine trains them (model_params.h).
#include "engine/model_params.h"

#include <set>
#include <unordered_map>

#include "zero/error.h"
#include "zero/log.h"

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
    out.user_group.push_back(g);
  }
}

}  // namespace

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
  std::vector<size_t> alone_sources;
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
      alone_sources.push_back(params.user_group[g]);
    }
  }
  for (auto& g : alone_groups) params.groups.push_back(std::move(g));
  for (double d : alone_decays) params.weight_decays.push_back(d);
  for (size_t u : alone_sources) params.user_group.push_back(u);
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

}  // namespace zero::engine
