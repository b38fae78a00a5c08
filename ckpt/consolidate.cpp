// consolidate(): one fp32 state dict in one safetensors file, from a sharded
// checkpoint of any world size. See Note [Checkpoint layout] in checkpoint.h.
#include <deque>

#include "ckpt/checkpoint.h"
#include "zero/error.h"

namespace zero::ckpt {

namespace {

// The rank whose file holds the whole tensor `name` (rank 0 writes them; the
// others are searched too, for checkpoints written otherwise).
int find_whole(FragmentReader& reader, const std::string& dir, const Manifest& m, const std::string& name) {
  if (reader.has(0, name)) return 0;
  for (const FileInfo& f : m.files)
    if (f.rank != 0 && reader.has(f.rank, name)) return f.rank;
  throw CheckpointError("checkpoint " + tag_dir(dir, m.tag) + ": no tensor \"" + name +
                        "\" in any rank file; the checkpoint is incomplete");
}

}  // namespace

int64_t consolidate(const std::string& dir, const std::string& tag, const std::string& out) {
  const Manifest m = read_manifest(dir, tag);
  FragmentReader reader(dir, m);
  // Storage must not move while `tensors` borrows it: deques keep addresses.
  std::deque<std::vector<float>> floats;
  std::deque<std::vector<uint8_t>> raw;
  std::vector<TensorData> tensors;

  auto add_whole = [&](const std::string& name, bool to_f32) {
    std::vector<uint8_t>& storage = raw.emplace_back();
    TensorData t = reader.read_whole(find_whole(reader, dir, m, "module/" + name), "module/" + name, storage);
    t.name = name;
    if (to_f32 && dtype_is_floating(t.dtype) && t.dtype != DType::F32) {
      const size_t n = t.bytes / dtype_size(t.dtype);
      std::vector<float>& f = floats.emplace_back(n);
      convert_to_f32(t.dtype, storage.data(), n, f.data());
      storage = {};
      t.dtype = DType::F32;
      t.data = f.data();
      t.bytes = n * 4;
    }
    tensors.push_back(std::move(t));
  };

  for (const ParamInfo& p : m.params) {
    if (!p.trainable) {
      add_whole(p.name, true);
      continue;
    }
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    std::vector<float>& f = floats.emplace_back(static_cast<size_t>(n));
    reader.read_f32("fp32", p.name, 0, n, f.data());
    TensorData t;
    t.name = p.name;
    t.dtype = DType::F32;
    t.shape = p.shape;
    t.data = f.data();
    t.bytes = static_cast<size_t>(n) * 4;
    tensors.push_back(std::move(t));
  }
  for (const std::string& b : m.buffers) add_whole(b, true);

  write_safetensors(out, tensors,
                    {{"format", "pt"},
                     {"source", "zero-ckpt consolidate"},
                     {"checkpoint_tag", m.tag},
                     {"checkpoint_world_size", std::to_string(m.world_size)}});
  return static_cast<int64_t>(tensors.size());
}

}  // namespace zero::ckpt
