#pragma once
// A Python torch.nn.Module as zero's C++ engine sees it.
//
// Note [The mirror]
// The engine trains a torch::nn::Module; a Python model is not one, but its
// parameters and buffers are at::Tensors of the same LibTorch. The mirror
// is a tree of C++ modules, one per Python module, that registers those very
// tensors (not copies) under the same names. What the engine does to them
// (set_data to its flat buffers, the training dtype, stage 3's empty
// released tensors, its gradient hooks) Python's parameters see, because
// they are the same tensors. The Python submodules chosen as units are
// PythonUnits, which the Python side's forward hooks drive as zero::Unit's
// own forward does (include/zero/unit.h). Non-persistent buffers (a rotary
// embedding's inv_freq) stay out, as they stay out of torch's state_dict.
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/unit.h"

namespace zero::python {

class PythonUnit : public UnitBase {
 public:
  using UnitBase::enter_forward;
  using UnitBase::leave_forward;
};

// One Python module: its dotted path ("" for the model), whether it is a
// unit, and its own (not its children's) parameters and persistent buffers.
struct ModuleSpec {
  std::string path;
  bool unit = false;
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<std::pair<std::string, at::Tensor>> buffers;
};

struct PythonModel {
  std::shared_ptr<torch::nn::Module> root;
  std::vector<std::shared_ptr<PythonUnit>> units;  // in the order of the specs
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;  // by path
  std::shared_ptr<torch::nn::Module> find(const std::string& path) const;
};

// The specs in the order of Python's named_modules() (a parent before its
// children). A PartitionError for a spec whose parent comes later or is
// missing, or a unit at the model itself. root_is_unit: the first spec is
// one unit just built (zero.Init hands it to the parts), whatever it says.
PythonModel mirror(const std::vector<ModuleSpec>& specs, bool root_is_unit = false);

}  // namespace zero::python
