// engine::save_checkpoint over ckpt/ (Note [Checkpoint layout] in
// ckpt/checkpoint.h): every rank writes the fragments of the parameters its
// partition holds, in model space, so that any world size and stage loads
// them directly; rank 0 writes the manifest once every file is complete.
// The staging folder a save writes into and its move into place:
// checkpoint_staging.h (Note [Concurrent saves]).
#include <torch/torch.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <mutex>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/fault.h"
#include "core/json_depth.h"
#include "engine/checkpoint_io.h"
#include "engine/checkpoint_staging.h"
#include "engine/training_parts.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

void agree(comm::ProcessGroup& pg, const std::string& my_error, const std::string& what, const std::string& suffix = "") {
  const std::string error = comm::agreed_error(pg, my_error, what);
  if (!error.empty()) throw CheckpointError(error + suffix);
}

// The first of n floats that is NaN or infinite (all exponent bits set), or
// -1: a pass over bytes about to be written, cheap beside the write.
int64_t first_non_finite(const float* p, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  constexpr int64_t kBlock = 4096;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    uint32_t any = 0;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, p + i, 4);
      any |= (bits & kExponent) == kExponent;
    }
    if (!any) continue;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(p[i])) return i;
    }
  }
  return -1;
}

// This rank's file: whole tensors are borrowed by the writer (`keep_` holds
// them); the fragments' bytes are fetched as the writer reaches them, one
// bucket at a time for NVMe offload and for device tensors (one host copy
// at a time). Fragments are checked for NaN and infinities as they are
// fetched (unless allowed): a failure removes the file being written, so
// nothing of the new checkpoint replaces the old one.
class RankFile {
 public:
  RankFile(TrainingParts& s, bool allow_non_finite)
      : window_(s.sharded->masters(), /*write_back=*/false),
        allow_non_finite_(allow_non_finite) {}

  void add_whole(const std::string& name, const at::Tensor& t) {
    at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
    keep_.push_back(cpu);
    tensors_.push_back({name, to_ckpt(cpu.scalar_type()), cpu.sizes().vec(), cpu.data_ptr(), cpu.nbytes()});
    sources_.emplace_back();
  }
  // The master weights ("fp32") and the states `kinds` of every bucket, as
  // fragments. The order, bucket by bucket and within a bucket kind by kind,
  // is the order a load at the same world size reads in (Note [Hashing
  // while reading] in ckpt/fragments.cpp).
  void add_fragments(TrainingParts& s, const std::vector<std::string>& kinds) {
    const auto& masters = s.sharded->masters().tensors();
    const auto fragments = s.sharded->fragments();
    std::vector<std::string> all_kinds{"fp32"};
    all_kinds.insert(all_kinds.end(), kinds.begin(), kinds.end());
    for (size_t k = 0; k < masters.size(); ++k) {
      for (const auto& kind : all_kinds) {
        const at::Tensor source = kind == "fp32" ? masters[k] : s.optimizer->state(masters[k], kind, false);
        if (source.scalar_type() != at::kFloat) throw CheckpointError("internal: fp32 master weights and optimizer states expected");
        for (const auto& f : fragments) {
          if (f.bucket != static_cast<int64_t>(k)) continue;
          const std::string& name = s.sharded->param_name(f.param);
          if (s.written_elsewhere.count(name)) continue;
          // In the full parameter's coordinates (a tensor-parallel slice
          // may be several pieces of it).
          for (const auto& piece : full_pieces(s.splits, name, f.param_offset, f.length)) {
            tensors_.push_back({ckpt::fragment_name(kind, name, piece.full_offset), ckpt::DType::F32, {piece.length},
                                nullptr, static_cast<size_t>(piece.length) * sizeof(float)});
            sources_.push_back({source, f.start + piece.offset - f.param_offset, k, kind, name, piece.full_offset});
          }
        }
      }
    }
  }
  // Rank 0's file records the parameter listing (ckpt::kParamsRecord), which
  // readers check the manifest against.
  ckpt::FileInfo write(const fs::path& path, int rank, const std::string& params_record, const std::string& save_id) {
    std::map<std::string, std::string> metadata{
        {"format", ckpt::kFormatName}, {"rank", std::to_string(rank)}, {ckpt::kSaveId, save_id}};
    if (rank == 0) metadata[ckpt::kParamsRecord] = params_record;
    ckpt::FileInfo info = ckpt::write_safetensors(path.string(), tensors_, metadata, [this](size_t i) { return fetch(i); });
    window_.finish();
    return info;
  }

