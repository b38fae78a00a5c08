// The C++ mirror of a Python model (python_model.h, Note [The mirror]).
#include "python_model.h"

#include "zero/error.h"

namespace zero::python {

std::shared_ptr<torch::nn::Module> PythonModel::find(const std::string& path) const {
  auto it = modules.find(path);
  if (it != modules.end()) return it->second;
  throw PartitionError("no module " + (path.empty() ? std::string("(the model)") : path) + " in the model given to zero.initialize");
}

PythonModel mirror(const std::vector<ModuleSpec>& specs, bool root_is_unit) {
  PythonModel model;
  for (const auto& spec : specs) {
    std::shared_ptr<torch::nn::Module> module;
    if (spec.path.empty() && root_is_unit) {
      auto unit = std::make_shared<PythonUnit>();
      model.units.push_back(unit);
      module = unit;
    } else if (spec.unit) {
      if (spec.path.empty()) throw PartitionError("the model itself cannot be a unit: name its blocks (units=...)");
      auto unit = std::make_shared<PythonUnit>();
      model.units.push_back(unit);
      module = unit;
    } else {
      module = std::make_shared<torch::nn::Module>();
    }
    for (const auto& [name, tensor] : spec.params) module->register_parameter(name, tensor, tensor.requires_grad());
    for (const auto& [name, tensor] : spec.buffers) module->register_buffer(name, tensor);
    if (spec.path.empty()) {
      if (model.root) throw PartitionError("zero.initialize: the model's spec names the model twice");
      model.root = module;
    } else {
      const auto dot = spec.path.rfind('.');
      const std::string parent = dot == std::string::npos ? "" : spec.path.substr(0, dot);
      const std::string name = dot == std::string::npos ? spec.path : spec.path.substr(dot + 1);
      if (!model.root) throw PartitionError("zero.initialize: the model's spec starts with " + spec.path + ", not the model");
      model.find(parent)->register_module(name, module);
    }
    model.modules.emplace(spec.path, module);
  }
  if (!model.root) throw PartitionError("zero.initialize: the model has no modules");
  return model;
}

}  // namespace zero::python
