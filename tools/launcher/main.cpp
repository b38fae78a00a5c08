// zero-run: the command line. See launcher.h for what the launcher does.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "allocator.h"
#include "core/blas_kernels.h"
#include "core/did_you_mean.h"
#include "core/env.h"
#include "launch_file.h"
#include "launcher.h"
#include "zero/launch_info.h"

extern char** environ;

namespace {

const char kUsage[] =
    "usage: zero-run --nproc N [--nnodes M --node-rank R] [--master-addr A]\n"
    "                [--master-port P] [--timeout-s T] [--max-restarts K] [--allocator A]\n"
    "                [--] PROGRAM [ARGS...]\n"
    "       zero-run --config-file FILE [options] [--] PROGRAM [ARGS...]\n"
    "       zero-run config [--output FILE] [...]   (writes a launch config; see zero-run config --help)\n";

const char kHelp[] =
    "\n"
    "Starts N processes (ranks) of PROGRAM on this node with torchrun's\n"
    "environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
    "MASTER_ADDR, MASTER_PORT, ...), prefixes every line they print with\n"
    "\"[rank r] \", and stops all of them when one fails.\n"
    "\n"
    "options:\n"
    "  --config-file F    a launch config in Accelerate's YAML (zero-run config\n"
    "                     writes one): ranks, machines, this machine's rank and\n"
    "                     the main process's address come from it, and the ranks\n"
    "                     get ZERO_LAUNCH_CONFIG=F for zero::Accelerator\n"
    "  --nproc N          ranks on this node (also torchrun's --nproc-per-node and\n"
    "                     DeepSpeed's --num-gpus)\n"
    "  --nnodes M         nodes in the job (default 1; also DeepSpeed's --num-nodes)\n"
    "  --node-rank R      this node, 0..M-1 (default 0); RANK = R*N + LOCAL_RANK\n"
    "  --master-addr A    address of the node running rank 0 (default 127.0.0.1)\n"
    "  --master-port P    its port; default: a free port (required when M > 1)\n"
    "  --timeout-s T      seconds the ranks get to exit after SIGTERM/SIGINT\n"
    "                     before SIGKILL (default 5)\n"
    "  --max-restarts K   after a rank fails, stop the others and start all of\n"
    "                     them again, at most K times (torchrun's option; with\n"
    "                     M > 1 every node's zero-run needs it, and node 0's\n"
    "                     listens on P + 1). Each start gets TORCHELASTIC_RESTART_COUNT;\n"
    "                     the program resumes with load_checkpoint_if_present\n"
    "  --allocator A      heap allocator preloaded into the ranks: tcmalloc (the\n"
    "                     default when installed), jemalloc, system (none) or a\n"
    "                     library path; also ZERO_ALLOCATOR. An LD_PRELOAD that\n"
    "                     already names an allocator or a sanitizer is kept\n"
    "  -h, --help         this text\n"
    "Options end at PROGRAM or at '--'; PROGRAM is looked up in PATH.\n"
    "Options may also be written --name=value, and with '_' for '-'.\n"
    "\n"
    "OPENBLAS_CORETYPE is set for the ranks when it is unset and OpenBLAS\n"
    "would compute with kernels older than this CPU (it does not know every\n"
    "CPU model): SkylakeX on AVX-512 CPUs, Haswell on AVX2 ones.\n"
    "\n"
    "exit status: 0 when every rank exits 0; else the first failing rank's\n"
    "code (128+signal if it was killed), of the last start with restarts;\n"
    "2 for a bad command line; 126/127\n"
    "when PROGRAM cannot be run / is not found. SIGINT, SIGTERM and SIGHUP are\n"
    "forwarded to every rank's process group, and zero-run then ends by the\n"
    "same signal.\n";

// The most ranks a job may have (zero/launch_info.h): a bigger world is a typo.
constexpr int kMaxWorld = zero::comm::LaunchInfo::kMaxWorldSize;

struct UsageError {
  std::string message;
};

int parse_int(const std::string& option, const std::string& text, long min, long max) {
  const auto value = zero::env::parse_whole_number(text, min, max);  // the one parser of numbers (core/env.h)
  if (!value) {
    std::string range = max == 2147483647L ? "an integer >= " + std::to_string(min)
                                           : "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    throw UsageError{option + " must be " + range + ", got '" + text + "'"};
  }
  return static_cast<int>(*value);
}

double parse_seconds(const std::string& option, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(value) || value < 0) {
    throw UsageError{option + " must be a number of seconds >= 0, got '" + text + "'"};
  }
  return value;
}

