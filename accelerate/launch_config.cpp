// Accelerate's YAML launch config, read with yaml-cpp (zero/launch_config.h).
// One concept over 400 lines: one YAML format, key by key, with the checks
// each key needs next to it.
#include "zero/launch_config.h"

#ifdef ZERO_HAVE_YAML
#include <yaml-cpp/yaml.h>

#include "accelerate/yaml_structure.h"
#endif

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <vector>

#include "core/did_you_mean.h"
#include "core/env.h"
#include "core/json_depth.h"
#include "core/regular_file.h"
#include "zero/error.h"
#include "zero/launch_info.h"

namespace zero {
namespace {

// A launch config is a few hundred bytes; 1 MiB leaves room for comments
// and is read in milliseconds. /dev/zero or a FIFO is refused before any
// byte is read (core/regular_file.h).
constexpr uint64_t kMaxLaunchConfigBytes = uint64_t{1} << 20;
// As deep as the JSON readers allow (core/json_depth.h); a launch config nests 2.
constexpr int kMaxLaunchConfigDepth = core::kMaxJsonDepth;

// The keys this reader takes (the branches of from_yaml and read_deepspeed).
const std::vector<std::string> kReadTop = {
    "compute_environment", "distributed_type",  "num_processes",   "num_machines",
    "machine_rank",        "main_process_ip",   "main_process_port", "mixed_precision",
    "use_cpu",             "gradient_accumulation_steps", "deepspeed_config"};
const std::vector<std::string> kReadDeepSpeed = {
    "deepspeed_config_file",       "zero_stage",              "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_clipping",        "gradient_accumulation_steps"};
// Keys Accelerate writes that have no meaning here; accepted silently.
const std::vector<std::string> kIgnoredTop = {
    "debug",         "downcast_bf16",    "enable_cpu_affinity", "gpu_ids",       "main_training_function",
    "rdzv_backend",  "same_network",     "tpu_env",             "tpu_use_cluster", "tpu_use_sudo",
    "tpu_name",      "tpu_zone",         "tpu_vm",              "commands",      "command_file",
    "dynamo_config", "dynamo_backend",   "ipex_config",         "mpirun_config", "megatron_lm_config",
    "fsdp_config",   "fp8_config",       "num_cpu_threads_per_process"};
const std::vector<std::string> kIgnoredDeepSpeed = {
    "deepspeed_hostfile",   "deepspeed_multinode_launcher", "zero3_init_flag",           "zero3_save_16bit_model",
    "deepspeed_moe_layer_cls_names", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter"};

#ifdef ZERO_HAVE_YAML
bool listed(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

using text::lower;

std::string list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw ConfigError(where() + ": " + (key.empty() ? "" : key + ": ") + problem);
  }
  std::string where() const { return source_.empty() ? "launch config" : "launch config " + source_; }

  // A scalar's text; null (`key:` or `~`) is "not given".
  std::optional<std::string> scalar(const YAML::Node& n, const std::string& key) const {
    if (!n || n.IsNull()) return std::nullopt;
    if (!n.IsScalar()) fail(key, std::string("expected a single value, found a ") + (n.IsMap() ? "mapping" : "list"));
    return n.Scalar();
  }

  std::optional<int64_t> integer(const YAML::Node& n, const std::string& key, int64_t min, int64_t max) const {
    auto text = scalar(n, key);
    if (!text) return std::nullopt;
    if (!env::parse_whole_number(*text, LLONG_MIN, LLONG_MAX)) fail(key, "expected an integer, found '" + *text + "'");
    auto v = env::parse_whole_number(*text, min, max);
    if (!v) fail(key, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], found " + *text);
    return *v;
  }

  std::optional<double> number(const YAML::Node& n, const std::string& key) const {
    auto text = scalar(n, key);
    if (!text) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text->c_str(), &end);
    if (text->empty() || *end != '\0' || errno == ERANGE) fail(key, "expected a number, found '" + *text + "'");
    if (v < 0) fail(key, "must be >= 0, found " + *text);
    return v;
  }

