// engine::load_checkpoint over ckpt/ (Note [Checkpoint layout] in
// ckpt/checkpoint.h): each rank reads the pieces of its partition from
// whichever files hold them, at any world size and stage.
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/fault.h"
#include "core/progress.h"
#include "engine/checkpoint_io.h"
#include "engine/checkpoint_staging.h"
#include "engine/training_parts.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The model must match the checkpoint by names and shapes.
// `whole`: the model is all of it (a pipeline stage holds a part, so what
// the checkpoint has beyond it is the other stages').
void check_matches_model(const ckpt::Manifest& m, const ModelTensors& model, const std::string& where, bool whole) {
  std::unordered_map<std::string, const ckpt::ParamInfo*> saved;
  for (const auto& p : m.params) saved[p.name] = &p;
  std::vector<std::string> missing, unexpected, reshaped;
  std::set<std::string> current;
  for (const auto& p : model.params) {
    current.insert(p.name);
    auto it = saved.find(p.name);
    if (it == saved.end()) {
      missing.push_back(p.name);
    } else if (it->second->shape != p.shape) {
      reshaped.push_back(p.name + " " + json(it->second->shape).dump() + " in the checkpoint, " + json(p.shape).dump() + " in the model");
    }
  }
  for (const auto& p : m.params) {
    if (whole && !current.count(p.name)) unexpected.push_back(p.name);
  }
  std::set<std::string> saved_buffers(m.buffers.begin(), m.buffers.end());
  for (const auto& [name, t] : model.buffers) {
    if (!saved_buffers.count(name)) missing.push_back(name + " (buffer)");
  }
  if (missing.empty() && unexpected.empty() && reshaped.empty()) return;
  std::string msg = "load_checkpoint: " + where + " does not match the model:";
  if (!missing.empty()) msg += "\nin the model, not in the checkpoint:" + listing(missing);
  if (!unexpected.empty()) msg += "\nin the checkpoint, not in the model:" + listing(unexpected);
  if (!reshaped.empty()) msg += "\nshapes differ:" + listing(reshaped);
  throw CheckpointError(msg);
}

// What the load restores, from the options and the checkpoint.
struct Plan {
  bool training = false;          // counters, scheduler, scaler, generators, accumulated gradients
  bool states = false;            // optimizer states
  bool mid_accumulation = false;  // the checkpoint holds partial gradients to resume
};

Plan plan_for(TrainingParts& s, const ckpt::Manifest& m, const EngineRecord& e, const LoadOptions& options,
              const std::string& where) {
  Plan plan;
  plan.training = !options.load_module_only;
  plan.states = plan.training && options.load_optimizer_states;
  plan.mid_accumulation = plan.training && e.mid_accumulation;
  if (plan.states && !m.states.empty()) {
    for (const auto& kind : s.optimizer->state_names()) {
      if (std::find(m.states.begin(), m.states.end(), kind) == m.states.end()) {
        throw CheckpointError("load_checkpoint: " + where + " holds the state of optimizer " + m.optimizer +
                              " without \"" + kind + "\", which " + s.config.optimizer.type +
                              " needs; load with load_optimizer_states = false to start the optimizer afresh");
      }
    }
  }
  if (plan.mid_accumulation && (m.world_size != s.pg->size() || m.stage != s.config.zero_optimization.stage ||
                                e.gradient_accumulation_steps != s.gas || m.tensor_parallel != s.mesh->shape().tp ||
                                m.pipeline_parallel != s.mesh->shape().pp)) {
    throw CheckpointError("load_checkpoint: " + where + " was saved in the middle of a gradient accumulation (micro step " +
                          std::to_string(e.micro_steps) + "), whose partial gradients resume only at "
                          "world size " + std::to_string(m.world_size) + " (tp " + std::to_string(m.tensor_parallel) +
                          " x pp " + std::to_string(m.pipeline_parallel) + "), stage " + std::to_string(m.stage) +
                          " and the same gradient_accumulation_steps; save at an accumulation boundary to change them");
  }
  return plan;
}

