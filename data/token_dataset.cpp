// zero::TokenDataset: a token file memory-mapped and cut into sequences (zero/data.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cerrno>
#include <cstring>

#include "zero/data.h"
#include "zero/error.h"

namespace zero {

// The file mapped read-only for as long as any copy of the dataset lives.
// The kernel pages it in as batches touch it, and drops clean pages under
// memory pressure, so the file may be larger than memory.
struct TokenDataset::Mapping {
  std::string path;
  int width = 2;
  size_t bytes = 0;
  const unsigned char* data = nullptr;

  Mapping(const std::string& p, int w) : path(p), width(w) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      if (fd >= 0) ::close(fd);
      throw EngineError("cannot read the token file " + p + " (a regular file of token ids)");
    }
    bytes = static_cast<size_t>(st.st_size);
    if (bytes % static_cast<size_t>(width) != 0) {
      ::close(fd);
      throw EngineError("the token file " + p + " has " + std::to_string(bytes) + " bytes, not a multiple of " +
                        std::to_string(width) + " (ids of " + (width == 2 ? "uint16" : "uint32") +
                        "); is it the other width?");
    }
    if (bytes > 0) {
      void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED) {
        ::close(fd);
        throw EngineError("cannot map the token file " + p + ": " + std::strerror(errno));
      }
      ::madvise(m, bytes, MADV_SEQUENTIAL);
      data = static_cast<const unsigned char*>(m);
    }
    ::close(fd);  // the mapping keeps the file
  }
  ~Mapping() {
    if (data) ::munmap(const_cast<unsigned char*>(data), bytes);
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
  const int64_t used = size() * sequence_length_;
  for (int64_t i = 0; i < used; ++i) {
    const int64_t id = map_->at(i);
    if (id >= vocab_size) {
      throw EngineError("the token file " + map_->path + " holds id " + std::to_string(id) + " at byte offset " +
                        std::to_string(i * map_->width) + ", not below the model's vocab_size " +
                        std::to_string(vocab_size));
    }
  }
}

}  // namespace zero