  std::optional<bool> boolean(const YAML::Node& n, const std::string& key) const {
    auto text = scalar(n, key);
    if (!text) return std::nullopt;
    const std::string t = lower(*text);
    if (t == "true" || t == "yes") return true;
    if (t == "false" || t == "no") return false;
    fail(key, "expected true or false, found '" + *text + "'");
  }

  // A value out of `allowed` (compared case-insensitively; returned as listed).
  std::optional<std::string> choice(const YAML::Node& n, const std::string& key,
                                    const std::vector<std::string>& allowed) const {
    auto text = scalar(n, key);
    if (!text) return std::nullopt;
    for (const auto& a : allowed) {
      if (lower(a) == lower(*text)) return a;
    }
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    fail(key, "expected one of " + list + ", found '" + *text + "'");
  }

  // Note [Unknown keys]
  // A key this reader neither reads nor knows as Accelerate's is an error, as
  // in a ds_config (config/config_reader.cpp): a typo (zero_stgae) must not
  // train with the default it leaves in place. The message names the nearest
  // key of the same mapping, else the same key in the other mapping (a
  // deepspeed_config key at the top, or the reverse), else the keys read there.
  [[noreturn]] void unknown(const std::string& key, bool in_deepspeed) const {
    const auto& read = in_deepspeed ? kReadDeepSpeed : kReadTop;
    const auto here = joined(read, in_deepspeed ? kIgnoredDeepSpeed : kIgnoredTop);
    const auto& other_read = in_deepspeed ? kReadTop : kReadDeepSpeed;
    const std::string other_prefix = in_deepspeed ? "" : "deepspeed_config.";
    const std::string path = in_deepspeed ? "deepspeed_config." + key : key;
    std::string message = "unknown key";
    if (auto guess = text::nearest(key, here)) {
      message += "; did you mean \"" + *guess + "\"?";
    } else if (auto elsewhere = text::nearest(key, other_read)) {
      message += "; did you mean \"" + other_prefix + *elsewhere + "\"" +
                 (in_deepspeed ? " (a top-level key, outside deepspeed_config)" : "") + "?";
    } else {
      message += (in_deepspeed ? "; deepspeed_config takes " : "; zero reads ") + list(read) +
                 (in_deepspeed ? "" : " (and accepts the other keys Accelerate writes)") +
                 "; correct the key or remove it";
    }
    fail(path, message);
  }

