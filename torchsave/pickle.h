#pragma once
// A restricted reader of Python pickles (protocols 2-5), as torch.save and
// DeepSpeed write them. Torch-free, and it executes nothing.
//
// Note [Restricted pickle]: a pickle is a program for a stack machine whose
// GLOBAL, REDUCE, NEWOBJ and BUILD opcodes import and call arbitrary Python
// code; torch.load runs them. This reader runs no code: it knows a short
// allow-list of globals (torchsave/allowed_globals.cpp) that checkpoints
// use, and for each one builds the *data* the call would have produced
// (OrderedDict -> Dict, torch.Size -> Tuple, _rebuild_tensor_v2 -> Tensor,
// DeepSpeed's LossScaler -> Object, a record of its class name and state).
// Any other global is refused with an error that names it, before anything
// else happens. Out-of-band buffers and the extension registry are refused
// too. Hostile input cannot make it recurse without bound or loop: lengths
// are checked against the bytes left, memo references share nodes instead
// of copying them, and a value that contains itself (a recursive pickle) or
// nests deeper than kMaxPickleDepth is refused once the pickle is read.
//
// Nor can it allocate more than its size allows. Every opcode that creates
// or grows an object charges what it allocates (a value, a string's bytes,
// an item, a dict entry and its index, a memo slot, a tensor's shape) to a
// budget of kMaxHeldPerInputByte bytes per byte the input took where it was
// stored, plus kHeldFloorBytes. The basis is the stored size, not the
// inflated one, so that a deflated data.pkl of repeated opcodes (2.5 KB
// inflating to megabytes of `]0`) is measured against its 2.5 KB. None,
// True and False are shared, as in Python, so the one-byte opcodes that
// make them allocate nothing. What is not charged is bounded by the input
// by construction: the stack and the marks hold at most one pointer per
// input byte.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"

namespace zero::torchsave {

constexpr int kMaxPickleDepth = 200;
// The machine's memory budget (Note [Restricted pickle]). The most a real
// pickle needs is about 40 bytes a byte (many small tensors); 512 leaves
// room for a data.pkl deflated 10:1.
constexpr size_t kMaxHeldPerInputByte = 512;
constexpr size_t kHeldFloorBytes = size_t{1} << 20;

// One storage of a torch.save file (a persistent id ('storage', type, key,
// location, numel)): `numel` elements of `dtype` in the file's data/<key>.
struct StorageRef {
  ckpt::DType dtype = ckpt::DType::U8;
  std::string key;
  std::string location;  // "cpu", "cuda:0", ...: where torch would put it
  int64_t numel = 0;
};

// A tensor: a strided view into a storage, checked to lie inside it.
struct TensorRef {
  StorageRef storage;
  int64_t offset = 0;  // in elements
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;  // in elements
  bool parameter = false;       // saved as a torch.nn.Parameter
  int64_t numel() const;
  bool contiguous() const;
};

struct Value {
  enum class Kind { None, Bool, Int, Float, String, Bytes, Tuple, List, Set, Dict, Global, Object, Tensor, Storage };
  Kind kind = Kind::None;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;  // String and Bytes: the bytes (UTF-8 for String); Global and Object: "module.name"
  std::vector<Value*> items;                        // Tuple, List, Set; Object: its constructor's arguments
  std::vector<std::pair<Value*, Value*>> entries;   // Dict, in insertion order
  Value* state = nullptr;                           // Object and Dict: what BUILD set (attributes)
  std::string member;                               // Object made by getattr(class, member): an enum member
  std::unique_ptr<TensorRef> tensor;                // Tensor (held apart: most values are not tensors)
  std::unique_ptr<StorageRef> storage;              // Storage

  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_sequence() const { return kind == Kind::Tuple || kind == Kind::List; }
  // A Dict's value under a string key; nullptr when absent or not a Dict.
  const Value* find(std::string_view key) const;
  // The same, but absent is an error naming `what` and the key.
  const Value& at(std::string_view key, const std::string& what) const;
  // Typed reads that name `what` in their error.
  int64_t as_int(const std::string& what) const;
  double as_float(const std::string& what) const;  // Int or Float
  const std::string& as_string(const std::string& what) const;
  const TensorRef& as_tensor(const std::string& what) const;
  // "Dict", "Tensor", ...: for error messages.
  static const char* kind_name(Kind k);
};

// A whole pickle read into values it owns; `root()` is what STOP returned.
class Pickle {
 public:
  // `what` names the input in errors (e.g. "ckpt/x.pt: data.pkl").
  // `stored_size` is the bytes the input took where it was kept (a zip
  // entry's compressed size), the basis of the memory budget; 0 means
  // `size`. Throws zero::CheckpointError.
  static std::unique_ptr<Pickle> read(const uint8_t* data, size_t size, const std::string& what,
                                      size_t stored_size = 0);
  const Value& root() const { return *root_; }
  // The bytes the machine charged to its budget while reading.
  size_t held_bytes() const { return held_bytes_; }
  // Every storage the pickle names, each key once.
  const std::vector<StorageRef>& storages() const { return storages_; }

 private:
  friend class Machine;
  std::vector<std::unique_ptr<Value>> nodes_;
  std::vector<StorageRef> storages_;
  Value* root_ = nullptr;
  size_t held_bytes_ = 0;
};

// Throws CheckpointError when a value contains itself or nests deeper than
// kMaxPickleDepth (Pickle::read calls it on every pickle).
void check_shape(const Value* root, const std::string& what);

// The allow-list, for documentation and the error that refuses the rest.
const std::vector<std::string>& allowed_globals();

}  // namespace zero::torchsave
