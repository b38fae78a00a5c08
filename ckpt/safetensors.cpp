// The safetensors layout: the writer (durable and hashed, through
// file_io.h) and the byte-range reader. See Note [Checkpoint layout] in
// checkpoint.h.
//
// A file is: 8 bytes, little-endian u64 N; N bytes of UTF-8 JSON
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<value>"}}
// padded with spaces so that the data starts at a multiple of 8; then the
// data section, offsets relative to its start.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "ckpt/checkpoint.h"
#include "ckpt/file_io.h"
#include "core/json_depth.h"
#include "core/json_duplicates.h"
#include "core/regular_file.h"
#include "zero/error.h"

namespace zero::ckpt {

namespace {

// The safetensors library refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeader = 100'000'000;


std::string base_name(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

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

uint64_t le64(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

}  // namespace

// ---- writing -----------------------------------------------------------------

FileInfo write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                           const std::map<std::string, std::string>& metadata, const FetchData& fetch,
                           const std::string& recycle) {
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
  AtomicWriter w(path, total, recycle);
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
    std::optional<std::string> duplicate;
    try {
      header = core::parse_json_noting_duplicates<nlohmann::json>(text, duplicate);
    } catch (const nlohmann::json::exception& e) {
      fail(where + "the header is not valid JSON (" + e.what() + ")");
    }
    if (duplicate) fail(where + "the header names " + *duplicate + " twice");
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
