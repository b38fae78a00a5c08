// zero-run: spawning the ranks, relaying their output, supervising them.
// See launcher.h for the overview; the Notes below explain the invariants.
#include "launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace zero_run {
namespace {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Output: whole writes to the launcher's stdout/stderr.

// A reader that went away (`zero-run ... | head`) must not kill the launcher
// and orphan the ranks: SIGPIPE is ignored and output to a broken pipe is
// dropped from then on.
struct Sink {
  int fd;
  bool broken = false;

  void write_all(const std::string& data) {
    size_t done = 0;
    while (!broken && done < data.size()) {
      ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n >= 0) {
        done += static_cast<size_t>(n);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{fd, POLLOUT, 0};  // a non-blocking fd inherited from our parent
        ::poll(&p, 1, 1000);
      } else if (errno != EINTR) {
        broken = true;
      }
    }
  }
};

Sink g_stdout{STDOUT_FILENO};
Sink g_stderr{STDERR_FILENO};

// One line from the launcher itself, on stderr.
void say(const std::string& message) { g_stderr.write_all("zero-run: " + message + "\n"); }

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "signal " + std::to_string(sig);
  }
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

// ---------------------------------------------------------------------------
// Note [Line relay]
// Each rank's stdout and stderr are pipes read by one poll() loop in one
// thread. A Stream buffers bytes until a newline and writes only complete
// lines, each prefixed with "[rank r] ", to the launcher's stdout (resp.
// stderr); since nothing else writes there meanwhile, lines of different
// ranks never mix. A last line without a newline is written, with a newline
// added, when the pipe closes or the launcher finishes; a line longer than
// kMaxLine is cut into pieces so that memory stays bounded.

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxLine = 1024 * 1024;

class Stream {
 public:
  Stream(int fd, Sink* sink, std::string prefix) : fd_(fd), sink_(sink), prefix_(std::move(prefix)) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { close(); }

  int fd() const { return fd_; }
  bool is_open() const { return fd_ >= 0; }

  // One read() of what is available. Returns false when nothing was read
  // (nothing available yet, or the pipe is now closed).
  bool read_some() {
    if (fd_ < 0) return false;
    char buf[kReadChunk];
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n <= 0) {  // EOF or a read error: either way this pipe is done
      finish();
      return false;
    }
    std::string out;
    const char* p = buf;
    const char* end = buf + n;
    while (const void* nl = std::memchr(p, '\n', static_cast<size_t>(end - p))) {
      const char* line_end = static_cast<const char*>(nl) + 1;
      out += prefix_;
      out += partial_;
      out.append(p, line_end);
      partial_.clear();
      p = line_end;
    }
    partial_.append(p, end);
    if (partial_.size() >= kMaxLine) {
      out += prefix_ + partial_ + "\n";
      partial_.clear();
    }
    if (!out.empty()) sink_->write_all(out);
    return true;
  }

  // Reads until nothing more is available right now (bounded, in case a
  // process that still holds the pipe keeps writing).
  void drain() {
    for (int i = 0; i < 256 && read_some(); ++i) {
    }
  }

  // Writes the partial last line, if any, and closes the pipe.
  void finish() {
    if (!partial_.empty()) {
      sink_->write_all(prefix_ + partial_ + "\n");
      partial_.clear();
    }
    close();
  }

 private:
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  int fd_;
  Sink* sink_;
  std::string prefix_;
  std::string partial_;
};

// ---------------------------------------------------------------------------
// Signals: a self-pipe turns them into readable bytes for the poll() loop.

int g_signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_signal_pipe[1], &byte, 1);  // non-blocking; a full pipe loses nothing that matters
  (void)ignored;
  errno = saved;
}

// Signals the launcher handles. Their dispositions on entry (SIG_DFL or
// SIG_IGN: exec resets handlers) are restored in the children, so that e.g.
// `nohup zero-run ...` still gives ranks an ignored SIGHUP.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};
constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGTSTP, SIGCHLD, SIGPIPE};

