// FragmentReader: reads any element range of any (kind, parameter) from the
// fragments every rank wrote, whatever the world size that wrote them.
// See Note [Checkpoint layout] in checkpoint.h.
//
// Files are opened lazily. Building the fragment index (first read_f32)
// parses the header of every rank file, which is cheap; a file's data is
// hashed against the manifest (verify) only when data is first read from it.
//
// Note [Hashing while reading]: a load reads each byte of a file once. For
// the files a rank verifies (verify_only), every read that continues where
// the hash has got to is hashed from the caller's buffer on a helper thread
// while the next one is read; a read that skips ahead first reads and
// hashes the bytes skipped; one that goes back is not hashed again.
// finish_verification() reads and hashes the rest of the file. The engine
// saves fragments in the order it loads them at the same world size, so
// there the whole file is read once and hashed as it arrives.
// One concept over 400 lines: the index of every rank's fragments and the
// reads across it, which share that index and its lazily opened files.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>

#include "ckpt/checkpoint.h"
#include "ckpt/hash_pipeline.h"
#include "core/regular_file.h"
#include "zero/error.h"

namespace zero::ckpt {

namespace {


std::string range_string(int64_t a, int64_t b) { return "[" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

}  // namespace

struct FragmentReader::Impl {
  struct Slot {
    FileInfo info;
    std::string path;
    std::unique_ptr<SafetensorsFile> file;
    bool verified = false;  // hashed, being hashed while read, or someone else's
    std::unique_ptr<Xxh3> stream;  // hashing while reading: bytes [0, hashed) fed
    uint64_t hashed = 0;
  };
  struct Fragment {
    int64_t offset = 0, length = 0;
    size_t slot = 0;
    std::string tensor;
    uint64_t begin = 0;  // of its bytes in the file
    DType dtype = DType::F32;
  };

  std::string where;  // "checkpoint <dir>/<tag>"
  std::string manifest_file;
  Manifest manifest;
  bool verify = true;
  int world_size = 1;
  std::vector<Slot> slots;
  std::map<int, size_t> slot_of_rank;
  std::map<std::string, int64_t> numel;  // parameter -> elements
  bool indexed = false;
  std::map<std::pair<std::string, std::string>, std::vector<Fragment>> index;  // (kind, param)
  HashPipeline hashing;  // last member: destroyed (drained) first

  SafetensorsFile& open(size_t i) {
    Slot& s = slots[i];
    if (s.file) return *s.file;
    struct stat st {};
    if (::stat(s.path.c_str(), &st) != 0) {
      int e = errno;
      if (e == ENOENT)
        fail("missing checkpoint file " + s.path + " (rank " + std::to_string(s.info.rank) + " of world size " +
             std::to_string(world_size) + ", listed in " + manifest_file +
             "): the checkpoint is incomplete; copy the file back or load another tag");
      fail(std::string(std::strerror(e)) + " opening checkpoint file " + s.path);
    }
    if (!S_ISREG(st.st_mode))
      fail("checkpoint file " + s.path + " is " + core::file_kind(st.st_mode) +
           ", not a regular file: restore it or load another tag");
    if (verify && static_cast<uint64_t>(st.st_size) != s.info.bytes)
      fail("size mismatch: " + s.path + " has " + std::to_string(st.st_size) + " bytes, " + manifest_file + " says " +
           std::to_string(s.info.bytes) + "; the file was truncated or replaced: restore it or load another tag");
    auto file = std::make_unique<SafetensorsFile>(s.path);
    // The file read from here on (its descriptor stays open) is the one
    // whose header is checked: one of another save of the tag is refused.
    const auto save = file->metadata().find(kSaveId);
    if (!manifest.save_id.empty() && (save == file->metadata().end() || save->second != manifest.save_id))
      fail("checkpoint file " + s.path + " was written by save \"" +
           (save == file->metadata().end() ? std::string("(none recorded)") : save->second) + "\", " + manifest_file +
           " by save \"" + manifest.save_id +
           "\": the tag was saved again while it was being read (is another job saving into the same folder?); "
           "load again, or load with an explicit tag that nothing is saving");
    s.file = std::move(file);
    return *s.file;
  }

  // Hashes the whole file the first time data is read from it.
  SafetensorsFile& open_for_data(size_t i) {
    SafetensorsFile& f = open(i);
    if (verify && !slots[i].verified) {
      f.verify(slots[i].info);
      slots[i].verified = true;
    }
    return f;
  }

