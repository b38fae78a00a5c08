// The safetensors layout: dtype helpers, the durable hashing writer and the
// byte-range reader. See Note [Checkpoint layout] in checkpoint.h.
//
// A file is: 8 bytes, little-endian u64 N; N bytes of UTF-8 JSON
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<value>"}}
// padded with spaces so that the data starts at a multiple of 8; then the
// data section, offsets relative to its start.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <xxhash.h>

#include "ckpt/checkpoint.h"
#include "core/json_depth.h"
#include "core/regular_file.h"
#include "zero/error.h"

namespace zero::ckpt {

namespace {

// Each write(2)/pread(2) call moves at most this much; the same chunk is
// hashed just before it is written, while it is still in cache.
constexpr size_t kChunk = size_t(16) << 20;
// The safetensors library refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeader = 100'000'000;

[[noreturn]] void fail(const std::string& message) { throw CheckpointError(message); }

std::string errno_text(int e) {
  std::string s = std::strerror(e);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}


std::string hint_for(int e) {
  switch (e) {
    case ENOSPC: return "; free space or save elsewhere";
    case EDQUOT: return "; the disk quota is used up: free space or save elsewhere";
    case EFBIG: return "; the file size limit (ulimit -f) or the file system's maximum file size is too small";
    case EROFS: return "; the file system is read-only: save elsewhere";
    case EACCES:
    case EPERM: return "; check the directory's permissions or save elsewhere";
    case ENOENT: return "; the directory does not exist: create it first";
    default: return "";
  }
}

// Writes a file as "<path>.tmp" then renames it over `path`. Any failure
// before the rename removes the temporary and leaves `path` as it was.
class AtomicWriter {
 public:
  AtomicWriter(std::string path, uint64_t total) : path_(std::move(path)), tmp_(path_ + ".tmp"), total_(total) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      int e = errno;
      fail(errno_text(e) + " creating " + tmp_ + " to write " + path_ + hint_for(e) + "; an existing " + path_ +
           " is untouched");
    }
  }
  ~AtomicWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;

  void write(const void* data, size_t n, Xxh3* hasher) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      size_t chunk = std::min(n, kChunk);
      if (hasher) hasher->update(p, chunk);
      size_t done = 0;
      while (done < chunk) {
        ssize_t w = ::write(fd_, p + done, chunk - done);
        if (w < 0) {
          if (errno == EINTR) continue;
          error(errno, "writing");
        }
        if (w == 0) error(EIO, "writing (short write)");
        done += static_cast<size_t>(w);
        written_ += static_cast<uint64_t>(w);
      }
      p += chunk;
      n -= chunk;
    }
  }

  // fsync, close, rename, fsync of the directory.
  void commit() {
    if (written_ != total_) error(EIO, "writing (size changed while writing)");
    if (::fsync(fd_) != 0) error(errno, "syncing");
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) error(errno, "closing");
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) error(errno, "renaming " + tmp_ + " to");
    committed_ = true;
    const std::string dir = parent_dir(path_);
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
      int e = errno;
      fail(errno_text(e) + " opening directory " + dir + " to make the rename of " + path_ + " durable");
    }
    if (::fsync(dfd) != 0 && errno != EINVAL) {
      int e = errno;
      ::close(dfd);
      fail(errno_text(e) + " syncing directory " + dir + " after writing " + path_ +
           "; the file is in place but may not survive a crash");
    }
    ::close(dfd);
  }

 private:
  [[noreturn]] void error(int e, const std::string& what) {
    fail(errno_text(e) + " " + what + " " + path_ + " (wrote " + std::to_string(written_) + " of " +
         std::to_string(total_) + " bytes)" + hint_for(e) + "; an existing " + path_ +
         " is untouched (the previous checkpoint is intact)");
  }

  std::string path_, tmp_;
  uint64_t total_;
  uint64_t written_ = 0;
  int fd_ = -1;
  bool committed_ = false;
};

