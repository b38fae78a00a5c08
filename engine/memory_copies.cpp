// Note [In-memory copies] in engine/memory_copies.h.
#include "engine/memory_copies.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt/file_io.h"
#include "comm/all_texts.h"
#include "core/env.h"
#include "engine/training_parts.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::engine {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::pair<int, int> ordered(int a, int b) { return {std::min(a, b), std::max(a, b)}; }

// A file's bytes, or an undefined tensor and `error` set.
at::Tensor read_bytes(const fs::path& path, std::string& error) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) {
    error = "cannot read " + path.string() + ": " + ec.message();
    return {};
  }
  at::Tensor bytes = torch::empty({static_cast<int64_t>(size)}, at::kByte);
  std::ifstream in(path, std::ios::binary);
  in.read(static_cast<char*>(bytes.data_ptr()), static_cast<std::streamsize>(size));
  if (!in || in.gcount() != static_cast<std::streamsize>(size)) {
    error = "cannot read " + path.string() + ": " + std::strerror(errno);
    return {};
  }
  return bytes;
}

// Writes `bytes` at `path` through ckpt's AtomicWriter, over the file
// `recycle` when it is there (its tmpfs pages reused: Note [In-memory copies]).
std::string write_bytes(const fs::path& path, const at::Tensor& bytes, const fs::path& recycle = {}) {
  try {
    ckpt::AtomicWriter out(path.string(), static_cast<uint64_t>(bytes.numel()), recycle.string());
    out.write(bytes.data_ptr(), static_cast<size_t>(bytes.numel()), nullptr);
    out.commit();
  } catch (const std::exception& e) {
    return std::string(e.what()) + " (is the memory folder's tmpfs full?)";
  }
  return "";
}

// Sends `bytes` (read on `root`) to every rank of `group`; an undefined
// tensor on the root sends nothing and returns an undefined tensor everywhere.
at::Tensor broadcast_bytes(comm::ProcessGroup& group, at::Tensor bytes, int root) {
  at::Tensor size = torch::tensor({bytes.defined() ? bytes.numel() : int64_t{-1}}, at::kLong);
  group.broadcast(size, root);
  const int64_t n = size.item<int64_t>();
  if (n < 0) return {};
  if (group.rank() != root) bytes = torch::empty({n}, at::kByte);
  if (n > 0) group.broadcast(bytes, root);
  return bytes;
}

// What one node's folder holds: every copy (a tag with a manifest) and the
// rank files of it that are whole.
json folder_record(const fs::path& folder) {
  json copies = json::array();
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string tag = entry.path().filename().string();
    if (!entry.is_directory() || tag.empty() || tag[0] == '.') continue;
    try {
      const ckpt::Manifest m = ckpt::read_manifest(folder.string(), tag);
      json present = json::array();
      for (const auto& f : m.files) {
        std::error_code size_ec;
        if (fs::file_size(entry.path() / f.name, size_ec) == f.bytes && !size_ec) present.push_back(f.rank);
      }
      copies.push_back({{"tag", tag}, {"save", m.save_id}, {"world", m.world_size},
                        {"step", m.engine.value("global_steps", int64_t{-1})}, {"present", present}});
    } catch (const std::exception&) {
      // a copy being made when the job stopped: not one to resume from
    }
  }
  return copies;
}

// The newest step saved in `dir` (-1: none; -2: one that does not read,
// which the disk's load will name).
int64_t disk_step(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / "latest")) return -1;
  try {
    return ckpt::read_manifest(dir, ckpt::read_latest(dir)).engine.value("global_steps", int64_t{-2});
  } catch (const std::exception&) {
    return -2;
  }
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

MemoryCopies::MemoryCopies(std::shared_ptr<comm::ProcessGroup> world, int64_t interval)
    : world_(std::move(world)), interval_(interval) {
  comm::ProcessGroup& pg = *world_;
  const int me = pg.rank(), nodes = pg.nodes();
  std::vector<std::vector<int>> on_node(static_cast<size_t>(nodes));
  for (int r = 0; r < pg.size(); ++r) on_node.at(static_cast<size_t>(pg.node(r))).push_back(r);
  const int node = pg.node(me);
  leader_ = on_node[static_cast<size_t>(node)].front() == me;
  const std::string given = env::get("ZERO_MEMORY_CHECKPOINTS", "");
  if (!given.empty()) {
    folder_ = given;  // zero-run's, made for this job
    readable_ = true;
  } else {
    folder_ = "/dev/shm/zero-in-memory-" + env::get("TORCHELASTIC_RUN_ID", "none") + "-" +
              env::get("MASTER_PORT", "0") + "-node" + std::to_string(node);
    readable_ = env::get("TORCHELASTIC_RESTART_COUNT", "0") != "0";
  }
  if (nodes == 1) return;
  const size_t per_node = on_node.front().size();
  for (const auto& ranks : on_node) {
    if (ranks.size() != per_node) {
      log::warn("ckpt", "checkpoint.in_memory: the nodes run different numbers of ranks, so each rank's copy stays "
                        "on its own node only (a node lost then falls back to the disk's checkpoint)");
      return;
    }
  }
  auto next_of = [&](int r) {
    const auto& mine = on_node[static_cast<size_t>(pg.node(r))];
    const size_t index = static_cast<size_t>(std::find(mine.begin(), mine.end(), r) - mine.begin());
    return on_node[static_cast<size_t>((pg.node(r) + 1) % nodes)][index];
  };
  next_ = next_of(me);
  for (int r = 0; r < pg.size(); ++r) {
    if (next_of(r) == me) previous_ = r;
    const auto pair = ordered(r, next_of(r));
    if (!pairs_.count(pair)) pairs_[pair] = pg.new_group({pair.first, pair.second});  // every rank, same order
  }
  // Neighbouring nodes send in different phases (an odd ring needs a third),
  // so in each phase a rank sends, receives or rests.
  for (int n = 0; n < nodes; ++n) color_.push_back(nodes % 2 == 1 && n == nodes - 1 ? 2 : n % 2);
}

