// Deprecated DeepSpeed spellings, rewritten to the current keys before the
// config is read, with exactly one warning each. Giving an old key and its
// replacement together is an error (DeepSpeed refuses it too).
#include "config/config_detail.h"
#include "zero/error.h"

namespace zero::config_detail {
namespace {

std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

void refuse_both(const std::string& old_path, const std::string& new_path) {
  throw ConfigError(old_path + " (deprecated) and " + new_path + " are both given; remove " + old_path);
}

// Moves obj[old_key] to obj[new_key]; warns unless it is a plain alias.
void rename(Json& obj, const std::string& prefix, const char* old_key, const char* new_key,
            std::vector<std::string>& warnings, bool warn = true) {
  if (!obj.contains(old_key)) return;
  const std::string old_path = join_path(prefix, old_key), new_path = join_path(prefix, new_key);
  if (obj.contains(new_key)) refuse_both(old_path, new_path);
  Json value = obj[old_key];   // a copy: inserting the new key may move the old one
  obj.erase(old_key);
  obj[new_key] = std::move(value);
  if (warn) warnings.push_back(old_path + " is deprecated; read as " + new_path + " (use that key instead)");
}

// Removes obj[key] and returns it as a bool; absent: nullopt.
std::optional<bool> take_flag(Json& obj, const std::string& prefix, const char* key) {
  if (!obj.contains(key) || obj[key].is_null()) {
    obj.erase(key);
    return std::nullopt;
  }
  const Json v = obj[key];
  if (!v.is_boolean())
    throw ConfigError(join_path(prefix, key) + " must be true or false; found " + show(v));
  obj.erase(key);
  return v.get<bool>();
}

// Sets obj[section][key] = value for a flag that replaced a deprecated one.
void set_in(Json& obj, const std::string& old_path, const char* section, const char* key, const Json& value) {
  if (!obj.contains(section) || obj[section].is_null()) obj[section] = Json::object();
  Json& target = obj[section];
  if (!target.is_object()) return;   // the reader reports the wrong type
  if (target.contains(key)) refuse_both(old_path, "zero_optimization." + std::string(section) + "." + key);
  target[key] = value;
}

// {"cpu_offload": true} -> {"offload_optimizer": {"device": "cpu"}}, and the
// same for parameters.
void map_cpu_offload(Json& z, const char* old_key, const char* section, std::vector<std::string>& warnings) {
  const std::string old_path = "zero_optimization." + std::string(old_key);
  std::optional<bool> on = take_flag(z, "zero_optimization", old_key);
  if (!on) return;
  const std::string new_path = "zero_optimization." + std::string(section) + ".device";
  if (*on) set_in(z, old_path, section, "device", "cpu");
  warnings.push_back(old_path + " is deprecated; read as " + new_path + " = " + (*on ? "\"cpu\"" : "\"none\"") +
                     " (use that key instead)");
}

void map_pin_memory(Json& z, std::vector<std::string>& warnings) {
  const std::string old_path = "zero_optimization.cpu_offload_use_pin_memory";
  std::optional<bool> pin = take_flag(z, "zero_optimization", "cpu_offload_use_pin_memory");
  if (!pin) return;
  std::vector<std::string> targets;
  for (const char* section : {"offload_optimizer", "offload_param"}) {
    if (!z.contains(section) || !z[section].is_object()) continue;
    set_in(z, old_path, section, "pin_memory", *pin);
    targets.push_back("zero_optimization." + std::string(section) + ".pin_memory");
  }
  if (targets.empty()) {
    warnings.push_back(old_path + " is deprecated and, with nothing offloaded, has no effect (the key is now "
                       "zero_optimization.offload_optimizer.pin_memory / offload_param.pin_memory)");
    return;
  }
  warnings.push_back(old_path + " is deprecated; read as " + join(targets, " and ") + " (use that key instead)");
}

void map_zero_optimization(Json& root, std::vector<std::string>& warnings) {
  if (!root.contains("zero_optimization")) return;
  if (root["zero_optimization"].is_boolean()) {   // the oldest form: "zero_optimization": true
    const bool on = root["zero_optimization"].get<bool>();
    Json object = Json::object();
    object["stage"] = on ? 1 : 0;
    if (root.contains("allgather_size")) {   // erasing moves the keys after it: no references kept
      if (on) object["allgather_bucket_size"] = root["allgather_size"];
      root.erase("allgather_size");
    }
    root["zero_optimization"] = std::move(object);
    warnings.push_back(std::string("\"zero_optimization\": ") + (on ? "true" : "false") +
                       " is deprecated; read as zero_optimization.stage = " + (on ? "1" : "0"));
    return;
  }
  Json& z = root["zero_optimization"];
  if (!z.is_object()) return;
  map_cpu_offload(z, "cpu_offload", "offload_optimizer", warnings);
  map_cpu_offload(z, "cpu_offload_param", "offload_param", warnings);
  map_cpu_offload(z, "cpu_offload_params", "offload_param", warnings);   // older DeepSpeed
  map_pin_memory(z, warnings);
  rename(z, "zero_optimization", "stage3_gather_fp16_weights_on_model_save",
         "stage3_gather_16bit_weights_on_model_save", warnings);
  // DeepSpeed accepts the field names behind its stage3_* aliases too.
  for (const char* name : {"prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
                           "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
                           "module_granularity_threshold", "use_all_reduce_for_fetch_params"})
    rename(z, "zero_optimization", name, ("stage3_" + std::string(name)).c_str(), warnings, false);
}

}  // namespace

void map_deprecated(Json& root, std::vector<std::string>& warnings) {
  rename(root, "", "bfloat16", "bf16", warnings);
  map_zero_optimization(root, warnings);
  if (root.contains("aio") && root["aio"].is_object())
    rename(root["aio"], "aio", "thread_count", "intra_op_parallelism", warnings);
}

}  // namespace zero::config_detail
