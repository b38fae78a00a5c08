// zero-run's output (relay.h).
#include "relay.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace zero_run {

// Note [Line relay]
// Each rank's stdout and stderr are pipes read by one poll() loop in one
// thread. A Stream buffers bytes until a newline and writes only complete
// lines, each prefixed with "[rank r] ", to the launcher's stdout (resp.
// stderr); since nothing else writes there meanwhile, lines of different
// ranks never mix. A last line without a newline is written, with a newline
// added, when the pipe closes or the launcher finishes; a line longer than
// kMaxLine is cut into pieces so that memory stays bounded.

namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr size_t kMaxLine = 1024 * 1024;

}  // namespace

Sink g_stdout{STDOUT_FILENO};
Sink g_stderr{STDERR_FILENO};

void Sink::write_all(const std::string& data) {
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

void say(const std::string& message) { g_stderr.write_all("zero-run: " + message + "\n"); }

bool Stream::read_some() {
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

void Stream::drain() {
  for (int i = 0; i < 256 && read_some(); ++i) {
  }
}

void Stream::finish() {
  if (!partial_.empty()) {
    sink_->write_all(prefix_ + partial_ + "\n");
    partial_.clear();
  }
  close();
}

void Stream::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace zero_run
