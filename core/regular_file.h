#pragma once
// Opening files named by users or by other files (configs, manifests,
// `latest`, safetensors files) only when they are regular files of a
// plausible size. A FIFO would block a plain open() until a writer appears,
// /dev/zero would be read without end and a directory fails late with an
// unclear error; these helpers refuse all three up front, in words.
// Header-only and torch-free: ckpt/, the tools and the fuzz targets use it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace zero::core {

struct OpenedFile {
  int fd = -1;             // -1 when `error` says why
  uint64_t bytes = 0;      // the file's size when it was opened
  std::string error;       // e.g. "/tmp/x is a FIFO, not a regular file"
};

inline const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Opens `path` read-only when it is a regular file of at most `max_bytes`.
// O_NONBLOCK keeps the open itself from waiting on a FIFO; it is cleared
// again (it means nothing for regular files). The caller closes fd.
inline OpenedFile open_regular_file(const std::string& path, uint64_t max_bytes) {
  OpenedFile f;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    f.error = std::string(std::strerror(errno)) + " opening " + path;
    return f;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    f.error = std::string(std::strerror(errno)) + " reading the size of " + path;
  } else if (!S_ISREG(st.st_mode)) {
    f.error = path + " is " + file_kind(st.st_mode) + ", not a regular file";
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    f.error = path + " has " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
              " such a file may have";
  }
  if (!f.error.empty()) {
    ::close(fd);
    return f;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  f.fd = fd;
  f.bytes = static_cast<uint64_t>(st.st_size);
  return f;
}

// The whole text of a regular file of at most `max_bytes`; reads no more
// than the size it had when opened. Returns false with `error` set.
inline bool read_regular_file(const std::string& path, uint64_t max_bytes, std::string& text, std::string& error) {
  OpenedFile f = open_regular_file(path, max_bytes);
  if (f.fd < 0) {
    error = f.error;
    return false;
  }
  text.assign(f.bytes, '\0');
  uint64_t done = 0;
  while (done < f.bytes) {
    const ssize_t n = ::read(f.fd, text.data() + done, f.bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = std::string(std::strerror(errno)) + " reading " + path;
      ::close(f.fd);
      return false;
    }
    if (n == 0) break;  // shrank since it was opened: keep what is there
    done += static_cast<uint64_t>(n);
  }
  text.resize(done);
  ::close(f.fd);
  return true;
}

}  // namespace zero::core
