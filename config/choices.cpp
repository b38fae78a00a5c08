// Note [One spelling]: offload devices and optimizer kinds are named in
// ds_config files, launch configs and programs' options as strings, and
// were once compared as strings in about twenty places, which drifted. The
// table below is the one place a spelling meets its meaning; everything
// past the config compares zero/choices.h's enums.
#include "zero/choices.h"

#include "zero/config.h"
#include "zero/error.h"

#include <array>
#include <utility>

namespace zero {
namespace {

constexpr std::array<std::pair<OffloadDevice, const char*>, 3> kDevices = {{
    {OffloadDevice::none, "none"}, {OffloadDevice::cpu, "cpu"}, {OffloadDevice::nvme, "nvme"}}};
constexpr std::array<std::pair<OptimizerKind, const char*>, 5> kOptimizers = {{
    {OptimizerKind::adam, "Adam"}, {OptimizerKind::adamw, "AdamW"}, {OptimizerKind::sgd, "SGD"},
    {OptimizerKind::adagrad, "Adagrad"}, {OptimizerKind::lamb, "Lamb"}}};

template <typename Enum, size_t N>
std::optional<Enum> named(const std::array<std::pair<Enum, const char*>, N>& table, const std::string& text) {
  for (const auto& [value, spelling] : table)
    if (text == spelling) return value;
  return std::nullopt;
}

template <typename Enum, size_t N>
const char* spelled(const std::array<std::pair<Enum, const char*>, N>& table, Enum value) {
  for (const auto& [v, spelling] : table)
    if (v == value) return spelling;
  return "?";
}

}  // namespace

std::optional<OffloadDevice> offload_device_named(const std::string& name) { return named(kDevices, name); }
std::optional<OptimizerKind> optimizer_kind_named(const std::string& type) { return named(kOptimizers, type); }
const char* name(OffloadDevice device) { return spelled(kDevices, device); }
const char* name(OptimizerKind kind) { return spelled(kOptimizers, kind); }

namespace {
OffloadDevice device_at(const std::string& device, const char* key) {
  if (auto d = offload_device_named(device)) return *d;
  throw ConfigError(std::string(key) + " \"" + device + "\" is not one of \"none\", \"cpu\", \"nvme\"");
}
}  // namespace

OffloadDevice OffloadOptimizerConfig::where() const { return device_at(device, "zero_optimization.offload_optimizer.device"); }
OffloadDevice OffloadParamConfig::where() const { return device_at(device, "zero_optimization.offload_param.device"); }

std::optional<OptimizerKind> OptimizerConfig::kind() const {
  if (type.empty()) return std::nullopt;
  if (auto k = optimizer_kind_named(type)) return k;
  throw ConfigError("optimizer.type \"" + type + "\" is not supported by the engine yet; use Adam, AdamW, SGD, Adagrad or Lamb");
}

}  // namespace zero
