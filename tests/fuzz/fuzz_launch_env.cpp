// Fuzz target: the launch environment (torchrun, OpenMPI, Slurm variables).
// The input is lines NAME=VALUE; only the variables the parser reads are
// set. LaunchInfo::from_env must return a consistent job or throw
// zero::CommError.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "zero/error.h"
#include "zero/launch_info.h"

namespace {

const char* const kNames[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const char* name : kNames) ::unsetenv(name);
  std::istringstream lines(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = line.substr(0, eq), value = line.substr(eq + 1);
    for (const char* known : kNames)
      if (name == known && value.find('\0') == std::string::npos) ::setenv(known, value.c_str(), 1);
  }
  try {
    const zero::comm::LaunchInfo info = zero::comm::LaunchInfo::from_env();
    if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size) std::abort();
    if (info.world_size > zero::comm::LaunchInfo::kMaxWorldSize) std::abort();
    if (info.local_world_size < 1 || info.local_world_size > info.world_size) std::abort();
    if (info.local_rank < 0 || info.local_rank >= info.local_world_size) std::abort();
    if (info.master_port < 1 || info.master_port > 65535) std::abort();
    (void)info.describe();
  } catch (const zero::CommError&) {
  }
  return 0;
}
