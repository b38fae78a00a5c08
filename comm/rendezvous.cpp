// Rendezvous: the TCP store every rank meets at, and the arrival barrier
// that names ranks which never came (Note [Missing rank] in internal.h).
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/version.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "comm/internal.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::comm {

StorePtr connect_store(const LaunchInfo& launch, std::chrono::milliseconds timeout, bool client_only) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(launch.master_port);
  opts.isServer = launch.rank == 0 && !launch.agent_store && !client_only;
  opts.numWorkers = c10::nullopt;
  opts.waitWorkers = false;  // arrivals are checked by wait_for_ranks, which names the missing
  opts.timeout = timeout;
  // A host name that does not resolve would surface from the store as a
  // failed connection (or, on rank 0, as a port in use): named first.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(launch.master_addr.c_str(), nullptr, &hints, &found); rc != 0) {
    throw CommError("rank " + std::to_string(launch.rank) + ": MASTER_ADDR \"" + launch.master_addr +
                    "\" does not resolve to an address (" + ::gai_strerror(rc) +
                    "); set MASTER_ADDR to the host of rank 0 as every node reaches it, e.g. its IP address");
  }
  ::freeaddrinfo(found);
  StorePtr store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, opts);
  } catch (const std::exception& e) {
    std::ostringstream msg;
    msg << "rank " << launch.rank << " could not " << (opts.isServer ? "start" : "reach") << " the rendezvous store at "
        << launch.master_addr << ":" << launch.master_port << " within " << timeout.count() / 1000 << " s: "
        << e.what() << "\n  "
        << (opts.isServer ? "Is another job using MASTER_PORT? Pick a free port."
                          : "Is rank 0 running, and do all ranks see the same MASTER_ADDR and MASTER_PORT?");
    throw CommError(msg.str());
  }
  if (launch.agent_store) {
    return c10::make_intrusive<c10d::PrefixStore>(launch.store_prefix, store);
  }
  return store;
}

void wait_for_ranks(c10d::Store& store, const std::string& prefix, int rank, int size,
                    const std::vector<int>& global_ranks, std::chrono::milliseconds timeout) {
  const std::string host_pid = std::to_string(::getpid());
  store.set(prefix + std::to_string(rank), std::vector<uint8_t>(host_pid.begin(), host_pid.end()));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (;;) {
    missing.clear();
    for (int r = 0; r < size; ++r) {
      if (!store.check({prefix + std::to_string(r)})) missing.push_back(r);
    }
    if (missing.empty()) return;
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ostringstream msg;
  msg << "rank " << global_ranks[rank] << ": rendezvous timed out after " << timeout.count() / 1000.0
      << " s; missing rank" << (missing.size() > 1 ? "s" : "");
  for (size_t i = 0; i < missing.size(); ++i) msg << (i ? ", " : " ") << global_ranks[missing[i]];
  msg << " (of " << size << "). Check that every rank was started with the same WORLD_SIZE, MASTER_ADDR and "
      << "MASTER_PORT, or raise ZERO_COMM_TIMEOUT.";
  throw CommError(msg.str());
}

// Note [A store that never answers]
// c10d's store client waits for each reply without a deadline of its own.
// A store that accepts the connection and never answers blocks the rank
// for good: torchrun's agent store from torch 2.x, say, to a rank built on
// LibTorch 1.13, whose request codes differ (its "check" reads as another
// request, and the server waits for bytes that never come; seen with the
// .venv's torchrun). wait_for_ranks' own deadline cannot fire inside that
// call, and nothing interrupts it, so the rendezvous runs under a watchdog:
// past ZERO_COMM_TIMEOUT and a margin it prints the error and ends the
// process, as the failure it is, instead of a hang.
StoreWatchdog::StoreWatchdog(const LaunchInfo& launch, std::chrono::milliseconds after) {
  std::ostringstream msg;
  msg << "rank " << launch.rank << ": the rendezvous store at " << launch.master_addr << ":" << launch.master_port
      << " has not answered for " << after.count() / 1000 << " s; it accepted the connection, so it is up but does "
      << "not speak this build's store protocol (LibTorch " << TORCH_VERSION << ")";
  if (launch.agent_store) {
    msg << ": it is torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True), likely from another torch version; "
        << "launch with zero-run, or with the torchrun of the torch this build uses";
  }
  thread_ = std::thread([this, after, message = msg.str()] {
    std::unique_lock<std::mutex> lock(mutex_);
    if (done_cv_.wait_for(lock, after, [this] { return done_; })) return;
    log::error("comm", message);
    std::fflush(nullptr);
    std::_Exit(1);
  });
}

StoreWatchdog::~StoreWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_all();
  thread_.join();
}

}  // namespace zero::comm
