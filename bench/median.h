// The median the benchmarks report (torch-free): the middle value, or the
// mean of the two middle ones; NaN for no values.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace zero_bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace zero_bench
