// Engine::save_checkpoint / load_checkpoint over ckpt/ (Note [Checkpoint
// layout] in ckpt/checkpoint.h): every rank writes the fragments of the
// parameters its partition holds, in model space, so that any world size
// and stage loads them directly.
#include <fcntl.h>  // renameat2

#include <torch/torch.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "core/env.h"
#include "engine/engine_impl.h"
#include "engine/optimizer.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ckpt::DType to_ckpt(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ckpt::DType::F32;
    case at::kHalf: return ckpt::DType::F16;
    case at::kBFloat16: return ckpt::DType::BF16;
    case at::kDouble: return ckpt::DType::F64;
    case at::kLong: return ckpt::DType::I64;
    case at::kInt: return ckpt::DType::I32;
    case at::kByte: return ckpt::DType::U8;
    case at::kBool: return ckpt::DType::BOOL;
    default: throw CheckpointError(std::string("cannot store tensors of dtype ") + c10::toString(t));
  }
}

at::ScalarType from_ckpt(ckpt::DType d) {
  switch (d) {
    case ckpt::DType::F32: return at::kFloat;
    case ckpt::DType::F16: return at::kHalf;
    case ckpt::DType::BF16: return at::kBFloat16;
    case ckpt::DType::F64: return at::kDouble;
    case ckpt::DType::I64: return at::kLong;
    case ckpt::DType::I32: return at::kInt;
    case ckpt::DType::U8: return at::kByte;
    case ckpt::DType::BOOL: return at::kBool;
  }
  return at::kFloat;
}

std::string fragment_name(const std::string& kind, const std::string& param, int64_t offset) {
  return kind + "/" + param + "/" + std::to_string(offset);
}

// The model's named tensors as a checkpoint describes them: every parameter
// once (a tied one under its first name), and the buffers.
struct ModelTensors {
  std::vector<ckpt::ParamInfo> params;
  std::vector<std::pair<std::string, at::Tensor>> frozen, buffers;
};

ModelTensors describe(torch::nn::Module& module) {
  ModelTensors out;
  std::set<const void*> seen;
  for (const auto& item : module.named_parameters()) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    out.params.push_back({item.key(), p.sizes().vec(), p.requires_grad()});
    if (!p.requires_grad()) out.frozen.emplace_back(item.key(), p);
  }
  for (const auto& item : module.named_buffers()) out.buffers.emplace_back(item.key(), item.value());
  return out;
}

void check_tag(const std::string& tag) {
  if (tag.empty() || tag == "latest" || tag[0] == '.' || tag.find('/') != std::string::npos) {
    throw CheckpointError("checkpoint tag \"" + tag + "\" is not usable as a folder name; use e.g. \"global_step100\"");
  }
}

// Every rank says how its part went: its error message, empty when it went
// well (the first kMessage bytes). Returns rank -> message for the failed ranks.
constexpr int64_t kMessage = 2048;
std::map<int, std::string> failures(comm::ProcessGroup& pg, const std::string& my_error) {
  at::Tensor mine = torch::zeros({kMessage}, at::kByte);
  std::memcpy(mine.data_ptr(), my_error.data(), std::min<size_t>(my_error.size(), kMessage - 1));
  at::Tensor all = torch::empty({pg.size() * kMessage}, at::kByte);
  pg.all_gather(all, mine);
  std::map<int, std::string> failed;
  for (int r = 0; r < pg.size(); ++r) {
    const char* text = reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * kMessage);
    if (text[0] != 0) failed[r] = std::string(text, strnlen(text, kMessage));
  }
  return failed;
}

// Throws on every rank when any rank failed, with every failed rank's message.
void agree(comm::ProcessGroup& pg, const std::string& my_error, const std::string& what, const std::string& suffix = "") {
  const auto failed = failures(pg, my_error);
  if (failed.empty()) return;
  if (failed.size() == 1 && failed.count(pg.rank())) throw CheckpointError(my_error + suffix);
  std::string message = what + ":";
  for (const auto& [rank, text] : failed) message += "\n  rank " + std::to_string(rank) + ": " + text;
  throw CheckpointError(message + suffix);
}

