// zero::Config: load (file or text), resolve for a world size, print.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json_depth.h"
#include "core/json_duplicates.h"
#include "core/regular_file.h"
#include "config/config_detail.h"
#include "zero/error.h"
#include "zero/mesh_shape.h"

namespace zero {
namespace {

using config_detail::Json;

// Far more than any ds_config section has; reading stops there (see core/json_duplicates.h).
constexpr size_t kMaxKeysPerObject = 10000;

Json parse(const std::string& written) {
  const std::string text = config_detail::blank_comments_and_trailing_commas(written);  // Note [DeepSpeed's config syntax]
  if (core::json_nests_deeper_than(text))
    throw ConfigError("invalid JSON: nested deeper than " + std::to_string(core::kMaxJsonDepth) +
                      " levels (a ds_config nests a few)");
  std::optional<std::string> duplicate;
  Json root;
  try {
    root = core::parse_json_noting_duplicates<Json>(text, duplicate, /*ignore_comments=*/true, kMaxKeysPerObject);
  } catch (const core::TooManyKeys& e) {
    const std::string where = e.what();
    throw ConfigError("invalid ds_config: " + (where.empty() ? std::string("the top-level object") : where) +
                      " holds more than " + std::to_string(kMaxKeysPerObject) +
                      " keys; a ds_config section has a few dozen");
  } catch (const Json::parse_error& e) {
    std::string what = e.what();   // "[json.exception.parse_error.101] parse error at line 3, column 5: ..."
    size_t start = what.find("] ");
    throw ConfigError("invalid JSON: " + (start == std::string::npos ? what : what.substr(start + 2)) +
                      config_detail::python_spelling_hint(text));
  }
  if (duplicate) throw ConfigError(*duplicate + ": duplicate key (a key may appear once per object)");
  if (!root.is_object()) throw ConfigError("a ds_config must be a JSON object; found " + config_detail::show(root));
  return root;
}

}  // namespace

Config Config::from_json(const std::string& json_text) {
  try {
    Json root = parse(json_text);
    Config c;
    config_detail::map_deprecated(root, ConfigAccess::warnings(c));
    config_detail::read_config(root, c);
    config_detail::warn_stage3_keys_elsewhere(root, ConfigAccess::warnings(c));
    return c;
  } catch (const nlohmann::json::exception& e) {   // a slip in the reader: still a ConfigError
    throw ConfigError(std::string("cannot read the config: ") + e.what());
  }
}

Config Config::from_file(const std::string& path) {
  // A ds_config is a few KB; 64 MiB leaves room for generated ones.
  std::string text, error;
  if (!core::read_regular_file(path, uint64_t{64} << 20, text, error))
    throw ConfigError("cannot read config file: " + error);
  try {
    Config c = from_json(text);
    c.source_ = path;
    return c;
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

void Config::resolve(int world_size) {
  if (world_size < 1) throw ConfigError("world size must be >= 1; got " + std::to_string(world_size));
  config_detail::check_resolvable(*this);
  // Read our own output back: fields a program changed after parsing get
  // the same checks as a file, and spellings are made canonical.
  Config checked = from_json(to_json());
  checked.warnings_ = std::move(warnings_);
  checked.source_ = std::move(source_);
  *this = std::move(checked);
  const int64_t sp = parallelism.sequence_parallel();
  MeshShape mesh;
  try {
    mesh = mesh_shape(world_size, static_cast<int>(parallelism.tensor_parallel()),
                      static_cast<int>(parallelism.pipeline_parallel()), static_cast<int>(sp));
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) +
                      " (sizes from tensor_parallel.autotp_size or tensor_parallel.tp.tp_size, pipeline.stages "
                      "and sequence_parallel_size)");
  }
  config_detail::resolve_batch(batch, mesh.dp);
  const int64_t hpz = zero_optimization.zero_hpz_partition_size;
  if (hpz > 1 && mesh.zero() % hpz != 0) {
    throw ConfigError("zero_optimization.zero_hpz_partition_size " + std::to_string(hpz) +
                      " does not divide the data-parallel size " + std::to_string(mesh.zero()) +
                      (sp > 1 ? " (data parallel x sequence parallel: the ranks ZeRO partitions over)" : "") +
                      "; set it to the ranks per node");
  }
  world_size_ = world_size;
  data_parallel_size_ = mesh.dp;
}

// Note [One validator]: what zero::initialize refuses for a reason in the
// config alone (given the world size) is refused here, in parsing,
// resolve() or check_trainable(), and nowhere later, so that `zero-config
// FILE --world-size N` refuses the same configs with the same words.
// What the engine still refuses later depends on more than the config: the
// model (pipeline stages, tensor-parallel shapes), the launch (ranks per
// node for hpZ) or the disk. tests/engine/test_one_validator.cpp holds the
// table of cases.
void Config::check_trainable() const {
  if (!optimizer.kind()) {
    throw ConfigError("the config has no \"optimizer\" section; add e.g. {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}, "
                      "or pass a torch::optim optimizer as InitOptions::optimizer");
  }
}

std::string Config::to_json(int indent) const {
  return config_detail::write_config(*this).dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace zero
