#pragma once
// ckpt/'s one internal header: the on-disk layout of a sharded checkpoint,
// torch-free (the engine converts tensors to TensorData and back).
//
// Note [Checkpoint layout]: a checkpoint lives in <dir>/<tag>/ and
//   <dir>/latest               text file naming the newest complete tag
//   <dir>/<tag>/manifest.json  written by rank 0 last (format, version,
//                              world size, stage, dtype, parameters, files
//                              with sizes and XXH3-64 checksums, engine
//                              counters, client_state)
//   <dir>/<tag>/rank<r>.safetensors   one per rank, written in parallel
// Each data file is in the safetensors layout (8-byte little-endian header
// length, JSON header, raw little-endian bytes) so the safetensors library
// reads it. Tensors in it are named
//   "<kind>/<parameter name>/<offset>"  a fragment: the 1-D elements
//        [offset, offset + length) of the flattened parameter, for kind
//        "fp32" (master weights) and each optimizer state ("exp_avg",
//        "exp_avg_sq", "sum", "momentum_buffer", ...). Fragments of one kind
//        and parameter, over all files, cover it exactly once (model space,
//        independent of world size and stage). A tensor-parallel slice is
//        written in its full parameter's coordinates (the manifest lists
//        full shapes), so any tp x dp layout reads any other's.
//   "module/<name>"  a whole tensor in its own shape: frozen parameters and
//        buffers (written by rank 0 only).
//   "rng/<name>"     a rank's random generator state (U8): "rng/cpu", and
//        "rng/cuda" for its GPU when it trains on one.
// `latest` is replaced only after every file is durable: temporary name,
// fsync, rename, fsync of the directory.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero::ckpt {

constexpr int kFormatVersion = 1;
constexpr const char* kFormatName = "zero-checkpoint";

// Element types, spelled as safetensors spells them. F8_E4M3 is the "fn"
// variant (no infinities, one NaN pattern per sign), as torch's
// float8_e4m3fn and Hugging Face's FP8 weights use it; F8_E5M2 is the upper
// byte of an IEEE half.
enum class DType { F32, F16, BF16, F64, I64, I32, U8, BOOL, F8_E4M3, F8_E5M2 };
const char* dtype_name(DType d);              // "F32", ...
DType dtype_from_name(const std::string& s);  // throws CheckpointError naming s
size_t dtype_size(DType d);

bool dtype_is_floating(DType d);              // F32, F16, BF16, F64, F8_E4M3, F8_E5M2
// Converts n elements of a floating dtype to F32: F16, BF16 and both F8s
// exactly, F64 rounded to nearest. Throws CheckpointError for other dtypes.
void convert_to_f32(DType d, const void* src, size_t n, float* dst);
// n F32 values as F32, BF16 or F16 (rounded to nearest, ties to even, as
// torch does); CheckpointError for other dtypes.
void convert_from_f32(DType d, const float* src, size_t n, void* dst);

// "0123456789abcdef": 16 lowercase hex digits, as FileInfo::xxh3 spells them.
std::string xxh3_hex(uint64_t hash);

// XXH3-64 over bytes fed in order: the checksum of FileInfo::xxh3.
class Xxh3 {
 public:
  Xxh3();
  ~Xxh3();
  Xxh3(const Xxh3&) = delete;
  Xxh3& operator=(const Xxh3&) = delete;
  void update(const void* p, size_t n);
  uint64_t digest() const;

 private:
  void* state_;  // XXH3_state_t; xxhash.h stays out of this header
};

// A tensor to write (data borrowed) or one read back (data owned).
struct TensorData {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // borrowed when writing
  size_t bytes = 0;
};

struct FileInfo {
  std::string name;   // relative to the tag directory
  int rank = 0;
  uint64_t bytes = 0;
  std::string xxh3;   // 16 lowercase hex digits of XXH3-64 over the whole file
};

// Size and XXH3-64 of the file at `path` as it is on disk (name = path);
// throws CheckpointError naming the path when it cannot be read.
FileInfo hash_file(const std::string& path);
// Replaces `path` with `content` durably and atomically: a staging file
// beside it (staging_name_for), fsync, rename, fsync of the directory; on
// failure the staging file is removed, an existing `path` is untouched and
// CheckpointError names the path and errno.
void write_file_durably(const std::string& path, const std::string& content);
// The staging file of one durable write of `path`: "<path>.<16 hex
// digits>.tmp", drawn anew for each write, so that two processes replacing
// one file (two saves' `latest`) never touch each other's.
std::string staging_name_for(const std::string& path);
// Whether `file_name` (in the folder of a file named `target_name`) is a
// staging file of it: a write in progress, or what a killed one left.
bool is_staging_name_for(const std::string& file_name, const std::string& target_name);

