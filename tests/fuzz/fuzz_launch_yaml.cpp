// Fuzz target: the YAML launch config reader (accelerate/launch_config.cpp),
// as zero-run --config-file and the Accelerator call it: a file read by
// LaunchConfig::from_file. Any bytes must give a config that keeps the
// reader's promises, or zero::ConfigError; anything else (yaml-cpp's own
// exceptions, std::bad_alloc, a crash, a hang) is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "memfd_file.h"
#include "zero/error.h"
#include "zero/launch_config.h"
#include "zero/launch_info.h"

namespace {

void check(const zero::LaunchConfig& c) {
  const bool type_known = c.distributed_type == "NO" || c.distributed_type == "MULTI_CPU" ||
                          c.distributed_type == "MULTI_GPU" || c.distributed_type == "DEEPSPEED";
  if (!type_known) std::abort();
  if (c.num_processes < 1 || c.num_processes > zero::comm::LaunchInfo::kMaxWorldSize) std::abort();
  if (c.num_machines < 1 || c.num_processes % c.num_machines != 0 || c.processes_per_machine() < 1) std::abort();
  if (c.machine_rank < 0 || c.machine_rank >= c.num_machines) std::abort();
  if (c.distributed_type == "NO" && c.num_processes != 1) std::abort();
  if (c.main_process_port < 0 || c.main_process_port > 65535) std::abort();
  if (c.num_machines > 1 && (c.main_process_ip.empty() || c.main_process_port == 0)) std::abort();
  if (c.deepspeed.zero_stage && (*c.deepspeed.zero_stage < 0 || *c.deepspeed.zero_stage > 3)) std::abort();
  if (c.deepspeed.gradient_clipping && !(*c.deepspeed.gradient_clipping >= 0)) std::abort();
  if (c.gradient_accumulation_steps && *c.gradient_accumulation_steps < 1) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_with(data, size);
  try {
    check(zero::LaunchConfig::from_file("/proc/self/fd/" + std::to_string(fd)));
  } catch (const zero::ConfigError&) {
  }
  ::close(fd);
  return 0;
}
