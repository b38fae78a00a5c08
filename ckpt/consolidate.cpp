// consolidate(): one fp32 state dict in one safetensors file, from a sharded
// checkpoint of any world size. See Note [Checkpoint layout] in checkpoint.h.
#include <filesystem>

#include "ckpt/checkpoint.h"
#include "core/progress.h"
#include "zero/error.h"

namespace zero::ckpt {

namespace {

// The output must not be one of the inputs: the writer replaces `out`
// atomically, so --out naming a rank file or the manifest would destroy the
// checkpoint it is reading. Links count (the same file under another name),
// and so does the tag folder itself, whose files the manifest lists.
void check_output(const std::string& dir, const Manifest& m, const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string folder = tag_dir(dir, m.tag);
  const fs::path out_parent = fs::weakly_canonical(fs::absolute(out, ec).parent_path(), ec);
  if (!ec && out_parent == fs::weakly_canonical(folder, ec))
    throw CheckpointError("refusing to write " + out + " into the checkpoint folder " + folder +
                          " it consolidates (it could replace a file the checkpoint needs); write it elsewhere");
  std::vector<std::string> inputs = {manifest_path(dir, m.tag), tag_dir(dir, "latest")};
  for (const FileInfo& f : m.files) inputs.push_back(folder + "/" + f.name);
  for (const std::string& input : inputs) {
    std::error_code e1;
    if (fs::exists(out, e1) && fs::exists(input, e1) && fs::equivalent(out, input, e1))
      throw CheckpointError("refusing to write " + out + ": it is " + input +
                            ", an input of the consolidation; write it elsewhere");
  }
}

}  // namespace

struct ConsolidatedTensors::Impl {
  struct Source {
    bool fragments = false;  // a trainable parameter: its fp32 fragments
    int rank = 0;            // else the whole tensor "module/<name>" in this rank's file
    bool to_f32 = false;     // converted from F16/BF16/F64
  };
  Manifest m;
  std::string dir;
  FragmentReader reader;
  std::vector<TensorData> tensors;
  std::vector<Source> sources;
  std::vector<float> floats;
  std::vector<uint8_t> raw;
  Impl(const std::string& d, const std::string& tag) : m(read_manifest(d, tag)), dir(d), reader(d, m) {}
};

// The names, dtypes and shapes first (the header), then each tensor read
// when asked, into one buffer: memory for the largest tensor only.
ConsolidatedTensors::ConsolidatedTensors(const std::string& dir, const std::string& tag)
    : impl_(std::make_unique<Impl>(dir, tag)) {
  Impl& s = *impl_;
  // The manifest against the files as a load checks it (an edited shape or
  // a removed parameter would be written as the manifest says), before any
  // buffer of a size the manifest claims is allocated.
  s.reader.check_matches_manifest();
  auto add_whole = [&](const std::string& name) {
    const int rank = s.reader.file_holding("module/" + name);
    TensorData t = s.reader.describe_whole(rank, "module/" + name);
    t.name = name;
    const bool to_f32 = dtype_is_floating(t.dtype) && t.dtype != DType::F32;
    if (to_f32) {
      t.bytes = t.bytes / dtype_size(t.dtype) * 4;
      t.dtype = DType::F32;
    }
    s.tensors.push_back(std::move(t));
    s.sources.push_back({false, rank, to_f32});
  };
  for (const ParamInfo& p : s.m.params) {
    if (!p.trainable) {
      add_whole(p.name);
      continue;
    }
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;  // bounded by read_manifest, covered by the fragments (checked above)
    s.tensors.push_back({p.name, DType::F32, p.shape, nullptr, static_cast<size_t>(n) * 4});
    s.sources.push_back({true, 0, false});
  }
  for (const std::string& b : s.m.buffers) add_whole(b);
}

ConsolidatedTensors::~ConsolidatedTensors() = default;
const Manifest& ConsolidatedTensors::manifest() const { return impl_->m; }
const std::vector<TensorData>& ConsolidatedTensors::tensors() const { return impl_->tensors; }

const void* ConsolidatedTensors::read(size_t i) {
  Impl& s = *impl_;
  const TensorData& t = s.tensors.at(i);
  const Impl::Source& src = s.sources[i];
  if (src.fragments) {
    s.floats.resize(t.bytes / 4);
    s.reader.read_f32("fp32", t.name, 0, static_cast<int64_t>(s.floats.size()), s.floats.data());
    return s.floats.data();
  }
  const TensorData stored = s.reader.read_whole(src.rank, "module/" + t.name, s.raw);
  if (!src.to_f32) return s.raw.data();
  s.floats.resize(t.bytes / 4);
  convert_to_f32(stored.dtype, s.raw.data(), s.floats.size(), s.floats.data());
  return s.floats.data();
}

int64_t consolidate(const std::string& dir, const std::string& tag, const std::string& out) {
  ConsolidatedTensors source(dir, tag);
  const Manifest& m = source.manifest();
  check_output(dir, m, out);
  int64_t total = 0;
  for (const TensorData& t : source.tensors()) total += static_cast<int64_t>(t.bytes);
  Progress progress("consolidating " + tag_dir(dir, m.tag), total);
  write_safetensors(out, source.tensors(),
                    {{"format", "pt"},
                     {"source", "zero-ckpt consolidate"},
                     {"checkpoint_tag", m.tag},
                     {"checkpoint_world_size", std::to_string(m.world_size)}},
                    [&](size_t i) -> const void* {
                      progress.advance(static_cast<int64_t>(source.tensors()[i].bytes));  // counted as it is read
                      return source.read(i);
                    });
  return static_cast<int64_t>(source.tensors().size());
}

}  // namespace zero::ckpt