 private:
  std::string source_;
};

// A mapping's key as text; a key that is a list, a mapping or null is an
// error naming where it is (yaml-cpp's as<std::string> would throw
// TypedBadConversion, which no caller expects).
std::string key_of(const Reader& r, const YAML::Node& key, const std::string& within) {
  if (key.IsScalar()) return key.Scalar();
  const char* kind = key.IsMap() ? "a mapping" : key.IsSequence() ? "a list" : "empty";
  r.fail(within, std::string("a key at line ") + std::to_string(key.Mark().line + 1) + " is " + kind +
                     "; keys are plain names such as num_processes");
}

std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

void read_deepspeed(const Reader& r, const YAML::Node& node, LaunchConfig& c) {
  if (!node.IsMap()) r.fail("deepspeed_config", "expected a mapping of keys");
  auto& ds = c.deepspeed;
  std::vector<std::string> given;
  for (const auto& kv : node) {
    const std::string key = key_of(r, kv.first, "deepspeed_config");
    const std::string path = "deepspeed_config." + key;
    const YAML::Node& v = kv.second;
    if (key == "deepspeed_config_file") {
      ds.config_file = r.scalar(v, path).value_or("");
      continue;
    }
    if (key == "zero_stage") {
      if (auto s = r.integer(v, path, 0, 3)) ds.zero_stage = static_cast<int>(*s);
    } else if (key == "offload_optimizer_device") {
      ds.offload_optimizer_device = r.choice(v, path, {"none", "cpu", "nvme"});
    } else if (key == "offload_param_device") {
      ds.offload_param_device = r.choice(v, path, {"none", "cpu", "nvme"});
    } else if (key == "offload_optimizer_nvme_path") {
      ds.offload_optimizer_nvme_path = r.scalar(v, path).value_or("");
    } else if (key == "offload_param_nvme_path") {
      ds.offload_param_nvme_path = r.scalar(v, path).value_or("");
    } else if (key == "gradient_clipping") {
      ds.gradient_clipping = r.number(v, path);
    } else if (key == "gradient_accumulation_steps") {
      ds.gradient_accumulation_steps = r.integer(v, path, 1, 1 << 30);
    } else if (listed(kIgnoredDeepSpeed, key)) {
      continue;
    } else {
      r.unknown(key, true);
    }
    if (!v.IsNull()) given.push_back(key);
  }
  if (!ds.config_file.empty()) {
    if (!given.empty()) {
      std::string keys;
      for (const auto& k : given) keys += (keys.empty() ? "" : ", ") + k;
      r.fail("deepspeed_config", "gives deepspeed_config_file and also " + keys +
                                     "; with a ds_config file, set these in that file and remove them here");
    }
    if (ds.config_file[0] != '/') ds.config_file = folder_of(c.source) + ds.config_file;
  }
  if (ds.offload_optimizer_device == std::string("nvme") && ds.offload_optimizer_nvme_path.empty()) {
    r.fail("deepspeed_config.offload_optimizer_nvme_path", "missing: offload_optimizer_device nvme needs a folder");
  }
  if (ds.offload_param_device == std::string("nvme") && ds.offload_param_nvme_path.empty()) {
    r.fail("deepspeed_config.offload_param_nvme_path", "missing: offload_param_device nvme needs a folder");
  }
}

#endif  // ZERO_HAVE_YAML

}  // namespace

LaunchConfig LaunchConfig::from_file(const std::string& path) {
  std::string text, error;
  if (!core::read_regular_file(path, kMaxLaunchConfigBytes, text, error)) {
    const bool missing = ::access(path.c_str(), F_OK) != 0 && errno == ENOENT;
    throw ConfigError("launch config " + path + ": cannot be read: " + error +
                      (missing ? "; write one with `zero-run config --output " + path + "`" : ""));
  }
  return from_yaml(text, path);
}

