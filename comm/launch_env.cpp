// Where this process sits in the job, from the variables its launcher set.
// Order: torchrun (and our zero-run, which sets the same and marks its ranks
// with ZERO_LAUNCHER=zero-run, tools/launcher/environment.cpp), OpenMPI, Slurm.
#include <sstream>

#include "core/env.h"
#include "zero/launch_info.h"
#include "zero/error.h"

namespace zero::comm {
namespace {

int required_int(const char* name) {
  const std::string text = env::get(name);
  try {
    size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw CommError(std::string("environment variable ") + name + "='" + text +
                  "' is not an integer; fix the launch command that set it");
}

int optional_int(const char* name, int fallback) {
  return env::is_set(name) ? required_int(name) : fallback;
}

void validate(const LaunchInfo& info) {
  if (info.world_size < 1 || info.rank < 0 || info.rank >= info.world_size) {
    std::ostringstream msg;
    msg << "launch environment (" << info.source << ") gives rank " << info.rank << " of world size "
        << info.world_size << ": the rank must be in [0, world size)";
    throw CommError(msg.str());
  }
  if (info.master_port <= 0 || info.master_port > 65535) {
    throw CommError("MASTER_PORT=" + std::to_string(info.master_port) + " is not a TCP port (1-65535)");
  }
}

}  // namespace

LaunchInfo LaunchInfo::from_env() {
  LaunchInfo info;
  if (env::is_set("RANK") && env::is_set("WORLD_SIZE")) {
    info.source = env::get("ZERO_LAUNCHER") == "zero-run" ? "zero-run" : "torchrun";
    info.rank = required_int("RANK");
    info.world_size = required_int("WORLD_SIZE");
    info.local_rank = optional_int("LOCAL_RANK", info.rank);
    info.local_world_size = optional_int("LOCAL_WORLD_SIZE", info.world_size);
    info.agent_store = env::get("TORCHELASTIC_USE_AGENT_STORE") == "True";
    if (info.agent_store) {
      info.store_prefix = "/worker/attempt_" + env::get("TORCHELASTIC_RESTART_COUNT", "0");
    }
  } else if (env::is_set("OMPI_COMM_WORLD_RANK") && env::is_set("OMPI_COMM_WORLD_SIZE")) {
    info.source = "openmpi";
    info.rank = required_int("OMPI_COMM_WORLD_RANK");
    info.world_size = required_int("OMPI_COMM_WORLD_SIZE");
    info.local_rank = optional_int("OMPI_COMM_WORLD_LOCAL_RANK", info.rank);
    info.local_world_size = optional_int("OMPI_COMM_WORLD_LOCAL_SIZE", info.world_size);
  } else if (env::is_set("SLURM_PROCID") && env::is_set("SLURM_NTASKS")) {
    info.source = "slurm";
    info.rank = required_int("SLURM_PROCID");
    info.world_size = required_int("SLURM_NTASKS");
    info.local_rank = optional_int("SLURM_LOCALID", info.rank);
    info.local_world_size = optional_int("SLURM_NTASKS_PER_NODE", info.world_size);
  } else {
    return info;  // a single process
  }
  info.master_addr = env::get("MASTER_ADDR", "127.0.0.1");
  info.master_port = optional_int("MASTER_PORT", 29500);
  if (info.world_size > 1 && info.source != "torchrun" && info.source != "zero-run" &&
      !env::is_set("MASTER_ADDR")) {
    // mpirun and srun do not name a rendezvous host: the user must.
    throw CommError("launched by " + info.source + " with " + std::to_string(info.world_size) +
                    " ranks but MASTER_ADDR is not set: export MASTER_ADDR=<host of rank 0> "
                    "(and MASTER_PORT) for every rank");
  }
  validate(info);
  return info;
}

std::string LaunchInfo::describe() const {
  std::ostringstream out;
  out << "rank " << rank << "/" << world_size << " (local " << local_rank << "/" << local_world_size
      << ", from " << source << ")";
  if (world_size > 1) out << ", store " << master_addr << ":" << master_port << (agent_store ? " (torchrun agent)" : "");
  return out.str();
}

}  // namespace zero::comm
