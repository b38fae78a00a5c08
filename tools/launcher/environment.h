#pragma once
// What zero-run tells its ranks: torchrun's variables over the launcher's
// own environment (Note [Launch environment] in environment.cpp), and a
// free MASTER_PORT when none was given.
#include <string>
#include <vector>

#include "launcher.h"

namespace zero_run {

class Environment {
 public:
  Environment(const LaunchOptions& o, int master_port);

  // The environment of one local rank, as strings owned by this object
  // (valid until the next call).
  char** for_rank(int local_rank);

 private:
  const LaunchOptions& options_;
  std::vector<std::string> common_;
  std::vector<std::string> rank_vars_;
  std::vector<char*> pointers_;
};

// A free TCP port: bind port 0 on the master address (any address if that
// fails) and read back what the kernel chose. Returns 0 on failure.
int find_free_port(const std::string& host);

}  // namespace zero_run
