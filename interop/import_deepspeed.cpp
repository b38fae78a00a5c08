// A DeepSpeed checkpoint written as a zero checkpoint: each DeepSpeed rank's
// partition becomes that rank's file of fragments, in model space (Note
// [Checkpoint layout]), so any world size loads it.
#include "interop/import_deepspeed.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "ckpt/checkpoint.h"
#include "core/regular_file.h"
#include "interop/deepspeed_checkpoint.h"
#include "interop/staging.h"
#include "zero/error.h"

namespace zero::interop {

using ckpt::fail;

namespace fs = std::filesystem;

namespace {


nlohmann::json engine_record(const DeepSpeedCheckpoint& ds) {
  const auto& c = ds.counters();
  // The keys engine/checkpoint_io.cpp's EngineRecord reads.
  nlohmann::json e;
  e["global_steps"] = c.global_steps;
  e["skipped_steps"] = c.skipped_steps;
  e["micro_steps"] = c.global_steps * c.gradient_accumulation_steps;  // DeepSpeed saves at a step boundary
  e["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  e["optimizer_steps"] = c.optimizer_steps;
  if (c.scheduler_steps) e["scheduler_steps"] = std::min(*c.scheduler_steps, c.global_steps - c.skipped_steps);
  if (c.lr) e["next_lr"] = *c.lr;  // DeepSpeed's param group holds the lr of the step to come
  e["mid_accumulation"] = false;
  if (ds.dtype() == "F16" && c.loss_scale) {
    e["loss_scaler"] = {{"scale", *c.loss_scale},
                        {"cur_hysteresis", c.cur_hysteresis},
                        {"last_overflow_iter", c.last_overflow_iter},
                        {"cur_iter", c.cur_iter}};
  }
  return e;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> read_name_map(const std::string& path) {
  std::string text, error;
  if (!core::read_regular_file(path, uint64_t{64} << 20, text, error)) fail("cannot read the name map: " + error);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("the name map " + path + " is not JSON: " + e.what());
  }
  if (!j.is_object()) fail("the name map " + path + " must be a JSON object {\"deepspeed name\": \"zero name\", ...}");
  std::vector<std::pair<std::string, std::string>> map;
  std::set<std::string> from, to;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string() || v.get<std::string>().empty())
      fail("the name map " + path + " maps \"" + k + "\" to " + v.dump() + ", not a name");
    if (!to.insert(v.get<std::string>()).second)
      fail("the name map " + path + " maps two names to \"" + v.get<std::string>() + "\"");
    map.emplace_back(k, v.get<std::string>());
  }
  return map;
}

ImportSummary import_deepspeed(const ImportOptions& o) {
  check_destination(o.from, o.out, "the DeepSpeed checkpoint");
  const DeepSpeedCheckpoint ds(o.from, o.tag);

  // Names: every rename must name a tensor, and no two may end up the same.
  std::set<std::string> known;
  for (const auto& p : ds.params()) known.insert(p.name);
  for (const auto& b : ds.buffers()) known.insert(b);
  for (const auto& [from, to] : o.rename)
    if (!known.count(from))
      fail("the name map renames \"" + from + "\", which " + ds.folder() + " does not hold (its first parameter is \"" +
           ds.params().front().name + "\")");
  auto renamed = [&](const std::string& name) {
    auto it = o.rename.find(name);
    return it == o.rename.end() ? name : it->second;
  };
  std::set<std::string> taken;
  for (const auto& name : known)
    if (!taken.insert(renamed(name)).second) fail("two tensors of " + ds.folder() + " would both be named \"" + renamed(name) + "\"");

  ImportSummary summary;
  summary.tag = ds.tag();
  summary.world_size = ds.world_size();
  summary.stage = ds.stage();
  summary.dtype = ds.dtype();
  summary.states = ds.state_kinds();
  summary.global_steps = ds.counters().global_steps;
  summary.buffers = static_cast<int64_t>(ds.buffers().size());

  ckpt::Manifest m;
  m.tag = ds.tag();
  m.world_size = ds.world_size();
  m.stage = ds.stage();
  m.dtype = ds.dtype();
  m.optimizer = ds.optimizer();
  m.states = ds.state_kinds();
  for (const auto& p : ds.params()) {
    m.params.push_back({renamed(p.name), p.shape, true});
    ++summary.params;
    summary.elements += p.numel;
  }
  for (const auto& b : ds.buffers()) m.buffers.push_back(renamed(b));
  m.engine = engine_record(ds);
  std::vector<std::string> skipped;
  m.client_state = ds.client_state(skipped);
  for (const auto& k : skipped)
    summary.notes.push_back("client_state key \"" + k + "\" holds more than plain data (tensors, objects): left out");

  Staging staging(o.out);
  const std::string tag_dir = ckpt::tag_dir(staging.path().string(), ds.tag());
  fs::create_directories(tag_dir);
  std::vector<std::string> kinds{"fp32"};
  kinds.insert(kinds.end(), ds.state_kinds().begin(), ds.state_kinds().end());
  for (int r = 0; r < ds.world_size(); ++r) {
    const auto pieces = ds.pieces(r);
    const auto rank = ds.open_rank(r);
    std::vector<ckpt::TensorData> tensors;
    struct Source {
      std::string kind;
      size_t piece;
    };
    std::vector<Source> sources;
    for (const auto& kind : kinds) {
      for (size_t i = 0; i < pieces.size(); ++i) {
        const DeepSpeedPiece& piece = pieces[i];
        ckpt::TensorData d;
        d.name = ckpt::fragment_name(kind, renamed(ds.params()[piece.param].name), piece.param_offset);
        d.dtype = ckpt::DType::F32;
        d.shape = {piece.length};
        d.bytes = static_cast<size_t>(piece.length) * sizeof(float);
        tensors.push_back(d);
        sources.push_back({kind, i});
      }
    }
    std::vector<std::vector<uint8_t>> buffer_bytes(r == 0 ? ds.buffers().size() : 0);
    for (size_t b = 0; b < buffer_bytes.size(); ++b) {  // zero keeps whole tensors in rank 0's file
      ckpt::TensorData d = ds.read_buffer(ds.buffers()[b], buffer_bytes[b]);
      d.name = "module/" + renamed(d.name);
      tensors.push_back(d);
    }
    std::vector<float> piece;  // one piece in memory at a time
    auto fetch = [&](size_t i) -> const void* {
      if (i >= sources.size()) return tensors[i].data;
      const DeepSpeedPiece& p = pieces[sources[i].piece];
      piece.resize(static_cast<size_t>(p.length));
      rank->read_f32(sources[i].kind, p.rank_offset, p.length, piece.data());
      return piece.data();
    };
    ckpt::FileInfo info = ckpt::write_safetensors(tag_dir + "/" + ckpt::rank_file_name(r), tensors, {}, fetch);
    info.rank = r;
    m.files.push_back(info);
  }
  ckpt::write_manifest(staging.path().string(), m);
  ckpt::write_latest(staging.path().string(), ds.tag());
  staging.commit();
  return summary;
}

}  // namespace zero::interop
