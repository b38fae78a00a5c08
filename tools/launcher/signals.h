#pragma once
// zero-run's signals: SIGINT, SIGTERM, SIGHUP, SIGTSTP and SIGCHLD become
// bytes on a pipe that the launcher's poll() loop reads (a self-pipe), so
// that nothing but that loop acts on them; SIGPIPE is ignored.
#include <string>

namespace zero_run {

// Creates the pipe and installs the handlers; false, with `error` set, when
// the pipe cannot be made.
bool install_signal_handlers(std::string* error);
// The pipe's read end: one byte per signal received, its number.
int signal_fd();
// Catches `sig` again after its default action was let run (SIGTSTP).
void catch_again(int sig);
// In a forked child, before exec: the dispositions and the mask the launcher
// found on entry.
void restore_signals_in_child();

// "SIGTERM", ..., or "signal N".
std::string signal_name(int sig);

// O_NONBLOCK and FD_CLOEXEC on `fd`; false when fcntl fails.
bool set_nonblocking_cloexec(int fd);

}  // namespace zero_run