struct SignalState {
  struct sigaction original[sizeof(kHandled) / sizeof(kHandled[0])];
  sigset_t original_mask;
};

SignalState g_signals;

bool set_handler(int sig, void (*handler)(int)) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
  return ::sigaction(sig, &sa, nullptr) == 0;
}

bool set_nonblocking_cloexec(int fd) {
  int fl = ::fcntl(fd, F_GETFL);
  int fd_flags = ::fcntl(fd, F_GETFD);
  return fl >= 0 && fd_flags >= 0 && ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0 &&
         ::fcntl(fd, F_SETFD, fd_flags | FD_CLOEXEC) == 0;
}

bool install_signal_handlers(std::string* error) {
  if (::pipe(g_signal_pipe) != 0 || !set_nonblocking_cloexec(g_signal_pipe[0]) ||
      !set_nonblocking_cloexec(g_signal_pipe[1])) {
    *error = std::string("cannot create the signal pipe: ") + std::strerror(errno);
    return false;
  }
  ::sigprocmask(SIG_SETMASK, nullptr, &g_signals.original_mask);
  for (size_t i = 0; i < sizeof(kHandled) / sizeof(kHandled[0]); ++i) {
    int sig = kHandled[i];
    ::sigaction(sig, nullptr, &g_signals.original[i]);
    if (sig == SIGPIPE) {
      ::signal(SIGPIPE, SIG_IGN);
    } else if (sig == SIGCHLD || g_signals.original[i].sa_handler != SIG_IGN) {
      // A signal ignored on entry (background job, nohup) stays ignored.
      set_handler(sig, on_signal);
    }
  }
  // The launcher's own mask must not block what it handles.
  sigset_t unblock;
  sigemptyset(&unblock);
  for (int sig : kHandled) sigaddset(&unblock, sig);
  ::sigprocmask(SIG_UNBLOCK, &unblock, nullptr);
  return true;
}

// In a forked child, before exec: entry dispositions and mask back.
void restore_signals_in_child() {
  for (size_t i = 0; i < sizeof(kHandled) / sizeof(kHandled[0]); ++i) {
    ::sigaction(kHandled[i], &g_signals.original[i], nullptr);
  }
  ::sigprocmask(SIG_SETMASK, &g_signals.original_mask, nullptr);
}

// ---------------------------------------------------------------------------
// Note [Launch environment]
// Every rank gets the launcher's environment plus torchrun's variables:
// RANK (= node_rank * nproc + local_rank), LOCAL_RANK, WORLD_SIZE,
// LOCAL_WORLD_SIZE, GROUP_RANK (node rank), GROUP_WORLD_SIZE (nodes),
// ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME=default, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT=0, TORCHELASTIC_MAX_RESTARTS=0 and
// TORCHELASTIC_RUN_ID=none (torchrun's defaults). TORCHELASTIC_USE_AGENT_STORE
// is removed, even when inherited: there is no agent store, rank 0 of the
// job starts the store itself. Like torchrun, OMP_NUM_THREADS is set when
// unset and nproc > 1, though not to 1 but to this machine's CPUs divided
// among the local ranks, so that ranks do not oversubscribe the cores.
// LD_PRELOAD gains the heap allocator of --allocator (allocator.h) with its
// tuning variables, each only where the user has not set it.

bool has_name(const char* entry, const char* name) {
  size_t len = std::strlen(name);
  return std::strncmp(entry, name, len) == 0 && entry[len] == '=';
}