// Every rank issues the same collectives (the bucket all-gathers) whatever
// fails on it; the first failure is kept and the ranks agree at the end.
struct Attempts {
  std::string error;
  template <typename Part>
  void run(const Part& part) {
    if (!error.empty()) return;
    try {
      part();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
};

// The checkpoint's files, read fragment by fragment or tensor by tensor.
class Source {
 public:
  Source(const std::string& dir, const ckpt::Manifest& m, comm::ProcessGroup& pg)
      : reader(std::make_unique<ckpt::FragmentReader>(dir, m)) {
    reader->check_matches_manifest();  // as consolidate checks it: the manifest against the files' headers
    std::vector<int> mine;  // each file is hashed by one rank: file f by rank f % world size
    for (int f = pg.rank(); f < m.world_size; f += pg.size()) mine.push_back(f);
    reader->verify_only(mine);
    for (const auto& p : m.params) {
      trainable_then_[p.name] = p.trainable;
      int64_t numel = 1;
      for (int64_t d : p.shape) numel *= d;  // the shapes are the model's (check_matches_model)
      numel_[p.name] = numel;
    }
  }
  // Elements of a parameter as fp32: from master fragments, or from the
  // whole tensor when it was frozen then.
  void read_param(const std::string& name, int64_t offset, int64_t length, float* dst) {
    if (trainable_then(name)) {
      reader->read_f32("fp32", name, offset, length, dst);
      return;
    }
    const at::Tensor whole = view_of(reader->read_whole(reader->file_holding("module/" + name), "module/" + name, storage_)).to(at::kFloat);
    check_numel(whole, numel_.at(name), "module/" + name);
    std::memcpy(dst, whole.data_ptr<float>() + offset, length * sizeof(float));
  }
  // A whole tensor of the file must hold as many elements as the model's
  // tensor: a file that says otherwise does not match its manifest.
  static void check_numel(const at::Tensor& whole, int64_t numel, const std::string& entry) {
    if (whole.numel() == numel) return;
    throw CheckpointError("load_checkpoint: " + ckpt::rank_file_name(0) + " holds " + std::to_string(whole.numel()) +
                          " elements of \"" + entry + "\" where the model's tensor has " + std::to_string(numel) +
                          "; the file does not match the checkpoint's manifest (rewritten, or copied from another checkpoint)");
  }
  // A whole tensor of rank `rank`'s file, viewed in the reader's storage.
  at::Tensor read_whole(int rank, const std::string& name) {
    const ckpt::TensorData d = reader->read_whole(rank, name, storage_);
    return torch::from_blob(const_cast<void*>(d.data), d.shape, from_ckpt(d.dtype));
  }
  bool trainable_then(const std::string& name) const {
    auto it = trainable_then_.find(name);
    return it != trainable_then_.end() && it->second;
  }
  std::unique_ptr<ckpt::FragmentReader> reader;

 private:
  std::unordered_map<std::string, bool> trainable_then_;
  std::unordered_map<std::string, int64_t> numel_;  // per parameter, as the manifest lists it
  std::vector<uint8_t> storage_;
};

// Bucket k's master weights and the states `kinds` from their fragments.
// Host tensors are read into directly; others through a host copy (which
// keeps the padding as it is), returned in `staged` while it is hashed.
void read_bucket(TrainingParts& s, Source& source, size_t k, const std::vector<std::string>& kinds,
                 const std::vector<partition::FlatLayout::Fragment>& fragments, std::vector<at::Tensor>& staged) {
  const at::Tensor& master = s.sharded->masters().tensors()[k];
  for (const auto& kind : kinds) {
    at::Tensor target = kind == "fp32" ? master : s.optimizer->state(master, kind, true);
    if (!target.defined()) continue;
    const bool direct = target.is_cpu() && target.is_contiguous();
    at::Tensor cpu = direct ? target : target.to(at::kCPU).contiguous();
    if (!direct) staged.push_back(cpu);
    for (const auto& f : fragments) {
      if (f.bucket != static_cast<int64_t>(k)) continue;
      const std::string& name = s.sharded->param_name(f.param);
      for (const auto& piece : full_pieces(s.splits, name, f.param_offset, f.length)) {
        float* dst = cpu.data_ptr<float>() + f.start + (piece.offset - f.param_offset);
        if (kind == "fp32") {
          source.read_param(name, piece.full_offset, piece.length, dst);
        } else if (source.trainable_then(name)) {
          source.reader->read_f32(kind, name, piece.full_offset, piece.length, dst);
        } else {
          std::fill(dst, dst + piece.length, 0.0f);  // frozen then: no state yet
        }
      }
    }
    if (!direct) {
      torch::NoGradGuard no_grad;
      target.copy_(cpu);
    }
  }
}

// Master weights (and optimizer states) of this rank's partition, bucket by
// bucket; each bucket's parameters are published (all-gathered) while the
// next one is read.
// Master weights or optimizer states that are NaN or infinite would train
// to NaN losses without a word: a checkpoint holding them is damaged (or
// saved after training diverged, with SaveOptions::allow_non_finite), and
// is refused naming the tensor unless LoadOptions::allow_non_finite.
void check_finite(TrainingParts& s, size_t k, const std::vector<std::string>& kinds,
                  const std::vector<partition::FlatLayout::Fragment>& fragments) {
  const at::Tensor& master = s.sharded->masters().tensors()[k];
  for (const auto& kind : kinds) {
    const at::Tensor t = kind == "fp32" ? master : s.optimizer->state(master, kind, false);
    if (!t.defined()) continue;
    const at::Tensor finite = torch::isfinite(t);
    if (finite.all().item<bool>()) continue;
    const int64_t first = torch::nonzero(finite.logical_not()).flatten()[0].item<int64_t>();
    std::string name = "(padding)";
    int64_t offset = 0;
    for (const auto& f : fragments) {
      if (f.bucket == static_cast<int64_t>(k) && first >= f.start && first < f.start + f.length) {
        name = s.sharded->param_name(f.param);
        offset = f.param_offset + (first - f.start);
      }
    }
    const std::string what = kind == "fp32" ? "the master weights of parameter " + name + " hold "
                                            : "the optimizer state " + kind + " of parameter " + name + " holds ";
    throw CheckpointError("load_checkpoint: " + what + std::to_string(t.view(-1)[first].item<float>()) +
                          " at element " + std::to_string(offset) +
                          "; a checkpoint with non-finite values would train to NaN: load an earlier tag, or pass "
                          "LoadOptions::allow_non_finite to load it anyway");
  }
}

void read_partition(TrainingParts& s, Source* source, const std::vector<std::string>& kinds, NvmeWindow& window,
                    Attempts& attempts, bool allow_non_finite) {
  const auto fragments = s.sharded->fragments();  // computed once: a walk over the whole layout
  int64_t total = 0;
  for (const at::Tensor& m : s.sharded->masters().tensors()) total += static_cast<int64_t>(m.nbytes() * kinds.size());
  Progress progress("loading the checkpoint's weights and optimizer states", total, s.pg->rank() == 0);
  for (size_t k = 0; k < s.sharded->masters().tensors().size(); ++k) {
    progress.advance(static_cast<int64_t>(s.sharded->masters().tensors()[k].nbytes() * kinds.size()));
    std::vector<at::Tensor> staged;  // host copies being hashed (see verify_only)
    try {
      window.enter(k);  // NVMe offload: the bucket comes back (and goes back to disk after)
    } catch (const std::exception& e) {
      if (attempts.error.empty()) attempts.error = e.what();
    }
    attempts.run([&] { read_bucket(s, *source, k, kinds, fragments, staged); });
    if (!allow_non_finite) attempts.run([&] { check_finite(s, k, kinds, fragments); });
    s.sharded->masters().publish_bucket(k);  // the loaded master weights become the parameters
    if (source && (!staged.empty() || s.sharded->masters().nvme_store())) source->reader->wait_for_hashes();  // they read the memory about to go
  }
  // Checked while the last buckets are gathered, before anything else is
  // taken from the files.
  attempts.run([&] { source->reader->finish_verification(); });
  s.sharded->masters().publish();  // waits for the buckets published above
}

// Frozen parameters and buffers, in the dtype the model holds them.
void read_module(Source& source, const ModelTensors& model) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : model.frozen) {
    at::Tensor values = torch::empty({t.numel()}, at::kFloat);
    source.read_param(name, 0, t.numel(), values.data_ptr<float>());
    t.copy_(values.view(t.sizes()));
  }
  for (const auto& [name, t] : model.buffers) {
    const at::Tensor whole = source.read_whole(source.reader->file_holding("module/" + name), "module/" + name);
    Source::check_numel(whole, t.numel(), "module/" + name);
    t.copy_(whole.view(t.sizes()));
  }
}

