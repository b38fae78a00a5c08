#pragma once
// LaunchInfo: the job as the launcher described it in the environment.
// Torch-free, so that the parser can be tested and fuzzed on its own.
#include <string>

namespace zero::comm {

// Where this process sits in the job, read from the environment: torchrun
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
// else OpenMPI (OMPI_COMM_WORLD_*), else Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID); none of them means a single process.
struct LaunchInfo {
  // The most ranks a job may have. Far above any job run with ZeRO so far;
  // a world size past it is a typo (WORLD_SIZE=100000000 would otherwise
  // wait for ranks that never come), refused by name at every entry point:
  // the launch variables, zero-run's --nproc x --nnodes and a launch
  // config's num_processes.
  static constexpr int kMaxWorldSize = 65536;

  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun with TORCHELASTIC_USE_AGENT_STORE=True: its agent already runs
  // the store, workers connect as clients under store_prefix.
  bool agent_store = false;
  std::string store_prefix;
  std::string source = "single";  // "zero-run", "torchrun", "openmpi", "slurm" or "single"

  static LaunchInfo from_env();
  std::string describe() const;
};

}  // namespace zero::comm
