// zero._C: the C++ engine for the Python package (python/zero). The Python
// side builds the model's spec (python_model.h) and turns DeepSpeed's
// arguments into these calls; everything that trains is zero's C++.
// Calls that wait (backward, step, collectives, gathers, checkpoints)
// release the GIL: autograd takes it back for any Python node or hook.
#include <torch/extension.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/exit_on_error.h"
#include "python_model.h"
#include "zero/comm.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/error.h"
#include "zero/init.h"

namespace py = pybind11;

namespace zero::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

comm::ReduceOp reduce_op(const std::string& name) {
  if (name == "sum") return comm::ReduceOp::Sum;
  if (name == "avg") return comm::ReduceOp::Avg;
  if (name == "max") return comm::ReduceOp::Max;
  throw EngineError("zero.comm: reduce op \"" + name + "\" is not one of sum, avg, max");
}

// A process group as zero.comm shows it (DeepSpeed's deepspeed.comm calls).
struct Group {
  std::shared_ptr<comm::ProcessGroup> pg;
  int rank() const { return pg->rank(); }
  int size() const { return pg->size(); }
  void all_reduce(at::Tensor t, const std::string& op) { pg->all_reduce_async(std::move(t), reduce_op(op))->wait(); }
  void broadcast(at::Tensor t, int root) { pg->broadcast_async(std::move(t), root)->wait(); }
  void all_gather(at::Tensor out, at::Tensor in) { pg->all_gather_async(std::move(out), std::move(in))->wait(); }
  void barrier() { pg->barrier(); }
};

// A GatheredParameters held from Python until release() (its __exit__).
struct Gathered {
  std::optional<GatheredParameters> held;
  void release() { held.reset(); }
};

struct ParamGroupSpec {
  std::vector<at::Tensor> params;
  std::optional<double> weight_decay;
};

// The ds_config keys whose C++ meaning needs zero's own modules (its
// tensor-parallel layers, pipeline stages, Ulysses attention): a Python
// model has none, so they are refused by name.
void refuse_what_python_cannot_honour(const Config& config) {
  std::vector<std::string> refused;
  const auto& p = config.parallelism;
  if (p.tensor_parallel() > 1) refused.push_back("tensor_parallel (" + std::to_string(p.tensor_parallel()) + " ranks)");
  if (p.pipeline_parallel() > 1) refused.push_back("pipeline.stages (" + std::to_string(p.pipeline_parallel()) + ")");
  if (p.sequence_parallel() > 1) refused.push_back("sequence_parallel_size (" + std::to_string(p.sequence_parallel()) + ")");
  if (refused.empty()) return;
  std::string names;
  for (const auto& r : refused) names += (names.empty() ? "" : ", ") + r;
  throw ConfigError("zero.initialize from Python cannot honour " + names +
                    " yet: they need zero's C++ layers (include/zero/tensor_parallel.h, pipeline.h, "
                    "sequence_parallel.h); leave them out of the ds_config");
}

class PyEngine {
 public:
  PyEngine(const std::string& config_json, const std::vector<ModuleSpec>& specs, std::vector<ParamGroupSpec> groups,
           std::optional<Group> group)
      : model_(mirror(specs)), engine_(make(config_json, std::move(groups), std::move(group))) {}

  Engine& engine() { return engine_; }
  void unit_enter(int k) { unit(k).enter_forward(); }
  void unit_leave(int k, const std::optional<at::Tensor>& output) { unit(k).leave_forward(output.value_or(at::Tensor())); }
  // Whether the config's activation checkpointing (checkpoint_every) chose unit k.
  bool unit_checkpoints(int k) { return unit(k).checkpoints_activations(); }
  Gathered gather(const std::string& path, std::optional<int> modifier_rank) {
    return Gathered{engine_.gather_parameters(*model_.find(path), modifier_rank)};
  }
  Group group() { return Group{engine_.mesh().dp_group()}; }

 private:
  PythonUnit& unit(int k) {
    if (k < 0 || k >= static_cast<int>(model_.units.size())) throw EngineError("zero: no unit " + std::to_string(k));
    return *model_.units[k];
  }
  Engine make(const std::string& config_json, std::vector<ParamGroupSpec> groups, std::optional<Group> group) {
    const Config config = Config::from_json(config_json);
    refuse_what_python_cannot_honour(config);
    InitOptions options;
    for (auto& g : groups) options.param_groups.push_back(ParamGroup{std::move(g.params), g.weight_decay});
    if (group) options.group = group->pg;
    return initialize(config, model_.root, std::move(options));
  }