zero_run::LaunchOptions parse(int argc, char** argv, bool* help) {
  zero_run::LaunchOptions o;
  bool have_nproc = false, have_port = false;
  std::string config_file;
  std::vector<std::string> given;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM (a lone "-" included)
    if (arg == "-h" || arg == "--help") {
      *help = true;
      return o;
    }
    // --name=value or --name value; '_' spelled as '-' (torchrun accepts both).
    std::string name = arg, value;
    bool inline_value = false;
    if (auto eq = arg.find('='); eq != std::string::npos && arg.compare(0, 2, "--") == 0) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      inline_value = true;
    }
    for (size_t k = 2; k < name.size(); ++k) {
      if (name[k] == '_') name[k] = '-';
    }
    // DeepSpeed's launcher spells two of them its own way, same meaning.
    if (name == "--num-gpus") name = "--nproc";
    if (name == "--num-nodes") name = "--nnodes";
    static const std::vector<std::string> kKnown = {"--nproc",       "--nproc-per-node", "--nnodes",    "--node-rank",
                                                    "--master-addr", "--master-port",    "--timeout-s", "--allocator",
                                                    "--config-file", "--num-gpus",       "--num-nodes",
                                                    "--max-restarts"};
    if (std::find(kKnown.begin(), kKnown.end(), name) == kKnown.end())
      throw UsageError{zero::text::unknown_option(arg, kKnown)};
    if (!inline_value) {
      if (i + 1 >= argc) throw UsageError{"option '" + name + "' needs a value"};
      value = argv[++i];
    }
    given.push_back(name == "--nproc-per-node" ? "--nproc" : name);
    if (name == "--config-file") {
      if (value.empty()) throw UsageError{"--config-file must not be empty"};
      config_file = value;
    } else if (name == "--nproc" || name == "--nproc-per-node") {
      o.nproc = parse_int(name, value, 1, kMaxWorld);
      have_nproc = true;
    } else if (name == "--nnodes") {
      o.nnodes = parse_int(name, value, 1, kMaxWorld);
    } else if (name == "--node-rank") {
      o.node_rank = parse_int(name, value, 0, kMaxWorld - 1);
    } else if (name == "--master-addr") {
      if (value.empty()) throw UsageError{"--master-addr must not be empty"};
      o.master_addr = value;
    } else if (name == "--master-port") {
      o.master_port = parse_int(name, value, 1, 65535);
      have_port = true;
    } else if (name == "--timeout-s") {
      o.grace_s = parse_seconds(name, value);
    } else if (name == "--max-restarts") {
      o.max_restarts = parse_int(name, value, 0, 1000000);
    } else if (name == "--allocator") {
      if (value.empty()) throw UsageError{"--allocator must not be empty"};
      o.allocator = value;
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);

  if (!config_file.empty()) {
    try {
      zero_run::apply_launch_file(config_file, given, o);
    } catch (const std::invalid_argument& e) {
      throw UsageError{e.what()};
    }
    have_nproc = true;
    have_port = have_port || o.master_port != 0;
  }
  if (!have_nproc) throw UsageError{"missing --nproc N (the number of ranks to start on this node)"};
  if (o.node_rank >= o.nnodes) {
    throw UsageError{"--node-rank must be in [0, " + std::to_string(o.nnodes) + "), got " +
                     std::to_string(o.node_rank)};
  }
  if (o.nnodes > 1 && !have_port) {
    throw UsageError{"--master-port is required when --nnodes > 1 (every node must use the same port)"};
  }
  if (static_cast<long long>(o.nproc) * o.nnodes > kMaxWorld) {
    throw UsageError{"--nproc " + std::to_string(o.nproc) + " x --nnodes " + std::to_string(o.nnodes) + " is " +
                     std::to_string(static_cast<long long>(o.nproc) * o.nnodes) + " ranks, more than the " +
                     std::to_string(kMaxWorld) + " a job may have"};
  }
  if (o.command.empty()) throw UsageError{"missing PROGRAM to run"};
  try {
    const zero_run::AllocatorChoice allocator = zero_run::choose_allocator(o.allocator, environ);
    if (!allocator.note.empty()) std::fprintf(stderr, "zero-run: note: %s\n", allocator.note.c_str());
    o.extra_env.insert(o.extra_env.end(), allocator.env.begin(), allocator.env.end());
  } catch (const std::invalid_argument& e) {
    throw UsageError{e.what()};
  }
  // OpenBLAS reads OPENBLAS_CORETYPE when it loads, before any rank code
  // runs: zero-run sets it when OpenBLAS would pick kernels older than this
  // CPU (core/blas_kernels.h). The user's own setting is kept.
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::string core = zero::blas::better_core(zero::blas::probe_openblas_core(), zero::blas::this_cpu());
    if (!core.empty()) o.extra_env.push_back("OPENBLAS_CORETYPE=" + core);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "config") return zero_run::write_launch_file(argc, argv);
  bool help = false;
  zero_run::LaunchOptions options;
  try {
    options = parse(argc, argv, &help);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "zero-run: %s\n%sTry 'zero-run --help' for more information.\n", e.message.c_str(), kUsage);
    return zero_run::kExitUsage;
  }
  if (help) {
    std::fputs(kUsage, stdout);
    std::fputs(kHelp, stdout);
    return 0;
  }
  std::fflush(stdout);
  return zero_run::run_launcher(options);
}