#ifndef ZERO_HAVE_YAML
LaunchConfig LaunchConfig::from_yaml(const std::string&, const std::string& source) {
  throw ConfigError("launch config " + source + ": this build of zero has no YAML reader; install Debian's "
                    "libyaml-cpp-dev (tools/setup-deps.sh does) and build again");
}
#else
namespace {

LaunchConfig read_yaml(const Reader& r, const std::string& text, const std::string& source) {
  LaunchConfig c;
  c.source = source;
  if (text.size() > kMaxLaunchConfigBytes) {
    r.fail("", "has " + std::to_string(text.size()) + " bytes, more than the " + std::to_string(kMaxLaunchConfigBytes) +
                   " a launch config may have");
  }
  YAML::Node root;
  try {
    // Note [Launch config structure]
    launch_yaml::check_structure(text, kMaxLaunchConfigDepth,
                                 [&](const std::string& path, const std::string& problem) { r.fail(path, problem); });
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    r.fail("", "is not valid YAML: " + std::string(e.what()));
  }
  if (!root || root.IsNull()) r.fail("", "is empty; write one with `zero-run config`");
  if (!root.IsMap()) r.fail("", "expected a mapping of keys at the top");

  bool have_processes = false, have_type = false;
  for (const auto& kv : root) {
    const std::string key = key_of(r, kv.first, "");
    const YAML::Node& v = kv.second;
    if (key == "compute_environment") {
      auto env = r.scalar(v, key);
      if (env && *env != "LOCAL_MACHINE") {
        r.fail(key, "'" + *env + "' is not available; zero launches on LOCAL_MACHINE (one or more machines you start "
                               "zero-run on)");
      }
    } else if (key == "distributed_type") {
      auto t = r.scalar(v, key);
      if (!t) continue;
      const std::string type = *t;
      if (type == "FSDP") {
        r.fail(key, "FSDP is not available in zero; use DEEPSPEED with deepspeed_config.zero_stage 3 (what FSDP's "
                    "FULL_SHARD does) or 2 (SHARD_GRAD_OP)");
      }
      c.distributed_type = *r.choice(v, key, {"NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED"});
      have_type = true;
    } else if (key == "num_processes") {
      if (auto n = r.integer(v, key, 1, comm::LaunchInfo::kMaxWorldSize)) c.num_processes = static_cast<int>(*n), have_processes = true;
    } else if (key == "num_machines") {
      if (auto n = r.integer(v, key, 1, comm::LaunchInfo::kMaxWorldSize)) c.num_machines = static_cast<int>(*n);
    } else if (key == "machine_rank") {
      if (auto n = r.integer(v, key, 0, comm::LaunchInfo::kMaxWorldSize - 1)) c.machine_rank = static_cast<int>(*n);
    } else if (key == "main_process_ip") {
      c.main_process_ip = r.scalar(v, key).value_or("");
    } else if (key == "main_process_port") {
      if (auto n = r.integer(v, key, 1, 65535)) c.main_process_port = static_cast<int>(*n);
    } else if (key == "mixed_precision") {
      // YAML 1.1 reads an unquoted no as a boolean; its text is still "no".
      c.mixed_precision = r.choice(v, key, {"no", "fp16", "bf16"});
    } else if (key == "use_cpu") {
      c.use_cpu = r.boolean(v, key).value_or(false);
    } else if (key == "gradient_accumulation_steps") {
      c.gradient_accumulation_steps = r.integer(v, key, 1, 1 << 30);
    } else if (key == "deepspeed_config") {
      if (!v.IsNull()) read_deepspeed(r, v, c);
    } else if (!listed(kIgnoredTop, key)) {
      r.unknown(key, false);
    }
  }

  if (!have_processes) r.fail("num_processes", "missing: how many ranks to start on all machines together");
  if (!have_type) r.fail("distributed_type", "missing: NO, MULTI_CPU, MULTI_GPU or DEEPSPEED");
  if (c.distributed_type == "NO" && c.num_processes > 1) {
    r.fail("distributed_type", "NO runs one process, but num_processes is " + std::to_string(c.num_processes) +
                                   "; use MULTI_CPU, MULTI_GPU or DEEPSPEED");
  }
  if (c.num_processes % c.num_machines != 0) {
    r.fail("num_processes", std::to_string(c.num_processes) + " does not divide evenly over num_machines " +
                                std::to_string(c.num_machines) + " (every machine starts the same number of ranks)");
  }
  if (c.machine_rank >= c.num_machines) {
    r.fail("machine_rank", "must be below num_machines " + std::to_string(c.num_machines) + ", found " +
                               std::to_string(c.machine_rank));
  }
  if (c.num_machines > 1 && (c.main_process_ip.empty() || c.main_process_port == 0)) {
    r.fail(c.main_process_ip.empty() ? "main_process_ip" : "main_process_port",
           "missing: with num_machines > 1 every machine must name machine 0's address and port");
  }
  if (c.distributed_type != "DEEPSPEED" &&
      (!c.deepspeed.config_file.empty() || c.deepspeed.zero_stage || c.deepspeed.offload_optimizer_device)) {
    c.warnings.push_back(r.where() + ": deepspeed_config is read only with distributed_type DEEPSPEED (this file "
                                     "has " + c.distributed_type + ")");
  }
  if (c.gradient_accumulation_steps && c.deepspeed.gradient_accumulation_steps &&
      *c.gradient_accumulation_steps != *c.deepspeed.gradient_accumulation_steps) {
    r.fail("gradient_accumulation_steps", std::to_string(*c.gradient_accumulation_steps) +
                                              " conflicts with deepspeed_config.gradient_accumulation_steps " +
                                              std::to_string(*c.deepspeed.gradient_accumulation_steps));
  }
  return c;
}

}  // namespace

