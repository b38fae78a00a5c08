#pragma once
// A torch.save file read without executing anything (Note [Restricted
// pickle]): the zip container torch >= 1.6 writes, read with libzip,
//   <record>/data.pkl      the pickle (protocol 2 by default)
//   <record>/data/<key>    each storage's raw little-endian bytes
//   <record>/byteorder     "little" (absent in older files: little)
//   <record>/version       the format version
// where <record> is the archive name torch chose (the file's stem). The
// older, non-zip format (torch < 1.6, or _use_new_zipfile_serialization=
// False) is refused by name. Every storage the pickle names is checked
// against its entry (present, stored uncompressed, exactly numel x element
// size bytes) when the file is opened, so a tensor read cannot run past its
// bytes. Not thread-safe: one reader per thread.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "torchsave/pickle.h"

namespace zero::torchsave {

class TorchSaveFile {
 public:
  // Throws zero::CheckpointError naming the file and what is wrong.
  explicit TorchSaveFile(const std::string& path);
  ~TorchSaveFile();
  TorchSaveFile(const TorchSaveFile&) = delete;
  TorchSaveFile& operator=(const TorchSaveFile&) = delete;

  const std::string& path() const { return path_; }
  const Value& root() const { return pickle_->root(); }

  // The tensor's elements in row-major order, numel x dtype size bytes,
  // into dst (strided views are gathered).
  void read(const TensorRef& t, void* dst) const;
  std::vector<uint8_t> read(const TensorRef& t) const;
  // `count` elements of the contiguous tensor t starting at element `first`
  // of its row-major order (a slice of a flat partition), into dst.
  void read_range(const TensorRef& t, int64_t first, int64_t count, void* dst) const;
  // Reads every storage once, start to end, so that libzip checks each
  // one's CRC-32 (a read by range cannot): a damaged byte is a
  // CheckpointError naming the entry. It costs one pass over the data.
  void verify() const;

 private:
  void read_storage_bytes(const StorageRef& s, uint64_t byte_offset, uint64_t bytes, void* dst) const;

  std::string path_;
  std::string record_;
  void* zip_ = nullptr;  // zip_t; zip.h stays out of this header
  std::unique_ptr<Pickle> pickle_;
};

}  // namespace zero::torchsave