// Test hook: ZERO_CKPT_FAULT=kill-after-write:<rank> kills that rank once its
// file is written, before the checkpoint is complete (an interrupted save).
void maybe_inject_fault(int rank) {
  const std::string fault = env::ckpt_fault();
  if (fault == "kill-after-write:" + std::to_string(rank)) std::raise(SIGKILL);
}



// The complete checkpoint in `staging` becomes `final_dir`. A tag saved again
// is swapped with the old one in one step (renameat2 RENAME_EXCHANGE), so a
// crash leaves the old or the new checkpoint under the tag, never neither;
// where the file system cannot swap, two renames (the old one parked at
// `replaced` in between).
void move_into_place(const fs::path& staging, const fs::path& final_dir, const fs::path& replaced) {
  std::error_code ignored;
  if (!fs::exists(final_dir)) {
    fs::rename(staging, final_dir);
    return;
  }
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(staging, ignored);  // the old checkpoint now
    return;
  }
  fs::remove_all(replaced, ignored);
  fs::rename(final_dir, replaced);
  fs::rename(staging, final_dir);
  fs::remove_all(replaced, ignored);
}

// The random generators a rank saves, as "rng/<device type>": the CPU's,
// and its accelerator's when the module trains on one (dropout there).
std::vector<std::pair<std::string, at::Generator>> generators(torch::nn::Module& module) {
  std::vector<at::Device> devices{at::Device(at::kCPU)};
  for (const auto& p : module.parameters()) {
    if (!p.device().is_cpu()) {
      devices.push_back(p.device());
      break;
    }
  }
  std::vector<std::pair<std::string, at::Generator>> out;
  for (const auto& d : devices) {
    out.emplace_back("rng/" + c10::DeviceTypeName(d.type(), /*lower_case=*/true), at::globalContext().defaultGenerator(d));
  }
  return out;
}

// NVMe offload (ZeRO-Infinity): a checkpoint brings the master weights and
// optimizer states in one bucket at a time, reading the next bucket
// meanwhile, and lets each go once used, so that it needs the host memory
// of two buckets rather than of the rank's whole partition. A save lets
// them go as they are (their files are current); a load writes them back.
class NvmeWindow {
 public:
  NvmeWindow(offload::SwappedTensors* store, std::vector<std::vector<int>> ids, bool write_back)
      : store_(store), ids_(std::move(ids)), write_back_(write_back) {}
  ~NvmeWindow() {
    try {
      finish();
    } catch (const std::exception& e) {  // an error of the caller's is already on its way
      log::warn("ckpt", std::string("NVMe offload after a failed checkpoint: ") + e.what());
    }
  }
  // Bucket k resident (the one before let go, the one after being read).
  void enter(size_t k) {
    if (!store_ || current_ == static_cast<int64_t>(k)) return;
    if (current_ >= 0) leave(static_cast<size_t>(current_));
    current_ = static_cast<int64_t>(k);
    if (k + 1 < ids_.size()) store_->swap_in(ids_[k + 1]);
    try {
      store_->wait_in(ids_[k]);
    } catch (...) {
      store_->materialize(ids_[k]);  // memory for the collectives that follow; the error is reported
      throw;
    }
  }
  // Nothing resident or in flight any more.
  void finish() {
    if (!store_) return;
    current_ = -1;
    if (write_back_) {
      store_->swap_out_all();
    } else {
      for (const auto& ids : ids_) store_->drop(ids);
    }
  }

 private:
  void leave(size_t k) {
    if (!write_back_) {
      store_->drop(ids_[k]);
      return;
    }
    store_->swap_out(ids_[k]);
    if (k > 0) store_->wait_out(ids_[k - 1]);
  }
  offload::SwappedTensors* store_;
  std::vector<std::vector<int>> ids_;  // per bucket: its master weights and states
  bool write_back_;
  int64_t current_ = -1;
};

