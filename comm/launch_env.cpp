// Where this process sits in the job, from the variables its launcher set.
// Order: torchrun (and our zero-run, which sets the same and marks its ranks
// with ZERO_LAUNCHER=zero-run, tools/launcher/environment.cpp), OpenMPI, Slurm.
// Every number is parsed by env::number (core/env.h) with its range, so a
// bad one is an error naming the variable before any rendezvous.
#include <sstream>

#include "core/env.h"
#include "zero/launch_info.h"
#include "zero/error.h"

namespace zero::comm {
namespace {

// The variables one launcher sets.
struct Names {
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr Names kTorchrun{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr Names kOpenMpi{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                         "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr Names kSlurm{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};

int number(const char* name, std::optional<long long> fallback, long long min, long long max,
           const std::string& meaning, const std::string& launcher) {
  const env::Number n = env::number(name, fallback, min, max, meaning);
  if (!n.error.empty()) {
    throw CommError(n.error + "; fix the " + launcher + " command or environment that set it");
  }
  return static_cast<int>(n.value);
}

// The world first, so that the ranks are checked against it.
void read_ranks(const Names& v, const std::string& launcher, LaunchInfo& info) {
  info.world_size = number(v.world_size, std::nullopt, 1, LaunchInfo::kMaxWorldSize, "the number of ranks", launcher);
  const std::string world = std::string(v.world_size) + "=" + std::to_string(info.world_size);
  info.rank = number(v.rank, std::nullopt, 0, info.world_size - 1, "this process's rank, below " + world, launcher);
  info.local_world_size = number(v.local_world_size, info.world_size, 1, info.world_size,
                                 "the ranks on this machine, at most " + world, launcher);
  const std::string local = std::string(v.local_world_size) + "=" + std::to_string(info.local_world_size);
  info.local_rank = number(v.local_rank, info.rank % info.local_world_size, 0, info.local_world_size - 1,
                           "this process's rank on this machine, below " + local, launcher);
}

}  // namespace

LaunchInfo LaunchInfo::from_env() {
  LaunchInfo info;
  if (env::is_set("RANK") && env::is_set("WORLD_SIZE")) {
    info.source = env::get("ZERO_LAUNCHER") == "zero-run" ? "zero-run" : "torchrun";
    read_ranks(kTorchrun, info.source, info);
    info.agent_store = env::get("TORCHELASTIC_USE_AGENT_STORE") == "True";
    if (info.agent_store) {
      const int restarts = number("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 30, "torchrun's restarts so far", "torchrun");
      info.store_prefix = "/worker/attempt_" + std::to_string(restarts);
    }
  } else if (env::is_set("OMPI_COMM_WORLD_RANK") && env::is_set("OMPI_COMM_WORLD_SIZE")) {
    info.source = "openmpi";
    read_ranks(kOpenMpi, "mpirun", info);
  } else if (env::is_set("SLURM_PROCID") && env::is_set("SLURM_NTASKS")) {
    info.source = "slurm";
    read_ranks(kSlurm, "srun", info);
  } else {
    return info;  // a single process
  }
  info.master_addr = env::get("MASTER_ADDR", "127.0.0.1");
  info.master_port = number("MASTER_PORT", 29500, 1, 65535, "the TCP port of the rendezvous store", info.source);
  if (info.world_size > 1 && info.source != "torchrun" && info.source != "zero-run" &&
      !env::is_set("MASTER_ADDR")) {
    // mpirun and srun do not name a rendezvous host: the user must.
    throw CommError("launched by " + info.source + " with " + std::to_string(info.world_size) +
                    " ranks but MASTER_ADDR is not set: export MASTER_ADDR=<host of rank 0> "
                    "(and MASTER_PORT) for every rank");
  }
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
