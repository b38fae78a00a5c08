// Fault scenarios, run on 3 ranks through zero-run. The ranks that stay
// must fail within seconds with a CommError naming the rank at fault; each
// checks its own error and exits 0 only if it is the expected one.
// broken-connect instead checks that the group recovers.
// shm-fallback checks that a group whose shared-memory segment could not be
// made uses gloo. ctest runs the failure scenarios over both host transports
// (ZERO_HOST_TRANSPORT).
//   comm_faults early-exit | crash | rank0-crash | never-arrives | mismatch | size-mismatch | broken-connect |
//               shm-fallback
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>

#include "zero/comm.h"
#include "zero/error.h"

namespace {

using Clock = std::chrono::steady_clock;

int expect_error(const std::function<void()>& body, const std::vector<std::string>& needles, double max_seconds) {
  const auto start = Clock::now();
  try {
    body();
  } catch (const zero::CommError& e) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const std::string what = e.what();
    std::cout << "got CommError after " << seconds << " s: " << what << std::endl;
    for (const auto& needle : needles) {
      if (what.find(needle) == std::string::npos) {
        std::cout << "FAIL: the error does not mention '" << needle << "'" << std::endl;
        return 1;
      }
    }
    if (seconds > max_seconds) {
      std::cout << "FAIL: took " << seconds << " s, more than " << max_seconds << " s" << std::endl;
      return 1;
    }
    return 0;
  }
  std::cout << "FAIL: no CommError" << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  auto launch = zero::comm::LaunchInfo::from_env();

  if (scenario == "never-arrives") {
    // Every rank believes the world has one more rank than was started.
    const int started = launch.world_size;
    launch.world_size += 1;
    return expect_error([&] { zero::comm::init_process_group(launch); },
                        {"missing rank " + std::to_string(started), "rendezvous timed out"}, 10);
  }

  auto world = zero::comm::init_process_group(launch);
  auto t = torch::ones({1 << 20});
  world->all_reduce(t);  // everyone is connected and working

  if (scenario == "broken-connect") {
    // ZERO_FAULT=comm.connected:1 (set by the test) broke rank 1's first
    // connection after its peers had connected: every rank connected the
    // world again (rank 0 warns, which the test's regular expression looks
    // for), and the collectives work, on the world and on a new subgroup.
    try {
      auto pair = world->new_group({1, 2});
      auto u = torch::ones({3});
      if (pair) pair->all_reduce(u);
      const float expected_u = pair ? 2.0f : 1.0f;
      if (t[0].item<float>() != world->size() || u[0].item<float>() != expected_u) {
        std::cout << "FAIL: rank " << world->rank() << " all-reduced " << t[0].item<float>() << " and "
                  << u[0].item<float>() << std::endl;
        return 1;
      }
      std::cout << "rank " << world->rank() << " after reconnecting: all_reduce gives " << t[0].item<float>()
                << std::endl;
      return 0;
    } catch (const std::exception& e) {
      std::cout << "FAIL: " << e.what() << std::endl;
      return 1;
    }
  }
  if (scenario == "shm-fallback") {
    if (world->host_transport() != "gloo" || t[0].item<float>() != world->size()) {
      std::cout << "FAIL: rank " << world->rank() << " uses " << world->host_transport() << " and all-reduced "
                << t[0].item<float>() << std::endl;
      return 1;
    }
    return 0;
  }
  if (scenario == "early-exit" || scenario == "crash") {
    if (world->rank() == 1) {
      if (scenario == "crash") ::_exit(0);  // no goodbye: as if killed
      world.reset();                         // a clean exit
      return 0;
    }
    const std::string why = scenario == "crash" ? "rank 1 stopped responding" : "rank 1 has exited";
    return expect_error([&] { for (int i = 0; i < 100; ++i) world->all_reduce(t); }, {why}, 10);
  }
  if (scenario == "rank0-crash") {
    if (world->rank() == 0) ::_exit(0);
    return expect_error([&] { for (int i = 0; i < 100; ++i) world->all_reduce(t); }, {"rank 0"}, 10);
  }
  if (scenario == "mismatch") {
    // Rank 1 calls a barrier while the others all-reduce: gloo waits until
    // the timeout (ZERO_COMM_TIMEOUT), then the diagnosis says why.
    return expect_error([&] { world->rank() == 1 ? world->barrier() : world->all_reduce(t); },
                        {"different collectives"}, 15);
  }
  if (scenario == "size-mismatch" && world->host_transport() == "shm") {
    // Over shared memory every rank sees what the others passed at the
    // collective's first barrier: all fail at once, naming both sizes.
    auto u = torch::ones({(1 << 20) + (world->rank() == 1 ? 16 : 0)});
    return expect_error([&] { world->all_reduce(u); },
                        {"all_reduce", "4194304", "4194368", "the ranks passed tensors of different sizes"}, 5);
  }
  if ((scenario == "size-mismatch" || scenario == "mismatch") && std::getenv("ZERO_CHECK_COLLECTIVES") &&
      std::string(std::getenv("ZERO_CHECK_COLLECTIVES")) == "1") {
    // Note [Checked collectives] in comm/gloo.cpp: every rank exchanges what
    // it passes first, so all fail at once with one CommError naming the
    // collective and every rank's size (or collective), before gloo runs it.
    if (scenario == "mismatch") {
      return expect_error([&] { world->rank() == 1 ? world->barrier() : world->all_reduce(t); },
                          {"the ranks issued different collectives", "rank 0: all_reduce (sum) of 4194304 bytes of Float",
                           "rank 1: barrier"},
                          5);
    }
    // Collective #3 of the world: one at initialization, one above, this one.
    auto u = torch::ones({(1 << 20) + (world->rank() == 1 ? 16 : 0)});
    return expect_error([&] { world->all_reduce(u); },
                        {"all_reduce (collective #3 of world) checked by ZERO_CHECK_COLLECTIVES: the ranks passed "
                         "tensors of different sizes",
                         "rank 0: all_reduce (sum) of 4194304 bytes of Float", "rank 1: all_reduce (sum) of 4194368 bytes of Float",
                         "rank 2: all_reduce (sum) of 4194304 bytes of Float"},
                        5);
  }
  if (scenario == "size-mismatch") {
    // Rank 1 all-reduces 64 more bytes than the others. gloo's check fails
    // on its own thread, which terminates that process (Note [Failures
    // inside gloo's threads]): it prints the diagnosis, naming the
    // collective and both sizes, which the test's PASS_REGULAR_EXPRESSION
    // looks for in the launcher's output. A rank that gets a CommError
    // instead (its peer died) checks that it names the collective.
    auto u = torch::ones({(1 << 20) + (world->rank() == 1 ? 16 : 0)});
    return expect_error([&] { world->all_reduce(u); },
                        {"all_reduce"}, 15);
  }
  std::cerr << "usage: comm_faults early-exit|crash|rank0-crash|never-arrives|mismatch|size-mismatch|broken-connect|"
               "shm-fallback"
            << std::endl;
  return 2;
}