// Writes `tensors` as one safetensors file at `path`, durably: to a staging
// file beside it (staging_name_for), fsync, rename, fsync of the directory. Hashes while writing.
// On any failure (ENOSPC, EIO, short write) removes the temporary file and
// throws CheckpointError naming the path and errno's text; an existing file
// at `path` is untouched until the rename. Returns the size and checksum, with
// name = the last component of `path` and rank = 0 (the caller sets the rank).
// Data starts at a multiple of 8 bytes (the header is padded with spaces) and
// tensors follow each other in the order given, without gaps.
// With `fetch`, tensor i's bytes are fetch(i) instead of tensors[i].data
// (which may then be null): asked for just before they are written, in
// order, and used only until the next call, so that the caller can bring
// the data in piece by piece (NVMe offload).
// With `recycle`, an existing file no longer needed (it is moved away
// first) is overwritten in place instead of a new file being made: on tmpfs
// its pages are reused, which writes about 5x faster here than pages the
// kernel must allocate and clear (Note [In-memory copies]).
using FetchData = std::function<const void*(size_t index)>;
FileInfo write_safetensors(const std::string& path, const std::vector<TensorData>& tensors,
                           const std::map<std::string, std::string>& metadata = {}, const FetchData& fetch = {},
                           const std::string& recycle = "");

// A safetensors file opened for reading tensors by byte range.
class SafetensorsFile {
 public:
  // Parses and validates the header (length within the file, JSON, known
  // dtypes, shape x dtype size == byte range, ranges inside the file, no
  // overlap); throws CheckpointError naming the path and what is wrong
  // (e.g. "truncated: header says 4096 bytes of data, file has 1000").
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte range, relative to the data section
  };
  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_bytes() const;
  // Where the data section starts in the file (Entry offsets are relative to it).
  uint64_t data_start() const { return data_start_; }
  // Copies bytes [byte_offset, byte_offset + bytes) of tensor `name` into dst.
  void read(const std::string& name, uint64_t byte_offset, uint64_t bytes, void* dst) const;
  // Copies bytes [offset, offset + bytes) of the file (header included) into dst.
  void read_raw(uint64_t offset, uint64_t bytes, void* dst) const;
  // Hashes the whole file; throws CheckpointError naming the file, the
  // expected and the actual checksum and size when they differ.
  void verify(const FileInfo& expected) const;
  // The same check for a hash computed elsewhere over the whole file.
  void check_hash(const FileInfo& expected, uint64_t actual) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0, file_bytes_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Weights as Hugging Face writes them, or as zero consolidates them: one
// safetensors file, a model.safetensors.index.json ({"weight_map": {tensor:
// shard file}}) and the shards it names in its folder, or a folder holding
// one of the two. Headers only are read at opening (each checked as
// SafetensorsFile does); a tensor is then read by element range, so a rank
// reads the bytes of its own shards only. Throws CheckpointError naming the
// path and what is wrong: no weights found, an index that names a file
// outside its folder, a tensor the index places in a file without it, a
// tensor in two files.
class WeightFiles {
 public:
  explicit WeightFiles(const std::string& path);
  ~WeightFiles();
  WeightFiles(const WeightFiles&) = delete;
  WeightFiles& operator=(const WeightFiles&) = delete;

  struct Tensor {
    DType dtype;
    std::vector<int64_t> shape;
    std::string file;  // the path of the file holding it
  };
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }
  // Elements [start, start + length) of flattened tensor `name` as F32 (a
  // floating dtype converted, through a bounded buffer).
  void read_f32(const std::string& name, int64_t start, int64_t length, float* dst) const;
  // Bytes [byte_offset, byte_offset + bytes) of tensor `name` as stored.
  void read(const std::string& name, uint64_t byte_offset, uint64_t bytes, void* dst) const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, const SafetensorsFile*> holder_;
};

// "<kind>/<param>/<offset>": the fragment of `param` at `offset` of state
// `kind` ("fp32" for the master weights, else the optimizer state's name).
std::string fragment_name(const std::string& kind, const std::string& param, int64_t offset);

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  bool trainable = true;  // trainable: fragments; else one "module/<name>" tensor
};

