// Engine::load_weights: weights from safetensors files (Hugging Face's
// layout, or zero's consolidated file) streamed into the partition, each
// rank reading the byte ranges of its own shards (ckpt::WeightFiles).
#include <torch/torch.h>

#include <set>

#include <nlohmann/json.hpp>

#include "core/fault.h"
#include "core/progress.h"
#include "engine/checkpoint_io.h"
#include "engine/engine_impl.h"
#include "engine/training_parts.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero {
namespace engine {
namespace {

// Every tensor of the model in the files, of its shape, and (with the
// whole model here) nothing else in them: checked before anything is read.
void check_matches(const ckpt::WeightFiles& files, const ModelTensors& model,
                   const std::function<std::string(const std::string&)>& in_files, bool whole) {
  std::vector<std::string> missing, reshaped, unused;
  std::set<std::string> used;
  auto check = [&](const std::string& name, const std::vector<int64_t>& shape, bool floating) {
    const std::string file_name = in_files(name);
    used.insert(file_name);
    const std::string shown = file_name == name ? name : name + " (\"" + file_name + "\" in the files)";
    auto it = files.tensors().find(file_name);
    if (it == files.tensors().end()) {
      missing.push_back(shown);
    } else if (it->second.shape != shape) {
      reshaped.push_back(shown + " " + nlohmann::json(it->second.shape).dump() + " in " + it->second.file + ", " +
                         nlohmann::json(shape).dump() + " in the model");
    } else if (floating && !ckpt::dtype_is_floating(it->second.dtype)) {
      reshaped.push_back(shown + " is " + ckpt::dtype_name(it->second.dtype) + " in " + it->second.file +
                         ", not a floating dtype");
    }
  };
  for (const auto& p : model.params) check(p.name, p.shape, true);
  for (const auto& [name, t] : model.buffers) check(name, t.sizes().vec(), at::isFloatingType(t.scalar_type()));
  if (whole) {
    for (const auto& [name, t] : files.tensors()) {
      if (!used.count(name)) unused.push_back(name + " (" + t.file + ")");
    }
  }
  if (missing.empty() && reshaped.empty() && unused.empty()) return;
  std::string message = "load_weights: " + files.path() + " does not match the model:";
  if (!missing.empty()) message += "\nin the model, not in the files:" + listing(missing);
  if (!unused.empty()) message += "\nin the files, not in the model:" + listing(unused);
  if (!reshaped.empty()) message += "\ndiffering:" + listing(reshaped);
  message += "\nnothing was loaded; map the model's names to the files' with WeightsLoadOptions::name_in_files";
  throw CheckpointError(message);
}

// Bucket k's master weights from the files (a host copy for a master
// elsewhere: one bucket at a time).
void read_bucket(TrainingParts& s, const ckpt::WeightFiles& files, size_t k,
                 const std::vector<partition::FlatLayout::Fragment>& fragments_of_k,
                 const std::function<std::string(const std::string&)>& in_files) {
  // A read failing half-way through the model (ZERO_FAULT, core/fault.h).
  if (fault::fires("weights.read", s.pg->rank())) {
    throw CheckpointError("load_weights: reading bucket " + std::to_string(k) + " failed (injected by ZERO_FAULT)");
  }
  const at::Tensor& master = s.sharded->masters().tensors()[k];
  const bool direct = master.is_cpu() && master.is_contiguous();
  at::Tensor cpu = direct ? master : master.to(at::kCPU).contiguous();
  for (const auto& f : fragments_of_k) {
    const std::string& name = s.sharded->param_name(f.param);
    for (const auto& piece : full_pieces(s.splits, name, f.param_offset, f.length)) {
      float* dst = cpu.data_ptr<float>() + f.start + (piece.offset - f.param_offset);
      files.read_f32(in_files(name), piece.full_offset, piece.length, dst);
    }
  }
  if (!direct) {
    torch::NoGradGuard no_grad;
    master.copy_(cpu);
  }
}

// Frozen parameters and buffers, whole, in the dtype the model holds them.
void read_module(const ckpt::WeightFiles& files, const ModelTensors& model,
                 const std::function<std::string(const std::string&)>& in_files) {
  torch::NoGradGuard no_grad;
  auto read = [&](const std::string& name, const at::Tensor& t) {
    if (at::isFloatingType(t.scalar_type())) {
      at::Tensor values = torch::empty({t.numel()}, at::kFloat);
      files.read_f32(in_files(name), 0, t.numel(), values.data_ptr<float>());
      t.copy_(values.view(t.sizes()));
      return;
    }
    const auto& stored = files.tensors().at(in_files(name));
    if (from_ckpt(stored.dtype) != t.scalar_type()) {
      throw CheckpointError("load_weights: buffer " + name + " is " + ckpt::dtype_name(stored.dtype) + " in " +
                            stored.file + " and " + std::string(c10::toString(t.scalar_type())) + " in the model");
    }
    at::Tensor values = torch::empty(t.sizes(), t.options().device(at::kCPU));
    files.read(in_files(name), 0, values.nbytes(), values.data_ptr());
    t.copy_(values);
  };
  for (const auto& [name, t] : model.frozen) read(name, t);
  for (const auto& [name, t] : model.buffers) read(name, t);
}

}  // namespace

void load_weights(TrainingParts& s, const std::string& path, const WeightsLoadOptions& options) {
  const auto in_files = options.name_in_files ? options.name_in_files
                                              : std::function<std::string(const std::string&)>(
                                                    [](const std::string& name) { return name; });
  const ckpt::WeightFiles files(path);  // headers only; every rank reads the same ones
  const ModelTensors model = describe(*s.module, s.splits);
  check_matches(files, model, in_files, /*whole=*/s.mesh->shape().pp == 1);

  // From here every rank runs the same collectives (each bucket's publish)
  // whatever fails on it; the first failure is kept and the ranks agree.
  std::string error;
  auto attempt = [&](const auto& part) {
    if (!error.empty()) return;
    try {
      part();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  const auto& masters = s.sharded->masters().tensors();
  std::vector<std::vector<partition::FlatLayout::Fragment>> by_bucket(masters.size());
  for (const auto& f : s.sharded->fragments()) by_bucket[f.bucket].push_back(f);
  int64_t total = 0;
  for (const at::Tensor& m : masters) total += static_cast<int64_t>(m.nbytes());
  Progress progress("loading weights from " + path, total, s.pg->rank() == 0);
  NvmeWindow window(s.sharded->masters(), /*write_back=*/true);
  for (size_t k = 0; k < masters.size(); ++k) {
    progress.advance(static_cast<int64_t>(masters[k].nbytes()));
    attempt([&] { window.enter(k); });  // NVMe offload: the bucket comes back, and goes back after
    attempt([&] { read_bucket(s, files, k, by_bucket[k], in_files); });
    s.sharded->masters().publish_bucket(k);  // the master weights become the parameters
  }
  s.sharded->masters().publish();
  attempt([&] { read_module(files, model, in_files); });
  attempt([&] { window.finish(); });
  error = comm::agreed_error(*s.pg, error, "load_weights: " + path);
  if (!error.empty()) {
    s.partly_loaded = "load_weights(" + path + ") failed: " + error;
    throw CheckpointError(error + "; the weights are partly loaded: load them again (or a checkpoint) before training");
  }
  s.partly_loaded.clear();
  log::info("ckpt", "loaded the weights of " + path + " (" + std::to_string(files.tensors().size()) + " tensors)");
}

}  // namespace engine

void Engine::load_weights(const std::string& path, const WeightsLoadOptions& options) {
  impl_->check_stopped("engine.load_weights");
  engine::load_weights(*impl_, path, options);
}

}  // namespace zero
