// zero::TokenDataset: a token file memory-mapped and cut into sequences (zero/data.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/regular_file.h"
#include "zero/data.h"
#include "zero/error.h"

namespace zero {

// The file mapped read-only for as long as any copy of the dataset lives.
// The kernel pages it in as batches touch it, and drops clean pages under
// memory pressure, so the file may be larger than memory. A mapped file cut
// shorter while it is read would kill the reading rank with SIGBUS, naming
// nothing: the descriptor stays open and every read first checks the size
// (check_still_whole).
struct TokenDataset::Mapping {
  std::string path;
  int width = 2;
  size_t bytes = 0;
  const unsigned char* data = nullptr;
  int fd = -1;

  Mapping(const std::string& p, int w) : path(p), width(w) {
    // A FIFO or a device would block or never end: refused before reading.
    const core::OpenedFile file = core::open_regular_file(p, std::numeric_limits<uint64_t>::max());
    if (file.fd < 0) throw EngineError("cannot read the token file " + p + " (a regular file of token ids): " + file.error);
    fd = file.fd;
    bytes = static_cast<size_t>(file.bytes);
    if (bytes % static_cast<size_t>(width) != 0) {
      release();
      throw EngineError("the token file " + p + " has " + std::to_string(bytes) + " bytes, not a multiple of " +
                        std::to_string(width) + " (ids of " + (width == 2 ? "uint16" : "uint32") +
                        "); is it the other width?");
    }
    if (bytes > 0) {
      void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED) {
        const std::string why = std::strerror(errno);
        release();
        throw EngineError("cannot map the token file " + p + ": " + why);
      }
      ::madvise(m, bytes, MADV_SEQUENTIAL);
      data = static_cast<const unsigned char*>(m);
    }
    if (width == 2 && looks_like_uint32()) {
      release();
      throw EngineError("the token file " + p + " looks like uint32 ids read as uint16: every other uint16 of its "
                        "first " + std::to_string(sampled()) + " is 0, as the high halves of uint32 ids below 65536 are; "
                        "read it with 4 bytes per token (zero-llama: --tokens-dtype uint32)");
    }
  }
  // The start of the file that the width check reads.
  int64_t sampled() const { return std::min<int64_t>(count(), 8192) / 2 * 2; }
  // Read as uint16, a file of uint32 ids below 65536 (every vocabulary this
  // side of 65536 tokens) has a 0 at every odd position and ids at the even
  // ones. Real uint16 text has no such pattern over thousands of tokens.
  bool looks_like_uint32() const {
    const int64_t n = sampled();
    if (n < 64) return false;  // too short to tell
    bool any_even = false;
    for (int64_t i = 0; i < n; i += 2) {
      if (at(i + 1) != 0) return false;
      any_even = any_even || at(i) != 0;
    }
    return any_even;
  }
  ~Mapping() { release(); }
  void release() {
    if (data) ::munmap(const_cast<unsigned char*>(data), bytes);
    if (fd >= 0) ::close(fd);
    data = nullptr;
    fd = -1;
  }
  // Before reading: the file is as long as when it was mapped.
  void check_still_whole() const {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
      throw EngineError("the token file " + path + " was cut from " + std::to_string(bytes) + " to " +
                        std::to_string(st.st_size) + " bytes while it was being read; reading past its new end would "
                        "stop this rank with SIGBUS. Restore the file (or start again with the file as it is now)");
    }
  }
  int64_t count() const { return static_cast<int64_t>(bytes / static_cast<size_t>(width)); }
  int64_t at(int64_t i) const {  // little-endian whatever the host
    const unsigned char* p = data + i * width;
    int64_t v = 0;
    for (int b = 0; b < width; ++b) v |= static_cast<int64_t>(p[b]) << (8 * b);
    return v;
  }
};

TokenDataset::TokenDataset(const std::string& path, int64_t sequence_length, int bytes_per_token)
    : sequence_length_(sequence_length) {
  if (bytes_per_token != 2 && bytes_per_token != 4) {
    throw EngineError("TokenDataset: bytes_per_token must be 2 (uint16) or 4 (uint32), got " +
                      std::to_string(bytes_per_token));
  }
  if (sequence_length < 1) {
    throw EngineError("TokenDataset: sequence_length must be >= 1, got " + std::to_string(sequence_length));
  }
  map_ = std::make_shared<const Mapping>(path, bytes_per_token);
}

int64_t TokenDataset::size() const { return map_->count() / sequence_length_; }
int64_t TokenDataset::tokens() const { return map_->count(); }
int64_t TokenDataset::sequence_length() const { return sequence_length_; }
const std::string& TokenDataset::path() const { return map_->path; }

std::vector<at::Tensor> TokenDataset::get(int64_t index) const { return {get_batch({index})[0][0]}; }

std::vector<at::Tensor> TokenDataset::get_batch(const std::vector<int64_t>& indices) const {
  map_->check_still_whole();
  const int64_t T = sequence_length_;
  at::Tensor out = torch::empty({static_cast<int64_t>(indices.size()), T}, torch::kLong);
  int64_t* ids = out.data_ptr<int64_t>();
  for (size_t r = 0; r < indices.size(); ++r) {
    const int64_t index = indices[r];
    if (index < 0 || index >= size()) {
      throw EngineError("TokenDataset " + map_->path + ": sequence " + std::to_string(index) + " is out of range (" +
                        std::to_string(size()) + " sequences of " + std::to_string(T) + ")");
    }
    for (int64_t i = 0; i < T; ++i) ids[static_cast<int64_t>(r) * T + i] = map_->at(index * T + i);
  }
  return {out};
}

void TokenDataset::check_ids(int64_t vocab_size) const {
  map_->check_still_whole();
  const int64_t used = size() * sequence_length_;
  for (int64_t i = 0; i < used; ++i) {
    const int64_t id = map_->at(i);
    if (id >= vocab_size) {
      // Two uint16 ids read as one uint32 make an id of 65536 and above.
      const bool two_halves = map_->width == 4 && id >= 65536 && vocab_size <= 65536;
      throw EngineError("the token file " + map_->path + " holds id " + std::to_string(id) + " at byte offset " +
                        std::to_string(i * map_->width) + ", not below the model's vocab_size " +
                        std::to_string(vocab_size) +
                        (two_halves ? "; if it holds uint16 ids, read it with 2 bytes per token (zero-llama: "
                                      "--tokens-dtype uint16)"
                                    : ""));
    }
  }
}

}  // namespace zero