int available_cpus() {
#ifdef __linux__
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

class Environment {
 public:
  Environment(const LaunchOptions& o, int master_port) : options_(o) {
    static const char* const kReplaced[] = {
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE"};
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      bool replaced = false;
      for (const char* name : kReplaced) replaced = replaced || has_name(*e, name);
      for (const std::string& extra : o.extra_env) {
        replaced = replaced || has_name(*e, extra.substr(0, extra.find('=')).c_str());
      }
      if (!replaced) common_.emplace_back(*e);
    }
    for (const std::string& extra : o.extra_env) common_.push_back(extra);
    const std::string world = std::to_string(o.nproc * o.nnodes);
    common_.push_back("WORLD_SIZE=" + world);
    common_.push_back("ROLE_WORLD_SIZE=" + world);
    common_.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
    common_.push_back("GROUP_RANK=" + std::to_string(o.node_rank));
    common_.push_back("GROUP_WORLD_SIZE=" + std::to_string(o.nnodes));
    common_.push_back("ROLE_NAME=default");
    common_.push_back("MASTER_ADDR=" + o.master_addr);
    common_.push_back("MASTER_PORT=" + std::to_string(master_port));
    common_.push_back("TORCHELASTIC_RESTART_COUNT=0");
    common_.push_back("TORCHELASTIC_MAX_RESTARTS=0");
    common_.push_back("TORCHELASTIC_RUN_ID=none");
    if (o.nproc > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
      common_.push_back("OMP_NUM_THREADS=" + std::to_string(std::max(1, available_cpus() / o.nproc)));
    }
  }

  // The environment of one local rank, as strings owned by this object
  // (valid until the next call).
  char** for_rank(int local_rank) {
    const int rank = options_.node_rank * options_.nproc + local_rank;
    rank_vars_ = {"RANK=" + std::to_string(rank), "ROLE_RANK=" + std::to_string(rank),
                  "LOCAL_RANK=" + std::to_string(local_rank)};
    pointers_.clear();
    for (std::string& s : common_) pointers_.push_back(&s[0]);
    for (std::string& s : rank_vars_) pointers_.push_back(&s[0]);
    pointers_.push_back(nullptr);
    return pointers_.data();
  }

 private:
  const LaunchOptions& options_;
  std::vector<std::string> common_;
  std::vector<std::string> rank_vars_;
  std::vector<char*> pointers_;
};

// ---------------------------------------------------------------------------
// A free TCP port: bind port 0 on the master address (any address if that
// fails) and read back what the kernel chose. Returns 0 on failure.

int bound_port(const sockaddr* addr, socklen_t len) {
  int s = ::socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return 0;
  int port = 0;
  sockaddr_storage got;
  socklen_t got_len = sizeof got;
  if (::bind(s, addr, len) == 0 && ::getsockname(s, reinterpret_cast<sockaddr*>(&got), &got_len) == 0) {
    if (got.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&got)->sin_port);
    if (got.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&got)->sin6_port);
  }
  ::close(s);
  return port;
}

int find_free_port(const std::string& host) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &found) == 0) {
    int port = 0;
    for (addrinfo* a = found; a != nullptr && port == 0; a = a->ai_next) port = bound_port(a->ai_addr, a->ai_addrlen);
    ::freeaddrinfo(found);
    if (port != 0) return port;
  }
  sockaddr_in any;
  std::memset(&any, 0, sizeof any);
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  return bound_port(reinterpret_cast<sockaddr*>(&any), sizeof any);
}

// ---------------------------------------------------------------------------
// Like torchrun (Popen's close_fds), a rank inherits only fds 0-2: a stray
// descriptor the launcher inherited (the write end of its caller's pipe, say)
// would otherwise be held open by every rank and what it starts. `keep` (the
// exec status pipe, FD_CLOEXEC) stays until exec.
void close_inherited_fds(int keep) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  if (keep > 3) ::close_range(3, static_cast<unsigned>(keep - 1), 0);
  if (::close_range(static_cast<unsigned>(keep + 1), ~0U, 0) == 0) return;
  // close_range is not in this kernel: fall through
