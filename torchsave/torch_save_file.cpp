// TorchSaveFile: torch.save's zip container through libzip, its pickle
// through the restricted machine (pickle.cpp). Layout facts from
// torch/serialization.py (_save, _load) and caffe2/serialize/inline_container.
#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/regular_file.h"
#include "torchsave/torch_save.h"
#include "zero/error.h"

namespace zero::torchsave {

namespace {

// A pickle larger than this is not a checkpoint's: a model's state dict
// pickles to kilobytes, DeepSpeed's largest (parameter shapes of every
// layer) to a few megabytes.
constexpr uint64_t kMaxPickleBytes = 256ull << 20;
// A whole .pt file: DeepSpeed's largest hold a rank's optimizer states.
constexpr uint64_t kMaxFileBytes = 1ull << 40;

zip_t* as_zip(void* z) { return static_cast<zip_t*>(z); }

// The first bytes of the legacy format: pickle protocol 2, then the magic
// number 0x1950a86a20f9469cfc6c as a 10-byte LONG1.
const uint8_t kLegacyMagic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

std::string zip_error_text(int code) {
  zip_error_t e;
  zip_error_init_with_code(&e, code);
  std::string text = zip_error_strerror(&e);
  zip_error_fini(&e);
  return text;
}

struct ZipFile {  // one open entry, closed on every path
  zip_file_t* f = nullptr;
  ~ZipFile() {
    if (f) zip_fclose(f);
  }
};

}  // namespace

TorchSaveFile::TorchSaveFile(const std::string& path) : path_(path) {
  // A regular file only: a FIFO (or a link to one) would block the read.
  const core::OpenedFile file = core::open_regular_file(path, kMaxFileBytes);
  if (file.fd < 0) throw CheckpointError(path + ": cannot open it (" + file.error + ")");
  {
    uint8_t head[sizeof kLegacyMagic] = {};
    const ssize_t read = ::pread(file.fd, head, sizeof head, 0);  // the offset stays at 0 for libzip
    const size_t got = read > 0 ? static_cast<size_t>(read) : 0;
    std::string refusal;
    if (got == sizeof head && std::memcmp(head, kLegacyMagic, sizeof head) == 0)
      refusal = path + ": a torch.save file in the legacy format (torch before 1.6, or "
                       "_use_new_zipfile_serialization=False), which zero does not read; rewrite it "
                       "in the zip format with torch.save(torch.load(PATH, weights_only=True), NEW_PATH)";
    else if (got < 4 || std::memcmp(head, "PK\x03\x04", 4) != 0)
      refusal = path + ": not a torch.save file (no zip signature at its start)";
    if (!refusal.empty()) {
      ::close(file.fd);
      throw CheckpointError(refusal);
    }
  }
  int error = 0;
  zip_ = zip_fdopen(file.fd, ZIP_CHECKCONS, &error);  // takes the descriptor when it succeeds
  if (zip_ == nullptr) {
    ::close(file.fd);
    throw CheckpointError(path + ": not a readable zip archive (" + zip_error_text(error) +
                          "); the file is truncated or damaged");
  }
  try {
    // The record folder: the one top-level folder holding data.pkl.
    const zip_int64_t entries = zip_get_num_entries(as_zip(zip_), 0);
    for (zip_int64_t i = 0; i < entries; ++i) {
      const char* name = zip_get_name(as_zip(zip_), i, ZIP_FL_ENC_RAW);
      if (name == nullptr) continue;
      const std::string n = name;
      const size_t slash = n.find('/');
      if (slash != std::string::npos && n.compare(slash, std::string::npos, "/data.pkl") == 0) {
        if (!record_.empty())
          throw CheckpointError(path + ": two pickles (" + record_ + "/data.pkl and " + n +
                                "); a torch.save file holds one");
        record_ = n.substr(0, slash);
      }
    }
    if (record_.empty()) throw CheckpointError(path + ": a zip archive without <name>/data.pkl: not a torch.save file");

    auto entry = [&](const std::string& name, zip_stat_t& st) {
      const zip_int64_t index = zip_name_locate(as_zip(zip_), name.c_str(), ZIP_FL_ENC_RAW);
      if (index < 0) return false;
      zip_stat_init(&st);
      if (zip_stat_index(as_zip(zip_), index, 0, &st) != 0)
        throw CheckpointError(path + ": cannot read the entry " + name + " (" + zip_strerror(as_zip(zip_)) + ")");
      return true;
    };
    auto read_whole = [&](const std::string& name, uint64_t limit) {
      zip_stat_t st;
      if (!entry(name, st)) throw CheckpointError(path + ": no entry " + name);
      if (st.size > limit)
        throw CheckpointError(path + ": " + name + " claims " + std::to_string(st.size) + " bytes, more than the " +
                              std::to_string(limit) + " zero reads for it");
      ZipFile f;
      f.f = zip_fopen_index(as_zip(zip_), st.index, 0);
      if (f.f == nullptr)
        throw CheckpointError(path + ": cannot open " + name + " (" + zip_strerror(as_zip(zip_)) + ")");
      std::vector<uint8_t> bytes(st.size);
      const zip_int64_t got = zip_fread(f.f, bytes.data(), bytes.size());
      if (got != static_cast<zip_int64_t>(bytes.size()))
        throw CheckpointError(path + ": " + name + " is shorter than its " + std::to_string(st.size) +
                              " bytes or damaged (" + zip_file_strerror(f.f) + ")");
      return bytes;
    };

    zip_stat_t st;
    if (entry(record_ + "/byteorder", st)) {
      const std::vector<uint8_t> order = read_whole(record_ + "/byteorder", 16);
      if (std::string(order.begin(), order.end()) != "little")
        throw CheckpointError(path + ": written on a big-endian machine (byteorder \"" +
                              std::string(order.begin(), order.end()) + "\"); zero reads little-endian files");
    }
    // The machine's budget counts the bytes data.pkl takes in the file: a
    // deflated pickle is held to its compressed size (Note [Restricted
    // pickle]), and one that would inflate past that budget is refused
    // before it is inflated (no pickle torch.save or DeepSpeed wrote
    // compresses 512:1).
    zip_stat_t pkl;
    if (!entry(record_ + "/data.pkl", pkl)) throw CheckpointError(path + ": no entry " + record_ + "/data.pkl");
    const uint64_t stored = (pkl.valid & ZIP_STAT_COMP_SIZE) ? pkl.comp_size : pkl.size;
    if (pkl.size > kHeldFloorBytes && (pkl.size - kHeldFloorBytes) / kMaxHeldPerInputByte > stored)  // no wrap
      throw CheckpointError(path + ": " + record_ + "/data.pkl inflates from " + std::to_string(stored) + " to " +
                            std::to_string(pkl.size) + " bytes, more than the " + std::to_string(kMaxHeldPerInputByte) +
                            " a byte zero allows a pickle: the file is built to exhaust memory");
    const std::vector<uint8_t> pickle = read_whole(record_ + "/data.pkl", kMaxPickleBytes);
    pickle_ = Pickle::read(pickle.data(), pickle.size(), path + ": " + record_ + "/data.pkl",
                           std::max<size_t>(std::min<size_t>(stored, pickle.size()), 1));

    for (const StorageRef& s : pickle_->storages()) {
      const std::string name = record_ + "/data/" + s.key;
      if (!entry(name, st)) throw CheckpointError(path + ": the pickle names storage " + s.key + ", but " + name + " is missing");
      const uint64_t expected = static_cast<uint64_t>(s.numel) * ckpt::dtype_size(s.dtype);
      if (st.size != expected)
        throw CheckpointError(path + ": " + name + " holds " + std::to_string(st.size) + " bytes, its storage " +
                              std::to_string(s.numel) + " x " + ckpt::dtype_name(s.dtype) + " = " +
                              std::to_string(expected));
      if (st.comp_method != ZIP_CM_STORE)
        throw CheckpointError(path + ": " + name + " is compressed (method " + std::to_string(st.comp_method) +
                              "); torch.save stores storages uncompressed");
    }
  } catch (...) {
    zip_discard(as_zip(zip_));
    throw;
  }
}

TorchSaveFile::~TorchSaveFile() {
  if (zip_) zip_discard(as_zip(zip_));
}

void TorchSaveFile::read_storage_bytes(const StorageRef& s, uint64_t byte_offset, uint64_t bytes, void* dst) const {
  const std::string name = record_ + "/data/" + s.key;
  const zip_int64_t index = zip_name_locate(as_zip(zip_), name.c_str(), ZIP_FL_ENC_RAW);
  if (index < 0) throw CheckpointError(path_ + ": no entry " + name);
  ZipFile f;
  f.f = zip_fopen_index(as_zip(zip_), index, 0);
  if (f.f == nullptr) throw CheckpointError(path_ + ": cannot open " + name + " (" + zip_strerror(as_zip(zip_)) + ")");
  if (byte_offset > 0 && zip_fseek(f.f, static_cast<zip_int64_t>(byte_offset), SEEK_SET) != 0)
    throw CheckpointError(path_ + ": cannot seek in " + name + " (" + zip_file_strerror(f.f) + ")");
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (uint64_t done = 0; done < bytes;) {
    const zip_int64_t got = zip_fread(f.f, out + done, bytes - done);
    if (got <= 0)
      throw CheckpointError(path_ + ": " + name + " ends early or is damaged (" + zip_file_strerror(f.f) + ")");
    done += static_cast<uint64_t>(got);
  }
}

void TorchSaveFile::verify() const {
  std::vector<uint8_t> chunk(size_t{1} << 20);
  for (const StorageRef& s : pickle_->storages()) {
    const std::string name = record_ + "/data/" + s.key;
    const zip_int64_t index = zip_name_locate(as_zip(zip_), name.c_str(), ZIP_FL_ENC_RAW);
    if (index < 0) throw CheckpointError(path_ + ": no entry " + name);
    ZipFile f;
    f.f = zip_fopen_index(as_zip(zip_), index, 0);
    if (f.f == nullptr) throw CheckpointError(path_ + ": cannot open " + name + " (" + zip_strerror(as_zip(zip_)) + ")");
    zip_int64_t got;
    while ((got = zip_fread(f.f, chunk.data(), chunk.size())) > 0) {
    }
    if (got < 0)
      throw CheckpointError(path_ + ": " + name + " is damaged (" + zip_file_strerror(f.f) +
                            "): the file changed after torch.save wrote it");
  }
}

void TorchSaveFile::read(const TensorRef& t, void* dst) const {
  const int64_t numel = t.numel();
  if (numel == 0) return;
  const size_t elem = ckpt::dtype_size(t.storage.dtype);
  if (t.contiguous()) {
    read_storage_bytes(t.storage, static_cast<uint64_t>(t.offset) * elem, static_cast<uint64_t>(numel) * elem, dst);
    return;
  }
  // A strided view: read the span it covers, then gather row-major.
  int64_t last = t.offset;
  for (size_t d = 0; d < t.shape.size(); ++d) last += (t.shape[d] - 1) * t.stride[d];
  std::vector<uint8_t> span(static_cast<size_t>(last - t.offset + 1) * elem);
  read_storage_bytes(t.storage, static_cast<uint64_t>(t.offset) * elem, span.size(), span.data());
  std::vector<int64_t> index(t.shape.size(), 0);
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t n = 0; n < numel; ++n) {
    int64_t at = 0;
    for (size_t d = 0; d < index.size(); ++d) at += index[d] * t.stride[d];
    std::memcpy(out + n * elem, span.data() + at * elem, elem);
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
}

std::vector<uint8_t> TorchSaveFile::read(const TensorRef& t) const {
  std::vector<uint8_t> bytes(static_cast<size_t>(t.numel()) * ckpt::dtype_size(t.storage.dtype));
  read(t, bytes.data());
  return bytes;
}

void TorchSaveFile::read_range(const TensorRef& t, int64_t first, int64_t count, void* dst) const {
  if (!t.contiguous()) throw CheckpointError(path_ + ": a slice of a strided tensor (zero reads slices of flat ones)");
  if (first < 0 || count < 0 || first > t.numel() - count)
    throw CheckpointError(path_ + ": elements [" + std::to_string(first) + ", " + std::to_string(first + count) +
                          ") of a tensor of " + std::to_string(t.numel()));
  const size_t elem = ckpt::dtype_size(t.storage.dtype);
  read_storage_bytes(t.storage, static_cast<uint64_t>(t.offset + first) * elem, static_cast<uint64_t>(count) * elem, dst);
}

}  // namespace zero::torchsave
