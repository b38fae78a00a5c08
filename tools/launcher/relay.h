#pragma once
// zero-run's output: whole writes to its own stdout and stderr, and the
// relay of each rank's output onto them, line by line (Note [Line relay] in
// relay.cpp).
#include <string>
#include <utility>

namespace zero_run {

// A reader that went away (`zero-run ... | head`) must not kill the launcher
// and orphan the ranks: SIGPIPE is ignored and output to a broken pipe is
// dropped from then on.
struct Sink {
  int fd;
  bool broken = false;

  void write_all(const std::string& data);
};

extern Sink g_stdout;
extern Sink g_stderr;

// One line from the launcher itself, on stderr.
void say(const std::string& message);

// One pipe of one rank (its stdout or its stderr), relayed to `sink` in
// whole lines, each prefixed with `prefix`. Owns (and closes) `fd`.
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
  bool read_some();
  // Reads until nothing more is available right now (bounded, in case a
  // process that still holds the pipe keeps writing).
  void drain();
  // Writes the partial last line, if any, and closes the pipe.
  void finish();

 private:
  void close();

  int fd_;
  Sink* sink_;
  std::string prefix_;
  std::string partial_;
};

}  // namespace zero_run
