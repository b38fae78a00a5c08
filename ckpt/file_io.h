#pragma once
// Internal to ckpt/: how checkpoint files reach the disk and come back. A
// write replaces its file durably or not at all (AtomicWriter); a read asks
// for every byte of a range (pread_all). Both move at most kChunk bytes a
// call and throw CheckpointError naming the file, errno's text and what to do.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/checkpoint.h"

namespace zero::ckpt {

// Each write(2)/pread(2) call moves at most this much; the same chunk is
// hashed just before it is written, while it is still in cache.
constexpr size_t kChunk = size_t(16) << 20;

// Writes a file as a staging file of its own (staging_name_for) then renames
// it over `path`. Any failure before the rename removes the staging file and
// leaves `path` as it was.
class AtomicWriter {
 public:
  // total: the bytes commit() expects. recycle: a file to overwrite in
  // place (moved to the staging name first; cut to `total` at commit), or
  // "" (or one that is not there): a new file.
  AtomicWriter(std::string path, uint64_t total, const std::string& recycle = "");
  ~AtomicWriter();
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  // Appends n bytes, feeding them to `hasher` (when not null) chunk by chunk.
  void write(const void* data, size_t n, Xxh3* hasher);
  // fsync, close, rename, fsync of the directory.
  void commit();

 private:
  [[noreturn]] void error(int e, const std::string& what);

  std::string path_, tmp_;
  uint64_t total_;
  uint64_t written_ = 0;
  int fd_ = -1;
  bool committed_ = false;
};

// Reads exactly `bytes` at `offset` of `fd` (the file at `path`); a file
// that ends early is an error saying so.
void pread_all(int fd, void* dst, uint64_t bytes, uint64_t offset, const std::string& path);

}  // namespace zero::ckpt