  // Note [Hashing while reading]: file bytes [at, at + n) were just read into
  // `data`; `stable` when data stays as it is until the hashes are waited for.
  void hash_read(size_t i, uint64_t at, uint64_t n, const void* data, bool stable) {
    Slot& s = slots[i];
    if (!s.stream || at + n <= s.hashed) return;
    if (at > s.hashed) hash_from_file(i, at);
    const uint64_t skip = s.hashed - at;
    const char* p = static_cast<const char*>(data) + skip;
    const size_t count = static_cast<size_t>(n - skip);
    if (stable) {
      hashing.push(s.stream.get(), p, count);
    } else {
      hashing.push(s.stream.get(), nullptr, count, std::vector<char>(p, p + count));
    }
    s.hashed = at + n;
  }

  // Reads and hashes the bytes of file i from where the hash has got to up to `to`.
  void hash_from_file(size_t i, uint64_t to) {
    constexpr uint64_t kPiece = uint64_t(16) << 20;
    Slot& s = slots[i];
    while (s.hashed < to) {
      std::vector<char> piece(static_cast<size_t>(std::min(kPiece, to - s.hashed)));
      s.file->read_raw(s.hashed, piece.size(), piece.data());
      const size_t n = piece.size();
      s.hashed += n;
      hashing.push(s.stream.get(), nullptr, n, std::move(piece));
    }
  }

  // The slot of `rank`'s file, which must hold `tensor` (errors name both).
  size_t slot_holding(int rank, const std::string& tensor) {
    auto it = slot_of_rank.find(rank);
    if (it == slot_of_rank.end())
      fail(where + ": no file for rank " + std::to_string(rank) + " in " + manifest_file + " (world size " +
           std::to_string(world_size) + ")");
    SafetensorsFile& f = open(it->second);
    if (!f.entries().count(tensor))
      fail(where + ": no tensor \"" + tensor + "\" in " + f.path() + " (rank " + std::to_string(rank) + ")");
    return it->second;
  }

  void build_index() {
    if (indexed) return;
    for (size_t i = 0; i < slots.size(); ++i) {
      SafetensorsFile& f = open(i);
      for (const auto& [name, entry] : f.entries()) {
        auto first = name.find('/');
        auto last = name.rfind('/');
        if (first == std::string::npos || first == last) continue;
        std::string kind = name.substr(0, first);
        if (kind == "module" || kind == "rng") continue;
        std::string param = name.substr(first + 1, last - first - 1);
        std::string off = name.substr(last + 1);
        if (off.empty() || off.size() > 18 || !std::all_of(off.begin(), off.end(), [](char c) { return c >= '0' && c <= '9'; }))
          continue;  // not a fragment name
        if (entry.shape.size() != 1)
          fail("fragment \"" + name + "\" in " + f.path() + " is not 1-D (shape has " +
               std::to_string(entry.shape.size()) + " dimensions)");
        // Master weights and optimizer states are fp32 whatever the training
        // dtype, and every save writes them so: another dtype is a rewritten file.
        if (entry.dtype != DType::F32)
          fail("fragment \"" + name + "\" in " + f.path() + " is " + dtype_name(entry.dtype) +
               ", not F32 as checkpoints store fragments (master weights and optimizer states are fp32 whatever "
               "the training dtype, " + manifest.dtype + " in " + manifest_file +
               "); the file was rewritten: restore it or load another tag");
        Fragment fr;
        fr.offset = std::stoll(off);
        fr.length = entry.shape[0];
        fr.slot = i;
        fr.tensor = name;
        fr.begin = f.data_start() + entry.begin;
        fr.dtype = entry.dtype;
        index[{kind, param}].push_back(std::move(fr));
      }
    }
    for (auto& [key, frags] : index)
      std::sort(frags.begin(), frags.end(), [](const Fragment& a, const Fragment& b) {
        return a.offset != b.offset ? a.offset < b.offset : a.length > b.length;
      });
    indexed = true;
  }

  std::string fragments_present(const std::vector<Fragment>& frags) const {
    std::string s;
    size_t shown = 0;
    for (const Fragment& f : frags) {
      if (++shown > 16) {
        s += ", ...";
        break;
      }
      s += (s.empty() ? "" : ", ") + range_string(f.offset, f.offset + f.length) + " in " + slots[f.slot].info.name;
    }
    return s;
  }

