#pragma once
// The closed sets a ds_config chooses from by name, as enums: where offload
// puts the optimizer or the parameters, and which optimizer runs. The
// spellings are read in config/ (the table in config/choices.cpp) and
// nowhere else: every other folder compares these values, never the
// strings (Note [One spelling]).
//
//   zero::offload_device_named("nvme")   -> OffloadDevice::nvme
//   zero::optimizer_kind_named("AdamW")  -> OptimizerKind::adamw
//   zero::name(OffloadDevice::cpu)       -> "cpu"
//
// Torch-free; partition/ and its estimate read it as well as config/.
#include <optional>
#include <string>

namespace zero {

// zero_optimization.offload_optimizer.device and offload_param.device.
enum class OffloadDevice { none, cpu, nvme };

// optimizer.type, in DeepSpeed's spelling ("Adam", "AdamW", "SGD",
// "Adagrad", "Lamb").
enum class OptimizerKind { adam, adamw, sgd, adagrad, lamb };

// The value a name spells exactly, or nothing for a name outside the set
// (the caller says what it expected; the config's reader, which also takes
// other cases of the optimizer's name, canonicalizes it first).
std::optional<OffloadDevice> offload_device_named(const std::string& name);
std::optional<OptimizerKind> optimizer_kind_named(const std::string& type);

const char* name(OffloadDevice device);  // "none", "cpu", "nvme"
const char* name(OptimizerKind kind);    // "Adam", "AdamW", "SGD", "Adagrad", "Lamb"

// Adam and AdamW: the kinds with two moments (exp_avg, exp_avg_sq) whose
// betas the schedules may cycle, with Lamb.
inline bool is_adam(OptimizerKind kind) { return kind == OptimizerKind::adam || kind == OptimizerKind::adamw; }

}  // namespace zero