std::string MemoryCopies::replicate(const fs::path& staging) {
  if (next_ < 0) return "";  // one node: the node's memory holds every copy already
  comm::ProcessGroup& pg = *world_;
  const int me = pg.rank();
  std::string error;
  for (int phase = 0; phase < 3; ++phase) {
    if (color_[static_cast<size_t>(pg.node(me))] == phase) {
      const auto pair = ordered(me, next_);
      std::string read_error;
      at::Tensor bytes = read_bytes(staging / ckpt::rank_file_name(me), read_error);
      if (!read_error.empty()) error = read_error;
      broadcast_bytes(*pairs_.at(pair), bytes, pair.first == me ? 0 : 1);
    } else if (color_[static_cast<size_t>(pg.node(previous_))] == phase) {
      const auto pair = ordered(previous_, me);
      at::Tensor bytes = broadcast_bytes(*pairs_.at(pair), {}, pair.first == previous_ ? 0 : 1);
      if (!bytes.defined()) {
        error = "rank " + std::to_string(previous_) + " could not send its copy";
      } else {
        const std::string name = ckpt::rank_file_name(previous_);
        const std::string write_error =
            write_bytes(staging / name, bytes, spare_.empty() ? fs::path() : fs::path(folder_) / spare_ / name);
        if (!write_error.empty()) error = write_error;
      }
    }
  }
  return error;
}

ckpt::Manifest MemoryCopies::from_rank0(const ckpt::Manifest& mine) {
  at::Tensor bytes;  // rank 0's text; the others learn its size from broadcast_bytes
  if (world_->rank() == 0) {
    const std::string text = mine.to_json().dump();
    bytes = torch::empty({static_cast<int64_t>(text.size())}, at::kByte);
    std::memcpy(bytes.data_ptr(), text.data(), text.size());
  }
  bytes = broadcast_bytes(*world_, bytes, 0);
  return ckpt::Manifest::from_json(
      json::parse(std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()))),
      "rank 0's manifest of the in-memory copy");
}

void MemoryCopies::after_step(TrainingParts& s) {
  if (interval_ <= 0 || s.steps.global_steps % interval_ != 0) return;
  const std::string tag = "global_step" + std::to_string(s.steps.global_steps);
  FolderPerNode per_node;
  per_node.leader = leader_;
  per_node.replicate = [this](const fs::path& staging) { return replicate(staging); };
  per_node.from_rank0 = [this](const ckpt::Manifest& m) { return from_rank0(m); };
  per_node.recycle = [this](const std::string& name) {
    return spare_.empty() ? std::string() : (fs::path(folder_) / spare_ / name).string();
  };
  SaveOptions options;
  options.allow_non_finite = true;  // the training's own state, as it is
  try {
    save_checkpoint(s, folder_, tag, "{}", options, &per_node);
  } catch (const CheckpointError& e) {  // every rank raises it (the save agrees on errors)
    // Once: a full tmpfs fails every copy after it the same way.
    log::warn_once("in-memory copy failed", "ckpt", "the in-memory copy of step " + std::to_string(s.steps.global_steps) +
                   " was not made (" + e.what() + "); training goes on, and a failure resumes from the previous copy "
                   "or the disk (later copies that fail are logged at debug level)");
    log::debug("ckpt", "the in-memory copy of step " + std::to_string(s.steps.global_steps) + " was not made: " + e.what());
    return;
  }
  // Every node holds the new copy now: the one before it stays as the next
  // copy's spare, older ones (and what is left of the spare) go.
  const std::string kept = newest_ == tag ? "" : newest_;
  spare_ = kept;
  newest_ = tag;
  if (!leader_) return;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder_, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && !name.empty() && name[0] != '.' && name != tag && name != kept) {
      fs::remove_all(entry.path(), ec);
    }
  }
}