#endif
  long max_fd = ::sysconf(_SC_OPEN_MAX);
  if (max_fd < 0 || max_fd > 65536) max_fd = 65536;
  for (int fd = 3; fd < max_fd; ++fd) {
    if (fd != keep) ::close(fd);
  }
}

// ---------------------------------------------------------------------------
// Note [Stopping the ranks]
// Each rank runs in its own process group (pgid = its pid), so a signal sent
// to -pgid also reaches the processes it started. Since no rank is in the
// launcher's group, ctrl-c in a terminal (SIGINT to the foreground group)
// reaches the ranks once, forwarded by the launcher, never twice; ranks read
// /dev/null instead of a terminal stdin, which a background group may not
// read. The first failure (a rank exiting non-zero or killed, or a SIGINT,
// SIGTERM or SIGHUP received by the launcher) starts the stop: the others get
// SIGTERM (or the received signal), and whatever still runs after the grace
// period gets SIGKILL. Only that first event is reported and decides the
// exit status; later exits are its consequences. On Linux a rank also gets
// SIGTERM if the launcher dies without stopping it (PR_SET_PDEATHSIG).

struct Rank {
  int local_rank = 0;
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  std::unique_ptr<Stream> out, err;
};

std::string exit_description(int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "was killed by " + signal_name(sig) + " (signal " + std::to_string(sig) + ")";
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) {
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

class Launcher {
 public:
  Launcher(const LaunchOptions& options, int master_port)
      : options_(options), env_(options, master_port), argv_(make_argv(options.command)) {}

  int run() {
    start_ranks();
    supervise();
    for (Rank& r : ranks_) {  // output still buffered in the pipes, then partial lines
      if (r.out) r.out->drain(), r.out->finish();
      if (r.err) r.err->drain(), r.err->finish();
    }
    if (received_signal_ != 0) reraise(received_signal_);
    return exit_code_;
  }

 private:
  static std::vector<char*> make_argv(const std::vector<std::string>& command) {
    std::vector<char*> argv;
    for (const std::string& s : command) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    return argv;
  }

  bool stopping() const { return exit_code_ != 0 || received_signal_ != 0; }

  // ---- starting -----------------------------------------------------------

  void start_ranks() {
    stdin_fd_ = ::isatty(STDIN_FILENO) ? ::open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
    ranks_.resize(static_cast<size_t>(options_.nproc));
    for (int i = 0; i < options_.nproc && !stopping(); ++i) {
      Rank& r = ranks_[static_cast<size_t>(i)];
      r.local_rank = i;
      r.rank = options_.node_rank * options_.nproc + i;
      start_rank(r);
    }
    if (stdin_fd_ >= 0) ::close(stdin_fd_);
  }

  // Starts one rank. A failure to start it (pipe, fork or exec) is the job's
  // first failure: the ranks already started are stopped.
  void start_rank(Rank& r) {
    int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_status[2] = {-1, -1};
    if (::pipe(out) != 0 || ::pipe(err) != 0 || ::pipe(exec_status) != 0) {
      int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1], exec_status[0], exec_status[1]})
        if (fd >= 0) ::close(fd);
      return fail_to_start(std::string("cannot start rank ") + std::to_string(r.rank) + ": " + std::strerror(e),
                           kExitInternal);
    }
    for (int fd : {out[0], out[1], err[0], err[1], exec_status[0], exec_status[1]}) {
      ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    char** envp = env_.for_rank(r.local_rank);
    const pid_t launcher_pid = ::getpid();

    // No handler may run in the child between fork and exec.
    sigset_t all, previous;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &previous);
    pid_t pid = ::fork();
    if (pid == 0) exec_child(out[1], err[1], exec_status[1], envp, launcher_pid);  // never returns
    int fork_errno = errno;
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);

    ::close(out[1]);
    ::close(err[1]);
    ::close(exec_status[1]);
    if (pid < 0) {
      for (int fd : {out[0], err[0], exec_status[0]}) ::close(fd);
      return fail_to_start("cannot start rank " + std::to_string(r.rank) + ": " + std::strerror(fork_errno),
                           kExitInternal);
    }
    ::setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
    r.pid = pid;
    r.running = true;
    const std::string prefix = "[rank " + std::to_string(r.rank) + "] ";
    set_nonblocking_cloexec(out[0]);
    set_nonblocking_cloexec(err[0]);
    r.out.reset(new Stream(out[0], &g_stdout, prefix));
    r.err.reset(new Stream(err[0], &g_stderr, prefix));

    // The status pipe closes on a successful exec, or carries exec's errno.
    int exec_errno = 0;
    ssize_t n;
    do {
      n = ::read(exec_status[0], &exec_errno, sizeof exec_errno);
    } while (n < 0 && errno == EINTR);
    ::close(exec_status[0]);
    if (n == static_cast<ssize_t>(sizeof exec_errno)) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      r.running = false;
      const int code = exec_errno == ENOENT ? kExitNotFound : kExitCannotExec;
      fail_to_start("cannot run '" + options_.command[0] + "': " + std::strerror(exec_errno), code);
    }
  }

  [[noreturn]] void exec_child(int out_fd, int err_fd, int status_fd, char** envp, pid_t launcher_pid) {
    restore_signals_in_child();
    ::setpgid(0, 0);
#ifdef __linux__
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher_pid) ::_exit(kExitInternal);  // the launcher is already gone
#else
    (void)launcher_pid;