// Number of elements of `shape`, or throws when negative or overflowing.
uint64_t element_count(const std::vector<int64_t>& shape, const std::string& what) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(what + ": negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) fail(what + ": shape overflows 64 bits");
  }
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void pread_all(int fd, void* dst, uint64_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(bytes, kChunk));
    ssize_t r = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      fail(errno_text(e) + " reading " + path + " at byte " + std::to_string(offset));
    }
    if (r == 0)
      fail("truncated: " + path + " ended at byte " + std::to_string(offset) + " while " + std::to_string(bytes) +
           " more bytes were expected (the file changed after it was opened?)");
    p += r;
    bytes -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

uint64_t le64(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

// float8 e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent
// 0 is subnormal (m/8 x 2^-6); S.1111.111 is NaN, and there is no infinity.
float f8_e4m3_to_f32(uint8_t b) {
  const int exp = (b >> 3) & 0xf, man = b & 0x7;
  float v;
  if (exp == 0xf && man == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + man), exp - 10);
  }
  return (b & 0x80) ? -v : v;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf, nan (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal half: normalise; every one is a normal float.
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    bits = sign | static_cast<uint32_t>(112 - e) << 23 | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

// ---- XXH3 --------------------------------------------------------------------

Xxh3::Xxh3() : state_(XXH3_createState()) {
  if (!state_ || XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)) == XXH_ERROR)
    fail("cannot initialise the XXH3 hash state");
}

Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3::update(const void* p, size_t n) {
  if (n) XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), p, n);
}

uint64_t Xxh3::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

// ---- dtypes ------------------------------------------------------------------

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
  }
  return "?";
}

DType dtype_from_name(const std::string& s) {
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::I32, DType::U8, DType::BOOL,
                  DType::F8_E4M3, DType::F8_E5M2})
    if (s == dtype_name(d)) return d;
  fail("unknown dtype \"" + s + "\"; this build reads F32, F16, BF16, F64, I64, I32, U8, BOOL, F8_E4M3, F8_E5M2");
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::U8:
    case DType::BOOL:
    case DType::F8_E4M3:
    case DType::F8_E5M2: return 1;
  }
  return 0;
}

bool dtype_is_floating(DType d) {
  return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64 || d == DType::F8_E4M3 ||
         d == DType::F8_E5M2;
}

void convert_to_f32(DType d, const void* src, size_t n, float* dst) {
  switch (d) {
    case DType::F32:
      if (n) std::memmove(dst, src, n * 4);
      return;
    case DType::F16: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<uint16_t>(s[2 * i] | (s[2 * i + 1] << 8)));
      return;
    }
    case DType::BF16: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) {
        uint32_t bits = static_cast<uint32_t>(s[2 * i] | (s[2 * i + 1] << 8)) << 16;
        std::memcpy(&dst[i], &bits, 4);
      }
      return;
    }
    case DType::F64: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, s + 8 * i, 8);
        dst[i] = static_cast<float>(v);
      }
      return;
    }
    case DType::F8_E4M3: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f8_e4m3_to_f32(s[i]);
      return;
    }
    case DType::F8_E5M2: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(static_cast<uint16_t>(s[i] << 8));
      return;
    }
    default: fail(std::string("cannot convert dtype ") + dtype_name(d) + " to F32: not a floating dtype");
  }
}

