// A zero checkpoint written as DeepSpeed's folder: the layout of Note
// [DeepSpeed layout], for the ds_config and world size DeepSpeed resumes
// with. What DeepSpeed 0.19 reads back: stages 1-2 take each rank's
// "single_partition_of_fp32_groups" and "base_optimizer_state" (a torch
// optimizer state dict: the group's hyperparameters replace DeepSpeed's
// own, so they are written from the ds_config with DeepSpeed's defaults);
// stage 3 also requires "loss_scaler", "dynamic_loss_scale" and "overflow";
// the model states give "module" (strictly: every parameter and buffer;
// stage 3's partitioned parameters as empty tensors), the counters and the
// scheduler's "last_batch_iteration".
// One concept over 400 lines: one DeepSpeed folder written, whose files
// must agree on one layout.
#include "interop/export_deepspeed.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "core/regular_file.h"
#include "interop/deepspeed_checkpoint.h"
#include "interop/staging.h"
#include "torchsave/pickle_writer.h"
#include "zero/error.h"

namespace zero::interop {

using ckpt::fail;

namespace fs = std::filesystem;
using nlohmann::json;
using torchsave::Py;
using torchsave::StorageBytes;

namespace {


// The DeepSpeed version whose layout this writes (its loader checks the
// checkpoint's version against its own stage-1 changes of 0.3.17).
constexpr const char* kDeepSpeedVersion = "0.19.8";

json read_config(const std::string& path) {
  std::string text, error;
  if (!core::read_regular_file(path, uint64_t{64} << 20, text, error)) fail("cannot read the ds_config: " + error);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("the ds_config " + path + " is not JSON: " + e.what());
  }
  if (!j.is_object()) fail("the ds_config " + path + " is not a JSON object");
  return j;
}

double number(const json& j, const char* key, double fallback, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  if (!j[key].is_number()) fail(where + ": \"" + key + "\" is " + j[key].dump() + ", not a number");
  return j[key].get<double>();
}

bool enabled(const json& config, const char* section) {
  auto it = config.find(section);
  return it != config.end() && it->is_object() && it->value("enabled", false) == true;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// What DeepSpeed's config decides about the layout and the optimizer.
struct Target {
  int stage = 0, world = 0;
  ckpt::DType dtype = ckpt::DType::F32;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0, clip = 0.0;
  int64_t sub_group_size = 1000000000;  // stage 3's sub_group_size
  int64_t batch = 0;                    // train_batch_size: global samples per step
  bool scheduler = false;
  json config;
};

Target target_of(const std::string& path, int world) {
  Target t;
  t.config = read_config(path);
  const json& c = t.config;
  const std::string where = "the ds_config " + path;
  const json zero = c.value("zero_optimization", json::object());
  t.stage = zero.is_object() && zero.contains("stage") && zero["stage"].is_number_integer() ? zero["stage"].get<int>() : 0;
  if (t.stage < 1 || t.stage > 3)
    fail(where + " has zero_optimization.stage " + std::to_string(t.stage) + "; export writes ZeRO stages 1, 2 and 3");
  if (enabled(c, "fp16"))
    fail(where + " enables fp16: export does not write fp16's dynamic loss scaler yet; export for a bf16 or fp32 run");
  t.dtype = enabled(c, "bf16") ? ckpt::DType::BF16 : ckpt::DType::F32;
  const json optimizer = c.value("optimizer", json::object());
  const std::string type = optimizer.is_object() ? optimizer.value("type", std::string()) : std::string();
  if (lower(type) != "adam" && lower(type) != "adamw")
    fail(where + " has optimizer type \"" + type + "\"; export writes the states of Adam and AdamW");
  const json params = optimizer.value("params", json::object());
  const std::string pw = where + ": optimizer.params";
  t.lr = number(params, "lr", t.lr, pw);
  if (params.contains("betas")) {
    const json& b = params["betas"];
    if (!b.is_array() || b.size() != 2 || !b[0].is_number() || !b[1].is_number()) fail(pw + ": \"betas\" is not two numbers");
    t.beta1 = b[0].get<double>();
    t.beta2 = b[1].get<double>();
  }
  t.eps = number(params, "eps", t.eps, pw);
  t.weight_decay = number(params, "weight_decay", t.weight_decay, pw);
  t.clip = number(c, "gradient_clipping", 0.0, where);
  t.sub_group_size = static_cast<int64_t>(number(zero, "sub_group_size", 1e9, where + ": zero_optimization"));
  if (t.sub_group_size < 1) fail(where + ": zero_optimization.sub_group_size must be at least 1");
  t.world = world;
  const int64_t micro = static_cast<int64_t>(number(c, "train_micro_batch_size_per_gpu", 1, where));
  const int64_t gas = static_cast<int64_t>(number(c, "gradient_accumulation_steps", 1, where));
  t.batch = static_cast<int64_t>(number(c, "train_batch_size", static_cast<double>(micro * gas * world), where));
  t.scheduler = c.contains("scheduler") && c["scheduler"].is_object();
  return t;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Param {
  std::string zero_name, ds_name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

// A stretch of a parameter in a rank's flat (as in DeepSpeedPiece).
struct Stretch {
  size_t param;
  int64_t param_offset, length, flat_offset;
};

// One rank's flat buffers (stage 3: one per sub-group) and where each
// parameter's elements go in them.
struct RankFlats {
  std::vector<int64_t> sizes;                 // elements of each flat
  std::vector<std::vector<Stretch>> stretches;  // per flat
  std::vector<int64_t> saved;                 // elements written of each flat's master weights (stage 1-2's last rank: unpadded)
};

RankFlats flats_of(const Target& t, const std::vector<Param>& params, int rank, int64_t& group_padding) {
  RankFlats f;
  group_padding = 0;
  if (t.stage < 3) {
    int64_t total = 0;
    for (const auto& p : params) total += p.numel;
    const int64_t align = 2 * t.world;  // DeepSpeed pads the group to 2 x world elements
    const int64_t partition = ceil_div(total, align) * align / t.world;
    const int64_t start = rank * partition;
    f.sizes.push_back(partition);
    f.stretches.emplace_back();
    int64_t flat = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t lo = std::max(flat, start), hi = std::min(flat + params[i].numel, start + partition);
      if (hi > lo) f.stretches[0].push_back({i, lo - flat, hi - lo, lo - start});
      flat += params[i].numel;
    }
    const int64_t real = std::clamp<int64_t>(total - start, 0, partition);
    group_padding = partition - real;
    f.saved.push_back(rank == t.world - 1 ? real : partition);  // DeepSpeed strips the last rank's padding
    return f;
  }
  // Stage 3: each parameter's part `rank`, ceil(numel / world) elements,
  // in sub-groups that close once they reach sub_group_size.
  f.sizes.push_back(0);
  f.stretches.emplace_back();
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t part = ceil_div(params[i].numel, t.world);
    const int64_t lo = std::min(params[i].numel, rank * part), hi = std::min(params[i].numel, lo + part);
    if (hi > lo) f.stretches.back().push_back({i, lo, hi - lo, f.sizes.back()});
    f.sizes.back() += part;
    if (f.sizes.back() >= t.sub_group_size && i + 1 < params.size()) {
      f.sizes.push_back(0);
      f.stretches.emplace_back();
    }
  }
  f.saved = f.sizes;
  return f;
}

// Flat buffers of `kind` for one rank, read from the checkpoint.
std::vector<std::vector<float>> read_flats(ckpt::FragmentReader& reader, const std::string& kind, const RankFlats& f,
                                           const std::vector<Param>& params) {
  std::vector<std::vector<float>> out;
  for (size_t g = 0; g < f.sizes.size(); ++g) {
    out.emplace_back(static_cast<size_t>(f.sizes[g]), 0.0f);
    for (const Stretch& s : f.stretches[g])
      reader.read_f32(kind, params[s.param].zero_name, s.param_offset, s.length, out.back().data() + s.flat_offset);
  }
  return out;
}

Py loss_scaler() {
  Py attributes = Py::dict();
  attributes.set("cur_scale", Py::real(1.0)).set("dynamic", Py::boolean(false));
  return Py::instance("deepspeed.runtime.fp16.loss_scaler", "LossScaler", std::move(attributes));
}

Py stage_enum(int stage) { return Py::call("deepspeed.runtime.zero.config", "ZeroStageEnum", {Py::integer(stage)}); }

// The torch optimizer state dict of the flats: one param group over them.
Py base_optimizer_state(const Target& t, const ckpt::Manifest& m, size_t flats, std::vector<StorageBytes>& storages,
                        const std::map<std::string, std::vector<std::vector<float>>>& states, double lr) {
  Py state = Py::dict();
  const int64_t steps = m.engine.value("optimizer_steps", int64_t{0});
  for (size_t g = 0; g < flats && !states.empty(); ++g) {
    Py entry = Py::dict();
    entry.set("step", Py::integer(steps));
    for (const auto& [kind, buffers] : states) {
      const std::string key = std::to_string(storages.size());
      storages.push_back({key, buffers[g].data(), buffers[g].size() * sizeof(float)});
      entry.set(kind, Py::tensor(key, ckpt::DType::F32, {static_cast<int64_t>(buffers[g].size())}));
    }
    state.set(Py::integer(static_cast<int64_t>(g)), std::move(entry));
  }
  Py ids = Py::list();
  for (size_t g = 0; g < flats; ++g) ids.append(Py::integer(static_cast<int64_t>(g)));
  Py group = Py::dict();
  group.set("lr", Py::real(lr))
      .set("bias_correction", Py::boolean(true))
      .set("betas", Py::tuple({Py::real(t.beta1), Py::real(t.beta2)}))
      .set("eps", Py::real(t.eps))
      .set("weight_decay", Py::real(t.weight_decay))
      .set("amsgrad", Py::boolean(false))
      .set("params", std::move(ids));
  Py sd = Py::dict();
  sd.set("state", std::move(state)).set("param_groups", Py::list({std::move(group)}));
  return sd;
}

Py json_to_py(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return Py::none();
    case json::value_t::boolean: return Py::boolean(j.get<bool>());
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return Py::integer(j.get<int64_t>());
    case json::value_t::number_float: return Py::real(j.get<double>());
    case json::value_t::string: return Py::str(j.get<std::string>());
    case json::value_t::array: {
      Py list = Py::list();
      for (const auto& x : j) list.append(json_to_py(x));
      return list;
    }
    case json::value_t::object: {
      Py dict = Py::dict();
      for (const auto& [k, v] : j.items()) dict.set(k, json_to_py(v));
      return dict;
    }
    default: return Py::none();
  }
}

}  // namespace