#endif
    // dup2 clears FD_CLOEXEC on the copies; the originals close at exec.
    // (fds 0-2 are open in the launcher, so no pipe end is itself 0, 1 or 2.)
    if (stdin_fd_ >= 0) ::dup2(stdin_fd_, STDIN_FILENO);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    close_inherited_fds(status_fd);
    environ = envp;
    ::execvp(argv_[0], argv_.data());
    int e = errno;
    ssize_t ignored = ::write(status_fd, &e, sizeof e);
    (void)ignored;
    ::_exit(kExitNotFound);
  }

  void fail_to_start(const std::string& message, int code) {
    say(message);
    exit_code_ = code;
    begin_stop(SIGTERM);
  }

  // ---- supervising --------------------------------------------------------

  int running_count() const {
    int n = 0;
    for (const Rank& r : ranks_) n += r.running ? 1 : 0;
    return n;
  }

  void supervise() {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    for (;;) {
      reap();
      if (running_count() == 0) return;
      if (stop_deadline_ && !killed_ && Clock::now() >= *stop_deadline_) kill_remaining();

      fds.assign(1, pollfd{g_signal_pipe[0], POLLIN, 0});
      streams.assign(1, nullptr);
      for (Rank& r : ranks_) {
        for (Stream* s : {r.out.get(), r.err.get()}) {
          if (s != nullptr && s->is_open()) {
            fds.push_back(pollfd{s->fd(), POLLIN, 0});
            streams.push_back(s);
          }
        }
      }
      int timeout_ms = 1000;  // SIGCHLD wakes us; the cap is only a safety net
      if (stop_deadline_ && !killed_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*stop_deadline_ - Clock::now()).count();
        timeout_ms = static_cast<int>(std::max<long long>(0, std::min<long long>(timeout_ms, left + 1)));
      }
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
        if (errno == EINTR) continue;
        say(std::string("poll failed: ") + std::strerror(errno));
        if (!stopping()) exit_code_ = kExitInternal;
        begin_stop(SIGKILL);
        ::sleep(1);  // SIGCHLD arrives, or the next failing poll() comes
        continue;
      }
      if (fds[0].revents != 0) handle_signals();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) streams[i]->read_some();
      }
    }
  }

  void reap() {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      int status = 0;
      pid_t got = ::waitpid(r.pid, &status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      r.running = false;
      if (got < 0) status = 0;  // cannot happen for our own child; treat as gone
      // Its last words first, then our verdict.
      r.out->drain();
      r.err->drain();
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !stopping()) {
        exit_code_ = exit_code_of(status);  // non-zero: failed means non-zero or killed
        const bool others = running_count() > 0;
        say("rank " + std::to_string(r.rank) + " " + exit_description(status) +
            (others ? "; stopping the other ranks" : ""));
        begin_stop(SIGTERM);
      }
    }
  }

  void handle_signals() {
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(g_signal_pipe[0], buf, sizeof buf)) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        const int sig = buf[i];
        if (sig == SIGCHLD) continue;  // reap() runs on every iteration
        if (sig == SIGTSTP) {
          suspend();
          continue;
        }
        // SIGINT, SIGTERM, SIGHUP: forwarded every time it arrives.
        const bool first = !stopping();
        if (first) received_signal_ = sig;
        say("received " + signal_name(sig) + "; " + (first ? "stopping" : "forwarding it to") + " the ranks");
        begin_stop(sig);
      }
    }
  }

  // ctrl-z: stop the ranks, then ourselves; on SIGCONT (fg/bg), wake them.
  void suspend() {
    signal_running(SIGTSTP);
    ::signal(SIGTSTP, SIG_DFL);
    sigset_t tstp;
    sigemptyset(&tstp);
    sigaddset(&tstp, SIGTSTP);
    ::sigprocmask(SIG_UNBLOCK, &tstp, nullptr);
    ::raise(SIGTSTP);  // returns after SIGCONT
    set_handler(SIGTSTP, on_signal);
    signal_running(SIGCONT);
  }

  void begin_stop(int sig) {
    signal_running(sig);
    if (!stop_deadline_) stop_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                              std::chrono::duration<double>(options_.grace_s));
  }

  void kill_remaining() {
    killed_ = true;
    std::string list;
    int n = 0;
    for (const Rank& r : ranks_) {
      if (!r.running) continue;
      list += (n++ ? ", " : "") + std::to_string(r.rank);
    }
    if (n == 0) return;
    say(std::string(n == 1 ? "rank " : "ranks ") + list + " still running " + format_seconds(options_.grace_s) +
        " after being told to stop; sending SIGKILL");
    signal_running(SIGKILL);
  }

  void signal_running(int sig) {
    for (const Rank& r : ranks_) {
      if (!r.running) continue;
      // The rank's group reaches what it started; a rank that left its group
      // (setsid) is still reached itself.
      if (::kill(-r.pid, sig) != 0) ::kill(r.pid, sig);
    }
  }

  [[noreturn]] void reraise(int sig) {
    ::signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
    ::raise(sig);
    ::_exit(128 + sig);
  }

  const LaunchOptions& options_;
  Environment env_;
  std::vector<char*> argv_;
  std::vector<Rank> ranks_;
  int stdin_fd_ = -1;
  int exit_code_ = 0;       // first failure's status, 0 while none
  int received_signal_ = 0; // the signal that stopped the job, when that came first
  std::optional<Clock::time_point> stop_deadline_;  // set once the stop began
  bool killed_ = false;
};

// fds 0-2 must be open, so that no pipe we create lands on them (a child's
// dup2 onto its own fd would then keep FD_CLOEXEC and close it at exec).
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      int null_fd = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null_fd >= 0 && null_fd != fd) {
        ::dup2(null_fd, fd);
        ::close(null_fd);
      }
    }
  }
}

}  // namespace

int run_launcher(const LaunchOptions& options) {
  ensure_standard_fds();
  std::string error;
  if (!install_signal_handlers(&error)) {
    say(error);
    return kExitInternal;
  }
  int port = options.master_port;
  if (port == 0) {
    port = find_free_port(options.master_addr);
    if (port == 0) {
      say("cannot find a free port on " + options.master_addr + "; give one with --master-port");
      return kExitInternal;
    }
  }
  Launcher launcher(options, port);
  return launcher.run();
}

}  // namespace zero_run
