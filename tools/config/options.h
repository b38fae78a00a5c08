#pragma once
// zero-config's command line (main.cpp parses it; estimate_report.cpp
// prints --estimate).
#include <cstdint>
#include <string>

#include "activations/estimate.h"

namespace zero_config_tool {

struct UsageError {
  std::string message;
};

struct Options {
  std::string file;
  int world_size = 1;
  bool json = false;
  bool help = false;
  bool estimate = false;
  int64_t params = 0;   // --params, with --estimate
  bool shape = false;   // --micro, --context, --width, --depth given: activations too
  bool cpu_ranks = false;  // --cpu-ranks: the parameters live in host memory (no accelerator)
  zero::ActivationShape activations;
};

// zero-config FILE --estimate ...: prints the table (or JSON); 0 on success.
int run_estimate(const Options& o);

}  // namespace zero_config_tool
