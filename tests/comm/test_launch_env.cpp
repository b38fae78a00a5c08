// Launch contract: torchrun's, OpenMPI's and Slurm's variables, in that
// order, and torchrun's agent store.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>

#include "zero/comm.h"
#include "zero/error.h"

namespace {

const char* kAll[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "OMPI_COMM_WORLD_RANK",
                      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "ZERO_LAUNCHER", "ZERO_COMM_TIMEOUT"};

class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kAll) ::unsetenv(name);
  }
  void TearDown() override { SetUp(); }
  void set(const char* name, const char* value) { ::setenv(name, value, 1); }
};

TEST_F(LaunchEnv, NoVariablesMeansOneProcess) {
  auto info = zero::comm::LaunchInfo::from_env();
  EXPECT_EQ(info.source, "single");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  auto world = zero::comm::init_process_group(info);
  EXPECT_EQ(world->size(), 1);
  auto t = torch::arange(10).to(torch::kFloat);
  auto out = torch::empty({10});
  world->all_gather(out, t);
  EXPECT_TRUE(out.equal(t));
}

// A timeout that is not a number of seconds is named, not replaced by the
// default or handed to c10d (where 0 or -5 time out at once).
TEST_F(LaunchEnv, ABadCommTimeoutIsNamed) {
  for (const char* bad : {"abc", "0", "-5", "99999999999999999999", "10s"}) {
    set("ZERO_COMM_TIMEOUT", bad);
    try {
      zero::comm::init_process_group(zero::comm::LaunchInfo::from_env());
      ADD_FAILURE() << bad << " was accepted";
    } catch (const zero::CommError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("ZERO_COMM_TIMEOUT=") + bad +
                                           ": the seconds a collective may wait, a whole number from 1 to 604800"),
                std::string::npos)
          << e.what();
    }
  }
  set("ZERO_COMM_TIMEOUT", "45");
  EXPECT_EQ(zero::comm::init_process_group(zero::comm::LaunchInfo::from_env())->size(), 1);
}

// zero-run sets torchrun's variables and marks its ranks, so that errors
// name the launcher the user ran.
TEST_F(LaunchEnv, ZeroRunIsTorchrunsVariablesMarked) {
  set("RANK", "1"), set("WORLD_SIZE", "2"), set("ZERO_LAUNCHER", "zero-run");
  auto info = zero::comm::LaunchInfo::from_env();
  EXPECT_EQ(info.source, "zero-run");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.master_addr, "127.0.0.1");  // zero-run's default rendezvous, as torchrun's
}

TEST_F(LaunchEnv, Torchrun) {
  set("RANK", "5"), set("WORLD_SIZE", "8"), set("LOCAL_RANK", "1"), set("LOCAL_WORLD_SIZE", "4");
  set("MASTER_ADDR", "node0"), set("MASTER_PORT", "1234");
  auto info = zero::comm::LaunchInfo::from_env();
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "node0");
  EXPECT_EQ(info.master_port, 1234);
  EXPECT_FALSE(info.agent_store);
}

TEST_F(LaunchEnv, TorchrunAgentStorePrefix) {
  set("RANK", "0"), set("WORLD_SIZE", "2"), set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_RESTART_COUNT", "3");
  auto info = zero::comm::LaunchInfo::from_env();
  EXPECT_TRUE(info.agent_store);
  EXPECT_EQ(info.store_prefix, "/worker/attempt_3");
}

TEST_F(LaunchEnv, OpenMpiThenSlurm) {
  set("OMPI_COMM_WORLD_RANK", "2"), set("OMPI_COMM_WORLD_SIZE", "4"), set("OMPI_COMM_WORLD_LOCAL_RANK", "0");
  set("SLURM_PROCID", "7"), set("SLURM_NTASKS", "9");
  set("MASTER_ADDR", "10.0.0.1");
  auto info = zero::comm::LaunchInfo::from_env();
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 0);

  ::unsetenv("OMPI_COMM_WORLD_RANK"), ::unsetenv("OMPI_COMM_WORLD_SIZE");
  set("SLURM_LOCALID", "3");
  info = zero::comm::LaunchInfo::from_env();
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 7);
  EXPECT_EQ(info.world_size, 9);
  EXPECT_EQ(info.local_rank, 3);
}

TEST_F(LaunchEnv, BadValuesNameTheVariable) {
  set("RANK", "x"), set("WORLD_SIZE", "2");
  EXPECT_THROW(
      {
        try {
          zero::comm::LaunchInfo::from_env();
        } catch (const zero::CommError& e) {
          EXPECT_NE(std::string(e.what()).find("RANK='x'"), std::string::npos) << e.what();
          throw;
        }
      },
      zero::CommError);
  set("RANK", "2");
  EXPECT_THROW(zero::comm::LaunchInfo::from_env(), zero::CommError);  // rank 2 of 2
  ::unsetenv("RANK"), ::unsetenv("WORLD_SIZE");
  set("SLURM_PROCID", "0"), set("SLURM_NTASKS", "2");  // srun names no rendezvous host
  try {
    zero::comm::LaunchInfo::from_env();
    FAIL() << "expected CommError";
  } catch (const zero::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR"), std::string::npos) << e.what();
  }
}

// torchrun's agent hosts the store; workers connect under its prefix. Here
// this test plays the agent and launches two ranks with zero-run.
TEST_F(LaunchEnv, WorkersJoinTorchrunAgentStore) {
  c10d::TCPStoreOptions opts;
  opts.port = 0;
  opts.isServer = true;
  opts.waitWorkers = false;
  auto agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", opts);
  const std::string port = std::to_string(agent->getPort());
  // zero-run clears the agent-store variables it inherits (its ranks never
  // share torchrun's store), so each rank sets them as torchrun would.
  const std::string cmd = ZERO_RUN " --nproc 2 --master-port " + port +
                          " sh -c 'TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=1 exec " TEST_COLLECTIVES
                          " --gtest_filter=Collectives.AllGather*' > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_TRUE(agent->check({"/worker/attempt_1/zero/world/arrive/0", "/worker/attempt_1/zero/world/arrive/1"}));
}

}  // namespace