// The accumulated gradients and each generator this rank saved (a
// checkpoint from CPU ranks leaves a GPU's as it is).
void read_rank_state(TrainingParts& s, Source& source, const ckpt::Manifest& m, bool mid_accumulation) {
  const int rank = s.pg->rank();
  if (mid_accumulation) {
    s.sharded->restore_accumulated_grads(source.read_whole(rank, "accum/grads"));
  } else {
    s.sharded->zero_grads();
  }
  for (auto& [name, gen] : generators(*s.module)) {
    if (rank >= m.world_size || !source.reader->has(rank, name)) continue;
    at::Tensor state = source.read_whole(rank, name).to(at::kByte).clone();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
}

void restore_counters(TrainingParts& s, const EngineRecord& e, const LoadOptions& options, bool mid_accumulation) {
  StepCounters& c = s.steps;
  c.global_steps = e.global_steps;
  c.skipped_steps = e.skipped_steps;
  c.micro_steps = e.micro_steps;
  if (!mid_accumulation) c.micro_steps -= c.micro_steps % s.gas;
  const int64_t taken = c.global_steps - c.skipped_steps;
  c.schedule_start = options.load_lr_scheduler_states ? taken - e.scheduler_steps.value_or(taken) : taken;
  c.lr = options.load_lr_scheduler_states ? e.lr.value_or(c.lr) : s.schedule->lr_at(0);
  if (s.scaler && e.loss_scaler) s.scaler->set_state(*e.loss_scaler);
}

}  // namespace