std::string xxh3_hex(uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

FileInfo hash_file(const std::string& path) {
  core::OpenedFile opened = core::open_regular_file(path, std::numeric_limits<uint64_t>::max());
  if (opened.fd < 0) fail(opened.error);
  const int fd = opened.fd;
  FileInfo info;
  info.name = path;
  info.bytes = opened.bytes;
  try {
    Xxh3 h;
    std::vector<char> buf(std::min<uint64_t>(info.bytes, kChunk));
    for (uint64_t off = 0; off < info.bytes;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(info.bytes - off, kChunk));
      pread_all(fd, buf.data(), n, off, path);
      h.update(buf.data(), n);
      off += n;
    }
    info.xxh3 = xxh3_hex(h.digest());
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return info;
}

void write_file_durably(const std::string& path, const std::string& content) {
  AtomicWriter w(path, content.size());
  w.write(content.data(), content.size(), nullptr);
  w.commit();
}

// ---- writing -----------------------------------------------------------------

FileInfo write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                           const std::map<std::string, std::string>& metadata, const FetchData& fetch) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const TensorData& t : tensors) {
    const std::string what = "writing " + path + ": tensor \"" + t.name + "\"";
    if (t.name.empty() || t.name == "__metadata__") fail(what + ": invalid tensor name");
    if (header.contains(t.name)) fail(what + " appears twice");
    uint64_t n = element_count(t.shape, what);
    uint64_t want;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(t.dtype)), &want))
      fail(what + ": size overflows 64 bits");
    if (want != t.bytes)
      fail(what + " has shape " + shape_string(t.shape) + " of " + dtype_name(t.dtype) + " (" + std::to_string(want) +
           " bytes) but " + std::to_string(t.bytes) + " bytes of data");
    if (t.bytes && !t.data && !fetch) fail(what + ": no data pointer");
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("writing " + path + ": a tensor name or metadata entry is not valid UTF-8 (" + e.what() + ")");
  }
  // Pad with spaces so that 8 + N, the start of the data, is a multiple of 8.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  const uint64_t total = 8 + text.size() + offset;
  AtomicWriter w(path, total);
  Xxh3 h;
  w.write(len, 8, &h);
  w.write(text.data(), text.size(), &h);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const void* data = fetch ? fetch(i) : tensors[i].data;
    if (tensors[i].bytes && !data) fail("writing " + path + ": no data for tensor \"" + tensors[i].name + "\"");
    w.write(data, tensors[i].bytes, &h);
  }
  w.commit();

  FileInfo info;
  info.name = base_name(path);
  info.bytes = total;
  info.xxh3 = xxh3_hex(h.digest());
  return info;
}

// ---- reading -----------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  core::OpenedFile opened = core::open_regular_file(path, std::numeric_limits<uint64_t>::max());
  if (opened.fd < 0) fail(opened.error);
  fd_ = opened.fd;
  try {
    file_bytes_ = opened.bytes;
    const std::string where = "not a valid safetensors file: " + path + ": ";
    if (file_bytes_ < 8)
      fail("truncated: " + path + " has " + std::to_string(file_bytes_) +
           " bytes, less than the 8-byte header length that starts a safetensors file");
    unsigned char len[8];
    pread_all(fd_, len, 8, 0, path);
    const uint64_t n = le64(len);
    if (n > kMaxHeader) fail(where + "header length " + std::to_string(n) + " is above the 100 MB limit");
    if (n > file_bytes_ - 8)
      fail("truncated: " + path + ": header length is " + std::to_string(n) + " bytes, the file has only " +
           std::to_string(file_bytes_ - 8) + " after the length");
    data_start_ = 8 + n;
    std::string text(n, '\0');
    pread_all(fd_, text.data(), n, 8, path);

    if (core::json_nests_deeper_than(text))
      fail(where + "the header nests deeper than " + std::to_string(core::kMaxJsonDepth) + " levels: it is not a safetensors header");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail(where + "the header is not valid JSON (" + e.what() + ")");
    }
    if (!header.is_object()) fail(where + "the header is not a JSON object");

    const uint64_t data_bytes = file_bytes_ - data_start_;
    uint64_t data_end = 0;
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& key = it.key();
      const nlohmann::json& v = it.value();
      if (key == "__metadata__") {
        if (!v.is_object()) fail(where + "__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) fail(where + "__metadata__ entry \"" + m.key() + "\" is not a string");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string t = where + "tensor \"" + key + "\": ";
      if (!v.is_object()) fail(t + "entry is not an object");
      if (!v.contains("dtype") || !v["dtype"].is_string()) fail(t + "no dtype string");
      if (!v.contains("shape") || !v["shape"].is_array()) fail(t + "no shape array");
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
        fail(t + "data_offsets is not a [begin, end] pair");
      Entry e;
      try {
        e.dtype = dtype_from_name(v["dtype"].get<std::string>());
      } catch (const CheckpointError& err) {
        fail(t + err.what());
      }
      for (const auto& d : v["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(t + "shape holds " + d.dump() + ", not a size");
        e.shape.push_back(d.get<int64_t>());
      }
      for (int i = 0; i < 2; ++i)
        if (!v["data_offsets"][i].is_number_unsigned() && !(v["data_offsets"][i].is_number_integer() &&
                                                            v["data_offsets"][i].get<int64_t>() >= 0))
          fail(t + "data_offsets holds " + v["data_offsets"][i].dump() + ", not an offset");
      e.begin = v["data_offsets"][0].get<uint64_t>();
      e.end = v["data_offsets"][1].get<uint64_t>();
      if (e.end < e.begin) fail(t + "data_offsets end " + std::to_string(e.end) + " is before begin " + std::to_string(e.begin));
      uint64_t want;
      if (__builtin_mul_overflow(element_count(e.shape, t), static_cast<uint64_t>(dtype_size(e.dtype)), &want) ||
          want != e.end - e.begin)
        fail(t + "shape " + shape_string(e.shape) + " of " + dtype_name(e.dtype) + " needs " + std::to_string(want) +
             " bytes but data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") hold " +
             std::to_string(e.end - e.begin));
      data_end = std::max(data_end, e.end);
      entries_.emplace(key, std::move(e));
    }
    if (data_end > data_bytes)
      fail("truncated: " + path + ": header says " + std::to_string(data_end) + " bytes of data, file has " +
           std::to_string(data_bytes));
    // No two tensors may share bytes.
    std::vector<std::pair<const std::string*, const Entry*>> order;
    for (const auto& [name, e] : entries_)
      if (e.end > e.begin) order.emplace_back(&name, &e);
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
    for (size_t i = 1; i < order.size(); ++i)
      if (order[i].second->begin < order[i - 1].second->end)
        fail(where + "tensors \"" + *order[i - 1].first + "\" and \"" + *order[i].first + "\" overlap");
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t SafetensorsFile::file_bytes() const { return file_bytes_; }

