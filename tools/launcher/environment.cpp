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

extern char** environ;

namespace zero_run {

// Note [Launch environment]
// Every rank gets the launcher's environment plus torchrun's variables:
// RANK (= node_rank * nproc + local_rank), LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK (node rank), GROUP_WORLD_SIZE (nodes),
// ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME=default, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT=0, TORCHELASTIC_MAX_RESTARTS=0 and
// TORCHELASTIC_RUN_ID=none (torchrun's defaults). TORCHELASTIC_USE_AGENT_STORE
// is removed, even when inherited: there is no agent store, rank 0 of the
// job starts the store itself. Like torchrun, OMP_NUM_THREADS is set when
// unset and nproc > 1, though not to 1 but to this machine's CPUs divided
// among the local ranks, so that ranks do not oversubscribe the cores.
// LD_PRELOAD gains the heap allocator of --allocator (allocator.h) with its
// tuning variables, each only where the user has not set it.
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

int bound_port(const sockaddr* addr, socklen_t len) {
  int s = ::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return 0;
  int port = 0;
  sockaddr_storage got;
  socklen_t got_len = sizeof got;
  if (::bind(s, addr, len) == 0 && ::getsockname(s, reinterpret_cast<sockaddr*>(&got), &got_len) == 0) {
    if (got.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&got)->sin_port);
    if (got.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  }
  ::close(s);
  return port;
}

}  // namespace

Environment::Environment(const LaunchOptions& o, int master_port) : options_(o) {
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
  common_.push_back("TORCHELASTIC_RESTART_COUNT=0");
  common_.push_back("TORCHELASTIC_MAX_RESTARTS=0");
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

int find_free_port(const std::string& host) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &found) == 0) {
    int port = 0;
    for (addrinfo* a = found; a != nullptr && port == 0; a = a->ai_next) port = bound_port(a->ai_addr, a->ai_addrlen);
    ::freeaddrinfo(found);
    if (port != 0) return port;
  }
  sockaddr_in any;
  std::memset(&any, 0, sizeof any);
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  return bound_port(reinterpret_cast<sockaddr*>(&any), sizeof any);
}

}  // namespace zero_run