  PythonModel model_;
  Engine engine_;
};

// zero.Init: partitioned construction (include/zero/init.h) for Python
// models. While it is open, each unit the Python side reports as just
// built is mirrored and handed to the parts, as a zero::Unit's constructor
// hands itself over (unit_built_hook, set on this thread by zero::Init).
class PyInit {
 public:
  PyInit(const std::string& config_json, const std::string& remote_device, const Group& group) {
    PartitionedInitOptions options;
    options.remote_device = remote_device;
    options.group = group.pg;
    init_ = std::make_unique<Init>(Config::from_json(config_json), options);
  }
  void take(const std::vector<ModuleSpec>& specs) {
    if (!init_) throw EngineError("zero.Init: a unit was built after the zero.Init closed");
    PythonModel unit = mirror(specs, /*root_is_unit=*/true);
    if (UnitBuiltHook hook = unit_built_hook()) hook(*unit.units.front());
  }
  void close() { init_.reset(); }  // the parts wait for initialize
  int64_t part_bytes() const { return init_ ? init_->part_bytes() : 0; }
  int64_t partitioned_params() const { return init_ ? init_->partitioned_params() : 0; }

 private:
  std::unique_ptr<Init> init_;
};

py::dict memory_report(const MemoryReport& r) {
  py::dict d;
  d["params"] = r.params;
  d["gradients"] = r.gradients;
  d["fp32_master"] = r.fp32_master;
  d["optimizer_states"] = r.optimizer_states;
  d["buffers"] = r.buffers;
  d["offload_buffers"] = r.offload_buffers;
  d["host_offloaded"] = r.host_offloaded;
  d["nvme_offloaded"] = r.nvme_offloaded;
  d["nvme_host_peak"] = r.nvme_host_peak;
  d["gathered_params_peak"] = r.gathered_params_peak;
  d["activations_peak"] = r.activations_peak;
  d["total"] = r.total();
  return d;
}

}  // namespace
}  // namespace zero::python