std::string load_checkpoint(TrainingParts& s, const std::string& dir, const std::string& tag_in, const LoadOptions& options) {
  const std::string tag = tag_in.empty() ? ckpt::read_latest(dir) : tag_in;
  if (tag_in.empty()) {
    // Each rank read `latest` itself: another job saving into the folder
    // meanwhile could give them different steps.
    const std::string differs = comm::disagreement(*s.pg, {{"the tag " + dir + "/latest names", tag}});
    if (!differs.empty()) {
      throw CheckpointError("load_checkpoint: " + differs +
                            "; is another job saving into the same folder? Load with an explicit tag");
    }
  }
  const std::string where = (fs::path(dir) / tag).string();
  const ckpt::Manifest m = agreed_manifest(*s.pg, dir, tag, where);
  if (!m.tag_in_file.empty()) {
    log::warn("ckpt", where + "/manifest.json names tag \"" + m.tag_in_file +
                          "\"; the folder it is in is the checkpoint, so its files are read from " + where);
  }
  const EngineRecord record = EngineRecord::from_json(m.engine, where + "/manifest.json");
  const ModelTensors model = describe(*s.module, s.splits);
  {
    // Pipeline stages check different layers: they agree before any collective.
    std::string mismatch;
    try {
      check_matches_model(m, model, where, /*whole=*/s.mesh->shape().pp == 1);
    } catch (const CheckpointError& e) {
      mismatch = e.what();
    }
    if (s.mesh->shape().pp > 1) mismatch = comm::agreed_error(*s.pg, mismatch, "load_checkpoint: " + where);
    if (!mismatch.empty()) throw CheckpointError(mismatch);
  }
  const Plan plan = plan_for(s, m, record, options, where);
  // The loaders made already must be the saved ones: checked before anything is read.
  for (size_t i = 0; plan.training && i < s.data_loaders.size() && i < record.data_loaders.size(); ++i) {
    if (auto loader = s.data_loaders[i].lock()) check_position(*loader, record.data_loaders[i], i, where);
  }
  // A client optimizer's rates and scheduler (Note [Client optimizer]), as restore_counters sets the schedule.
  const int64_t taken = record.global_steps - record.skipped_steps;
  const int64_t client_scheduler_steps = options.load_lr_scheduler_states ? record.scheduler_steps.value_or(taken) : 0;
  const std::vector<double> client_lrs = options.load_lr_scheduler_states ? record.client_lrs : std::vector<double>{};
  if (plan.training && s.client) s.client->check_loadable(client_scheduler_steps, client_lrs, where);

  Attempts attempts;
  std::unique_ptr<Source> source;
  attempts.run([&] { source = std::make_unique<Source>(dir, m, *s.pg); });
  std::vector<std::string> kinds{"fp32"};
  if (plan.states) kinds.insert(kinds.end(), m.states.begin(), m.states.end());
  NvmeWindow window(s.sharded->masters(), /*write_back=*/true);
  read_partition(s, source.get(), kinds, window, attempts, options.allow_non_finite);
  attempts.run([&] {
    if (plan.states && !m.states.empty()) s.optimizer->set_step_count(record.optimizer_steps);
    read_module(*source, model);
    if (plan.training) read_rank_state(s, *source, m, plan.mid_accumulation);
  });
  if (source) source->reader->wait_for_hashes();  // they read the targets
  attempts.run([&] { window.finish(); });
  fault::reached("load.read", s.pg->rank());
  const std::string error = comm::agreed_error(*s.pg, attempts.error, "load_checkpoint: " + where);
  if (!error.empty()) {
    s.partly_loaded = "load_checkpoint(" + where + ") failed: " + error;
    throw CheckpointError(error);
  }
  s.partly_loaded.clear();

  if (plan.training) {
    restore_counters(s, record, options, plan.mid_accumulation);
    if (s.client) s.client->restore(client_scheduler_steps, client_lrs);
    s.loaded_positions = record.data_loaders;
    s.loaded_from = where;
    for (size_t i = 0; i < s.data_loaders.size(); ++i) restore_loader(s, i);
  }
  // A restart by zero-run or torchrun (Note [Restarts] in tools/launcher/launcher.cpp) says so.
  const std::string restart = env::get("TORCHELASTIC_RESTART_COUNT", "0");
  log::info("ckpt", "loaded " + where + " (saved by " + std::to_string(m.world_size) + " rank(s) at stage " +
                        std::to_string(m.stage) + ", step " + std::to_string(record.global_steps) + ")" +
                        (restart != "0" && !restart.empty()
                             ? "; resuming at step " + std::to_string(record.global_steps) + " after restart " +
                                   restart + " of " + env::get("TORCHELASTIC_MAX_RESTARTS", "?")
                             : ""));
  return m.client_state.dump();
}

}  // namespace zero::engine
