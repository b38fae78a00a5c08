// The parameter listing a save records in rank 0's file (checkpoint.h,
// kParamsRecord), written and read back. Torch-free.
#include <optional>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "core/json_depth.h"
#include "zero/error.h"

namespace zero::ckpt {
namespace {


}  // namespace

std::optional<std::vector<ParamInfo>> recorded_params(const SafetensorsFile& file) {
  auto it = file.metadata().find(kParamsRecord);
  if (it == file.metadata().end()) return std::nullopt;
  const std::string bad = file.path() + ": its metadata \"" + kParamsRecord + "\" is not the parameter listing a save writes";
  if (core::json_nests_deeper_than(it->second)) fail(bad + " (nested too deep)");
  std::vector<ParamInfo> out;
  try {
    const nlohmann::json j = nlohmann::json::parse(it->second);
    if (!j.is_array()) fail(bad);
    for (const auto& p : j) {
      if (!p.is_array() || p.size() != 3 || !p[0].is_string() || !p[1].is_array() || !p[2].is_boolean()) fail(bad);
      ParamInfo info{p[0].get<std::string>(), {}, p[2].get<bool>()};
      for (const auto& d : p[1]) {
        if (!d.is_number_integer()) fail(bad);
        info.shape.push_back(d.get<int64_t>());
      }
      out.push_back(std::move(info));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(bad + " (" + e.what() + ")");
  }
  return out;
}

std::string params_record(const std::vector<ParamInfo>& params) {
  nlohmann::json j = nlohmann::json::array();
  for (const ParamInfo& p : params) j.push_back({p.name, p.shape, p.trainable});
  return j.dump();
}

}  // namespace zero::ckpt