PYBIND11_MODULE(_C, m) {
  using namespace zero;
  using namespace zero::python;
  m.doc() = "zero's C++ engine (use the zero package, not this module)";
  m.attr("torch_version") = TORCH_VERSION;

  // zero's errors keep their names; each is also the Python error a
  // DeepSpeed user would catch for it.
  auto base = py::register_exception<Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<ConfigError>(m, "ConfigError", PyExc_ValueError);
  py::register_exception<CommError>(m, "CommError", base.ptr());
  py::register_exception<PartitionError>(m, "PartitionError", base.ptr());
  py::register_exception<OffloadError>(m, "OffloadError", base.ptr());
  py::register_exception<CheckpointError>(m, "CheckpointError", base.ptr());
  py::register_exception<EngineError>(m, "EngineError", base.ptr());

  py::class_<ModuleSpec>(m, "ModuleSpec")
      .def(py::init<std::string, bool, std::vector<std::pair<std::string, at::Tensor>>,
                    std::vector<std::pair<std::string, at::Tensor>>>(),
           py::arg("path"), py::arg("unit"), py::arg("params"), py::arg("buffers"));
  py::class_<ParamGroupSpec>(m, "ParamGroupSpec")
      .def(py::init<std::vector<at::Tensor>, std::optional<double>>(), py::arg("params"), py::arg("weight_decay"));

  py::class_<Group>(m, "Group")
      .def_property_readonly("rank", &Group::rank)
      .def_property_readonly("size", &Group::size)
      .def("all_reduce", &Group::all_reduce, py::arg("tensor"), py::arg("op") = "sum", Release())
      .def("broadcast", &Group::broadcast, py::arg("tensor"), py::arg("src"), Release())
      .def("all_gather", &Group::all_gather, py::arg("output"), py::arg("input"), Release())
      .def("barrier", &Group::barrier, Release());
  m.def("init_process_group", [] { return Group{comm::init_process_group()}; }, Release());
  m.def("exiting_on_error", &comm::exiting_on_error);  // Note [Exiting on an error]

  py::class_<Gathered>(m, "Gathered").def("release", &Gathered::release, Release());

  py::class_<PyInit>(m, "Init")
      .def(py::init<std::string, std::string, Group>(), py::arg("config_json"), py::arg("remote_device"), py::arg("group"),
           Release())
      .def("take", &PyInit::take, py::arg("modules"), Release())
      .def("close", &PyInit::close)
      .def("part_bytes", &PyInit::part_bytes)
      .def("partitioned_params", &PyInit::partitioned_params);

  py::class_<PyEngine>(m, "Engine")
      .def(py::init<std::string, std::vector<ModuleSpec>, std::vector<ParamGroupSpec>, std::optional<Group>>(),
           py::arg("config_json"), py::arg("modules"), py::arg("param_groups"), py::arg("group"), Release())
      .def("backward", [](PyEngine& e, const at::Tensor& loss) { e.engine().backward(loss); }, Release())
      .def("step", [](PyEngine& e) { e.engine().step(); }, Release())
      .def("is_gradient_accumulation_boundary", [](PyEngine& e) { return e.engine().is_gradient_accumulation_boundary(); })
      .def("train", [](PyEngine& e, bool on) { e.engine().train(on); })
      .def("lr", [](PyEngine& e) { return e.engine().lr(); })
      .def("get_lr", [](PyEngine& e) { return e.engine().get_lr(); })
      .def("loss_scale", [](PyEngine& e) { return e.engine().loss_scale(); })
      .def("global_steps", [](PyEngine& e) { return e.engine().global_steps(); })
      .def("skipped_steps", [](PyEngine& e) { return e.engine().skipped_steps(); })
      .def("micro_steps", [](PyEngine& e) { return e.engine().micro_steps(); })
      .def("train_batch_size", [](PyEngine& e) { return e.engine().train_batch_size(); })
      .def("train_micro_batch_size_per_gpu", [](PyEngine& e) { return e.engine().train_micro_batch_size_per_gpu(); })
      .def("gradient_accumulation_steps", [](PyEngine& e) { return e.engine().gradient_accumulation_steps(); })
      .def("last_grad_norm", [](PyEngine& e) { return e.engine().last_grad_norm(); })
      .def("set_gradient_clipping", [](PyEngine& e, double v) { e.engine().set_gradient_clipping(v); })
      .def("dtype", [](PyEngine& e) { return std::string(c10::toString(e.engine().dtype())); })
      .def("memory_report", [](PyEngine& e) { return memory_report(e.engine().memory_report()); })
      .def("stage", [](PyEngine& e) { return e.engine().config().zero_optimization.stage; })
      .def("fp16_auto_cast", [](PyEngine& e) { return e.engine().config().fp16.auto_cast; })
      .def("has_scheduler", [](PyEngine& e) { return !e.engine().config().scheduler.type.empty(); })
      .def("dp_group", &PyEngine::group)
      .def("unit_enter", &PyEngine::unit_enter, Release())
      .def("unit_leave", &PyEngine::unit_leave, py::arg("unit"), py::arg("output"), Release())
      .def("unit_checkpoints", &PyEngine::unit_checkpoints)
      .def("gather", &PyEngine::gather, py::arg("path"), py::arg("modifier_rank"), Release())
      .def("save_checkpoint",
           [](PyEngine& e, const std::string& dir, const std::string& tag, const std::string& client_state) {
             e.engine().save_checkpoint(dir, tag, client_state);
           },
           Release())
      .def("load_checkpoint",
           [](PyEngine& e, const std::string& dir, const std::string& tag, bool optimizer_states, bool lr_scheduler_states,
              bool module_only) {
             LoadOptions options;
             options.load_optimizer_states = optimizer_states;
             options.load_lr_scheduler_states = lr_scheduler_states;
             options.load_module_only = module_only;
             return e.engine().load_checkpoint_if_present(dir, tag, options);
           },
           Release())
      .def("save_16bit_model",
           [](PyEngine& e, const std::string& dir, const std::string& filename) { return e.engine().save_16bit_model(dir, filename); },
           Release())
      .def("load_weights", [](PyEngine& e, const std::string& path) { e.engine().load_weights(path); }, Release());
}
