// Launch contract: torchrun's, OpenMPI's and Slurm's variables, in that
// order, and torchrun's agent store.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

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

// A MASTER_ADDR that resolves to nothing is named as such, on rank 0 too
// (its store would otherwise report a connection failure or a busy port).
TEST_F(LaunchEnv, AnUnresolvableMasterAddrIsNamed) {
  set("RANK", "0"), set("WORLD_SIZE", "2"), set("MASTER_ADDR", "no-such-host.invalid"), set("MASTER_PORT", "29777");
  set("ZERO_COMM_TIMEOUT", "5");
  try {
    zero::comm::init_process_group(zero::comm::LaunchInfo::from_env());
    ADD_FAILURE() << "an unresolvable MASTER_ADDR was accepted";
  } catch (const zero::CommError& e) {
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR \"no-such-host.invalid\" does not resolve to an address"),
              std::string::npos) << e.what();
  }
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

// Every launch variable is a whole number in its range (core/env.h's
// parser, comm/launch_env.cpp's bounds); anything else is a CommError that
// names the variable, its value and the range, before any rendezvous.
TEST_F(LaunchEnv, BadValuesNameTheVariable) {
  struct Case {
    std::vector<std::pair<const char*, const char*>> env;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}},
       "RANK=x: this process's rank, below WORLD_SIZE=2, a whole number from 0 to 1; fix the torchrun command"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2: this process's rank, below WORLD_SIZE=2, a whole number from 0 to 1"},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK=-1: this process's rank, below WORLD_SIZE=2"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "100000000"}},
       "WORLD_SIZE=100000000: the number of ranks, a whole number from 1 to 65536"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0: the number of ranks, a whole number from 1 to 65536"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2 "}}, "WORLD_SIZE=2 : the number of ranks"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}, "WORLD_SIZE=99999999999999999999: the number of ranks"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "8"}},
       "LOCAL_WORLD_SIZE=8: the ranks on this machine, at most WORLD_SIZE=4, a whole number from 1 to 4"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}},
       "LOCAL_RANK=2: this process's rank on this machine, below LOCAL_WORLD_SIZE=2, a whole number from 0 to 1"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}},
       "MASTER_PORT=0: the TCP port of the rendezvous store, a whole number from 1 to 65535 (unset: 29500)"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}}, "MASTER_PORT=http: the TCP port"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
        {"TORCHELASTIC_RESTART_COUNT", "once"}},
       "TORCHELASTIC_RESTART_COUNT=once: torchrun's restarts so far, a whole number from 0 to 1073741824"},
      {{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "3"}, {"MASTER_ADDR", "h"}},
       "OMPI_COMM_WORLD_RANK=3: this process's rank, below OMPI_COMM_WORLD_SIZE=3, a whole number from 0 to 2; "
       "fix the mpirun command"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1e3"}, {"MASTER_ADDR", "h"}},
       "SLURM_NTASKS=1e3: the number of ranks, a whole number from 1 to 65536; fix the srun command"},
      // srun names no rendezvous host.
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, "launched by slurm with 2 ranks but MASTER_ADDR is not set"},
  };
  for (const Case& c : cases) {
    SetUp();
    std::string described;
    for (const auto& [name, value] : c.env) set(name, value), described += std::string(name) + "=" + value + " ";
    try {
      zero::comm::LaunchInfo::from_env();
      ADD_FAILURE() << described << "was accepted";
    } catch (const zero::CommError& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << described << "\n" << e.what();
    }
  }
}

// The same values given to a real rank (a test program joining the world
// from its environment, as every zero program does) end it at once with the
// message: WORLD_SIZE=100000000 waited 90 s without a word.
TEST_F(LaunchEnv, ABadLaunchVariableEndsARankAtOnce) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RANK=0 WORLD_SIZE=100000000", "WORLD_SIZE=100000000: the number of ranks, a whole number from 1 to 65536"},
      {"RANK=abc WORLD_SIZE=2", "RANK=abc: this process's rank, below WORLD_SIZE=2"},
      {"RANK=0 WORLD_SIZE=2 MASTER_PORT=99999", "MASTER_PORT=99999: the TCP port of the rendezvous store"},
      {"ZERO_COMM_TIMEOUT=-5", "ZERO_COMM_TIMEOUT=-5: the seconds a collective may wait, a whole number from 1 to 604800"},
      // Read once the ranks have met: both ranks of a real launch.
      {"ZERO_SHM_SLOT_KIB=lots " ZERO_RUN " --nproc 2",
       "ZERO_SHM_SLOT_KIB=lots: the KiB per rank of a shared-memory chunk, a whole number from 4 to 1048576"},
  };
  for (const auto& [env, message] : cases) {
    const std::string cmd = "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u MASTER_PORT " + env +
                            " timeout 60 " TEST_COLLECTIVES " --gtest_filter=Collectives.AllGather* 2>&1";
    const auto start = std::chrono::steady_clock::now();
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = ::pclose(p);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 124) << env << "\n" << out;
    EXPECT_NE(out.find(message), std::string::npos) << env << "\n" << out;
    EXPECT_EQ(out.find("terminate called"), std::string::npos) << env << "\n" << out;
    EXPECT_LT(seconds, 20.0) << env;
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