  std::string kinds_of(const std::string& param) const {
    std::string s;
    for (const auto& [key, frags] : index)
      if (key.second == param) s += (s.empty() ? "" : ", ") + key.first;
    return s.empty() ? "none" : s;
  }
};

void FragmentReader::verify_only(const std::vector<int>& ranks) {
  Impl& I = *impl_;
  for (auto& slot : I.slots) {
    if (std::find(ranks.begin(), ranks.end(), slot.info.rank) == ranks.end()) slot.verified = true;  // someone else's
  }
  for (int r : ranks) {
    auto it = I.slot_of_rank.find(r);
    if (it == I.slot_of_rank.end() || !I.verify) continue;
    Impl::Slot& slot = I.slots[it->second];
    I.open(it->second);
    slot.verified = true;
    slot.stream = std::make_unique<Xxh3>();
    slot.hashed = 0;
  }
}

void FragmentReader::wait_for_hashes() { impl_->hashing.drain(); }

void FragmentReader::finish_verification() {
  Impl& I = *impl_;
  for (size_t i = 0; i < I.slots.size(); ++i) {
    if (I.slots[i].stream) I.hash_from_file(i, I.slots[i].info.bytes);
  }
  I.hashing.drain();
  std::exception_ptr first;
  for (auto& slot : I.slots) {
    if (!slot.stream) continue;
    try {
      slot.file->check_hash(slot.info, slot.stream->digest());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    slot.stream.reset();
  }
  if (first) std::rethrow_exception(first);
}

FragmentReader::FragmentReader(const std::string& dir, const Manifest& manifest, bool verify)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.manifest = manifest;
  I.verify = verify;
  I.world_size = manifest.world_size;
  I.where = "checkpoint " + tag_dir(dir, manifest.tag);
  I.manifest_file = manifest_path(dir, manifest.tag);
  for (const FileInfo& f : manifest.files) {
    Impl::Slot s;
    s.info = f;
    s.path = tag_dir(dir, manifest.tag) + "/" + f.name;
    I.slot_of_rank[f.rank] = I.slots.size();
    I.slots.push_back(std::move(s));
  }
  for (const ParamInfo& p : manifest.params) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    I.numel[p.name] = n;
  }
}

FragmentReader::~FragmentReader() = default;  // Impl drains the hashes before the files close

void FragmentReader::read_f32(const std::string& kind, const std::string& param, int64_t start, int64_t length,
                              float* dst) {
  Impl& I = *impl_;
  const std::string what = I.where + ": \"" + kind + "\" of parameter \"" + param + "\"";
  if (start < 0 || length < 0) fail(what + ": invalid element range " + range_string(start, start + length));
  auto n = I.numel.find(param);
  if (n != I.numel.end() && start + length > n->second)
    fail(what + ": element range " + range_string(start, start + length) + " is outside the parameter's " +
         std::to_string(n->second) + " elements");
  if (length == 0) return;
  I.build_index();
  auto it = I.index.find({kind, param});
  if (it == I.index.end())
    fail(what + ": no fragments at all (kinds stored for \"" + param + "\": " + I.kinds_of(param) +
         "); elements " + range_string(start, start + length) + " are missing");
  const std::vector<Impl::Fragment>& frags = it->second;
  const int64_t end = start + length;
  int64_t cursor = start;
  std::vector<char> tmp;
  for (const Impl::Fragment& f : frags) {
    const int64_t fend = f.offset + f.length;
    if (f.length == 0 || fend <= cursor) continue;
    if (f.offset >= end) break;
    if (f.offset > cursor)
      fail(what + ": no fragment covers elements " + range_string(cursor, f.offset) + " (reading " +
           range_string(start, end) + "; fragments present: " + I.fragments_present(frags) +
           "); the checkpoint is incomplete");
    const int64_t to = std::min(end, fend);
    const int64_t count = to - cursor;
    const uint64_t esize = dtype_size(f.dtype);
    SafetensorsFile& file = I.open_for_data(f.slot);
    const uint64_t byte_off = static_cast<uint64_t>(cursor - f.offset) * esize;
    if (f.dtype == DType::F32) {
      file.read(f.tensor, byte_off, static_cast<uint64_t>(count) * 4, dst + (cursor - start));
      I.hash_read(f.slot, f.begin + byte_off, static_cast<uint64_t>(count) * 4, dst + (cursor - start), true);
    } else {
      tmp.resize(static_cast<size_t>(count) * esize);
      file.read(f.tensor, byte_off, tmp.size(), tmp.data());
      I.hash_read(f.slot, f.begin + byte_off, tmp.size(), tmp.data(), false);
      convert_to_f32(f.dtype, tmp.data(), static_cast<size_t>(count), dst + (cursor - start));
    }
    cursor = to;
    if (cursor >= end) break;
  }
  if (cursor < end)
    fail(what + ": no fragment covers elements " + range_string(cursor, end) + " (reading " + range_string(start, end) +
         "; fragments present: " + I.fragments_present(frags) + "); the checkpoint is incomplete");
}

int64_t FragmentReader::covered_elements(const std::string& kind, const std::string& param) {
  Impl& I = *impl_;
  I.build_index();
  auto it = I.index.find({kind, param});
  if (it == I.index.end()) return 0;
  int64_t cursor = 0;
  for (const Impl::Fragment& f : it->second) {  // sorted by offset
    if (f.offset > cursor) break;
    cursor = std::max(cursor, f.offset + f.length);
  }
  return cursor;
}

namespace {

std::string shape_text(const std::vector<int64_t>& shape) { return nlohmann::json(shape).dump(); }

}  // namespace

void FragmentReader::check_matches_manifest() {
  Impl& I = *impl_;
  const Manifest& m = I.manifest;
  const std::string& mf = I.manifest_file;
  const std::string fix = ": the manifest or the file was changed; restore it or load another tag";

  // The listing rank 0's file was saved with: names, shapes, trainable.
  auto rank0 = I.slot_of_rank.find(0);
  if (rank0 != I.slot_of_rank.end()) {
    const SafetensorsFile& file = I.open(rank0->second);
    if (const auto saved = recorded_params(file)) {
      std::map<std::string, const ParamInfo*> theirs;
      for (const ParamInfo& p : *saved) theirs[p.name] = &p;
      std::vector<std::string> differences;
      std::set<std::string> listed;
      for (const ParamInfo& p : m.params) {
        listed.insert(p.name);
        auto it = theirs.find(p.name);
        if (it == theirs.end()) {
          differences.push_back("\"" + p.name + "\" is in the manifest, not in the files");
        } else if (it->second->shape != p.shape) {
          differences.push_back("\"" + p.name + "\" has shape " + shape_text(it->second->shape) + " in the files, " +
                                shape_text(p.shape) + " in the manifest");
        } else if (it->second->trainable != p.trainable) {
          differences.push_back("\"" + p.name + "\" is " + (it->second->trainable ? "trainable" : "frozen") +
                                " in the files, " + (p.trainable ? "trainable" : "frozen") + " in the manifest");
        }
      }
      for (const ParamInfo& p : *saved) {
        if (!listed.count(p.name)) differences.push_back("\"" + p.name + "\" is in the files, not in the manifest");
      }
      if (!differences.empty()) {
        std::string msg = I.where + ": " + mf + " does not list the parameters " + file.path() + " was saved with:";
        for (size_t i = 0; i < differences.size() && i < 20; ++i) msg += "\n  " + differences[i];
        if (differences.size() > 20) msg += "\n  ... and " + std::to_string(differences.size() - 20) + " more";
        fail(msg + "\n" + fix.substr(2));
      }
    }
  }

  // Every fragment belongs to a listed trainable parameter and a listed
  // kind, and lies inside the parameter's elements.
  I.build_index();
  std::map<std::string, const ParamInfo*> params;
  for (const ParamInfo& p : m.params) params[p.name] = &p;
  std::set<std::string> kinds(m.states.begin(), m.states.end());
  kinds.insert("fp32");
  for (const auto& [key, frags] : I.index) {
    const std::string& kind = key.first;
    const std::string& param = key.second;
    const Impl::Fragment& first = frags.front();
    const std::string held = I.where + ": " + I.slots[first.slot].path + " holds fragment \"" + first.tensor + "\"";
    auto it = params.find(param);
    if (it == params.end())
      fail(held + " of parameter \"" + param + "\", which " + mf + " does not list" + fix);
    if (!it->second->trainable)
      fail(held + " of parameter \"" + param + "\", which " + mf + " lists as frozen (stored whole)" + fix);
    if (!kinds.count(kind)) {
      std::string listed = "fp32";
      for (const auto& k : m.states) listed += ", " + k;
      fail(held + " of state \"" + kind + "\", which " + mf + " does not list (its kinds: " + listed + ")" + fix);
    }
    const int64_t n = I.numel.at(param);
    for (const Impl::Fragment& f : frags) {
      if (f.offset + f.length > n)
        fail(I.where + ": " + mf + " gives parameter \"" + param + "\" shape " + shape_text(it->second->shape) + " (" +
             std::to_string(n) + " elements) but fragment \"" + f.tensor + "\" in " + I.slots[f.slot].path +
             " holds elements " + range_string(f.offset, f.offset + f.length) + fix);
    }
  }

  // Each trainable parameter is covered whole by its master weights.
  std::set<std::string> whole;
  for (const ParamInfo& p : m.params) {
    if (!p.trainable) {
      whole.insert("module/" + p.name);
      continue;
    }
    const int64_t n = I.numel.at(p.name);
    const int64_t covered = covered_elements("fp32", p.name);
    if (covered < n)
      fail(I.where + ": the manifest gives parameter \"" + p.name + "\" " + std::to_string(n) +
           " elements but its fp32 fragments in the rank files cover the first " + std::to_string(covered) +
           ": elements " + range_string(covered, n) + " are missing; the checkpoint is damaged or incomplete");
  }
  for (const std::string& b : m.buffers) whole.insert("module/" + b);

  // Whole tensors: each frozen parameter and buffer present, a frozen
  // parameter in its listed shape, none left over.
  std::set<std::string> found;
  for (size_t i = 0; i < I.slots.size(); ++i) {
    for (const auto& [name, entry] : I.open(i).entries()) {
      if (name.compare(0, 7, "module/") != 0) continue;
      if (!whole.count(name))
        fail(I.where + ": " + I.slots[i].path + " holds \"" + name + "\", which " + mf +
             " lists neither as a frozen parameter nor as a buffer" + fix);
      found.insert(name);
      auto it = params.find(name.substr(7));
      if (it != params.end() && entry.shape != it->second->shape)
        fail(I.where + ": \"" + name + "\" in " + I.slots[i].path + " has shape " + shape_text(entry.shape) + " but " +
             mf + " gives frozen parameter \"" + it->first + "\" shape " + shape_text(it->second->shape) + fix);
    }
  }
  for (const std::string& name : whole) {
    if (!found.count(name))
      fail(I.where + ": " + mf + " lists \"" + name.substr(7) + "\" (" +
           (params.count(name.substr(7)) ? "a frozen parameter" : "a buffer") + ") but no rank file holds \"" + name +
           "\"; the checkpoint is damaged or incomplete");
  }
}

bool FragmentReader::has(int rank, const std::string& tensor_name) {
  Impl& I = *impl_;
  auto it = I.slot_of_rank.find(rank);
  if (it == I.slot_of_rank.end()) return false;
  return I.open(it->second).entries().count(tensor_name) > 0;
}

int FragmentReader::file_holding(const std::string& tensor_name) {
  if (has(0, tensor_name)) return 0;
  for (const auto& [rank, slot] : impl_->slot_of_rank) {
    if (rank != 0 && has(rank, tensor_name)) return rank;
  }
  throw CheckpointError("checkpoint: no tensor \"" + tensor_name + "\" in any rank file; the checkpoint is incomplete");
}

TensorData FragmentReader::describe_whole(int rank, const std::string& tensor_name) {
  Impl& I = *impl_;
  const size_t slot = I.slot_holding(rank, tensor_name);
  const SafetensorsFile::Entry& e = I.slots[slot].file->entries().at(tensor_name);
  TensorData t;
  t.name = tensor_name;
  t.dtype = e.dtype;
  t.shape = e.shape;
  t.bytes = e.end - e.begin;
  return t;
}

TensorData FragmentReader::read_whole(int rank, const std::string& tensor_name, std::vector<uint8_t>& storage) {
  Impl& I = *impl_;
  TensorData t = describe_whole(rank, tensor_name);
  const size_t slot = I.slot_of_rank.at(rank);
  SafetensorsFile& f = I.open_for_data(slot);
  storage.resize(t.bytes);
  f.read(tensor_name, 0, t.bytes, storage.data());
  I.hash_read(slot, f.data_start() + f.entries().at(tensor_name).begin, t.bytes, storage.data(), false);
  t.data = storage.data();
  return t;
}

}  // namespace zero::ckpt