void SafetensorsFile::read(const std::string& name, uint64_t byte_offset, uint64_t bytes, void* dst) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail("no tensor \"" + name + "\" in " + path_);
  const Entry& e = it->second;
  const uint64_t size = e.end - e.begin;
  if (byte_offset > size || bytes > size - byte_offset)
    fail("reading bytes [" + std::to_string(byte_offset) + ", " + std::to_string(byte_offset + bytes) +
         ") of tensor \"" + name + "\" in " + path_ + ": the tensor has " + std::to_string(size) + " bytes");
  pread_all(fd_, dst, bytes, data_start_ + e.begin + byte_offset, path_);
}

void SafetensorsFile::verify(const FileInfo& expected) const {
  struct stat st {};
  uint64_t now = file_bytes_;
  if (::fstat(fd_, &st) == 0) now = static_cast<uint64_t>(st.st_size);
  if (now != expected.bytes)
    fail("size mismatch: " + path_ + " has " + std::to_string(now) + " bytes, the manifest says " +
         std::to_string(expected.bytes) + " (xxh3 " + expected.xxh3 +
         "); the file was truncated or replaced: restore it or load another tag");
  Xxh3 h;
  std::vector<char> buf(std::min<uint64_t>(now, kChunk));
  for (uint64_t off = 0; off < now;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(now - off, kChunk));
    pread_all(fd_, buf.data(), n, off, path_);
    h.update(buf.data(), n);
    off += n;
  }
  check_hash(expected, h.digest());
}

void SafetensorsFile::check_hash(const FileInfo& expected, uint64_t actual_hash) const {
  const std::string actual = xxh3_hex(actual_hash);
  if (actual != expected.xxh3)
    fail("checksum mismatch: " + path_ + " has xxh3 " + actual + " (" + std::to_string(file_bytes_) +
         " bytes), the manifest says " + expected.xxh3 + " (" + std::to_string(expected.bytes) +
         " bytes); the file is corrupt: restore it or load another tag");
}

void SafetensorsFile::read_raw(uint64_t offset, uint64_t bytes, void* dst) const {
  if (offset > file_bytes_ || bytes > file_bytes_ - offset)
    fail("reading bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) + ") of " + path_ +
         ": the file has " + std::to_string(file_bytes_) + " bytes");
  pread_all(fd_, dst, bytes, offset, path_);
}

}  // namespace zero::ckpt
