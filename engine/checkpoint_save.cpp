// engine::save_checkpoint over ckpt/ (Note [Checkpoint layout] in
// ckpt/checkpoint.h): every rank writes the fragments of the parameters its
// partition holds, in model space, so that any world size and stage loads
// them directly; rank 0 writes the manifest once every file is complete.
// The staging folder a save writes into and its move into place:
// checkpoint_staging.h (Note [Concurrent saves]).
#include <torch/torch.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "comm/all_texts.h"
#include "core/env.h"
#include "core/fault.h"
#include "core/json_depth.h"
#include "engine/checkpoint_io.h"
#include "engine/checkpoint_rank_file.h"
#include "engine/checkpoint_staging.h"
#include "engine/memory_copies.h"
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
  const std::vector<std::string> texts = comm::all_texts(*s.pg, mine.dump());
  params.clear();
  buffers.clear();
  std::set<std::string> seen;
  for (int stage = 0; stage < s.mesh->shape().pp; ++stage) {
    const json theirs = json::parse(texts.at(static_cast<size_t>(s.mesh->rank_at({0, 0, stage}))));
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
// With `per_node` (Note [In-memory copies] in engine/memory_copies.h) each
// node's first rank does the folder work in its node's own folder, the ranks
// copy their files to the next node, and rank 0's manifest goes to every node.
void save_checkpoint(TrainingParts& s, const std::string& dir, const std::string& tag_in, const std::string& client_state,
                     const SaveOptions& options, const FolderPerNode* per_node) {
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
  const bool leader = per_node ? per_node->leader : rank == 0;  // does the folder work
  if (leader) {
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
      write_rank_file(s, staging, kinds, model, ckpt::params_record(listed.params), save_id, options.allow_non_finite,
                      per_node ? per_node->recycle(ckpt::rank_file_name(rank)) : "");
  fault::reached("save.written", rank);
  auto files = share_file_entries(pg, info, write_error);  // rank 0 learns every file's size and checksum
  if (!files.empty() && per_node) write_error = per_node->replicate(staging);  // a collective
  if (per_node && !comm::agreed_error(pg, write_error, "").empty()) files.clear();
  if (files.empty()) {
    if (leader) discard_staging(own, saving_root);
    const std::string kept = fs::exists(root / "latest") ? "; " + (root / "latest").string() + " still names the previous checkpoint" : "";
    agree(pg, write_error, "save_checkpoint: writing " + (root / tag).string() + " failed", kept);  // throws
  }
  ckpt::Manifest written;
  if (rank == 0) written = manifest(s, tag, kinds, listed, std::move(files), std::move(client), save_id);
  if (per_node) written = per_node->from_rank0(written);  // a collective
  if (leader) {
    try {
      ckpt::write_manifest(own.string(), written);
      fault::reached("save.finishing", rank);
      move_into_place(staging, root / tag, own / "replaced");
      ckpt::write_latest(dir, tag);
    } catch (const std::exception& e) {
      error = std::string("save_checkpoint: finishing ") + (root / tag).string() + ": " + e.what();
    }
    discard_staging(own, saving_root);
  }
  agree(pg, error, "save_checkpoint: finishing " + (root / tag).string());
  (per_node ? log::debug : log::info)("ckpt", "saved " + (root / tag).string() + " (" + std::to_string(pg.size()) + " file(s), this rank " +
                        std::to_string(info.bytes) + " bytes in " +
                        std::to_string(std::chrono::duration<double>(Clock::now() - start).count()) + " s)");
}

}  // namespace zero::engine
