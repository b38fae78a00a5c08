// Checked reads of DeepSpeed's pickled values (saved_values.h).
#include "interop/saved_values.h"

#include <cmath>
#include <cstring>

#include "ckpt/checkpoint.h"
#include "zero/error.h"

namespace zero::interop {

using ckpt::fail;

using torchsave::TensorRef;
using torchsave::TorchSaveFile;
using torchsave::Value;

namespace {


}  // namespace

const std::vector<Value*>& sequence(const Value& v, const std::string& what) {
  if (!v.is_sequence()) fail(what + ": expected a list, found a " + Value::kind_name(v.kind));
  return v.items;
}

std::vector<int64_t> shape_of(const Value& v, const std::string& what) {
  std::vector<int64_t> shape;
  for (const Value* d : sequence(v, what)) {
    const int64_t n = d->as_int(what);
    if (n < 0 || n > (int64_t{1} << 50)) fail(what + ": dimension " + std::to_string(n) + " is out of range");
    shape.push_back(n);
  }
  return shape;
}

int64_t numel_of(const std::vector<int64_t>& shape, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > (int64_t{1} << 50) / d) fail(what + ": more than 2^50 elements");
    n *= d;
  }
  return n;
}

int64_t step_count(const TorchSaveFile& file, const Value& v, const std::string& what) {
  if (v.kind == Value::Kind::Float && v.real >= 0 && v.real == std::floor(v.real)) return static_cast<int64_t>(v.real);
  if (v.kind == Value::Kind::Tensor) {
    const TensorRef& t = *v.tensor;
    if (t.numel() != 1) fail(what + ": a step count tensor of " + std::to_string(t.numel()) + " elements");
    std::vector<uint8_t> bytes = file.read(t);
    double value = 0;
    if (t.storage.dtype == ckpt::DType::I64) {
      int64_t i;
      std::memcpy(&i, bytes.data(), 8);
      value = static_cast<double>(i);
    } else if (ckpt::dtype_is_floating(t.storage.dtype)) {
      float f;
      ckpt::convert_to_f32(t.storage.dtype, bytes.data(), 1, &f);
      value = f;
    } else {
      fail(what + ": a step count of dtype " + ckpt::dtype_name(t.storage.dtype));
    }
    if (value < 0 || value != std::floor(value)) fail(what + ": step count " + std::to_string(value));
    return static_cast<int64_t>(value);
  }
  const int64_t n = v.as_int(what);
  if (n < 0) fail(what + ": step count " + std::to_string(n));
  return n;
}

}  // namespace zero::interop
