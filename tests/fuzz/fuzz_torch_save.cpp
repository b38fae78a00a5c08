// Fuzz target: the restricted torch.save reader (torchsave/). The input is
// read twice: as a pickle on its own (Pickle::read), and as a whole
// torch.save file (through a memfd) whose every tensor is then read. Any
// input must either read or fail with zero::CheckpointError; no tensor read
// may allocate more than the file holds.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <unordered_set>
#include <vector>

#include "torchsave/torch_save.h"
#include "memfd_file.h"
#include "zero/error.h"

namespace {

using zero::torchsave::Value;

// Every tensor once (memo references make a DAG: a visited set keeps the
// walk linear).
void tensors(const Value& v, std::unordered_set<const Value*>& seen, std::vector<const Value*>& out) {
  if (!seen.insert(&v).second) return;
  if (v.kind == Value::Kind::Tensor) out.push_back(&v);
  for (const Value* x : v.items) tensors(*x, seen, out);
  for (const auto& [k, x] : v.entries) {
    tensors(*k, seen, out);
    tensors(*x, seen, out);
  }
  if (v.state) tensors(*v.state, seen, out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    zero::torchsave::Pickle::read(data, size, "fuzz");
  } catch (const zero::CheckpointError&) {
  }
  const int fd = memfd_with(data, size);
  try {
    zero::torchsave::TorchSaveFile file("/proc/self/fd/" + std::to_string(fd));
    std::unordered_set<const Value*> seen;
    std::vector<const Value*> found;
    tensors(file.root(), seen, found);
    for (const Value* t : found) {
      const uint64_t bytes = static_cast<uint64_t>(t->tensor->numel()) * zero::ckpt::dtype_size(t->tensor->storage.dtype);
      if (bytes > size) std::abort();  // a tensor larger than the file passed the checks
      file.read(*t->tensor);
    }
  } catch (const zero::CheckpointError&) {
  }
  ::close(fd);
  return 0;
}