 private:
  struct Source {
    at::Tensor tensor;  // undefined: tensors_[i].data
    int64_t start = 0;
    size_t bucket = 0;
    std::string kind;     // a fragment's state ("fp32": the master weights)
    std::string param;    // and parameter, for the non-finite check's error
    int64_t full_offset = 0;  // of its first element in the parameter
  };
  const void* fetch(size_t i) {
    const Source& src = sources_[i];
    if (!src.tensor.defined()) return tensors_[i].data;
    window_.enter(src.bucket);
    const float* data = nullptr;
    if (src.tensor.is_cpu()) {
      data = src.tensor.data_ptr<float>() + src.start;
    } else {
      if (staged_from_ != src.tensor.unsafeGetTensorImpl()) {
        staged_ = src.tensor.detach().to(at::kCPU).contiguous();
        staged_from_ = src.tensor.unsafeGetTensorImpl();
      }
      data = staged_.data_ptr<float>() + src.start;
    }
    if (!allow_non_finite_) check_finite(src, data, tensors_[i].shape[0]);
    return data;
  }
  static void check_finite(const Source& src, const float* data, int64_t n) {
    const int64_t bad = first_non_finite(data, n);
    if (bad < 0) return;
    const std::string what = src.kind == "fp32" ? "the master weights of parameter " + src.param + " hold "
                                                : "the optimizer state " + src.kind + " of parameter " + src.param + " holds ";
    throw CheckpointError("save_checkpoint: " + what + std::to_string(data[bad]) + " at element " +
                          std::to_string(src.full_offset + bad) +
                          " (training diverged?); a checkpoint of them would train to NaN, so none was saved. "
                          "Save an earlier state, or pass SaveOptions::allow_non_finite to keep it anyway");
  }
  NvmeWindow window_;
  std::vector<at::Tensor> keep_;
  std::vector<ckpt::TensorData> tensors_;
  std::vector<Source> sources_;
  at::Tensor staged_;  // host copy of the device tensor being written
  const c10::TensorImpl* staged_from_ = nullptr;
  bool allow_non_finite_;
};

// The states saved: those the optimizer has made (none before its first step).
std::vector<std::string> saved_kinds(TrainingParts& s) {
  std::vector<std::string> kinds;
  const auto& masters = s.sharded->masters().tensors();
  for (const auto& kind : s.optimizer->state_names()) {
    if (!masters.empty() && s.optimizer->state(masters.front(), kind, false).defined()) kinds.push_back(kind);
  }
  return kinds;
}

// Writes this rank's file; returns its size and checksum, or the error.
std::pair<ckpt::FileInfo, std::string> write_rank_file(TrainingParts& s, const fs::path& staging,
                                                       const std::vector<std::string>& kinds, const ModelTensors& model,
                                                       const std::string& params_record, const std::string& save_id,
                                                       bool allow_non_finite) {
  const int rank = s.pg->rank();
  RankFile file(s, allow_non_finite);
  // At stage 0 every rank of ZeRO's group holds everything: the first writes it.
  const bool first_of_zero_group = s.mesh->zero_group()->rank() == 0;
  if (s.sharded->owners() > 1 || first_of_zero_group) file.add_fragments(s, kinds);
  // Frozen parameters and buffers: the first rank of each pipeline stage
  // writes its stage's (rank 0 alone without a pipeline).
  if (s.mesh->coordinates().tp == 0 && first_of_zero_group) {
    for (const auto& [name, t] : model.frozen) {
      if (!s.written_elsewhere.count(name)) file.add_whole("module/" + name, t);
    }
    for (const auto& [name, t] : model.buffers) {
      if (!s.written_elsewhere.count(name)) file.add_whole("module/" + name, t);
    }
  }
  if (s.steps.micro_steps % s.gas != 0) file.add_whole("accum/grads", s.sharded->accumulated_grads());
  for (auto& [name, gen] : generators(*s.module)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    file.add_whole(name, gen.get_state());
  }
  try {
    return {file.write(staging / ckpt::rank_file_name(rank), rank, params_record, save_id), ""};
  } catch (const std::exception& e) {
    return {ckpt::FileInfo(), e.what()};
  }
}