// The parameter listing (names, shapes, trainable) as a save records it in
// rank 0's file, under the metadata key kParamsRecord, so that a manifest
// edited afterwards (a shape changed, a parameter removed) disagrees with
// the files (FragmentReader::check_matches_manifest).
constexpr const char* kParamsRecord = "params";
// The metadata key of every rank file naming the save that wrote it (Manifest::save_id).
constexpr const char* kSaveId = "save";
std::string params_record(const std::vector<ParamInfo>& params);
// The listing `file` (rank 0's) recorded, or nullopt where it holds none (a
// file written before the record, or by an import); CheckpointError when
// it is not such a listing.
std::optional<std::vector<ParamInfo>> recorded_params(const SafetensorsFile& file);

struct Manifest {
  std::string format = kFormatName;
  int version = kFormatVersion;
  std::string tag;                 // read_manifest: the folder it was found in
  std::string tag_in_file;         // read_manifest: the file's own "tag" when it names another folder, else empty
  int world_size = 1;
  // The rank mesh that wrote it ("mesh": {"tp", "pp"}; absent: 1 and 1).
  // Parameters are listed in their full shapes and fragments are in full
  // coordinates whatever the mesh, so any layout loads them.
  int tensor_parallel = 1, pipeline_parallel = 1;
  int stage = 0;
  std::string dtype;               // training dtype: "F32", "F16", "BF16"
  std::string optimizer;           // optimizer.type
  std::vector<std::string> states; // optimizer state kinds stored per fragment ("exp_avg", ...)
  std::vector<ParamInfo> params;   // every named parameter once (trainable and frozen)
  std::vector<std::string> buffers;
  std::vector<FileInfo> files;     // one per rank (from_json: exactly world_size, ranks 0..N-1 once)
  nlohmann::json engine;           // counters, loss scaler, scheduler (the engine's business)
  nlohmann::json client_state;
  // The save that wrote it, also in each rank file's metadata (kSaveId):
  // a reader takes no file of another save of the same tag (Note
  // [Concurrent saves]). Empty in checkpoints written before it, or imported.
  std::string save_id;

  nlohmann::json to_json() const;
  // Validates format name, version (unknown: error saying which versions this
  // build reads) and required keys; `where` names the file in errors.
  static Manifest from_json(const nlohmann::json& j, const std::string& where);
};

// Every refusal in ckpt/ and interop/: a CheckpointError whose message
// names what is wrong and how to fix it.
[[noreturn]] void fail(const std::string& message);

// Note [Tag rule]: a tag is one folder name inside the checkpoint
// directory, the same rule wherever one is saved, loaded or read from
// `latest`, zero's or DeepSpeed's: not empty, not "latest" (the pointer
// file beside the tags), not starting with '.' ("." and "..", and the
// hidden folders saves stage in), and without '/', newline or NUL.
// tag_problem: empty when `tag` is one, otherwise what is wrong with it.
std::string tag_problem(const std::string& tag);
// fail()s, naming `where`, when tag_problem says.
void check_tag(const std::string& tag, const std::string& where);

// Paths and the `latest` pointer.
std::string tag_dir(const std::string& dir, const std::string& tag);
std::string rank_file_name(int rank);  // "rank00003.safetensors"
std::string manifest_path(const std::string& dir, const std::string& tag);
// Atomically replaces <dir>/latest with `tag` (temporary, fsync, rename, fsync dir).
// Refuses (CheckpointError) when <dir>/<tag>/manifest.json does not exist yet:
// the manifest is written last, then `latest`.
void write_latest(const std::string& dir, const std::string& tag);
// The tag in <dir>/latest; throws CheckpointError when dir or latest is
// missing, listing the tags present (directories holding a manifest.json).
std::string read_latest(const std::string& dir);
// Complete tags (directories holding a manifest.json; hidden ones skipped), in
// natural order: "global_step9" before "global_step10".
std::vector<std::string> list_tags(const std::string& dir);
// <dir>/<m.tag>/manifest.json, durably like write_safetensors; creates the
// tag directory when missing.
void write_manifest(const std::string& dir, const Manifest& m);
// Reads and validates; errors name the path (missing: "no manifest ...
// the save was interrupted or the tag is wrong; complete tags: ...").
// The folder the manifest is found in is the checkpoint: its files are read
// from there whatever the file's "tag" says (a renamed folder loads; a
// crafted tag cannot point the reader at another checkpoint's files or out
// of `dir`); a tag that disagrees is kept in tag_in_file for a warning.
Manifest read_manifest(const std::string& dir, const std::string& tag);
// A manifest's text, checked as read_manifest checks it; `path` names it in errors.
Manifest parse_manifest(const std::string& text, const std::string& path);

