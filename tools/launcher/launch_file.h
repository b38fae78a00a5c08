// zero-run and Accelerate's launch config files (include/zero/launch_config.h):
// `zero-run --config-file FILE PROGRAM` takes the ranks, machines and the
// main process's address from FILE; `zero-run config` writes a commented one.
#pragma once

#include <string>
#include <vector>

#include "launcher.h"

namespace zero_run {

// Fills `options` from the launch config at `path` (ranks per machine,
// machines, this machine's rank, address and port) where the command line
// did not give them, and passes the file to the ranks as ZERO_LAUNCH_CONFIG.
// `given` names the options the command line gave ("--nproc", ...); one
// that disagrees with the file is an error. Throws std::invalid_argument
// with the message to print.
void apply_launch_file(const std::string& path, const std::vector<std::string>& given, LaunchOptions& options);

// `zero-run config [--output FILE] [--force] [--num-processes N] ...`:
// writes the file and returns the exit status.
int write_launch_file(int argc, char** argv);

}  // namespace zero_run
