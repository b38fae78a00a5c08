// zero-run's side of launch config files (launch_file.h).
#include "launch_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "zero/error.h"
#include "zero/launch_config.h"
#include "core/env.h"

namespace zero_run {
namespace {

bool gave(const std::vector<std::string>& given, const std::string& name) {
  return std::find(given.begin(), given.end(), name) != given.end();
}

std::string absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

int count_gpus() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

int count_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

const char kConfigUsage[] =
    "usage: zero-run config [--output FILE] [--force] [--distributed-type T] [--num-processes N]\n"
    "                       [--num-machines M] [--machine-rank R] [--main-process-ip A]\n"
    "                       [--main-process-port P] [--mixed-precision no|fp16|bf16]\n"
    "                       [--gradient-accumulation-steps K] [--zero-stage S]\n"
    "                       [--offload-optimizer-device none|cpu|nvme] [--offload-param-device none|cpu|nvme]\n"
    "                       [--gradient-clipping X] [--deepspeed-config-file FILE]\n"
    "\n"
    "Writes a commented launch config (Accelerate's YAML) for this machine, by\n"
    "default to zero_config.yaml; an existing file is kept unless --force. Start\n"
    "a program with it: zero-run --config-file FILE PROGRAM [ARGS...].\n"
    "distributed_type: NO (one process), MULTI_CPU, MULTI_GPU or DEEPSPEED (ZeRO; the\n"
    "default when --zero-stage or an offload device is given). num_processes: the\n"
    "GPUs found, else 2 (1 on a one-core machine).\n";

}  // namespace

void apply_launch_file(const std::string& path, const std::vector<std::string>& given, LaunchOptions& o) {
  zero::LaunchConfig c;
  try {
    c = zero::LaunchConfig::from_file(path);
  } catch (const zero::ConfigError& e) {
    throw std::invalid_argument(e.what());
  }
  for (const auto& w : c.warnings) std::fprintf(stderr, "zero-run: warning: %s\n", w.c_str());
  auto check = [&](const char* option, int from_command_line, int from_file, const char* key) {
    if (gave(given, option) && from_command_line != from_file) {
      throw std::invalid_argument(std::string(option) + " " + std::to_string(from_command_line) + " disagrees with " +
                                  key + " " + std::to_string(from_file) + " in " + path +
                                  "; give one of them or make them agree");
    }
  };
  check("--nproc", o.nproc, c.processes_per_machine(), "num_processes / num_machines");
  check("--nnodes", o.nnodes, c.num_machines, "num_machines");
  check("--node-rank", o.node_rank, c.machine_rank, "machine_rank");
  o.nproc = c.processes_per_machine();
  o.nnodes = c.num_machines;
  o.node_rank = c.machine_rank;
  if (!c.main_process_ip.empty() && !gave(given, "--master-addr")) o.master_addr = c.main_process_ip;
  if (c.main_process_port != 0 && !gave(given, "--master-port")) o.master_port = c.main_process_port;
  o.extra_env.push_back("ZERO_LAUNCH_CONFIG=" + absolute(path));
}

int write_launch_file(int argc, char** argv) {
  zero::LaunchConfigAnswers a;
  a.gpus_found = count_gpus();
  a.cpus_found = count_cpus();
  std::string output = "zero_config.yaml";
  bool force = false, zero_keys = false;
  try {
    for (int i = 2; i < argc; ++i) {
      std::string name = argv[i], value;
      if (name == "-h" || name == "--help") {
        std::fputs(kConfigUsage, stdout);
        return 0;
      }
      if (name == "--force") {
        force = true;
        continue;
      }
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else {
        if (i + 1 >= argc) throw std::invalid_argument("option '" + name + "' needs a value");
        value = argv[++i];
      }
      std::replace(name.begin() + std::min<size_t>(2, name.size()), name.end(), '_', '-');
      auto integer = [&](int min, int max) {
        const auto v = zero::env::parse_whole_number(value, min, max);  // the one parser of numbers (core/env.h)
        if (!v) {
          throw std::invalid_argument(name + " must be an integer in [" + std::to_string(min) + ", " +
                                      std::to_string(max) + "], got '" + value + "'");
        }
        return static_cast<int>(*v);
      };
      auto one_of = [&](std::initializer_list<const char*> allowed) {
        for (const char* x : allowed) {
          if (value == x) return value;
        }
        std::string list;
        for (const char* x : allowed) list += (list.empty() ? "" : ", ") + std::string(x);
        throw std::invalid_argument(name + " must be one of " + list + ", got '" + value + "'");
      };
      if (name == "--output") output = value;
      else if (name == "--distributed-type") a.distributed_type = one_of({"NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED"});
      else if (name == "--num-processes") a.num_processes = integer(1, 1 << 20);
      else if (name == "--num-machines") a.num_machines = integer(1, 1 << 16);
      else if (name == "--machine-rank") a.machine_rank = integer(0, 1 << 16);
      else if (name == "--main-process-ip") a.main_process_ip = value;
      else if (name == "--main-process-port") a.main_process_port = integer(1, 65535);
      else if (name == "--mixed-precision") a.mixed_precision = one_of({"no", "fp16", "bf16"});
      else if (name == "--gradient-accumulation-steps") a.gradient_accumulation_steps = integer(1, 1 << 30);
      else if (name == "--zero-stage") a.zero_stage = integer(0, 3), zero_keys = true;
      else if (name == "--offload-optimizer-device") a.offload_optimizer_device = one_of({"none", "cpu", "nvme"}), zero_keys = true;
      else if (name == "--offload-param-device") a.offload_param_device = one_of({"none", "cpu", "nvme"}), zero_keys = true;
      else if (name == "--deepspeed-config-file") a.deepspeed_config_file = value, zero_keys = true;
      else if (name == "--gradient-clipping") {
        char* end = nullptr;
        a.gradient_clipping = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !(a.gradient_clipping >= 0)) {
          throw std::invalid_argument("--gradient-clipping must be a number >= 0, got '" + value + "'");
        }
        zero_keys = true;
      } else {
        throw std::invalid_argument("unknown option '" + name + "'");
      }
    }
    if (a.distributed_type.empty() && zero_keys) a.distributed_type = "DEEPSPEED";
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "zero-run config: %s\n%s", e.what(), kConfigUsage);
    return 2;
  }
  if (!force && ::access(output.c_str(), F_OK) == 0) {
    std::fprintf(stderr, "zero-run config: %s exists and is kept; pass --force to replace it or --output another file\n",
                 output.c_str());
    return 1;
  }
  const std::string text = zero::default_launch_config_yaml(a);
  // Staged in a fresh file (O_EXCL | O_NOFOLLOW: a symlink planted at the
  // .tmp name cannot carry the write elsewhere), written whole and synced
  // before the rename; a failure (a full disk: ENOSPC) names the file and
  // errno's text, removes the staging file and leaves OUTPUT as it was.
  const std::string tmp = output + ".tmp";
  const auto fail = [&](const char* what, int e, int fd) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    std::fprintf(stderr, "zero-run config: %s %s: %s; %s is unchanged\n", what, tmp.c_str(), std::strerror(e),
                 output.c_str());
    return 1;
  };
  ::unlink(tmp.c_str());  // a leftover of an interrupted run
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    std::fprintf(stderr, "zero-run config: cannot create %s: %s\n", tmp.c_str(), std::strerror(e));
    return 1;
  }
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("cannot write", n < 0 ? errno : EIO, fd);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("cannot sync", errno, fd);
  if (::close(fd) != 0) return fail("cannot write", errno, -1);
  if (std::rename(tmp.c_str(), output.c_str()) != 0) return fail("cannot rename to its place", errno, -1);
  try {
    zero::LaunchConfig::from_file(output);  // what was written must read back
  } catch (const zero::ConfigError& e) {
    std::fprintf(stderr, "zero-run config: the file written does not read back: %s\n", e.what());
    return 1;
  }
  std::printf("zero-run config: wrote %s; start a program with: zero-run --config-file %s PROGRAM [ARGS...]\n",
              output.c_str(), output.c_str());
  return 0;
}

}  // namespace zero_run
