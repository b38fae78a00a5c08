#include "core/fault.h"

#include <signal.h>

#include <map>
#include <mutex>
#include <string>

#include "core/env.h"

namespace zero::fault {

bool fires(const char* point, int rank) {
  const std::string spec = env::fault();
  if (spec.empty()) return false;
  const std::string mine = std::string(point) + ":" + std::to_string(rank);
  if (spec.compare(0, mine.size(), mine) != 0) return false;
  const std::string rest = spec.substr(mine.size());
  if (!rest.empty() && rest[0] != ':') return false;  // "step.reduced:1" must not match rank 10
  const long nth = rest.empty() ? 1 : std::atol(rest.c_str() + 1);
  static std::mutex mu;
  static std::map<std::string, long> seen;
  std::lock_guard<std::mutex> lock(mu);
  return ++seen[mine] == nth;
}

void reached(const char* point, int rank) {
  if (fires(point, rank)) ::raise(SIGKILL);
}

}  // namespace zero::fault
