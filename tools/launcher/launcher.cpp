// zero-run: starting the ranks and supervising them. See launcher.h for the
// overview; the output relay, the signals and the ranks' environment are in
// relay.cpp, signals.cpp and environment.cpp.
#include "launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
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

#include "environment.h"
#include "memory_folder.h"
#include "node_link.h"
#include "relay.h"
#include "signals.h"

extern char** environ;

namespace zero_run {
namespace {

using Clock = std::chrono::steady_clock;

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
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

// One start of the job's ranks, supervised until every one is gone.
class Launcher {
 public:
  // `link`: the other nodes' zero-run, with --max-restarts across nodes (Note [Restarts across nodes]).
  Launcher(const LaunchOptions& options, int master_port, int restart, NodeLink* link = nullptr)
      : options_(options), env_(options, master_port, restart), argv_(make_argv(options.command)), link_(link) {}

  // The attempt's exit status (see run_launcher); a signal the launcher
  // received is re-raised once the ranks are gone.
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
  // A rank that started failed (not the launcher, and not a PROGRAM that
  // cannot be run): what starting the ranks again may mend.
  bool rank_failed() const { return rank_failed_; }

 private:
  static std::vector<char*> make_argv(const std::vector<std::string>& command) {
    std::vector<char*> argv;
    for (const std::string& s : command) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    return argv;
  }

  bool stopping() const { return exit_code_ != 0 || received_signal_ != 0 || stopped_for_job_; }

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

      fds.assign(1, pollfd{signal_fd(), POLLIN, 0});
      streams.assign(1, nullptr);
      const size_t link_fds = link_ ? link_->fds().size() : 0;
      for (size_t i = 0; i < link_fds; ++i) {
        fds.push_back(pollfd{link_->fds()[i], POLLIN, 0});
        streams.push_back(nullptr);
      }
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
      for (size_t i = 1; i <= link_fds; ++i) {
        if (fds[i].revents != 0 && link_->read_from(fds[i].fd) && !stopping()) {
          stopped_for_job_ = true;  // not this node's failure
          say(link_->why() + "; stopping the ranks of node " + std::to_string(options_.node_rank));
          begin_stop(SIGTERM);
        }
      }
      for (size_t i = 1 + link_fds; i < fds.size(); ++i) {
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
        rank_failed_ = true;
        const bool others = running_count() > 0;
        say("rank " + std::to_string(r.rank) + " " + exit_description(status) +
            (others ? "; stopping the other ranks" : ""));
        begin_stop(SIGTERM);
        if (link_) link_->tell_failed();
      }
    }
  }

  void handle_signals() {
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(signal_fd(), buf, sizeof buf)) > 0) {
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
    catch_again(SIGTSTP);
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
    remove_memory_folder();
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
  bool rank_failed_ = false;
  NodeLink* link_ = nullptr;
  bool stopped_for_job_ = false;  // told to stop by node 0: another node failed
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
  std::optional<HeldPort> held;  // Note [Held port] in environment.cpp: kept until the ranks are gone
  if (port == 0) {
    port = held.emplace(options.master_addr).port();
    if (port == 0) {
      say("cannot find a free port on " + options.master_addr + "; give one with --master-port");
      return kExitInternal;
    }
  }
  MemoryFolder memory;  // Note [Memory folder]
  // Note [Restarts]
  // torchrun's --max-restarts on one node: when a rank fails, every rank is
  // stopped as always, and then all of them are started again, with
  // TORCHELASTIC_RESTART_COUNT one higher and the same MASTER_PORT (still
  // held), at most max_restarts times. The program resumes by itself
  // (engine.load_checkpoint_if_present), so the steps since its last
  // checkpoint are what a failure costs. Nothing is restarted after the
  // launcher was told to stop (SIGINT, SIGTERM, SIGHUP), after every rank
  // succeeded, or when the ranks could not be started at all (a PROGRAM
  // that is not found would fail the same way again).
  // Across nodes, node 0's zero-run decides for all (Note [Restarts across nodes] in node_link.h).
  std::unique_ptr<NodeLink> link;
  if (options.nnodes > 1 && options.max_restarts > 0) {
    try {
      link = std::make_unique<NodeLink>(options, port);
    } catch (const std::exception& e) {
      say(e.what());
      return kExitInternal;
    }
  }
  for (int restart = 0;; ++restart) {
    Launcher launcher(options, port, restart, link.get());
    const int code = launcher.run();
    if (link) {
      const NodeLink::Decision decision =
          link->finish_attempt(code, launcher.rank_failed(), restart, options.max_restarts);
      if (!decision.restart) return decision.code;
      say("restart " + std::to_string(restart + 1) + " of " + std::to_string(options.max_restarts) +
          ": starting the " + std::to_string(options.nproc) + " ranks of node " + std::to_string(options.node_rank) +
          " again, with every other node's (TORCHELASTIC_RESTART_COUNT=" + std::to_string(restart + 1) + ")");
      continue;
    }
    if (code == 0 || !launcher.rank_failed()) return code;
    if (restart >= options.max_restarts) {
      if (options.max_restarts > 0) {
        say("the ranks failed after " + std::to_string(restart) + " restart(s), all that --max-restarts " +
            std::to_string(options.max_restarts) + " allows; the job ends with the failing rank's status (" +
            std::to_string(code) + "); run it again to resume from its last checkpoint");
      }
      return code;
    }
    say("restart " + std::to_string(restart + 1) + " of " + std::to_string(options.max_restarts) + ": starting the " +
        std::to_string(options.nproc) + " ranks again (TORCHELASTIC_RESTART_COUNT=" + std::to_string(restart + 1) + ")");
  }
}

}  // namespace zero_run