ExportSummary export_deepspeed(const ExportOptions& o) {
  check_destination(o.from, o.out, "the zero checkpoint");
  const std::string tag = o.tag.empty() ? ckpt::read_latest(o.from) : o.tag;
  const ckpt::Manifest m = ckpt::read_manifest(o.from, tag);
  const int world = o.world_size > 0 ? o.world_size : m.world_size;
  if (world > 65536) fail("--world-size " + std::to_string(world) + " is out of range");
  const Target t = target_of(o.config, world);

  // DeepSpeed's parameter order is its model's: the name map's order, then
  // the parameters the map does not name in the checkpoint's order.
  std::map<std::string, std::string> ds_name_of;
  for (const auto& [ds, zero] : o.rename) ds_name_of[zero] = ds;
  std::map<std::string, const ckpt::ParamInfo*> by_name;
  for (const auto& p : m.params) {
    if (!p.trainable)
      fail(o.from + "/" + tag + " holds the frozen parameter " + p.name + "; export does not write frozen parameters yet");
    by_name[p.name] = &p;
  }
  std::vector<Param> params;
  std::set<std::string> placed;
  auto add = [&](const ckpt::ParamInfo& p) {
    if (!placed.insert(p.name).second) return;
    Param q;
    q.zero_name = p.name;
    q.ds_name = ds_name_of.count(p.name) ? ds_name_of[p.name] : p.name;
    q.shape = p.shape;
    q.numel = 1;
    for (int64_t d : p.shape) q.numel *= d;
    params.push_back(std::move(q));
  };
  for (const auto& [ds, zero] : o.rename) {
    auto it = by_name.find(zero);
    if (it != by_name.end()) {
      add(*it->second);
    } else if (std::find(m.buffers.begin(), m.buffers.end(), zero) == m.buffers.end()) {
      fail("the name map maps \"" + ds + "\" to \"" + zero + "\", which " + o.from + "/" + tag + " does not hold");
    }
  }
  for (const auto& p : m.params) add(p);
  if (params.empty()) fail(o.from + "/" + tag + " holds no trainable parameters");

  std::vector<std::string> kinds;  // Adam's states, when the optimizer has stepped
  if (!m.states.empty()) {
    for (const char* k : {"exp_avg", "exp_avg_sq"}) {
      if (std::find(m.states.begin(), m.states.end(), k) == m.states.end())
        fail(o.from + "/" + tag + " holds the states of optimizer " + m.optimizer + " without \"" + k +
             "\", which DeepSpeed's Adam needs");
      kinds.push_back(k);
    }
  }
  // DeepSpeed's param group holds the lr of the step to come, which the
  // scheduler set after the last one (zero's "next_lr").
  std::vector<std::string> notes;
  double lr = t.lr;
  if (m.engine.contains("next_lr") && m.engine["next_lr"].is_number()) {
    lr = m.engine["next_lr"].get<double>();
  } else if (t.scheduler) {
    notes.push_back("the checkpoint does not record the next step's lr (saved by an older zero): DeepSpeed's first "
                    "step after loading uses the ds_config's lr " + std::to_string(t.lr) + ", its scheduler the rest");
  }
  const int64_t global_steps = m.engine.value("global_steps", int64_t{0});
  const int64_t skipped = m.engine.value("skipped_steps", int64_t{0});
  const int64_t scheduler_steps = m.engine.value("scheduler_steps", global_steps - skipped);
  if (m.engine.value("mid_accumulation", false))
    fail(o.from + "/" + tag + " was saved in the middle of a gradient accumulation; DeepSpeed resumes at a step boundary");

  ExportSummary summary;
  summary.tag = tag;
  summary.world_size = world;
  summary.stage = t.stage;
  summary.dtype = ckpt::dtype_name(t.dtype);
  summary.notes = notes;
  for (const auto& p : params) {
    ++summary.params;
    summary.elements += p.numel;
  }

  Staging staging(o.out);
  const fs::path folder = staging.path() / tag;
  fs::create_directories(folder);
  ckpt::FragmentReader reader(o.from, m);
  const bool bf16 = t.dtype == ckpt::DType::BF16;

  // The optimizer files, one rank at a time.
  for (int r = 0; r < world; ++r) {
    int64_t group_padding = 0;
    const RankFlats f = flats_of(t, params, r, group_padding);
    const auto masters = read_flats(reader, "fp32", f, params);
    std::map<std::string, std::vector<std::vector<float>>> states;
    for (const auto& k : kinds) states[k] = read_flats(reader, k, f, params);
    std::vector<StorageBytes> storages;
    Py osd = Py::dict();
    osd.set("zero_stage", stage_enum(t.stage)).set("loss_scaler", loss_scaler());
    osd.set("dynamic_loss_scale", Py::boolean(false)).set("overflow", Py::boolean(false));
    Py base = base_optimizer_state(t, m, f.sizes.size(), storages, states, lr);
    Py flats = Py::list();
    for (size_t g = 0; g < masters.size(); ++g) {
      const std::string key = std::to_string(storages.size());
      storages.push_back({key, masters[g].data(), static_cast<size_t>(f.saved[g]) * sizeof(float)});
      flats.append(Py::tensor(key, ckpt::DType::F32, {f.saved[g]}));
    }
    if (t.stage < 3) {
      osd.set("clip_grad", Py::real(t.clip)).set("base_optimizer_state", std::move(base));
      osd.set("single_partition_of_fp32_groups", std::move(flats));
      osd.set("group_paddings", Py::list({Py::integer(group_padding)}));
      Py zeros = Py::list();
      for (size_t i = 0; i < params.size(); ++i) zeros.append(Py::integer(0));
      osd.set("param_alignment_paddings", Py::list({std::move(zeros)}));
      osd.set("partition_count", Py::list({Py::integer(world)}));
    } else {
      osd.set("partition_count", Py::integer(world)).set("optimizer_state_dict", std::move(base));
      osd.set("fp32_flat_groups", std::move(flats));
    }
    osd.set("ds_version", Py::str(kDeepSpeedVersion));
    Py root = Py::dict();
    root.set("optimizer_state_dict", std::move(osd)).set("ds_config", json_to_py(t.config));
    root.set("ds_version", Py::str(kDeepSpeedVersion));
    torchsave::write_torch_save((folder / deepspeed_optim_file(r, bf16)).string(), root, storages);
  }

  // The model states: one file at stages 1-2 (whole weights in the
  // training dtype), one per rank at stage 3 (partitioned weights empty).
  std::vector<std::vector<uint8_t>> whole;  // stages 1-2: each parameter's bytes
  if (t.stage < 3) {
    for (const auto& p : params) {
      std::vector<float> values(static_cast<size_t>(p.numel));
      reader.read_f32("fp32", p.zero_name, 0, p.numel, values.data());
      whole.emplace_back(static_cast<size_t>(p.numel) * ckpt::dtype_size(t.dtype));
      ckpt::convert_from_f32(t.dtype, values.data(), values.size(), whole.back().data());
    }
  }
  std::vector<ckpt::TensorData> buffers;
  std::vector<std::vector<uint8_t>> buffer_bytes(m.buffers.size());
  for (size_t b = 0; b < m.buffers.size(); ++b) {
    const std::string name = "module/" + m.buffers[b];
    buffers.push_back(reader.read_whole(reader.file_holding(name), name, buffer_bytes[b]));
  }
  static const std::set<std::string> deepspeed_keys{
      "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
      "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "skipped_steps", "global_steps",
      "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version"};
  auto ds_buffer_name = [&](const std::string& zero) { return ds_name_of.count(zero) ? ds_name_of[zero] : zero; };
  for (int r = 0; r < (t.stage == 3 ? world : 1); ++r) {
    std::vector<StorageBytes> storages;
    Py module = Py::ordered_dict(), shapes = Py::ordered_dict(), buffer_names = Py::list();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string key = std::to_string(storages.size());
      if (t.stage < 3) {
        storages.push_back({key, whole[i].data(), whole[i].size()});
        module.set(params[i].ds_name, Py::tensor(key, t.dtype, params[i].shape));
      } else {
        storages.push_back({key, nullptr, 0});
        module.set(params[i].ds_name, Py::tensor(key, t.dtype, {0}));
      }
      shapes.set(params[i].ds_name, Py::size(params[i].shape));
    }
    for (size_t b = 0; b < buffers.size(); ++b) {
      const std::string key = std::to_string(storages.size());
      storages.push_back({key, buffers[b].data, buffers[b].bytes});
      module.set(ds_buffer_name(m.buffers[b]), Py::tensor(key, buffers[b].dtype, buffers[b].shape));
      buffer_names.append(Py::str(ds_buffer_name(m.buffers[b])));
    }
    Py scheduler = Py::none();
    if (t.scheduler) {
      scheduler = Py::dict();
      scheduler.set("last_batch_iteration", Py::integer(scheduler_steps - 1));
    }
    Py root = Py::dict();
    root.set("module", std::move(module)).set("buffer_names", std::move(buffer_names)).set("optimizer", Py::none());
    root.set("param_shapes", Py::list({std::move(shapes)})).set("frozen_param_shapes", Py::ordered_dict());
    root.set("shared_params", Py::dict()).set("frozen_param_fragments", Py::ordered_dict());
    root.set("lr_scheduler", std::move(scheduler)).set("data_sampler", Py::none()).set("random_ltd", Py::none());
    root.set("skipped_steps", Py::integer(skipped)).set("global_steps", Py::integer(global_steps));
    root.set("global_samples", Py::integer(global_steps * t.batch));
    root.set("dp_world_size", Py::integer(world)).set("mp_world_size", Py::integer(1));
    root.set("ds_config", json_to_py(t.config)).set("ds_version", Py::str(kDeepSpeedVersion));
    for (const auto& [k, v] : m.client_state.items()) {  // DeepSpeed keeps the client_state beside its own keys
      if (deepspeed_keys.count(k)) {
        if (r == 0) summary.notes.push_back("client_state key \"" + k + "\" is one of DeepSpeed's own keys: left out");
        continue;
      }
      root.set(k, json_to_py(v));
    }
    torchsave::write_torch_save((folder / deepspeed_model_file(t.stage, r)).string(), root, storages);
  }
  ckpt::write_file_durably((staging.path() / "latest").string(), tag);
  staging.commit();
  return summary;
}

}  // namespace zero::interop