// Every rank's file entry, on every rank; empty when any rank failed.
std::vector<ckpt::FileInfo> share_file_entries(comm::ProcessGroup& pg, const ckpt::FileInfo& info, const std::string& error) {
  at::Tensor mine = torch::tensor({error.empty() ? 1L : 0L, static_cast<int64_t>(info.bytes),
                                   static_cast<int64_t>(std::stoull(error.empty() ? info.xxh3 : "0", nullptr, 16))},
                                  at::kLong);
  at::Tensor all = torch::empty({pg.size() * 3}, at::kLong);
  pg.all_gather(all, mine);
  std::vector<ckpt::FileInfo> entries;
  for (int r = 0; r < pg.size(); ++r) {
    if (all[3 * r].item<int64_t>() == 0) return {};
    entries.push_back({ckpt::rank_file_name(r), r, static_cast<uint64_t>(all[3 * r + 1].item<int64_t>()),
                       ckpt::xxh3_hex(static_cast<uint64_t>(all[3 * r + 2].item<int64_t>()))});
  }
  return entries;
}

// The engine's record in the manifest: counters, lr and the loss scaler.
json engine_record(TrainingParts& s) {
  const StepCounters& c = s.steps;
  EngineRecord e;
  e.global_steps = c.global_steps;
  e.skipped_steps = c.skipped_steps;
  e.micro_steps = c.micro_steps;
  e.gradient_accumulation_steps = s.gas;
  e.optimizer_steps = s.optimizer->step_count();
  e.scheduler_steps = c.scheduler_steps();
  e.lr = c.lr;
  e.next_lr = s.next_lr();
  if (s.client) e.client_lrs = s.client->lrs();
  e.mid_accumulation = c.micro_steps % s.gas != 0;
  if (s.scaler) e.loss_scaler = s.scaler->state();
  for (const auto& weak : s.data_loaders) {
    if (auto loader = weak.lock()) e.data_loaders.push_back(saved_position(*loader));
  }
  return e.to_json();
}

// Pipeline stages each hold their own layers: the manifest lists the whole
// model, the stages' parameters and buffers in stage order (each name once:
// tensor-parallel ranks list the same full shapes, tied modules recur).
void list_whole_model(TrainingParts& s, std::vector<ckpt::ParamInfo>& params, std::vector<std::string>& buffers) {
  if (s.mesh->shape().pp == 1) return;
  json mine = json::object();
  mine["params"] = json::array();
  for (const auto& p : params) mine["params"].push_back({p.name, p.shape, p.trainable});
  mine["buffers"] = buffers;
  const std::string text = mine.dump();
  at::Tensor length = torch::tensor({static_cast<int64_t>(text.size())}, at::kLong);
  at::Tensor lengths = torch::empty({s.pg->size()}, at::kLong);
  s.pg->all_gather(lengths, length);
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor bytes = torch::zeros({longest}, at::kByte);
  std::memcpy(bytes.data_ptr(), text.data(), text.size());
  at::Tensor all = torch::empty({s.pg->size() * longest}, at::kByte);
  s.pg->all_gather(all, bytes);
  params.clear();
  buffers.clear();
  std::set<std::string> seen;
  for (int stage = 0; stage < s.mesh->shape().pp; ++stage) {
    const int r = s.mesh->rank_at({0, 0, stage});
    const char* begin = reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * longest;
    const json theirs = json::parse(std::string(begin, lengths[r].item<int64_t>()));
    for (const auto& p : theirs["params"]) {
      if (seen.insert(p[0].get<std::string>()).second) {
        params.push_back({p[0].get<std::string>(), p[1].get<std::vector<int64_t>>(), p[2].get<bool>()});
      }
    }
    for (const auto& b : theirs["buffers"]) {
      if (seen.insert("buffer " + b.get<std::string>()).second) buffers.push_back(b.get<std::string>());
    }
  }
}

struct Listing {
  std::vector<ckpt::ParamInfo> params;
  std::vector<std::string> buffers;
};

ckpt::Manifest manifest(TrainingParts& s, const std::string& tag, const std::vector<std::string>& kinds,
                        const Listing& listed, std::vector<ckpt::FileInfo> files, json client, const std::string& save_id) {
  ckpt::Manifest m;
  m.tag = tag;
  m.save_id = save_id;
  m.world_size = s.pg->size();
  m.tensor_parallel = s.mesh->shape().tp;
  m.pipeline_parallel = s.mesh->shape().pp;
  m.stage = s.config.zero_optimization.stage;
  m.dtype = ckpt::dtype_name(to_ckpt(s.dtype));
  m.optimizer = s.config.optimizer.type;
  m.states = kinds;
  m.params = listed.params;
  m.buffers = listed.buffers;
  m.files = std::move(files);
  m.engine = engine_record(s);
  m.client_state = std::move(client);
  return m;
}