// All fragments of a checkpoint, for reading any element range of any
// (kind, parameter) whatever the world size that wrote it.
class FragmentReader {
 public:
  // Opens the rank files lazily. With verify = true, a file's size is checked
  // against the manifest when it is opened and its XXH3-64 over the whole
  // file the first time data is read from it; the fragment index (first
  // read_f32) reads every file's header only. A rank file that is missing
  // on disk is an error naming it. Fragments may come from any world size;
  // Fragments are F32, as every save writes them: another dtype is refused
  // naming the fragment, its file and both dtypes. Not thread-safe.
  FragmentReader(const std::string& dir, const Manifest& manifest, bool verify = true);
  ~FragmentReader();
  // Copies elements [start, start + length) of the flattened `param` of
  // `kind` (stored as F32) into dst; throws CheckpointError naming the
  // kind, parameter and the missing element range when fragments do not
  // cover it.
  void read_f32(const std::string& kind, const std::string& param, int64_t start, int64_t length,
                float* dst);
  // How many leading elements of `param` of `kind` the fragments present
  // cover without a gap (reads the files' headers, not their data): what
  // a reader checks before allocating what the manifest's shape claims.
  int64_t covered_elements(const std::string& kind, const std::string& param);
  // The manifest against the files' headers (no data is read), as every
  // reader of a whole checkpoint checks it first (load_checkpoint,
  // consolidate, fp32_state_dict_from_checkpoint): every fragment belongs
  // to a parameter the manifest lists as trainable and to a kind it lists;
  // the fp32 fragments of each trainable parameter cover exactly its
  // elements and no fragment reaches past them; each frozen parameter's
  // whole tensor has its shape, and each buffer's is present; no whole
  // tensor is left over; and the listing rank 0's file records (saves since
  // this check; older files have none) equals the manifest's. Throws
  // CheckpointError naming the tensor, the file and what differs.
  void check_matches_manifest();
  // Shared verification for a load by many ranks: hashes the files written
  // by `ranks` and skips the hash of the others (their sizes are still
  // checked), which other ranks verify; the callers agree on the outcome.
  // The files of `ranks` are hashed from the data as it is read (see Note
  // [Hashing while reading] in fragments.cpp): the bytes read_f32 copies
  // into dst are hashed from dst on a helper thread, so dst must stay
  // allocated and unchanged until wait_for_hashes(), finish_verification()
  // or the destructor returns. finish_verification() reads and hashes what
  // was not read, waits, and throws the first mismatch.
  void verify_only(const std::vector<int>& ranks);
  void wait_for_hashes();
  void finish_verification();
  // Whole "module/<name>" or "rng/<name>" tensor from the file of `rank`.
  bool has(int rank, const std::string& tensor_name);
  // The rank whose file holds the whole tensor (rank 0's first: it writes
  // them unless pipeline stages share the writing); throws CheckpointError
  // naming the tensor when no file does.
  int file_holding(const std::string& tensor_name);
  // Name, dtype, shape and size of a whole tensor, without reading it (data null).
  TensorData describe_whole(int rank, const std::string& tensor_name);
  TensorData read_whole(int rank, const std::string& tensor_name, std::vector<uint8_t>& storage);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The tensors of a checkpoint as consolidate writes them: full fp32 weights
// of every parameter (master fragments for trainable ones, frozen ones and
// floating buffers converted to F32, others as stored), described first
// (data null) and read one at a time.
class ConsolidatedTensors {
 public:
  ConsolidatedTensors(const std::string& dir, const std::string& tag);
  ~ConsolidatedTensors();
  const Manifest& manifest() const;
  const std::vector<TensorData>& tensors() const;
  // Tensor i's bytes (tensors()[i]'s dtype and size), valid until the next read.
  const void* read(size_t i);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Assembles full fp32 weights of every parameter (master fragments for
// trainable ones, frozen ones and floating buffers converted to F32, others
// as stored) and writes them to one safetensors file at `out`, one tensor
// in memory at a time. Returns the number of tensors written.
int64_t consolidate(const std::string& dir, const std::string& tag, const std::string& out);

}  // namespace zero::ckpt
