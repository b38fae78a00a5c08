// zero-run: starts the ranks of one node and supervises them.
//
// A plain C++17 POSIX program (no LibTorch, no libzero). main.cpp parses the
// command line into LaunchOptions; run_launcher() does the rest:
//
//   * resolves PROGRAM through PATH (like execvp) and finds a free
//     MASTER_PORT when none was given, held until the ranks are gone
//     (Note [Held port] in environment.cpp);
//   * forks one child per local rank, each in its own process group, with
//     torchrun's environment variables (see Note [Launch environment] in
//     environment.cpp);
//   * relays every line of each rank's stdout/stderr, prefixed with
//     "[rank r] ", from one poll() loop (see Note [Line relay] in relay.cpp);
//   * forwards SIGINT/SIGTERM/SIGHUP (and job-control stops) to every rank's
//     process group, stops all ranks when one fails, and escalates to SIGKILL
//     after a grace period (see Note [Stopping the ranks]);
//   * with --max-restarts, starts every rank again after a rank failed, as
//     torchrun does (Note [Restarts] in launcher.cpp).
#pragma once

#include <string>
#include <vector>

namespace zero_run {

struct LaunchOptions {
  int nproc = 0;       // ranks on this node (LOCAL_WORLD_SIZE)
  int nnodes = 1;      // nodes in the job
  int node_rank = 0;   // this node (GROUP_RANK); global rank = node_rank * nproc + local_rank
  std::string master_addr = "127.0.0.1";
  int master_port = 0; // 0: pick a free port on master_addr and hold it (single node only)
  double grace_s = 5;  // SIGTERM/SIGINT -> SIGKILL grace period (--timeout-s)
  int max_restarts = 0;  // --max-restarts: times the ranks are started again after a failure
  std::vector<std::string> command; // PROGRAM ARGS...
  std::string allocator;   // --allocator: "" (the default), tcmalloc, jemalloc, system or a path (allocator.h)
  std::vector<std::string> extra_env; // NAME=value entries that replace the inherited ones in every rank
};

// Exit codes, in the shell's conventions.
constexpr int kExitUsage = 2;         // bad command line
constexpr int kExitCannotExec = 126;  // PROGRAM found but not executable
constexpr int kExitNotFound = 127;    // PROGRAM not found
constexpr int kExitInternal = 1;      // launcher-side failure (fork, pipe, port)

// Runs the job and returns the launcher's exit status: 0 when every rank
// exited 0 (in the last attempt, with restarts); else the first failing
// rank's exit code (128+signal when it was killed by a signal) in the last
// attempt. When the launcher itself was stopped by SIGINT, SIGTERM
// or SIGHUP, it re-raises that signal after the ranks are gone (so shells see
// "killed by SIGINT"); 128+signal is returned only if that raise returns.
int run_launcher(const LaunchOptions& options);

}  // namespace zero_run
