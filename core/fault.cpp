#include "core/fault.h"

#include <signal.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
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
  const auto nth = rest.empty() ? std::optional<long long>(1) : env::parse_whole_number(rest.substr(1), 1, 1000000000);
  if (!nth) {  // a test hook: said once, and it never fires
    static std::once_flag said;
    std::call_once(said, [&] { std::fprintf(stderr, "zero: ZERO_FAULT=%s: the count after the rank must be a whole number from 1 to 1e9\n", spec.c_str()); });
    return false;
  }
  static std::mutex mu;
  static std::map<std::string, long long> seen;
  std::lock_guard<std::mutex> lock(mu);
  return ++seen[mine] == *nth;
}

void reached(const char* point, int rank) {
  if (fires(point, rank)) ::raise(SIGKILL);
}

}  // namespace zero::fault
