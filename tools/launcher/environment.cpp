// What zero-run tells its ranks (environment.h).
#include "environment.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>

extern char** environ;

namespace zero_run {

// Note [Launch environment]
// Every rank gets the launcher's environment plus torchrun's variables:
// RANK (= node_rank * nproc + local_rank), LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK (node rank), GROUP_WORLD_SIZE (nodes),
// ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME=default, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT (0, then 1, 2, ... as the ranks are started
// again: Note [Restarts] in launcher.cpp), TORCHELASTIC_MAX_RESTARTS
// (--max-restarts, default 0) and TORCHELASTIC_RUN_ID=none (torchrun's
// defaults). TORCHELASTIC_USE_AGENT_STORE
// is removed, even when inherited: there is no agent store, rank 0 of the
// job starts the store itself. Like torchrun, OMP_NUM_THREADS is set when
// unset and nproc > 1, though not to 1 but to this machine's CPUs divided
// among the local ranks, so that ranks do not oversubscribe the cores.
// LD_PRELOAD gains the heap allocator of --allocator (allocator.h) with its
// tuning variables, each only where the user has not set it.
// ZERO_MEMORY_CHECKPOINTS names the job's folder for in-memory checkpoint
// copies (Note [Memory folder] in memory_folder.cpp), unless the user set it.
// ZERO_LAUNCHER=zero-run marks the ranks as started by zero-run (replacing
// an inherited value): torchrun sets the same variables, and only this one
// tells a rank's messages to name zero-run rather than torchrun.

namespace {

bool has_name(const char* entry, const char* name) {
  size_t len = std::strlen(name);
  return std::strncmp(entry, name, len) == 0 && entry[len] == '=';
}

int available_cpus() {
#ifdef __linux__
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// A socket bound to `addr` with SO_REUSEADDR, and its port; -1 and 0 on failure.
std::pair<int, int> bind_reusable(const sockaddr* addr, socklen_t len) {
  int s = ::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return {-1, 0};
  const int on = 1;
  int port = 0;
  sockaddr_storage got;
  socklen_t got_len = sizeof got;
  if (::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) == 0 && ::bind(s, addr, len) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&got), &got_len) == 0) {
    if (got.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&got)->sin_port);
    if (got.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  }
  if (port == 0) {
    ::close(s);
    return {-1, 0};
  }
  return {s, port};
}

}  // namespace

Environment::Environment(const LaunchOptions& o, int master_port, int restart) : options_(o) {
  static const char* const kReplaced[] = {
      "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
      "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
      "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
      "TORCHELASTIC_USE_AGENT_STORE", "ZERO_LAUNCHER"};
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    bool replaced = false;
    for (const char* name : kReplaced) replaced = replaced || has_name(*e, name);
    for (const std::string& extra : o.extra_env) {
      replaced = replaced || has_name(*e, extra.substr(0, extra.find('=')).c_str());
    }
    if (!replaced) common_.emplace_back(*e);
  }
  for (const std::string& extra : o.extra_env) common_.push_back(extra);
  const std::string world = std::to_string(o.nproc * o.nnodes);
  common_.push_back("WORLD_SIZE=" + world);
  common_.push_back("ROLE_WORLD_SIZE=" + world);
  common_.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
  common_.push_back("GROUP_RANK=" + std::to_string(o.node_rank));
  common_.push_back("GROUP_WORLD_SIZE=" + std::to_string(o.nnodes));
  common_.push_back("ROLE_NAME=default");
  common_.push_back("MASTER_ADDR=" + o.master_addr);
  common_.push_back("MASTER_PORT=" + std::to_string(master_port));
  common_.push_back("TORCHELASTIC_RESTART_COUNT=" + std::to_string(restart));
  common_.push_back("TORCHELASTIC_MAX_RESTARTS=" + std::to_string(o.max_restarts));
  common_.push_back("TORCHELASTIC_RUN_ID=none");
  common_.push_back("ZERO_LAUNCHER=zero-run");
  if (o.nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    common_.push_back("OMP_NUM_THREADS=" + std::to_string(std::max(1, available_cpus() / o.nproc)));
  }
}

char** Environment::for_rank(int local_rank) {
  const int rank = options_.node_rank * options_.nproc + local_rank;
  rank_vars_ = {"RANK=" + std::to_string(rank), "ROLE_RANK=" + std::to_string(rank),
                "LOCAL_RANK=" + std::to_string(local_rank)};
  pointers_.clear();
  for (std::string& s : common_) pointers_.push_back(&s[0]);
  for (std::string& s : rank_vars_) pointers_.push_back(&s[0]);
  pointers_.push_back(nullptr);
  return pointers_.data();
}

// Note [Held port]
// Without --master-port, zero-run picks the rendezvous port by binding port
// 0. Closing that socket before rank 0 listens would leave the port free
// for anyone in between: another job's probe, or an outgoing connection
// given it as its ephemeral port, and rank 0 would then fail to start the
// store. So the socket stays bound, not listening, until the job ends.
// While it is bound the kernel gives the port to no bind(0) and to no
// outgoing connection, and a plain bind() of it fails with EADDRINUSE.
// It is bound with SO_REUSEADDR, which the store servers set too (c10d's
// own sockets and libuv's): Linux lets sockets that all set it bind one
// port as long as none of the others listens, so rank 0's store binds and
// listens on the port while zero-run still holds it (checked: LibTorch 1.13,
// and torch 2.x's store with and without libuv). The socket is
// close-on-exec, so no rank inherits it.
HeldPort::HeldPort(const std::string& host) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &found) == 0) {
    for (addrinfo* a = found; a != nullptr && port_ == 0; a = a->ai_next) {
      std::tie(fd_, port_) = bind_reusable(a->ai_addr, a->ai_addrlen);
    }
    ::freeaddrinfo(found);
    if (port_ != 0) return;
  }
  sockaddr_in any;
  std::memset(&any, 0, sizeof any);
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  std::tie(fd_, port_) = bind_reusable(reinterpret_cast<sockaddr*>(&any), sizeof any);
}

HeldPort::~HeldPort() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace zero_run
