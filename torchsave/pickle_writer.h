#pragma once
// Python data written as a pickle (protocol 2), as torch.save writes it:
// what zero-ckpt export gives DeepSpeed. Torch-free. The reverse of
// pickle.h, for the few shapes a checkpoint needs: plain data, dicts in
// order, torch.Size, tensors (a persistent id naming a storage of the
// archive), calls of a named global and instances rebuilt from their
// attributes.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"

namespace zero::torchsave {

class Py {
 public:
  static Py none();
  static Py boolean(bool b);
  static Py integer(int64_t i);
  static Py real(double d);
  static Py str(std::string s);
  static Py list(std::vector<Py> items = {});
  static Py tuple(std::vector<Py> items = {});
  static Py dict();          // a plain dict, in insertion order
  static Py ordered_dict();  // collections.OrderedDict
  static Py size(const std::vector<int64_t>& shape);  // torch.Size
  // A contiguous tensor over storage `key` of the archive (numel elements
  // of dtype from element 0), as torch._utils._rebuild_tensor_v2 builds it.
  static Py tensor(const std::string& key, ckpt::DType dtype, const std::vector<int64_t>& shape);
  // module.name(*args), e.g. an enum's value: ZeroStageEnum(2).
  static Py call(const std::string& module, const std::string& name, std::vector<Py> args);
  // An instance of module.name made without calling its constructor, its
  // attributes set from `attributes` (pickle's NEWOBJ and BUILD).
  static Py instance(const std::string& module, const std::string& name, Py attributes);

  // Dicts: appends key -> value (keys are not checked for repeats).
  Py& set(Py key, Py value);
  Py& set(const std::string& key, Py value) { return set(str(key), std::move(value)); }
  Py& append(Py item);  // lists

 private:
  friend class PickleWriter;
  enum class Kind { None, Bool, Int, Float, Str, List, Tuple, Dict, OrderedDict, Size, Tensor, Call, Instance };
  Kind kind_ = Kind::None;
  int64_t integer_ = 0;
  double real_ = 0;
  std::string text_, module_;
  ckpt::DType dtype_ = ckpt::DType::F32;
  std::vector<int64_t> shape_;
  std::vector<Py> items_;
  std::vector<std::pair<Py, Py>> entries_;
};

// The pickle of `root`: PROTO 2 ... STOP.
std::string pickle(const Py& root);

// A storage of a torch.save archive: `bytes` bytes at `data` (borrowed
// until the write returns), named `key` ("0", "1", ...).
struct StorageBytes {
  std::string key;
  const void* data = nullptr;
  size_t bytes = 0;
};

// Writes `path` as torch.save does (zip, stored entries): <record>/data.pkl
// holding pickle(root), <record>/data/<key> per storage, byteorder and
// version, where <record> is the file's stem. torch.load and this
// project's TorchSaveFile read it. The file is fsynced; CheckpointError
// names the path on failure (and nothing is left at it).
void write_torch_save(const std::string& path, const Py& root, const std::vector<StorageBytes>& storages);

}  // namespace zero::torchsave
