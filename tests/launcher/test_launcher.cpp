// Tests of zero-run, run as a user runs it: a subprocess started with a
// command line, observed through its output, exit status and the marker
// files its ranks (launcher_probe) leave behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const std::string kZeroRun = ZERO_RUN_PATH;
const std::string kProbe = LAUNCHER_PROBE_PATH;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

struct Result {
  int status = -1;
  std::string out, err;
  double seconds = 0;

  bool exited_with(int code) const { return WIFEXITED(status) && WEXITSTATUS(status) == code; }
  bool killed_by(int sig) const { return WIFSIGNALED(status) && WTERMSIG(status) == sig; }
  std::string summary() const { return describe(status) + "\n--- stdout:\n" + out + "--- stderr:\n" + err; }
};

// zero-run as a subprocess, in its own process group (as a shell job would
// be), stdin from /dev/null, stdout and stderr captured.
class Job {
 public:
  struct Env {
    std::vector<std::pair<std::string, std::string>> set;
    std::vector<std::string> unset;
  };

  explicit Job(const std::vector<std::string>& args, const Env& env = {}) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry = *e;
      std::string name = entry.substr(0, entry.find('='));
      bool drop = false;
      for (const auto& n : env.unset) drop = drop || n == name;
      for (const auto& kv : env.set) drop = drop || kv.first == name;
      if (!drop) env_strings.push_back(entry);
    }
    for (const auto& kv : env.set) env_strings.push_back(kv.first + "=" + kv.second);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(&s[0]);
    envp.push_back(nullptr);
    std::vector<std::string> argv_strings{kZeroRun};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_strings) argv.push_back(&s[0]);
    argv.push_back(nullptr);

    int out[2], err[2];
    if (::pipe(out) != 0 || ::pipe(err) != 0) throw std::runtime_error("pipe failed");
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      int null_fd = ::open("/dev/null", O_RDONLY);
      ::dup2(null_fd, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      for (int fd : {null_fd, out[0], out[1], err[0], err[1]}) ::close(fd);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(250);
    }
    ::setpgid(pid_, pid_);
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  ~Job() {
    if (pid_ > 0) {  // a test that failed half-way: leave nothing behind
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  pid_t pid() const { return pid_; }

  // Collects output until zero-run exits (SIGKILL after timeout_s).
  Result wait(double timeout_s = 20) {
    Result r;
    bool timed_out = false;
    while (out_fd_ >= 0 || err_fd_ >= 0) {
      double left = timeout_s - seconds_since(start_);
      if (left <= 0) {
        timed_out = true;
        ::kill(-pid_, SIGKILL);
        break;
      }
      std::vector<pollfd> fds;
      if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
      if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), static_cast<int>(left * 1000) + 1) <= 0) continue;
      for (const pollfd& p : fds) {
        if (p.revents == 0) continue;
        int& fd = p.fd == out_fd_ ? out_fd_ : err_fd_;
        std::string& sink = p.fd == out_fd_ ? r.out : r.err;
        char buf[65536];
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n > 0) {
          sink.append(buf, static_cast<size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          ::close(fd);
          fd = -1;
        }
      }
    }
    while (::waitpid(pid_, &r.status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    r.seconds = seconds_since(start_);
    if (timed_out) ADD_FAILURE() << "zero-run did not finish within " << timeout_s << " s\n" << r.summary();
    return r;
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  Clock::time_point start_;
};

Result run(const std::vector<std::string>& args, const Job::Env& env = {}) { return Job(args, env).wait(); }

// A fresh directory for marker files, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "zero-run-test.XXXXXX").string();
    if (::mkdtemp(&tmpl[0]) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits until prefix.0 .. prefix.(n-1) exist in dir.
bool wait_for_files(const TempDir& dir, const std::string& prefix, int n, double timeout_s = 10) {
  const auto start = Clock::now();
  for (;;) {
    int found = 0;
    for (int r = 0; r < n; ++r) found += fs::exists(dir.file(prefix + "." + std::to_string(r))) ? 1 : 0;
    if (found == n) return true;
    if (seconds_since(start) > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// "[rank r] env NAME=value" lines -> rank -> NAME -> value ("<unset>" when unset).
std::map<int, std::map<std::string, std::string>> parse_env(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> env;
  static const std::regex set_re(R"(^\[rank (\d+)\] env ([A-Z_]+)=(.*)$)");
  static const std::regex unset_re(R"(^\[rank (\d+)\] env ([A-Z_]+) unset$)");
  for (const std::string& line : split_lines(out)) {
    std::smatch m;
    if (std::regex_match(line, m, set_re)) env[std::stoi(m[1])][m[2]] = m[3];
    else if (std::regex_match(line, m, unset_re)) env[std::stoi(m[1])][m[2]] = "<unset>";
  }
  return env;
}

int count_occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// ---------------------------------------------------------------------------
// Environment

TEST(Env, EachRankGetsTorchrunVariables) {
  Job::Env env;
  env.set = {{"ZERO_TEST_INHERITED", "hello world"},
             {"TORCHELASTIC_USE_AGENT_STORE", "True"},  // from an outer torchrun: must not leak
             {"RANK", "99"},
             {"MASTER_PORT", "1"}};
  Result r = run({"--nproc", "4", kProbe, "env", "@0", "bind-master"}, env);
  ASSERT_TRUE(r.exited_with(0)) << r.summary();

  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 4u) << r.summary();
  std::set<std::string> ports;
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(ranks.count(rank)) << "no output from rank " << rank << "\n" << r.summary();
    auto& v = ranks[rank];
    const std::string s = std::to_string(rank);
    EXPECT_EQ(v["RANK"], s);  // the "[rank r]" prefix and RANK agree
    EXPECT_EQ(v["LOCAL_RANK"], s);
    EXPECT_EQ(v["ROLE_RANK"], s);
    EXPECT_EQ(v["WORLD_SIZE"], "4");
    EXPECT_EQ(v["LOCAL_WORLD_SIZE"], "4");
    EXPECT_EQ(v["ROLE_WORLD_SIZE"], "4");
    EXPECT_EQ(v["GROUP_RANK"], "0");
    EXPECT_EQ(v["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(v["ROLE_NAME"], "default");
    EXPECT_EQ(v["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(v["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(v["TORCHELASTIC_MAX_RESTARTS"], "0");
    EXPECT_EQ(v["TORCHELASTIC_RUN_ID"], "none");
    EXPECT_EQ(v["TORCHELASTIC_USE_AGENT_STORE"], "<unset>");
    EXPECT_EQ(v["ZERO_TEST_INHERITED"], "hello world");
    ports.insert(v["MASTER_PORT"]);
  }
  ASSERT_EQ(ports.size(), 1u) << "ranks disagree on MASTER_PORT\n" << r.summary();
  const int port = std::stoi(*ports.begin());
  EXPECT_GT(port, 1);
  EXPECT_LE(port, 65535);
  // Rank 0 could listen on MASTER_ADDR:MASTER_PORT, as a store server must.
  EXPECT_NE(r.out.find("[rank 0] bind ok\n"), std::string::npos) << r.summary();
}

// A rank cannot tell zero-run from torchrun by torchrun's variables; the
// marker lets its messages name the launcher that started it (Note [Launch
// environment]). An inherited marker (a program that ran under zero-run
// starting another job) is replaced, never passed on.
TEST(Env, RanksAreMarkedAsStartedByZeroRun) {
  Job::Env env;
  env.set = {{"ZERO_LAUNCHER", "torchrun"}};
  Result r = run({"--nproc", "2", kProbe, "env"}, env);
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.summary();
  for (auto& kv : ranks) EXPECT_EQ(kv.second["ZERO_LAUNCHER"], "zero-run") << "rank " << kv.first;
}

TEST(Env, MultiNodeGlobalRanks) {
  Result r = run({"--nproc", "2", "--nnodes", "3", "--node-rank", "1", "--master-addr", "10.1.2.3",
                  "--master-port", "29555", kProbe, "env"});
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.summary();
  for (int local = 0; local < 2; ++local) {
    const int rank = 2 + local;  // node_rank * nproc + local_rank
    ASSERT_TRUE(ranks.count(rank)) << r.summary();
    auto& v = ranks[rank];
    EXPECT_EQ(v["RANK"], std::to_string(rank));
    EXPECT_EQ(v["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(v["WORLD_SIZE"], "6");
    EXPECT_EQ(v["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(v["GROUP_RANK"], "1");
    EXPECT_EQ(v["GROUP_WORLD_SIZE"], "3");
    EXPECT_EQ(v["MASTER_ADDR"], "10.1.2.3");
    EXPECT_EQ(v["MASTER_PORT"], "29555");
  }
}

// Note [Held port] in tools/launcher/environment.cpp: the port zero-run
// picks stays bound until the ranks are gone, so no other program can take
// it between the choice and rank 0's store (a plain bind fails), while a
// store server, which binds with SO_REUSEADDR, still can. Before, the probe
// closed its socket at once and the port was anyone's.
TEST(Env, TheChosenMasterPortStaysHeldUntilTheRanksEnd) {
  Result r = run({"--nproc", "2", kProbe, "@0", "take-master", "@0", "bind-master"});
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  EXPECT_NE(r.out.find("[rank 0] take failed: Address already in use\n"), std::string::npos) << r.summary();
  EXPECT_NE(r.out.find("[rank 0] bind ok\n"), std::string::npos) << r.summary();

  // A port the user gives is not held: it is theirs to manage.
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof any;
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  ASSERT_EQ(::getsockname(s, reinterpret_cast<sockaddr*>(&any), &len), 0);
  const std::string port = std::to_string(ntohs(any.sin_port));
  ::close(s);
  Result given = run({"--nproc", "1", "--master-port", port, kProbe, "take-master"});
  ASSERT_TRUE(given.exited_with(0)) << given.summary();
  EXPECT_EQ(given.out, "[rank 0] take ok\n") << given.summary();
}

TEST(Env, GivenMasterPortIsUsedOnOneNode) {
  Result r = run({"--nproc=2", "--master-port=29556", "--master_addr=localhost", kProbe, "env"});
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.summary();
  for (auto& kv : ranks) {
    EXPECT_EQ(kv.second["MASTER_PORT"], "29556");
    EXPECT_EQ(kv.second["MASTER_ADDR"], "localhost");
  }
}

TEST(Env, OmpNumThreadsSetOnlyWhenUnsetAndSeveralRanks) {
  Job::Env unset;
  unset.unset = {"OMP_NUM_THREADS"};
  {
    auto ranks = parse_env(run({"--nproc", "2", kProbe, "env"}, unset).out);
    ASSERT_EQ(ranks.size(), 2u);
    for (auto& kv : ranks) EXPECT_GE(std::atoi(kv.second["OMP_NUM_THREADS"].c_str()), 1);
  }
  {
    auto ranks = parse_env(run({"--nproc", "1", kProbe, "env"}, unset).out);
    ASSERT_EQ(ranks.size(), 1u);
    EXPECT_EQ(ranks[0]["OMP_NUM_THREADS"], "<unset>");
  }
  {
    Job::Env set;
    set.set = {{"OMP_NUM_THREADS", "7"}};
    auto ranks = parse_env(run({"--nproc", "2", kProbe, "env"}, set).out);
    ASSERT_EQ(ranks.size(), 2u);
    for (auto& kv : ranks) EXPECT_EQ(kv.second["OMP_NUM_THREADS"], "7");
  }
}

// tools/launcher/allocator.h: tcmalloc is preloaded when installed (else a
// note says so), the rank really runs on it (its own symbol is found), and
// the user's choice wins: --allocator, ZERO_ALLOCATOR, an LD_PRELOAD that
// already names an allocator, tuning variables already set.
TEST(Env, AllocatorIsPreloadedUnlessTheUserChoseOne) {
#if defined(__SANITIZE_ADDRESS__)
  // The probe is built with ASan, whose runtime must come first: it refuses
  // to start behind a preloaded allocator (tools/sanitize.sh sets
  // ZERO_ALLOCATOR=system for that reason).
  GTEST_SKIP() << "an ASan build cannot run behind a preloaded allocator";
#endif
  Job::Env clean;
  clean.unset = {"LD_PRELOAD", "ZERO_ALLOCATOR", "TCMALLOC_RELEASE_RATE", "MALLOC_CONF"};
  {
    Result r = run({"--nproc", "2", kProbe, "env", "heap"}, clean);
    ASSERT_TRUE(r.exited_with(0)) << r.summary();
    auto ranks = parse_env(r.out);
    ASSERT_EQ(ranks.size(), 2u) << r.summary();
    const std::string preload = ranks[0]["LD_PRELOAD"];
    if (preload == "<unset>") {
      EXPECT_NE(r.err.find("zero-run: note: tcmalloc is not installed (apt-get install libtcmalloc-minimal4)"),
                std::string::npos) << r.summary();
      EXPECT_EQ(count_occurrences(r.out, "heap glibc malloc\n"), 2) << r.summary();
    } else {
      EXPECT_NE(preload.find("libtcmalloc"), std::string::npos) << preload;
      EXPECT_TRUE(fs::exists(preload)) << preload;
      EXPECT_EQ(ranks[1]["LD_PRELOAD"], preload);
      EXPECT_EQ(ranks[0]["TCMALLOC_RELEASE_RATE"], "0");
      EXPECT_EQ(count_occurrences(r.out, "heap tcmalloc\n"), 2) << r.summary();
      EXPECT_EQ(r.err, "") << r.summary();
    }
  }
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--nproc", "1", "--allocator", "system", kProbe, "env", "heap"},
        std::vector<std::string>{"--nproc", "1", "--allocator=system", kProbe, "env", "heap"}}) {
    Result r = run(args, clean);
    ASSERT_TRUE(r.exited_with(0)) << r.summary();
    auto ranks = parse_env(r.out);
    EXPECT_EQ(ranks[0]["LD_PRELOAD"], "<unset>");
    EXPECT_EQ(ranks[0]["TCMALLOC_RELEASE_RATE"], "<unset>");
    EXPECT_NE(r.out.find("[rank 0] heap glibc malloc\n"), std::string::npos) << r.summary();
  }
  {
    Job::Env env = clean;
    env.set = {{"ZERO_ALLOCATOR", "system"}};
    auto ranks = parse_env(run({"--nproc", "1", kProbe, "env"}, env).out);
    EXPECT_EQ(ranks[0]["LD_PRELOAD"], "<unset>");
  }
  {
    // An allocator the user preloads stays the only one.
    Job::Env env = clean;
    env.set = {{"LD_PRELOAD", "libjemalloc.so.2"}};
    auto ranks = parse_env(run({"--nproc", "1", kProbe, "env"}, env).out);
    EXPECT_EQ(ranks[0]["LD_PRELOAD"], "libjemalloc.so.2");
  }
  {
    // Another preload is kept, after the allocator; tuning the user set is kept.
    Job::Env env = clean;
    env.set = {{"LD_PRELOAD", "libm.so.6"}, {"TCMALLOC_RELEASE_RATE", "3"}};
    Result r = run({"--nproc", "1", kProbe, "env"}, env);
    auto ranks = parse_env(r.out);
    const std::string preload = ranks[0]["LD_PRELOAD"];
    const std::string after = ":libm.so.6";
    const bool allocator_first = preload.find("libtcmalloc") != std::string::npos && preload.size() > after.size() &&
                                 preload.compare(preload.size() - after.size(), after.size(), after) == 0;
    EXPECT_TRUE(preload == "libm.so.6" || allocator_first) << preload;
    EXPECT_EQ(ranks[0]["TCMALLOC_RELEASE_RATE"], "3");
  }
}

// core/blas_kernels.h: OpenBLAS does not know every CPU model and falls back
// to SSE kernels for the ones it does not know; zero-run's ranks compute with
// AVX2 or wider kernels wherever the CPU has AVX2 (the kernel's flags in
// /proc/cpuinfo say so), and OPENBLAS_CORETYPE set by the user is kept.
TEST(Env, RanksGetOpenBlasKernelsForThisCpu) {
  Job::Env clean;
  clean.unset = {"OPENBLAS_CORETYPE"};
  Result r = run({"--nproc", "1", kProbe, "blas", "env"}, clean);
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  if (r.out.find("[rank 0] blas none\n") != std::string::npos) GTEST_SKIP() << "OpenBLAS is not installed";
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line + " ";
      break;
    }
  }
  if (flags.find(" avx2 ") == std::string::npos || flags.find(" fma ") == std::string::npos) {
    GTEST_SKIP() << "this CPU has no AVX2";
  }
  std::smatch core;
  ASSERT_TRUE(std::regex_search(r.out, core, std::regex("\\[rank 0\\] blas (\\S+)\n"))) << r.summary();
  const std::set<std::string> avx2_or_wider = {"Haswell", "Excavator", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
  EXPECT_EQ(avx2_or_wider.count(core[1]), 1u) << core[1] << "\n" << r.summary();

  Job::Env chosen;
  chosen.set = {{"OPENBLAS_CORETYPE", "Nehalem"}};
  r = run({"--nproc", "1", kProbe, "blas", "env"}, chosen);
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  EXPECT_EQ(parse_env(r.out)[0]["OPENBLAS_CORETYPE"], "Nehalem");
  EXPECT_NE(r.out.find("[rank 0] blas Nehalem\n"), std::string::npos) << r.summary();
}

TEST(Env, ArgumentsAfterProgramArePassedUnchanged) {
  Result r = run({"--nproc", "1", "--", kProbe, "args", "--nproc", "5", "--", "a b", ""});
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  EXPECT_EQ(r.out, "[rank 0] arg --nproc\n[rank 0] arg 5\n[rank 0] arg --\n[rank 0] arg a b\n[rank 0] arg \n");
}

TEST(Env, ProgramIsFoundThroughPath) {
  TempDir dir;
  const std::string link = dir.file("zero-run-test-probe");
  ASSERT_EQ(::symlink(kProbe.c_str(), link.c_str()), 0);
  Job::Env env;
  const char* path = std::getenv("PATH");
  env.set = {{"PATH", dir.str() + ":" + (path ? path : "/usr/bin:/bin")}};
  Result r = run({"--nproc", "2", "zero-run-test-probe", "print", "found"}, env);
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  auto lines = split_lines(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank 0] found", "[rank 1] found"}));
}

// ---------------------------------------------------------------------------
// Output

TEST(Output, EveryLineIsPrefixedWithItsRankOnTheRightStream) {
  Result r = run({"--nproc", "3", kProbe, "print", "to stdout", "eprint", "to stderr"});
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  auto out = split_lines(r.out), err = split_lines(r.err);
  std::sort(out.begin(), out.end());
  std::sort(err.begin(), err.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[rank 0] to stdout", "[rank 1] to stdout", "[rank 2] to stdout"}));
  EXPECT_EQ(err, (std::vector<std::string>{"[rank 0] to stderr", "[rank 1] to stderr", "[rank 2] to stderr"}));
}

// Many lines from 4 ranks, each line written in several pieces: every output
// line must be exactly one whole line of one rank, and each rank's lines
// must arrive complete and in order.
void check_no_interleaving(const std::string& text, int nproc, int nlines) {
  static const std::regex line_re(R"(^\[rank (\d+)\] line (\d+) (\d+) (x+)$)");
  std::vector<int> next(static_cast<size_t>(nproc), 0);
  int bad = 0;
  for (const std::string& line : split_lines(text)) {
    std::smatch m;
    if (!std::regex_match(line, m, line_re) || m[1] != m[2]) {
      if (++bad <= 5) ADD_FAILURE() << "malformed line: '" << line << "'";
      continue;
    }
    const int rank = std::stoi(m[1]), i = std::stoi(m[3]);
    ASSERT_LT(rank, nproc);
    EXPECT_EQ(i, next[static_cast<size_t>(rank)]) << "rank " << rank << " out of order";
    EXPECT_EQ(m[4].length(), static_cast<size_t>(1 + (i * 7 + rank) % 97)) << line;
    next[static_cast<size_t>(rank)] = i + 1;
  }
  EXPECT_EQ(bad, 0);
  for (int rank = 0; rank < nproc; ++rank) EXPECT_EQ(next[static_cast<size_t>(rank)], nlines) << "rank " << rank;
}

TEST(Output, LinesFromManyRanksNeverInterleave) {
  Result r = run({"--nproc", "4", kProbe, "lines", "3000", "elines", "500"});
  ASSERT_TRUE(r.exited_with(0)) << describe(r.status) << "\n" << r.err;
  check_no_interleaving(r.out, 4, 3000);
  check_no_interleaving(r.err, 4, 500);
}

TEST(Output, FinalPartialLineIsFlushedWithANewline) {
  Result r = run({"--nproc", "2", kProbe, "print", "whole", "partial", "no newline", "epartial", "err tail"});
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  auto out = split_lines(r.out), err = split_lines(r.err);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[rank 0] no newline", "[rank 0] whole", "[rank 1] no newline",
                                           "[rank 1] whole"}));
  std::sort(err.begin(), err.end());
  EXPECT_EQ(err, (std::vector<std::string>{"[rank 0] err tail", "[rank 1] err tail"}));
  EXPECT_EQ(r.out.back(), '\n');
}

TEST(Output, PartialLineOfAFailingRankComesBeforeTheVerdict) {
  Result r = run({"--nproc", "1", kProbe, "epartial", "last words", "exit", "4"});
  EXPECT_TRUE(r.exited_with(4)) << r.summary();
  EXPECT_EQ(r.err, "[rank 0] last words\nzero-run: rank 0 exited with code 4\n");
}

TEST(Output, LauncherDoesNotWaitForGrandchildrenHoldingThePipes) {
  // Each rank leaves a process behind that keeps its stdout/stderr open.
  Result r = run({"--nproc", "2", kProbe, "daemon", "4", "print", "done"});
  EXPECT_TRUE(r.exited_with(0)) << r.summary();
  EXPECT_LT(r.seconds, 3.0);
  EXPECT_EQ(count_occurrences(r.out, "] done\n"), 2) << r.summary();
}

TEST(Output, RanksInheritOnlyStandardDescriptors) {
  // A descriptor zero-run inherits without FD_CLOEXEC (here: a pipe of the
  // test) must not reach the ranks, or they would hold it open.
  int leaked[2];
  ASSERT_EQ(::pipe(leaked), 0);
  Result r = run({"--nproc", "2", kProbe, "fds"});
  ::close(leaked[0]);
  ::close(leaked[1]);
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  EXPECT_EQ(count_occurrences(r.out, "] fds none\n"), 2) << r.summary();
}

// ---------------------------------------------------------------------------
// Exit status

TEST(Exit, AllRanksSucceed) {
  Result r = run({"--nproc", "4", kProbe, "print", "ok"});
  EXPECT_TRUE(r.exited_with(0)) << r.summary();
  EXPECT_EQ(r.err, "");
}

TEST(Exit, FailingRankCodeIsPropagatedAndOthersStopQuickly) {
  Result r = run({"--nproc", "4", kProbe, "@2", "exit", "3", "sleep", "30"});
  EXPECT_TRUE(r.exited_with(3)) << r.summary();
  EXPECT_LT(r.seconds, 4.0) << "the other ranks were not stopped";
  EXPECT_NE(r.err.find("zero-run: rank 2 exited with code 3; stopping the other ranks\n"), std::string::npos)
      << r.summary();
  EXPECT_EQ(count_occurrences(r.err, "zero-run:"), 1) << "only the first failure is reported\n" << r.summary();
}

TEST(Exit, OnlyTheFirstFailureCounts) {
  Result r = run({"--nproc", "3", kProbe, "@1", "exit", "4", "@2", "exit", "5", "sleep", "30"});
  ASSERT_TRUE(r.exited_with(4) || r.exited_with(5)) << r.summary();
  const int code = WEXITSTATUS(r.status);
  const std::string rank = code == 4 ? "1" : "2";
  EXPECT_NE(r.err.find("zero-run: rank " + rank + " exited with code " + std::to_string(code)), std::string::npos)
      << r.summary();
  EXPECT_EQ(count_occurrences(r.err, "zero-run:"), 1) << r.summary();
  EXPECT_LT(r.seconds, 4.0);
}

TEST(Exit, RankKilledBySignalGives128PlusSignal) {
  Result r = run({"--nproc", "3", kProbe, "@1", "kill", "9", "sleep", "30"});
  EXPECT_TRUE(r.exited_with(128 + SIGKILL)) << r.summary();
  EXPECT_NE(r.err.find("zero-run: rank 1 was killed by SIGKILL (signal 9); stopping the other ranks"),
            std::string::npos)
      << r.summary();
  EXPECT_LT(r.seconds, 4.0);

  Result u = run({"--nproc", "2", kProbe, "@0", "kill", std::to_string(SIGUSR1), "sleep", "30"});
  EXPECT_TRUE(u.exited_with(128 + SIGUSR1)) << u.summary();
  EXPECT_NE(u.err.find("rank 0 was killed by SIGUSR1"), std::string::npos) << u.summary();
}

TEST(Exit, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  TempDir dir;
  Result r = run({"--nproc", "3", "--timeout-s", "1", kProbe,             //
                  "@1", "ignore-term", "@1", "ready", dir.str(),          // rank 1 will not stop on SIGTERM
                  "@0", "wait-file", dir.file("ready.1"), "@0", "exit", "5",  // then rank 0 fails
                  "sleep", "30"});
  EXPECT_TRUE(r.exited_with(5)) << r.summary();
  EXPECT_GE(r.seconds, 1.0) << "SIGKILL came before the grace period ended";
  EXPECT_LT(r.seconds, 5.0) << "no SIGKILL after the grace period";
  EXPECT_NE(r.err.find("zero-run: rank 1 still running 1 s after being told to stop; sending SIGKILL"),
            std::string::npos)
      << r.summary();
}

// ---------------------------------------------------------------------------
// Signals sent to the launcher

// Starts `nproc` probes that record SIGTERM/SIGINT and sleep, waits until all
// are ready, then lets `send` deliver a signal.
void expect_signal_reaches_every_rank(int sig, bool to_whole_group) {
  TempDir dir;
  const int nproc = 3;
  Job job({"--nproc", std::to_string(nproc), kProbe, "on-signal", dir.str(), "ready", dir.str(), "sleep", "30"});
  ASSERT_TRUE(wait_for_files(dir, "ready", nproc)) << "ranks did not start";
  // to_whole_group: as ctrl-c in a terminal, which signals the foreground
  // process group (here: zero-run's own group, made by Job).
  ::kill(to_whole_group ? -job.pid() : job.pid(), sig);
  Result r = job.wait();
  EXPECT_TRUE(r.killed_by(sig)) << "zero-run should end by the signal it received\n" << r.summary();
  EXPECT_LT(r.seconds, 5.0);
  const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  for (int rank = 0; rank < nproc; ++rank) {
    // Exactly once: a rank must not get it both from the terminal and from zero-run.
    EXPECT_EQ(read_file(dir.file("signal." + std::to_string(rank))), name + "\n") << "rank " << rank;
  }
  EXPECT_NE(r.err.find("zero-run: received " + name), std::string::npos) << r.summary();
}

TEST(Signals, SigtermReachesEveryRank) { expect_signal_reaches_every_rank(SIGTERM, false); }
TEST(Signals, SigintReachesEveryRank) { expect_signal_reaches_every_rank(SIGINT, false); }
TEST(Signals, CtrlCToTheWholeGroupReachesEachRankOnce) { expect_signal_reaches_every_rank(SIGINT, true); }

TEST(Signals, SigtermReachesProcessesStartedByRanks) {
  TempDir dir;
  const int nproc = 2;
  Job job({"--nproc", std::to_string(nproc), kProbe, "grandchild", dir.str(), "ready", dir.str(), "sleep", "30"});
  ASSERT_TRUE(wait_for_files(dir, "ready", nproc));
  ASSERT_TRUE(wait_for_files(dir, "gcready", nproc));
  ::kill(job.pid(), SIGTERM);
  Result r = job.wait();
  EXPECT_TRUE(r.killed_by(SIGTERM)) << r.summary();
  EXPECT_TRUE(wait_for_files(dir, "grandchild", nproc, 5)) << "a rank's child did not get SIGTERM";
}

TEST(Signals, RankIgnoringForwardedSignalIsKilledAfterTheGracePeriod) {
  TempDir dir;
  Job job({"--nproc", "2", "--timeout-s", "0.5", kProbe, "@0", "ignore-term", "ready", dir.str(), "sleep", "30"});
  ASSERT_TRUE(wait_for_files(dir, "ready", 2));
  ::kill(job.pid(), SIGTERM);
  Result r = job.wait();
  EXPECT_TRUE(r.killed_by(SIGTERM)) << r.summary();
  EXPECT_GE(r.seconds, 0.5);
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_NE(r.err.find("rank 0 still running 0.5 s after being told to stop; sending SIGKILL"), std::string::npos)
      << r.summary();
}

// ---------------------------------------------------------------------------
// Command line

struct UsageCase {
  std::vector<std::string> args;
  std::string message;
};

TEST(Usage, BadCommandLinesExitWith2AndSayWhy) {
  const std::vector<UsageCase> cases = {
      {{}, "zero-run: missing --nproc"},
      {{kProbe}, "zero-run: missing --nproc"},
      {{"--nproc", "0", kProbe}, "zero-run: --nproc must be an integer in [1, "},
      {{"--nproc", "-3", kProbe}, "zero-run: --nproc must be an integer in [1, "},
      {{"--nproc", "two", kProbe}, "zero-run: --nproc must be an integer in [1, "},
      {{"--nproc"}, "zero-run: option '--nproc' needs a value"},
      {{"--nproc", "2", "--bogus", kProbe}, "zero-run: unknown option '--bogus'"},
      {{"--nproc", "2"}, "zero-run: missing PROGRAM"},
      {{"--nproc", "2", "--"}, "zero-run: missing PROGRAM"},
      {{"--nproc", "2", "--nnodes", "2", kProbe}, "zero-run: --master-port is required when --nnodes > 1"},
      {{"--nproc", "2", "--nnodes", "2", "--node-rank", "2", "--master-port", "1234", kProbe},
       "zero-run: --node-rank must be in [0, 2), got 2"},
      {{"--nproc", "2", "--node-rank", "1", kProbe}, "zero-run: --node-rank must be in [0, 1), got 1"},
      {{"--nproc", "2", "--master-port", "70000", kProbe}, "zero-run: --master-port must be an integer in [1, 65535]"},
      {{"--nproc", "2", "--master-port", " 80", kProbe}, "zero-run: --master-port must be an integer in [1, 65535]"},
      {{"--nproc", "100000000", kProbe}, "zero-run: --nproc must be an integer in [1, 65536], got '100000000'"},
      {{"--nproc", "300", "--nnodes", "300", "--master-port", "1234", kProbe},
       "zero-run: --nproc 300 x --nnodes 300 is 90000 ranks, more than the 65536 a job may have"},
      {{"--nproc", "2", "--timeout-s", "-1", kProbe}, "zero-run: --timeout-s must be a number of seconds >= 0"},
      {{"--nproc", "2", "--max-restarts", "-1", kProbe}, "zero-run: --max-restarts must be an integer in [0, 1000000]"},
      {{"--nproc", "2", "--nnodes", "2", "--max-restarts", "1", kProbe},
       "zero-run: --master-port is required when --nnodes > 1"},
      {{"--nproc", "2", "--allocator", "ptmalloc", kProbe},
       "zero-run: --allocator must be tcmalloc, jemalloc, system or a library path; got 'ptmalloc'"},
      {{"--nproc", "2", "--allocator", "/nonexistent/libtcmalloc.so", kProbe},
       "zero-run: --allocator /nonexistent/libtcmalloc.so: no readable library at that path"},
  };
  for (const UsageCase& c : cases) {
    std::string cmd;
    for (const auto& a : c.args) cmd += " " + a;
    Result r = run(c.args);
    EXPECT_TRUE(r.exited_with(2)) << "zero-run" << cmd << "\n" << r.summary();
    EXPECT_EQ(r.err.rfind(c.message, 0), 0u) << "zero-run" << cmd << "\n" << r.summary();
    EXPECT_NE(r.err.find("usage: zero-run --nproc N"), std::string::npos) << "zero-run" << cmd;
    EXPECT_EQ(r.out, "") << "zero-run" << cmd;
  }
}

// A launch config's unknown key stops zero-run before any rank starts, with
// one message naming the file, the key and the nearest known key (Note
// [Unknown keys] in accelerate/launch_config.cpp), not a warning per process
// and a run with the key's default.
TEST(Usage, ALaunchConfigTypoIsOneErrorBeforeAnyRankStarts) {
#ifndef ZERO_HAVE_YAML
  GTEST_SKIP() << "zero-run was built without yaml-cpp";
#endif
  TempDir dir;
  struct Case {
    std::string yaml, message;
  };
  const std::vector<Case> cases = {
      {"distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stgae: 3\n",
       ": deepspeed_config.zero_stgae: unknown key; did you mean \"zero_stage\"?\n"},
      {"distributed_type: MULTI_CPU\nnum_process: 2\n", ": num_process: unknown key; did you mean \"num_processes\"?\n"},
  };
  for (const Case& c : cases) {
    const std::string file = dir.file("launch.yaml");
    std::ofstream(file) << c.yaml;
    Result r = run({"--config-file", file, kProbe, "print", "started"});
    EXPECT_TRUE(r.exited_with(2)) << r.summary();
    const std::string expected = "zero-run: launch config " + file + c.message;
    EXPECT_EQ(r.err.rfind(expected, 0), 0u) << r.summary();
    EXPECT_EQ(r.err.find("unknown key", expected.size()), std::string::npos) << "said twice\n" << r.summary();
    EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.summary();
    EXPECT_EQ(r.out, "") << "a rank started\n" << r.summary();
  }
}

// A launch config gets the checks of the JSON readers (accelerate/
// launch_config.cpp): only a regular file of at most 1 MiB is read (/dev/zero
// ended in std::bad_alloc and "terminate called", a FIFO hung), nesting is
// bounded, a key written twice or a key that is not a name is an error
// naming it and the file, and so is a second document. Each ends at once
// with exit 2, before any rank starts.
TEST(Usage, ALaunchConfigIsReadAsStrictlyAsADsConfig) {
#ifndef ZERO_HAVE_YAML
  GTEST_SKIP() << "zero-run was built without yaml-cpp";
#endif
  TempDir dir;
  const std::string fifo = dir.file("fifo.yaml");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string head = "distributed_type: MULTI_CPU\nnum_processes: 1\n";
  auto file = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.file(name)) << text;
    return dir.file(name);
  };
  struct Case {
    std::string path, message;
  };
  const std::vector<Case> cases = {
      {"/dev/zero", "launch config /dev/zero: cannot be read: /dev/zero is a character device, not a regular file"},
      {fifo, "launch config " + fifo + ": cannot be read: " + fifo + " is a FIFO, not a regular file"},
      {dir.str(), "launch config " + dir.str() + ": cannot be read: " + dir.str() + " is a directory, not a regular file"},
      {file("big.yaml", head + std::string(1 << 20, '#')),
       "launch config " + dir.file("big.yaml") + ": cannot be read: " + dir.file("big.yaml") + " has 1048621 bytes, "
       "more than the 1048576 such a file may have"},
      {file("deep.yaml", head + "gpu_ids: " + std::string(100, '[') + std::string(100, ']') + "\n"),
       "launch config " + dir.file("deep.yaml") + ": nested deeper than 64 levels at line 3 (a launch config nests 2)"},
      {file("dup.yaml", head + "num_processes: 2\n"),
       "launch config " + dir.file("dup.yaml") + ": num_processes: duplicate key (a key may appear once per mapping; "
       "which one was meant?)"},
      {file("dup_ds.yaml", "distributed_type: DEEPSPEED\nnum_processes: 1\ndeepspeed_config:\n  zero_stage: 2\n"
                           "  offload_param_device: none\n  zero_stage: 0\n"),
       "launch config " + dir.file("dup_ds.yaml") + ": deepspeed_config.zero_stage: duplicate key"},
      {file("dup_alias.yaml", "distributed_type: MULTI_CPU\n&n num_processes: 1\n*n : 2\n"),
       "launch config " + dir.file("dup_alias.yaml") + ": num_processes: duplicate key"},
      {file("list_key.yaml", head + "[num_processes]: 2\n"),
       "launch config " + dir.file("list_key.yaml") + ": a key at line 3 is a list; keys are plain names"},
      {file("map_key.yaml", "distributed_type: DEEPSPEED\nnum_processes: 1\ndeepspeed_config:\n  {zero_stage: 1}: 2\n"),
       "launch config " + dir.file("map_key.yaml") + ": deepspeed_config: a key at line 4 is a mapping; keys are plain names"},
      {file("list_value.yaml", "distributed_type: MULTI_CPU\nnum_processes: [1, 2]\n"),
       "launch config " + dir.file("list_value.yaml") + ": num_processes: expected a single value, found a list"},
      {file("map_value.yaml", head + "main_process_ip: {a: 1}\n"),
       "launch config " + dir.file("map_value.yaml") + ": main_process_ip: expected a single value, found a mapping"},
      {file("two_docs.yaml", head + "---\nnum_processes: 2\n"),
       "launch config " + dir.file("two_docs.yaml") + ": holds more than one YAML document"},
      {file("world.yaml", "distributed_type: MULTI_CPU\nnum_processes: 100000000\n"),
       "launch config " + dir.file("world.yaml") + ": num_processes: must be in [1, 65536], found 100000000"},
  };
  for (const Case& c : cases) {
    Job job({"--config-file", c.path, kProbe, "print", "started"});
    Result r = job.wait(10);
    EXPECT_TRUE(r.exited_with(2)) << c.path << "\n" << r.summary();
    EXPECT_EQ(r.err.rfind("zero-run: " + c.message, 0), 0u) << r.summary();
    EXPECT_LT(r.seconds, 5.0) << c.path;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.summary();
    EXPECT_EQ(r.out, "") << "a rank started\n" << r.summary();
  }
}

TEST(Usage, HelpPrintsUsageAndExits0) {
  Result r = run({"--help"});
  EXPECT_TRUE(r.exited_with(0)) << r.summary();
  EXPECT_EQ(r.out.rfind("usage: zero-run --nproc N", 0), 0u) << r.summary();
  EXPECT_NE(r.out.find("--timeout-s"), std::string::npos);
}

TEST(Usage, TorchrunSpellingsAreAccepted) {
  Result r = run({"--nproc_per_node", "2", "--nnodes=1", "--node_rank=0", kProbe, "env"});
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  EXPECT_EQ(parse_env(r.out).size(), 2u);
}

// DeepSpeed's launcher flags with the same meaning: --num_gpus is --nproc,
// --num_nodes is --nnodes.
TEST(Usage, DeepSpeedSpellingsAreAccepted) {
  Result r = run({"--num_gpus", "2", "--num_nodes=1", kProbe, "env"});
  ASSERT_TRUE(r.exited_with(0)) << r.summary();
  const auto ranks = parse_env(r.out);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks.begin()->second.at("WORLD_SIZE"), "2");
}

// A near miss names the option meant.
TEST(Usage, AnOptionNearAKnownOneIsSuggested) {
  Result r = run({"--nprocs", "2", kProbe});
  EXPECT_TRUE(r.exited_with(2)) << r.summary();
  EXPECT_EQ(r.err.rfind("zero-run: unknown option '--nprocs'; did you mean --nproc?", 0), 0u) << r.summary();
  Result port = run({"--nproc", "2", "--master_prot", "1234", kProbe});
  EXPECT_EQ(port.err.rfind("zero-run: unknown option '--master_prot'; did you mean --master-port?", 0), 0u)
      << port.summary();
}

TEST(Usage, UnknownProgramExits127LikeAShell) {
  Result r = run({"--nproc", "2", "zero-run-no-such-program"});
  EXPECT_TRUE(r.exited_with(127)) << r.summary();
  EXPECT_EQ(r.err, "zero-run: cannot run 'zero-run-no-such-program': No such file or directory\n");
  EXPECT_EQ(r.out, "");

  Result p = run({"--nproc", "2", "/nonexistent/dir/prog"});
  EXPECT_TRUE(p.exited_with(127)) << p.summary();
  EXPECT_EQ(p.err, "zero-run: cannot run '/nonexistent/dir/prog': No such file or directory\n");
}

TEST(Usage, NonExecutableProgramExits126) {
  TempDir dir;
  const std::string file = dir.file("not-executable");
  std::ofstream(file) << "#!/bin/sh\necho hi\n";
  ::chmod(file.c_str(), 0644);
  Result r = run({"--nproc", "2", file});
  EXPECT_TRUE(r.exited_with(126)) << r.summary();
  EXPECT_EQ(r.err, "zero-run: cannot run '" + file + "': Permission denied\n");
}

}  // namespace
