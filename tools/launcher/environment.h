#pragma once
// What zero-run tells its ranks: torchrun's variables over the launcher's
// own environment (Note [Launch environment] in environment.cpp), and a
// free MASTER_PORT, held until the job ends, when none was given.
#include <string>
#include <vector>

#include "launcher.h"

namespace zero_run {

class Environment {
 public:
  // `restart`: how many times the ranks were started again before (TORCHELASTIC_RESTART_COUNT).
  Environment(const LaunchOptions& o, int master_port, int restart);

  // The environment of one local rank, as strings owned by this object
  // (valid until the next call).
  char** for_rank(int local_rank);

 private:
  const LaunchOptions& options_;
  std::vector<std::string> common_;
  std::vector<std::string> rank_vars_;
  std::vector<char*> pointers_;
};

// A free TCP port for the rendezvous store, held until this object goes
// (Note [Held port] in environment.cpp). port() is 0 when none was found.
class HeldPort {
 public:
  HeldPort() = default;
  // Binds port 0 on `host` (any address if that fails) and keeps the socket.
  explicit HeldPort(const std::string& host);
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  ~HeldPort();
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace zero_run