LaunchConfig LaunchConfig::from_yaml(const std::string& text, const std::string& source) {
  Reader r(source);
  try {
    return read_yaml(r, text, source);
  } catch (const YAML::Exception& e) {  // a slip in the reader: still a ConfigError naming the file
    r.fail("", "cannot be read: " + std::string(e.what()));
  }
}
#endif  // ZERO_HAVE_YAML

std::string default_launch_config_yaml(const LaunchConfigAnswers& a) {
  const int processes = a.num_processes > 0 ? a.num_processes
                        : a.gpus_found > 0  ? a.gpus_found
                                            : std::min(2, std::max(1, a.cpus_found));
  std::string type = a.distributed_type;
  if (type.empty()) type = processes == 1 ? "NO" : a.gpus_found > 0 ? "MULTI_GPU" : "MULTI_CPU";
  std::ostringstream y;
  y << "# zero launch config, in Hugging Face Accelerate's format.\n"
       "#   zero-run --config-file THIS_FILE PROGRAM [ARGS...]\n"
       "# starts the ranks; zero::Accelerator in PROGRAM reads the same file.\n"
       "# Written for a machine with "
    << a.gpus_found << " GPU(s) and " << a.cpus_found
    << " CPU(s).\n"
       "\n"
       "compute_environment: LOCAL_MACHINE\n"
       "# NO (one process), MULTI_CPU, MULTI_GPU (plain data parallelism: ZeRO stage 0)\n"
       "# or DEEPSPEED (ZeRO, with the deepspeed_config block below).\n"
       "distributed_type: "
    << type
    << "\n"
       "# Ranks on all machines together; zero-run starts num_processes / num_machines here.\n"
       "num_processes: "
    << processes << "\nnum_machines: " << a.num_machines << "\nmachine_rank: " << a.machine_rank << "\n";
  y << "# Machine 0's address and port; needed when num_machines > 1 (one machine: 127.0.0.1 and a free port).\n";
  if (a.main_process_ip.empty()) {
    y << "# main_process_ip: 10.0.0.1\n";
  } else {
    y << "main_process_ip: " << a.main_process_ip << "\n";
  }
  if (a.main_process_port == 0) {
    y << "# main_process_port: 29500\n";
  } else {
    y << "main_process_port: " << a.main_process_port << "\n";
  }
  y << "# 'no', fp16 or bf16 (quote 'no': YAML reads a bare no as false). A ds_config\n"
       "# file that sets fp16/bf16 itself must agree.\n"
       "mixed_precision: '"
    << a.mixed_precision
    << "'\n"
       "# Micro-batches per optimizer step.\n"
       "gradient_accumulation_steps: "
    << a.gradient_accumulation_steps << "\n";
  if (type == "DEEPSPEED") {
    y << "deepspeed_config:\n";
    if (!a.deepspeed_config_file.empty()) {
      y << "  # A ds_config JSON file (relative to this file); it holds every ZeRO setting.\n"
           "  deepspeed_config_file: "
        << a.deepspeed_config_file << "\n";
    } else {
      y << "  # 0: plain data parallelism; 1: optimizer states sharded; 2: + gradients; 3: + parameters.\n"
           "  zero_stage: "
        << a.zero_stage
        << "\n"
           "  # none, cpu or nvme (nvme also needs offload_optimizer_nvme_path / offload_param_nvme_path).\n"
           "  offload_optimizer_device: "
        << a.offload_optimizer_device << "\n  offload_param_device: " << a.offload_param_device
        << "\n"
           "  # Max global gradient norm; 0.0: no clipping.\n"
           "  gradient_clipping: "
        << a.gradient_clipping
        << "\n"
           "  # Or one ds_config file instead of the keys above:\n"
           "  # deepspeed_config_file: ds_config.json\n";
    }
  }
  return y.str();
}

}  // namespace zero