void MemoryCopies::spread(const std::string& tag, const std::string& name, int holder,
                          const std::vector<bool>& lacking) {
  comm::ProcessGroup& pg = *world_;
  const fs::path path = fs::path(folder_) / tag / name;
  std::string error;
  at::Tensor bytes = pg.rank() == holder ? read_bytes(path, error) : at::Tensor();
  bytes = broadcast_bytes(pg, bytes, holder);
  if (leader_ && lacking[static_cast<size_t>(pg.node(pg.rank()))]) {
    if (!bytes.defined()) throw CheckpointError("rank " + std::to_string(holder) + " could not send " + name);
    fs::create_directories(path.parent_path());
    const std::string write_error = write_bytes(path, bytes);
    if (!write_error.empty()) throw CheckpointError(write_error);
  }
}

std::optional<std::pair<std::string, std::string>> MemoryCopies::newest(const std::string& disk_dir) {
  comm::ProcessGroup& pg = *world_;
  const int me = pg.rank();
  json mine = {{"node", pg.node(me)}, {"readable", readable_}, {"copies", json::array()}, {"disk", -1}};
  if (readable_) mine["copies"] = folder_record(folder_);
  if (me == 0) mine["disk"] = disk_step(disk_dir);
  // What each node holds (its ranks see the same folder) and the disk's newest step, on every rank.
  std::map<int, json> nodes;
  int64_t on_disk = -1;
  bool readable = true;
  for (const auto& text : comm::all_texts(pg, mine.dump())) {
    const json record = json::parse(text);
    nodes.emplace(record["node"].get<int>(), record["copies"]);
    readable = readable && record["readable"].get<bool>();
    if (record["disk"].get<int64_t>() != -1) on_disk = record["disk"].get<int64_t>();
  }
  if (!readable) return std::nullopt;

  // Each copy (tag and save): the ranks' files the nodes hold between them.
  struct Copy {
    int64_t step = -1;
    int world = 0;
    std::set<int> present;
    std::map<int, std::set<int>> by_node;  // node -> its files of it
  };
  std::map<std::pair<std::string, std::string>, Copy> copies;
  for (const auto& [node, held] : nodes) {
    for (const auto& c : held) {
      Copy& copy = copies[{c["tag"].get<std::string>(), c["save"].get<std::string>()}];
      copy.step = c["step"].get<int64_t>();
      copy.world = c["world"].get<int>();
      auto& files = copy.by_node[node];
      for (const auto& r : c["present"]) {
        copy.present.insert(r.get<int>());
        files.insert(r.get<int>());
      }
    }
  }
  const std::pair<std::string, std::string>* best = nullptr;
  int64_t best_step = -1, newest_step = -1;
  std::vector<int> lost;
  for (const auto& [key, copy] : copies) {
    const bool whole = static_cast<int>(copy.present.size()) == copy.world;
    if (copy.step > newest_step) {
      newest_step = copy.step;
      lost.clear();
      for (int r = 0; r < copy.world; ++r) {
        if (!copy.present.count(r)) lost.push_back(r);
      }
    }
    if (whole && copy.step > best_step) best = &key, best_step = copy.step;
  }
  const std::string disk_said = on_disk >= 0 ? "the newest checkpoint in " + disk_dir + " is step " + std::to_string(on_disk)
                                             : "there is no checkpoint in " + disk_dir;
  if (!lost.empty() && me == 0) {
    log::warn("ckpt", "the in-memory copy of step " + std::to_string(newest_step) + " lost the shards of rank(s) " +
                          rank_list(lost) + " with their copies (a node and the next one both lost)");
  }
  if (!best || best_step < on_disk) {
    if (best && me == 0) {
      log::info("ckpt", "the in-memory copy of step " + std::to_string(best_step) + " is older: " + disk_said);
    }
    return std::nullopt;
  }

  // Every node gets the files of the copy it lacks, from the lowest rank of a node that holds each.
  const Copy& copy = copies.at(*best);
  const std::string& tag = best->first;
  std::string error;
  int spread_files = 0;
  try {
    std::vector<std::string> names{"manifest.json"};
    for (int r = 0; r < copy.world; ++r) names.push_back(ckpt::rank_file_name(r));
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<bool> lacking(static_cast<size_t>(pg.nodes()), true);
      int holder = -1;
      for (const auto& [node, files] : copy.by_node) {
        const bool has = i == 0 || files.count(static_cast<int>(i) - 1);
        lacking[static_cast<size_t>(node)] = !has;
        if (has) {
          for (int r = 0; r < pg.size(); ++r) {
            if (pg.node(r) == node && (holder < 0 || r < holder)) holder = r;
          }
        }
      }
      if (std::none_of(lacking.begin(), lacking.end(), [](bool b) { return b; })) continue;
      spread(tag, names[i], holder, lacking);
      ++spread_files;
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  error = comm::agreed_error(pg, error, "in-memory copy of step " + std::to_string(best_step));
  if (!error.empty()) {
    if (me == 0) log::warn("ckpt", error + "; resuming from the disk instead");
    return std::nullopt;
  }
  if (me == 0) {
    log::info("ckpt", "resuming from the in-memory copy of step " + std::to_string(best_step) + " (" + disk_said +
                          (spread_files > 0 ? "; " + std::to_string(spread_files) +
                                                  " file(s) sent to the nodes that had lost them"
                                            : "") +
                          ")");
  }
  return std::make_pair(folder_, tag);
}

}  // namespace zero::engine
