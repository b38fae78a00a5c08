#pragma once
// A launch config file in Hugging Face Accelerate's YAML shape: what
// `accelerate config` writes and `accelerate launch` reads. zero-run reads it
// (`zero-run --config-file FILE PROGRAM`) to start the ranks, and the
// Accelerator (zero/accelerate.h) reads the same file for mixed precision,
// accumulation and the ZeRO settings. `zero-run config` writes a commented
// default one.
//
//   compute_environment: LOCAL_MACHINE
//   distributed_type: DEEPSPEED        # NO | MULTI_CPU | MULTI_GPU | DEEPSPEED
//   num_processes: 4                   # all machines together
//   num_machines: 1
//   machine_rank: 0
//   main_process_ip: 127.0.0.1         # num_machines > 1 only
//   main_process_port: 29500
//   mixed_precision: 'no'              # 'no' | fp16 | bf16 (quoted: YAML reads no as false)
//   gradient_accumulation_steps: 1
//   deepspeed_config:
//     zero_stage: 2
//     offload_optimizer_device: none   # none | cpu | nvme
//     offload_param_device: none
//     gradient_clipping: 1.0
//     # or, instead of the keys above: deepspeed_config_file: ds_config.json
//
// Rules: a key Accelerate writes that means nothing here (gpu_ids,
// rdzv_backend, tpu_*, dynamo_config, ...) is accepted silently; any other
// key is a ConfigError naming the file, the key and the nearest known key,
// as an unknown ds_config key is (`deepspeed_config.zero_stgae: unknown key;
// did you mean "zero_stage"?`), so that a typo never trains with a default;
// a wrong type is a ConfigError naming the key, what was expected and what
// was found. Torch-free (zero-run links it).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zero {

struct LaunchConfig {
  std::string source;                         // the file, or "" for from_yaml
  std::string compute_environment = "LOCAL_MACHINE";
  std::string distributed_type = "NO";
  int num_processes = 1;
  int num_machines = 1;
  int machine_rank = 0;
  std::string main_process_ip;                // "": 127.0.0.1 on one machine
  int main_process_port = 0;                  // 0: a free port on one machine
  std::optional<std::string> mixed_precision; // "no" | "fp16" | "bf16"
  bool use_cpu = false;
  std::optional<int64_t> gradient_accumulation_steps;

  // "deepspeed_config" (distributed_type DEEPSPEED).
  struct DeepSpeed {
    std::string config_file;                  // deepspeed_config_file, relative to the launch config
    std::optional<int> zero_stage;
    std::optional<std::string> offload_optimizer_device;  // none | cpu | nvme
    std::optional<std::string> offload_param_device;
    std::string offload_optimizer_nvme_path;
    std::string offload_param_nvme_path;
    std::optional<double> gradient_clipping;
    std::optional<int64_t> gradient_accumulation_steps;
  } deepspeed;

  // Settings read but without effect (deepspeed_config under another
  // distributed_type), one line each; whoever reads the file prints them.
  std::vector<std::string> warnings;

  // Throws zero::ConfigError naming the file, the key and the problem.
  static LaunchConfig from_file(const std::string& path);
  static LaunchConfig from_yaml(const std::string& text, const std::string& source = "");

  // Ranks zero-run starts on this machine: num_processes / num_machines.
  int processes_per_machine() const { return num_processes / num_machines; }
};

// The answers `zero-run config` takes as flags (Accelerate's questions).
struct LaunchConfigAnswers {
  std::string distributed_type;   // "": MULTI_GPU with GPUs, else MULTI_CPU (NO for one process)
  int num_processes = 0;          // 0: the GPUs found, else 2 ranks (1 on a one-core machine)
  int num_machines = 1;
  int machine_rank = 0;
  std::string main_process_ip;
  int main_process_port = 0;
  std::string mixed_precision = "no";
  int64_t gradient_accumulation_steps = 1;
  int zero_stage = 2;             // with distributed_type DEEPSPEED
  std::string offload_optimizer_device = "none";
  std::string offload_param_device = "none";
  double gradient_clipping = 0.0;
  std::string deepspeed_config_file;
  int gpus_found = 0;             // filled in by the caller from the machine
  int cpus_found = 1;
};

// A commented YAML launch config from the answers (what `zero-run config`
// writes); from_yaml reads it back to the same values.
std::string default_launch_config_yaml(const LaunchConfigAnswers& answers);

}  // namespace zero