json parse_client_state(const std::string& text) {
  if (core::json_nests_deeper_than(text))
    throw CheckpointError("save_checkpoint: client_state nests deeper than " + std::to_string(core::kMaxJsonDepth) +
                          " levels, which a load could not read back safely");
  try {
    return json::parse(text.empty() ? "{}" : text);
  } catch (const json::exception& e) {
    throw CheckpointError("save_checkpoint: client_state is not JSON text (" + std::string(e.what()) + ")");
  }
}

}  // namespace

// Files are written under <dir>/.saving/<tag>/ and the folder is renamed to
// <dir>/<tag> once complete: an interrupted save never leaves a
// half-written tag behind, and `latest` moves only after that.
void save_checkpoint(TrainingParts& s, const std::string& dir, const std::string& tag_in, const std::string& client_state,
                     const SaveOptions& options) {
  const std::string tag = tag_in.empty() ? "global_step" + std::to_string(s.steps.global_steps) : tag_in;
  ckpt::check_tag(tag, "save_checkpoint(" + dir + ")");
  json client = parse_client_state(client_state);
  comm::ProcessGroup& pg = *s.pg;
  const int rank = pg.rank();
  const auto start = Clock::now();
  const fs::path root(dir), saving_root = root / ".saving";
  const std::string save_id = staging_id(pg);  // names this save's folder, its files and its manifest
  const fs::path own = saving_root / save_id, staging = own / tag;  // Note [Concurrent saves]
  std::string error;
  SavingLock lock;
  if (rank == 0) {
    try {
      fs::create_directories(root);
      if (lock.acquire(root)) {
        // What killed saves left, their folders and their `latest` staging
        // files: no other save is in progress.
        fs::remove_all(saving_root);
        for (const auto& entry : fs::directory_iterator(root)) {
          if (ckpt::is_staging_name_for(entry.path().filename().string(), "latest")) fs::remove(entry.path());
        }
        lock.share();
      }
      std::error_code ec;
      for (int attempt = 1; attempt <= 3; ++attempt) {  // another save may remove an empty .saving meanwhile
        ec.clear();
        fs::create_directories(staging, ec);
        if (!ec) break;
      }
      if (ec) error = "save_checkpoint: cannot create " + staging.string() + ": " + ec.message();
    } catch (const std::exception& e) {
      error = "save_checkpoint: cannot create " + staging.string() + ": " + e.what();
    }
  }
  agree(pg, error, "save_checkpoint: preparing " + staging.string());

  const std::vector<std::string> kinds = saved_kinds(s);
  const ModelTensors model = describe(*s.module, s.splits);
  Listing listed{model.params, {}};
  for (const auto& [name, t] : model.buffers) listed.buffers.push_back(name);
  list_whole_model(s, listed.params, listed.buffers);  // a collective with pipeline stages
  auto [info, write_error] =
      write_rank_file(s, staging, kinds, model, ckpt::params_record(listed.params), save_id, options.allow_non_finite);
  fault::reached("save.written", rank);
  auto files = share_file_entries(pg, info, write_error);  // rank 0 learns every file's size and checksum
  if (files.empty()) {
    if (rank == 0) discard_staging(own, saving_root);
    const std::string kept = fs::exists(root / "latest") ? "; " + (root / "latest").string() + " still names the previous checkpoint" : "";
    agree(pg, write_error, "save_checkpoint: writing " + (root / tag).string() + " failed", kept);  // throws
  }
  if (rank == 0) {
    try {
      ckpt::write_manifest(own.string(), manifest(s, tag, kinds, listed, std::move(files), std::move(client), save_id));
      fault::reached("save.finishing", rank);
      move_into_place(staging, root / tag, own / "replaced");
      ckpt::write_latest(dir, tag);
    } catch (const std::exception& e) {
      error = std::string("save_checkpoint: finishing ") + (root / tag).string() + ": " + e.what();
    }
    discard_staging(own, saving_root);
  }
  agree(pg, error, "save_checkpoint: finishing " + (root / tag).string());
  log::info("ckpt", "saved " + (root / tag).string() + " (" + std::to_string(pg.size()) + " file(s), this rank " +
                        std::to_string(info.bytes) + " bytes in " +
                        std::to_string(std::chrono::duration<double>(Clock::now() - start).count()) + " s)");
}

}  // namespace zero::engine
