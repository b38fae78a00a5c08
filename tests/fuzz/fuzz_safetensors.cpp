// Fuzz target: the safetensors reader (8-byte length, JSON header, data).
// The input is a whole file, handed to SafetensorsFile through a memfd (a
// regular file that lives in memory). Any file must open or fail with
// zero::CheckpointError, and every tensor of a file that opens must read,
// so no read may allocate more than the file holds.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "memfd_file.h"
#include "zero/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_with(data, size);
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    zero::ckpt::SafetensorsFile file(path);
    std::vector<uint8_t> buffer;
    for (const auto& [name, entry] : file.entries()) {
      const uint64_t bytes = entry.end - entry.begin;
      if (bytes > size) std::abort();  // an entry larger than the file passed the checks
      buffer.resize(bytes);
      file.read(name, 0, bytes, buffer.data());
    }
  } catch (const zero::CheckpointError&) {
  }
  ::close(fd);
  return 0;
}
