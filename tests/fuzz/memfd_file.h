#pragma once
// A fuzz input as a regular file that lives in memory (a memfd), for the
// readers that take a path. Returns the descriptor; the path is
// "/proc/self/fd/<fd>". The caller closes it.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

inline int memfd_with(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("fuzz.input", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  return fd;
}