// The NVMe store's ids of each bucket's master weights and optimizer states.
std::vector<std::vector<int>> nvme_ids(const offload::SwappedTensors* store, engine::MasterOptimizer& optimizer,
                                       const std::vector<at::Tensor>& masters) {
  std::vector<std::vector<int>> ids;
  if (!store) return ids;
  for (const auto& master : masters) {
    ids.emplace_back();
    std::vector<at::Tensor> tensors{master};
    for (const auto& name : optimizer.state_names()) tensors.push_back(optimizer.state(master, name, false));
    for (const auto& t : tensors) {
      const int id = t.defined() ? store->find(t) : -1;
      if (id >= 0) ids.back().push_back(id);
    }
  }
  return ids;
}

}  // namespace

void Engine::save_checkpoint(const std::string& dir, const std::string& tag_in, const std::string& client_state) {
  Impl& s = *impl_;
  const std::string tag = tag_in.empty() ? "global_step" + std::to_string(s.global_steps) : tag_in;
  check_tag(tag);
  json client;
  try {
    client = json::parse(client_state.empty() ? "{}" : client_state);
  } catch (const json::exception& e) {
    throw CheckpointError("save_checkpoint: client_state is not JSON text (" + std::string(e.what()) + ")");
  }
  comm::ProcessGroup& pg = *s.pg;
  const int rank = pg.rank();
  const auto start = Clock::now();
  // Files are written under <dir>/.saving/<tag>/ and the folder is renamed
  // to <dir>/<tag> once complete: an interrupted save never leaves a
  // half-written tag behind, and `latest` moves only after that.
  const fs::path root(dir), saving_root = root / ".saving", staging = saving_root / tag;
  std::string error;
  if (rank == 0) {
    try {
      fs::create_directories(root);
      fs::remove_all(staging);
      fs::create_directories(staging);
    } catch (const std::exception& e) {
      error = "save_checkpoint: cannot create " + staging.string() + ": " + e.what();
    }
  }
  agree(pg, error, "save_checkpoint: preparing " + staging.string());

  // This rank's tensors. Whole tensors are borrowed by the writer (`keep`
  // holds them); the fragments' bytes are fetched as the writer reaches
  // them (Source), one bucket at a time for NVMe offload and for device
  // tensors (one host copy at a time).
  std::vector<at::Tensor> keep;
  std::vector<ckpt::TensorData> tensors;
  struct Source {
    at::Tensor tensor;  // undefined: tensors[i].data
    int64_t start = 0;
    size_t bucket = 0;
  };
  std::vector<Source> sources;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
    keep.push_back(cpu);
    tensors.push_back({name, to_ckpt(cpu.scalar_type()), cpu.sizes().vec(), cpu.data_ptr(), cpu.nbytes()});
    sources.emplace_back();
  };
  const auto& masters = s.sharded->master_tensors();
  std::vector<std::string> kinds;
  for (const auto& kind : s.optimizer->state_names()) {
    if (!masters.empty() && s.optimizer->state(masters.front(), kind, false).defined()) {
      kinds.push_back(kind);
    }
  }
  // At stage 0 every rank holds everything: rank 0 writes it. The order,
  // bucket by bucket and within a bucket kind by kind, is the order a load
  // at the same world size reads in (Note [Hashing while reading]).
  if (s.sharded->owners() > 1 || rank == 0) {
    const auto fragments = s.sharded->fragments();
    std::vector<std::string> all_kinds{"fp32"};
    all_kinds.insert(all_kinds.end(), kinds.begin(), kinds.end());
    for (size_t k = 0; k < masters.size(); ++k) {
      for (const auto& kind : all_kinds) {
        const at::Tensor source = kind == "fp32" ? masters[k]
                                                 : s.optimizer->state(masters[k], kind, false);
        if (source.scalar_type() != at::kFloat) throw CheckpointError("internal: fp32 master weights and optimizer states expected");
        for (const auto& f : fragments) {
          if (f.bucket != static_cast<int64_t>(k)) continue;
          tensors.push_back({fragment_name(kind, s.sharded->param_name(f.param), f.param_offset), ckpt::DType::F32,
                             {f.length}, nullptr, static_cast<size_t>(f.length) * sizeof(float)});
          sources.push_back({source, f.start, k});
        }
      }
    }
  }
  NvmeWindow window(s.nvme.get(), nvme_ids(s.nvme.get(), *s.optimizer, masters), false);
  at::Tensor staged;  // host copy of the device tensor being written
  const c10::TensorImpl* staged_from = nullptr;
  auto fetch = [&](size_t i) -> const void* {
    const Source& src = sources[i];
    if (!src.tensor.defined()) return tensors[i].data;
    window.enter(src.bucket);
    if (src.tensor.is_cpu()) return src.tensor.data_ptr<float>() + src.start;
    if (staged_from != src.tensor.unsafeGetTensorImpl()) {
      staged = src.tensor.detach().to(at::kCPU).contiguous();
      staged_from = src.tensor.unsafeGetTensorImpl();
    }
    return staged.data_ptr<float>() + src.start;
  };
  const ModelTensors model = describe(*s.module);
  if (rank == 0) {
    for (const auto& [name, t] : model.frozen) add("module/" + name, t);
    for (const auto& [name, t] : model.buffers) add("module/" + name, t);
  }
  const bool mid_accumulation = s.micro_steps % s.gas != 0;
  if (mid_accumulation) add("accum/grads", s.sharded->accumulated_grads());
  for (auto& [name, gen] : generators(*s.module)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    add(name, gen.get_state());
  }

  ckpt::FileInfo info;
  try {
    info = ckpt::write_safetensors((staging / ckpt::rank_file_name(rank)).string(), tensors,
                                   {{"format", ckpt::kFormatName}, {"rank", std::to_string(rank)}}, fetch);
    window.finish();
  } catch (const std::exception& e) {
    error = e.what();
  }
  maybe_inject_fault(rank);

  // Rank 0 learns every file's size and checksum.
  at::Tensor mine = torch::tensor({error.empty() ? 1L : 0L, static_cast<int64_t>(info.bytes),
                                   static_cast<int64_t>(std::stoull(error.empty() ? info.xxh3 : "0", nullptr, 16))},
                                  at::kLong);
  at::Tensor all = torch::empty({pg.size() * 3}, at::kLong);
  pg.all_gather(all, mine);
  bool any_failed = false;
  for (int r = 0; r < pg.size(); ++r) any_failed = any_failed || all[3 * r].item<int64_t>() == 0;
  if (any_failed) {
    if (rank == 0) {
      std::error_code ignored;
      fs::remove_all(staging, ignored);
    }
    const std::string kept = fs::exists(root / "latest") ? "; " + (root / "latest").string() + " still names the previous checkpoint" : "";
    agree(pg, error, "save_checkpoint: writing " + (root / tag).string() + " failed", kept);  // throws
  }

  if (rank == 0) {
    try {
      ckpt::Manifest m;
      m.tag = tag;
      m.world_size = pg.size();
      m.stage = s.config.zero_optimization.stage;
      m.dtype = ckpt::dtype_name(to_ckpt(s.dtype));
      m.optimizer = s.config.optimizer.type;
      m.states = kinds;
      m.params = model.params;
      for (const auto& [name, t] : model.buffers) m.buffers.push_back(name);
      for (int r = 0; r < pg.size(); ++r) {
        m.files.push_back({ckpt::rank_file_name(r), r, static_cast<uint64_t>(all[3 * r + 1].item<int64_t>()),
                           ckpt::xxh3_hex(static_cast<uint64_t>(all[3 * r + 2].item<int64_t>()))});
      }
      json e;
      e["global_steps"] = s.global_steps;
      e["skipped_steps"] = s.skipped_steps;
      e["micro_steps"] = s.micro_steps;
      e["gradient_accumulation_steps"] = s.gas;
      e["optimizer_steps"] = s.optimizer->step_count();
      e["scheduler_steps"] = s.global_steps - s.skipped_steps - s.schedule_start;
      e["lr"] = s.lr;
      e["mid_accumulation"] = mid_accumulation;
      if (s.scaler) {
        const LossScalerState st = s.scaler->state();
        e["loss_scaler"] = {{"scale", st.scale},
                            {"cur_hysteresis", st.cur_hysteresis},
                            {"last_overflow_iter", st.last_overflow_iter},
                            {"cur_iter", st.cur_iter}};
      }
      m.engine = e;
      m.client_state = client;
      ckpt::write_manifest(saving_root.string(), m);
      move_into_place(staging, root / tag, saving_root / (tag + ".replaced"));
      ckpt::write_latest(dir, tag);
    } catch (const std::exception& e) {
      error = std::string("save_checkpoint: finishing ") + (root / tag).string() + ": " + e.what();
    }
  }
  agree(pg, error, "save_checkpoint: finishing " + (root / tag).string());
  log::info("ckpt", "saved " + (root / tag).string() + " (" + std::to_string(pg.size()) + " file(s), this rank " +
                        std::to_string(info.bytes) + " bytes in " +
                        std::to_string(std::chrono::duration<double>(Clock::now() - start).count()) + " s)");
}

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag_in, const LoadOptions& options) {
  Impl& s = *impl_;
  comm::ProcessGroup& pg = *s.pg;
  const std::string tag = tag_in.empty() ? ckpt::read_latest(dir) : tag_in;
  const ckpt::Manifest m = ckpt::read_manifest(dir, tag);
  const std::string where = (fs::path(dir) / tag).string();

  // The model must match the checkpoint by names and shapes.
  const ModelTensors model = describe(*s.module);
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
    if (!current.count(p.name)) unexpected.push_back(p.name);
  }
  std::set<std::string> saved_buffers(m.buffers.begin(), m.buffers.end());
  for (const auto& [name, t] : model.buffers) {
    if (!saved_buffers.count(name)) missing.push_back(name + " (buffer)");
  }
  if (!missing.empty() || !unexpected.empty() || !reshaped.empty()) {
    auto list = [](const std::vector<std::string>& v) {
      std::string out;
      for (size_t i = 0; i < v.size() && i < 20; ++i) out += "\n  " + v[i];
      if (v.size() > 20) out += "\n  ... and " + std::to_string(v.size() - 20) + " more";
      return out;
    };
    std::string msg = "load_checkpoint: " + where + " does not match the model:";
    if (!missing.empty()) msg += "\nin the model, not in the checkpoint:" + list(missing);
    if (!unexpected.empty()) msg += "\nin the checkpoint, not in the model:" + list(unexpected);
    if (!reshaped.empty()) msg += "\nshapes differ:" + list(reshaped);
    throw CheckpointError(msg);
  }
  const bool restore_training = !options.load_module_only;
  const bool restore_states = restore_training && options.load_optimizer_states;
  const bool mid_accumulation = restore_training && m.engine.value("mid_accumulation", false);
  if (restore_states && !m.states.empty()) {
    for (const auto& kind : s.optimizer->state_names()) {
      if (std::find(m.states.begin(), m.states.end(), kind) == m.states.end()) {
        throw CheckpointError("load_checkpoint: " + where + " holds the state of optimizer " + m.optimizer +
                              " without \"" + kind + "\", which " + s.config.optimizer.type +
                              " needs; load with load_optimizer_states = false to start the optimizer afresh");
      }
    }
  }
  if (mid_accumulation && (m.world_size != pg.size() || m.stage != s.config.zero_optimization.stage ||
                           m.engine.value("gradient_accumulation_steps", int64_t{1}) != s.gas)) {
    throw CheckpointError("load_checkpoint: " + where + " was saved in the middle of a gradient accumulation (micro step " +
                          std::to_string(m.engine.value("micro_steps", int64_t{0})) + "), whose partial gradients resume only at "
                          "world size " + std::to_string(m.world_size) + ", stage " + std::to_string(m.stage) +
                          " and the same gradient_accumulation_steps; save at an accumulation boundary to change them");
  }

  // Every rank issues the same collectives (the bucket all-gathers) whatever
  // fails on it; the failures are agreed on at the end.
  std::string error;
  auto attempt = [&](const auto& part) {
    if (!error.empty()) return;
    try {
      part();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  std::unique_ptr<ckpt::FragmentReader> reader;
  attempt([&] {
    reader = std::make_unique<ckpt::FragmentReader>(dir, m);
    std::vector<int> mine;  // each file is hashed by one rank: file f by rank f % world size
    for (int f = pg.rank(); f < m.world_size; f += pg.size()) mine.push_back(f);
    reader->verify_only(mine);
  });
  std::unordered_map<std::string, bool> trainable_then;
  for (const auto& p : m.params) trainable_then[p.name] = p.trainable;
  std::vector<uint8_t> storage;
  // Elements of a parameter as fp32: from master fragments, or from the
  // whole tensor when it was frozen then.
  auto read_param = [&](const std::string& name, int64_t offset, int64_t length, float* dst) {
    if (trainable_then[name]) {
      reader->read_f32("fp32", name, offset, length, dst);
      return;
    }
    ckpt::TensorData t = reader->read_whole(0, "module/" + name, storage);
    at::Tensor whole = torch::from_blob(const_cast<void*>(t.data), {static_cast<int64_t>(t.bytes / ckpt::dtype_size(t.dtype))},
                                        from_ckpt(t.dtype))
                           .to(at::kFloat);
    std::memcpy(dst, whole.data_ptr<float>() + offset, length * sizeof(float));
  };

  // Master weights (and optimizer states) of this rank's partition, bucket
  // by bucket; each bucket's parameters are published (all-gathered) while
  // the next one is read.
  const auto& masters = s.sharded->master_tensors();
  const auto fragments = s.sharded->fragments();
  std::vector<std::string> all_kinds{"fp32"};
  if (restore_states) all_kinds.insert(all_kinds.end(), m.states.begin(), m.states.end());
  NvmeWindow window(s.nvme.get(), nvme_ids(s.nvme.get(), *s.optimizer, masters), true);
  for (size_t k = 0; k < masters.size(); ++k) {
    std::vector<at::Tensor> staged;  // host copies being hashed (see verify_only)
    try {
      window.enter(k);  // NVMe offload: the bucket comes back (and goes back to disk below)
    } catch (const std::exception& e) {
      if (error.empty()) error = e.what();
    }
    attempt([&] {
      for (const auto& kind : all_kinds) {
        at::Tensor target = kind == "fp32" ? masters[k]
                                           : s.optimizer->state(masters[k], kind, true);
        if (!target.defined()) continue;
        // Host tensors are read into directly; others through a host copy
        // (which keeps the padding as it is).
        const bool direct = target.is_cpu() && target.is_contiguous();
        at::Tensor cpu = direct ? target : target.to(at::kCPU).contiguous();
        if (!direct) staged.push_back(cpu);
        for (const auto& f : fragments) {
          if (f.bucket != static_cast<int64_t>(k)) continue;
          const std::string& name = s.sharded->param_name(f.param);
          float* dst = cpu.data_ptr<float>() + f.start;
          if (kind == "fp32") {
            read_param(name, f.param_offset, f.length, dst);
          } else if (trainable_then[name]) {
            reader->read_f32(kind, name, f.param_offset, f.length, dst);
          } else {
            std::fill(dst, dst + f.length, 0.0f);  // frozen then: no state yet
          }
        }
        if (!direct) {
          torch::NoGradGuard no_grad;
          target.copy_(cpu);
        }
      }
    });
    s.sharded->publish_bucket(k);  // the loaded master weights become the parameters
    if (reader && (!staged.empty() || s.nvme)) reader->wait_for_hashes();  // they read the memory about to go
  }
  // Checked while the last buckets are gathered, before anything else is
  // taken from the files.
  attempt([&] { reader->finish_verification(); });
  s.sharded->publish();  // waits for the buckets published above

  attempt([&] {
    if (restore_states && !m.states.empty()) {
      s.optimizer->set_step_count(m.engine.value("optimizer_steps", int64_t{0}));
    }
    // Frozen parameters and buffers, in the dtype the model holds them.
    torch::NoGradGuard no_grad;
    for (const auto& [name, t] : model.frozen) {
      at::Tensor values = torch::empty({t.numel()}, at::kFloat);
      read_param(name, 0, t.numel(), values.data_ptr<float>());
      t.copy_(values.view(t.sizes()));
    }
    for (const auto& [name, t] : model.buffers) {
      ckpt::TensorData d = reader->read_whole(0, "module/" + name, storage);
      at::Tensor values = torch::from_blob(const_cast<void*>(d.data), d.shape, from_ckpt(d.dtype));
      t.copy_(values.view(t.sizes()));
    }
    if (restore_training) {
      if (mid_accumulation) {
        ckpt::TensorData d = reader->read_whole(pg.rank(), "accum/grads", storage);
        s.sharded->restore_accumulated_grads(torch::from_blob(const_cast<void*>(d.data), d.shape, from_ckpt(d.dtype)));
      } else {
        s.sharded->zero_grads();
      }
      // Each generator this rank saved (a checkpoint from CPU ranks leaves a GPU's as it is).
      for (auto& [name, gen] : generators(*s.module)) {
        if (pg.rank() >= m.world_size || !reader->has(pg.rank(), name)) continue;
        ckpt::TensorData d = reader->read_whole(pg.rank(), name, storage);
        at::Tensor state = torch::from_blob(const_cast<void*>(d.data), d.shape, at::kByte).clone();
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(state);
      }
    }
  });
  if (reader) reader->wait_for_hashes();  // they read the targets
  attempt([&] { window.finish(); });
  agree(pg, error, "load_checkpoint: " + where);

  if (restore_training) {
    const json& e = m.engine;
    s.global_steps = e.value("global_steps", int64_t{0});
    s.skipped_steps = e.value("skipped_steps", int64_t{0});
    s.micro_steps = e.value("micro_steps", int64_t{0});
    if (!mid_accumulation) s.micro_steps -= s.micro_steps % s.gas;
    const int64_t taken = s.global_steps - s.skipped_steps;
    s.schedule_start = options.load_lr_scheduler_states ? taken - e.value("scheduler_steps", taken) : taken;
    s.lr = options.load_lr_scheduler_states ? e.value("lr", s.lr) : s.schedule->lr_at(0);
    if (s.scaler && e.contains("loss_scaler")) {
      const json& l = e["loss_scaler"];
      s.scaler->set_state({l.value("scale", 1.0), l.value("cur_hysteresis", int64_t{1}),
                           l.value("last_overflow_iter", int64_t{-1}), l.value("cur_iter", int64_t{0})});
    }
  }
  log::info("ckpt", "loaded " + where + " (saved by " + std::to_string(m.world_size) + " rank(s) at stage " +
                        std::to_string(m.stage) + ", step " + std::to_string(m.engine.value("global_steps", int64_t{0})) + ")");
  return m.client_state.dump();
}

}  // namespace zero
