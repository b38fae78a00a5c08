// zero-run's signals (signals.h).
#include "signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace zero_run {
namespace {

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

}  // namespace

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

void restore_signals_in_child() {
  for (size_t i = 0; i < sizeof(kHandled) / sizeof(kHandled[0]); ++i) {
    ::sigaction(kHandled[i], &g_signals.original[i], nullptr);
  }
  ::sigprocmask(SIG_SETMASK, &g_signals.original_mask, nullptr);
}

int signal_fd() { return g_signal_pipe[0]; }

void catch_again(int sig) { set_handler(sig, on_signal); }

}  // namespace zero_run
