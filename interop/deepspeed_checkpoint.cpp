// A DeepSpeed checkpoint folder read as data. See Note [DeepSpeed layout]
// in deepspeed_checkpoint.h.
// One concept over 400 lines: one DeepSpeed folder read, whose files must
// agree with each other and with Note [DeepSpeed layout].
#include "interop/deepspeed_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>

#include "ckpt/checkpoint.h"
#include "core/regular_file.h"
#include "interop/saved_values.h"
#include "interop/value_json.h"
#include "torchsave/torch_save.h"
#include "zero/error.h"

namespace zero::interop {

using ckpt::fail;

namespace fs = std::filesystem;
using torchsave::TensorRef;
using torchsave::TorchSaveFile;
using torchsave::Value;

namespace {


// A tag is one path component.
std::string read_latest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "latest").string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail(path + " does not exist: name the tag with --tag (the folder inside " + dir + " holding the .pt files)");
  std::string text, error;
  if (!core::read_regular_file(path, 4096, text, error)) fail("cannot read " + error);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  ckpt::check_tag(text, path);
  return text;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool enabled(const nlohmann::json& config, const char* section) {
  auto it = config.find(section);
  if (it == config.end() || !it->is_object()) return false;
  auto e = it->find("enabled");
  return e != it->end() && e->is_boolean() && e->get<bool>();
}

// The keys DeepSpeed itself writes into a model-states file; the rest is
// the program's client_state.
const std::set<std::string>& own_keys() {
  static const std::set<std::string> keys{
      "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
      "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
      "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
      "checkpoint_parallel_dimensions", "csr_tensor_module_names"};
  return keys;
}

}  // namespace

std::string deepspeed_optim_file(int rank, bool bf16) {
  return std::string(bf16 ? "bf16_" : "") + "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_optim_states.pt";
}

std::string deepspeed_model_file(int stage, int rank) {
  return stage == 3 ? "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_model_states.pt"
                    : "mp_rank_00_model_states.pt";
}

// Rank R's optimizer file, its fp32 tensors and each state's, in partition order.
struct DeepSpeedCheckpoint::RankLayout {
  std::unique_ptr<TorchSaveFile> file;
  std::vector<TensorRef> fp32;
  std::map<std::string, std::vector<TensorRef>> states;
  int64_t optimizer_steps = 0;
  std::optional<double> lr;
  const Value* loss_scaler = nullptr;

  // Reads the layout of `path` and checks it against the checkpoint's.
  RankLayout(const std::string& path, int stage, int world, size_t groups) {
    file = std::make_unique<TorchSaveFile>(path);
    const Value& osd = file->root().at("optimizer_state_dict", path);
    const std::string where = path + ": optimizer_state_dict";
    const Value& count = osd.at("partition_count", where);
    int64_t partitions = 0;
    if (count.is_sequence()) {
      for (const Value* c : count.items) partitions = std::max(partitions, c->as_int(where + ".partition_count"));
    } else {
      partitions = count.as_int(where + ".partition_count");
    }
    if (partitions != world)
      fail(where + ".partition_count is " + std::to_string(partitions) + ", but the model states say dp_world_size " +
           std::to_string(world) + ": the folder mixes checkpoints of different world sizes");
    if (const Value* z = osd.find("zero_stage")) {
      int64_t s = -1;
      if (!z->items.empty() && z->items[0]->kind == Value::Kind::Int) s = z->items[0]->integer;
      static const std::map<std::string, int> members{{"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}};
      if (auto m = members.find(z->member); m != members.end()) s = m->second;
      if (z->kind == Value::Kind::Int) s = z->integer;
      if (s != stage)
        fail(where + ".zero_stage is " + std::to_string(s) + ", but ds_config says stage " + std::to_string(stage));
    }
    const char* key = stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
    for (const Value* t : sequence(osd.at(key, where), where + "." + key)) {
      fp32.push_back(t->as_tensor(where + "." + key));
      if (fp32.back().shape.size() != 1 || !fp32.back().contiguous())
        fail(where + "." + key + ": a partition is not a flat tensor");
    }
    if (stage != 3 && fp32.size() != groups)
      fail(where + "." + key + " holds " + std::to_string(fp32.size()) + " groups, param_shapes " + std::to_string(groups));
    // The wrapped optimizer's state dict: "base_optimizer_state" at stages
    // 1-2, "optimizer_state_dict" at stage 3.
    const char* base_key = stage == 3 ? "optimizer_state_dict" : "base_optimizer_state";
    const Value& base = osd.at(base_key, where);
    const std::string bw = where + "." + base_key;
    const Value& state = base.at("state", bw);
    for (const auto& [k, group_state] : state.entries) {
      const int64_t g = k->as_int(bw + ".state key");
      if (g < 0 || g >= static_cast<int64_t>(fp32.size()))
        fail(bw + ".state has group " + std::to_string(g) + " of " + std::to_string(fp32.size()));
      const std::string gw = bw + ".state[" + std::to_string(g) + "]";
      if (!group_state->is_dict()) fail(gw + ": expected a dict");
      for (const auto& [name, v] : group_state->entries) {
        const std::string kind = name->as_string(gw);
        if (kind == "step") {
          optimizer_steps = std::max(optimizer_steps, step_count(*file, *v, gw + ".step"));
          continue;
        }
        if (v->kind != Value::Kind::Tensor) continue;  // hyperparameters kept per state (none in Adam's)
        const TensorRef& t = *v->tensor;
        if (t.numel() < fp32[g].numel() || t.shape.size() != 1 || !t.contiguous())
          fail(gw + "." + kind + " has " + std::to_string(t.numel()) + " elements, fewer than the group's master weights (" +
               std::to_string(fp32[g].numel()) + "), or is not flat");
        auto& list = states[kind];
        if (list.size() != static_cast<size_t>(g))
          fail(gw + ": the groups of state \"" + kind + "\" are not in order 0, 1, ...");
        list.push_back(t);
      }
    }
    for (const auto& [kind, list] : states)
      if (list.size() != fp32.size())
        fail(where + ": state \"" + kind + "\" is kept for " + std::to_string(list.size()) + " of " +
             std::to_string(fp32.size()) + " groups");
    const auto& param_groups = sequence(base.at("param_groups", bw), bw + ".param_groups");
    if (!param_groups.empty())
      if (const Value* lr_value = param_groups[0]->find("lr")) lr = lr_value->as_float(where + ".param_groups[0].lr");
    loss_scaler = osd.find("loss_scaler");
  }

  int64_t elements() const {
    int64_t n = 0;
    for (const auto& t : fp32) n += t.numel();
    return n;
  }
};

namespace {

class RankReader : public DeepSpeedCheckpoint::Rank {
 public:
  explicit RankReader(std::unique_ptr<DeepSpeedCheckpoint::RankLayout> layout) : layout_(std::move(layout)) {}

  const std::string& path() const override { return layout_->file->path(); }

  void read_f32(const std::string& kind, int64_t rank_offset, int64_t length, float* dst) const override {
    const std::vector<TensorRef>* tensors = &layout_->fp32;
    if (kind != "fp32") {
      auto it = layout_->states.find(kind);
      if (it == layout_->states.end()) fail(path() + ": no optimizer state \"" + kind + "\"");
      tensors = &it->second;
    }
    // Each group's stretch is as long as its master weights; a state may
    // keep padding after it.
    int64_t start = 0;
    for (size_t g = 0; g < tensors->size(); ++g) {
      const TensorRef& t = (*tensors)[g];
      const int64_t end = start + layout_->fp32[g].numel();
      const int64_t lo = std::max(rank_offset, start), hi = std::min(rank_offset + length, end);
      if (lo < hi) {
        float* out = dst + (lo - rank_offset);
        if (t.storage.dtype == ckpt::DType::F32) {
          layout_->file->read_range(t, lo - start, hi - lo, out);
        } else if (ckpt::dtype_is_floating(t.storage.dtype)) {
          std::vector<uint8_t> raw(static_cast<size_t>(hi - lo) * ckpt::dtype_size(t.storage.dtype));
          layout_->file->read_range(t, lo - start, hi - lo, raw.data());
          ckpt::convert_to_f32(t.storage.dtype, raw.data(), static_cast<size_t>(hi - lo), out);
        } else {
          fail(path() + ": \"" + kind + "\" is " + ckpt::dtype_name(t.storage.dtype) + ", not a floating dtype");
        }
      }
      start = end;
    }
    if (rank_offset < 0 || rank_offset + length > start)
      fail(path() + ": elements [" + std::to_string(rank_offset) + ", " + std::to_string(rank_offset + length) +
           ") of \"" + kind + "\" lie past its " + std::to_string(start) + " elements");
  }

 private:
  std::unique_ptr<DeepSpeedCheckpoint::RankLayout> layout_;
};

}  // namespace

DeepSpeedCheckpoint::DeepSpeedCheckpoint(const std::string& dir, const std::string& tag) : dir_(dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("DeepSpeed checkpoint folder " + dir + " does not exist");
  tag_ = tag.empty() ? read_latest(dir) : tag;
  ckpt::check_tag(tag_, "--tag");
  folder_ = (fs::path(dir) / tag_).string();
  if (!fs::is_directory(folder_, ec))
    fail((tag.empty() ? (fs::path(dir) / "latest").string() + " names tag \"" + tag_ + "\", but " : std::string()) +
         folder_ + " is not a folder");
  read_model_states();
  read_optimizer_layout();
  if (stage_ != 3) check_groups_fit();
}

DeepSpeedCheckpoint::~DeepSpeedCheckpoint() = default;

void DeepSpeedCheckpoint::read_model_states() {
  // What the folder holds decides the stage's file names; model or
  // pipeline parallelism shows in them.
  static const std::regex mp_rank(R"((?:.*_)?mp_rank_(\d+)_(?:model|optim)_states\.pt)");
  static const std::regex layer(R"(layer_\d+-model_\d+-model_states\.pt|layer_\d+-model_states\.pt)");
  bool stage3_files = false, plain_file = false;
  for (const auto& entry : fs::directory_iterator(folder_)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, layer))
      fail(folder_ + " holds " + name + ": a pipeline-parallel DeepSpeed checkpoint (pipe's layer files), which zero-ckpt "
           "import does not read; save it from a run without pipeline parallelism");
    if (std::regex_match(name, m, mp_rank) && m[1] != "00")
      fail(folder_ + " holds " + name + ": a model-parallel (tensor-parallel) DeepSpeed checkpoint (mp_rank " +
           m[1].str() + "), which zero-ckpt import does not read; it reads checkpoints with mp_world_size 1");
    if (name == "zero_pp_rank_0_mp_rank_00_model_states.pt") stage3_files = true;
    if (name == "mp_rank_00_model_states.pt") plain_file = true;
  }
  if (!stage3_files && !plain_file)
    fail(folder_ + " holds no DeepSpeed model states (mp_rank_00_model_states.pt, or "
         "zero_pp_rank_0_mp_rank_00_model_states.pt at stage 3): is it a DeepSpeed checkpoint tag folder?");
  model_file_ = (fs::path(folder_) / (stage3_files ? deepspeed_model_file(3, 0) : deepspeed_model_file(0, 0))).string();
  model_ = std::make_unique<TorchSaveFile>(model_file_);
  const Value& root = model_->root();
  const std::string& where = model_file_;
  ds_config_ = to_json(root.at("ds_config", where), where + ": ds_config");
  if (!ds_config_.is_object()) fail(where + ": ds_config is not a dict");
  const nlohmann::json zero = ds_config_.value("zero_optimization", nlohmann::json::object());
  stage_ = zero.is_object() && zero.contains("stage") && zero["stage"].is_number_integer() ? zero["stage"].get<int>() : 0;
  if (stage_ < 1 || stage_ > 3)
    fail(where + ": ds_config's zero_optimization.stage is " + std::to_string(stage_) +
         "; zero-ckpt import reads ZeRO stages 1, 2 and 3 (at stage 0 DeepSpeed keeps the optimizer in the model states)");
  if ((stage_ == 3) != stage3_files)
    fail(where + ": ds_config says stage " + std::to_string(stage_) + ", but the files are named as stage " +
         (stage3_files ? "3's" : "1-2's") + " are");
  dtype_ = enabled(ds_config_, "bf16") ? "BF16" : enabled(ds_config_, "fp16") ? "F16" : "F32";
  if (ds_config_.contains("optimizer") && ds_config_["optimizer"].is_object() && ds_config_["optimizer"].contains("type") &&
      ds_config_["optimizer"]["type"].is_string())
    optimizer_ = ds_config_["optimizer"]["type"].get<std::string>();
  if (ds_config_.contains("gradient_accumulation_steps")) {
    const auto& gas = ds_config_["gradient_accumulation_steps"];
    if (!gas.is_number_integer() || gas.get<int64_t>() < 1 || gas.get<int64_t>() > (int64_t{1} << 31))
      fail(where + ": ds_config's gradient_accumulation_steps is " + gas.dump() +
           ", not a whole number from 1 to 2^31; the checkpoint's ds_config is damaged");
    counters_.gradient_accumulation_steps = gas.get<int64_t>();
  }

  if (const Value* mp = root.find("mp_world_size"); mp && mp->as_int(where + ": mp_world_size") != 1)
    fail(where + ": mp_world_size is " + std::to_string(mp->integer) + "; zero-ckpt import reads checkpoints without "
         "model parallelism (mp_world_size 1)");
  const int64_t world = root.at("dp_world_size", where).as_int(where + ": dp_world_size");
  if (world < 1 || world > 65536) fail(where + ": dp_world_size " + std::to_string(world) + " is out of range");
  world_ = static_cast<int>(world);

  if (const Value* frozen = root.find("frozen_param_shapes"); frozen && frozen->is_dict() && !frozen->entries.empty())
    fail(where + ": frozen_param_shapes lists " + std::to_string(frozen->entries.size()) + " frozen parameters (" +
         frozen->entries[0].first->as_string(where) + ", ...); zero-ckpt import does not read frozen parameters yet");
  std::set<std::string> seen;
  for (const Value* group : sequence(root.at("param_shapes", where), where + ": param_shapes")) {
    if (!group->is_dict()) fail(where + ": param_shapes holds a " + Value::kind_name(group->kind) + ", not a dict");
    for (const auto& [k, v] : group->entries) {
      DeepSpeedParam p;
      p.name = k->as_string(where + ": param_shapes key");
      p.shape = shape_of(*v, where + ": param_shapes[" + p.name + "]");
      p.numel = numel_of(p.shape, where + ": param_shapes[" + p.name + "]");
      if (!seen.insert(p.name).second) fail(where + ": param_shapes names " + p.name + " twice");
      params_.push_back(std::move(p));
    }
    group_sizes_.push_back(group->entries.size());
  }
  if (params_.empty()) fail(where + ": param_shapes lists no parameters");
  if (const Value* names = root.find("buffer_names"))
    for (const Value* b : sequence(*names, where + ": buffer_names")) buffers_.push_back(b->as_string(where + ": buffer_names"));
  const Value& module = root.at("module", where);
  for (const auto& b : buffers_) module.at(b, where + ": module").as_tensor(where + ": module[" + b + "]");

  counters_.global_steps = root.at("global_steps", where).as_int(where + ": global_steps");
  if (const Value* s = root.find("skipped_steps")) counters_.skipped_steps = s->as_int(where + ": skipped_steps");
  if (counters_.global_steps < 0 || counters_.skipped_steps < 0 || counters_.skipped_steps > counters_.global_steps)
    fail(where + ": global_steps " + std::to_string(counters_.global_steps) + " and skipped_steps " +
         std::to_string(counters_.skipped_steps) + " are not counts of steps");
  // Checked before any arithmetic: micro steps are global_steps x accumulation,
  // and a checkpoint's counters stay below 2^53 (what a double holds exactly).
  constexpr int64_t kMaxCount = int64_t{1} << 53;
  if (counters_.global_steps > kMaxCount / counters_.gradient_accumulation_steps)
    fail(where + ": global_steps " + std::to_string(counters_.global_steps) + " x gradient_accumulation_steps " +
         std::to_string(counters_.gradient_accumulation_steps) + " is beyond 2^53 micro steps; the file is damaged");
  if (const Value* sched = root.find("lr_scheduler"); sched && sched->is_dict())
    if (const Value* it = sched->find("last_batch_iteration"); it && !it->is_none())
      counters_.scheduler_steps =
          std::max<int64_t>(0, std::min(it->as_int(where + ": lr_scheduler.last_batch_iteration"), kMaxCount) + 1);
}

void DeepSpeedCheckpoint::read_optimizer_layout() {
  const bool bf16 = dtype_ == "BF16";
  // Every optimizer file of the folder: exactly ranks 0..W-1.
  static const std::regex optim(R"((bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt)");
  for (const auto& entry : fs::directory_iterator(folder_)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, optim)) continue;
    if (m[1].matched != bf16)
      fail(folder_ + " holds " + name + ", but ds_config " + (bf16 ? "enables" : "does not enable") +
           " bf16: DeepSpeed names the files " + deepspeed_optim_file(0, bf16) + ", ...");
    const std::string digits = m[2].str();
    if (digits.size() > 6 || std::stoll(digits) >= world_)
      fail(folder_ + " holds " + name + ", but the model states say dp_world_size " + std::to_string(world_) +
           ": the folder mixes checkpoints of different world sizes");
  }
  for (int r = 0; r < world_; ++r) {
    const std::string path = (fs::path(folder_) / deepspeed_optim_file(r, bf16)).string();
    std::error_code ec;
    if (!fs::exists(path, ec))
      fail(path + " is missing: the checkpoint was written by " + std::to_string(world_) + " ranks (dp_world_size in " +
           model_file_ + ") and each writes its own optimizer file");
    if (stage_ == 3) {
      const std::string model = (fs::path(folder_) / deepspeed_model_file(3, r)).string();
      if (!fs::exists(model, ec)) fail(model + " is missing: at stage 3 each of the " + std::to_string(world_) + " ranks writes one");
    }
    optim_files_.push_back(path);
  }

  // Alignment paddings (stages 1-2) come from rank 0's file; every rank's
  // partition sizes and states are checked against rank 0's.
  for (int r = 0; r < world_; ++r) {
    RankLayout rank(optim_files_[r], stage_, world_, group_sizes_.size());
    const std::string& where = optim_files_[r];
    if (r == 0) {
      for (const auto& [kind, list] : rank.states) state_kinds_.push_back(kind);
      counters_.optimizer_steps = rank.optimizer_steps;
      counters_.lr = rank.lr;
      if (dtype_ == "F16" && rank.loss_scaler && rank.loss_scaler->state && rank.loss_scaler->state->is_dict()) {
        const Value& s = *rank.loss_scaler->state;
        const std::string lw = where + ": loss_scaler";
        if (const Value* v = s.find("cur_scale")) counters_.loss_scale = v->as_float(lw + ".cur_scale");
        if (const Value* v = s.find("cur_iter")) counters_.cur_iter = v->as_int(lw + ".cur_iter");
        if (const Value* v = s.find("last_overflow_iter")) counters_.last_overflow_iter = v->as_int(lw + ".last_overflow_iter");
        if (const Value* v = s.find("cur_hysteresis")) counters_.cur_hysteresis = v->as_int(lw + ".cur_hysteresis");
      }
      if (stage_ != 3) {
        const Value& osd = rank.file->root().at("optimizer_state_dict", where);
        alignment_paddings_.assign(group_sizes_.size(), {});
        if (const Value* pads = osd.find("param_alignment_paddings")) {
          const auto& groups = sequence(*pads, where + ": param_alignment_paddings");
          if (groups.size() != group_sizes_.size())
            fail(where + ": param_alignment_paddings has " + std::to_string(groups.size()) + " groups, param_shapes " +
                 std::to_string(group_sizes_.size()));
          for (size_t g = 0; g < groups.size(); ++g) {
            for (const Value* p : sequence(*groups[g], where + ": param_alignment_paddings")) {
              const int64_t n = p->as_int(where + ": param_alignment_paddings");
              if (n < 0 || n > (int64_t{1} << 20)) fail(where + ": param_alignment_paddings holds " + std::to_string(n));
              alignment_paddings_[g].push_back(n);
            }
            if (alignment_paddings_[g].size() != group_sizes_[g])
              fail(where + ": param_alignment_paddings[" + std::to_string(g) + "] has " +
                   std::to_string(alignment_paddings_[g].size()) + " entries for " + std::to_string(group_sizes_[g]) +
                   " parameters");
          }
        }
      }
    } else {
      std::vector<std::string> kinds;
      for (const auto& [kind, list] : rank.states) kinds.push_back(kind);
      if (kinds != state_kinds_)
        fail(where + " keeps optimizer states different from " + optim_files_[0] + "'s: the folder mixes checkpoints");
      // A rank's file from another save of the same run has the same layout
      // but not the same step: it would import into mixed-step weights.
      if (rank.optimizer_steps != counters_.optimizer_steps)
        fail(where + ": its optimizer states have taken " + std::to_string(rank.optimizer_steps) + " steps, " +
             optim_files_[0] + "'s " + std::to_string(counters_.optimizer_steps) +
             ": the folder mixes checkpoints of different steps");
    }
    if (stage_ != 3) {
      partition_sizes_.emplace_back();
      for (size_t g = 0; g < group_sizes_.size(); ++g) {
        const int64_t size = rank.fp32[g].numel(), first = partition_sizes_[0].empty() ? size : partition_sizes_[0][g];
        if (r + 1 < world_ ? size != first : size > first)
          fail(where + ": its partition of group " + std::to_string(g) + " has " + std::to_string(size) + " elements, rank 0's " +
               std::to_string(first) + ": the folder mixes checkpoints");
        partition_sizes_.back().push_back(size);
      }
    }
    if (stage_ == 3) {
      int64_t expected = 0;
      for (const auto& p : params_) expected += ceil_div(p.numel, world_);
      if (rank.elements() != expected)
        fail(where + ": fp32_flat_groups hold " + std::to_string(rank.elements()) + " elements, but the " +
             std::to_string(params_.size()) + " parameters of param_shapes take " + std::to_string(expected) +
             " on each of " + std::to_string(world_) + " ranks: the folder mixes checkpoints");
    }
  }
}

void DeepSpeedCheckpoint::check_groups_fit() const {
  size_t first = 0;
  for (size_t g = 0; g < group_sizes_.size(); ++g) {
    int64_t flat = 0, held = 0;
    for (size_t i = 0; i < group_sizes_[g]; ++i)
      flat += params_[first + i].numel + (alignment_paddings_[g].empty() ? 0 : alignment_paddings_[g][i]);
    for (const auto& sizes : partition_sizes_) held += sizes[g];
    // The last parameter's own padding may lie in the stripped end.
    const int64_t last_padding = alignment_paddings_[g].empty() ? 0 : alignment_paddings_[g].back();
    if (flat - last_padding > held)
      fail(folder_ + ": group " + std::to_string(g) + "'s parameters take " + std::to_string(flat - last_padding) +
           " elements, but its " + std::to_string(world_) + " partitions hold " + std::to_string(held) +
           ": param_shapes and the optimizer files disagree");
    first += group_sizes_[g];
  }
}

std::vector<DeepSpeedPiece> DeepSpeedCheckpoint::pieces(int rank) const {
  std::vector<DeepSpeedPiece> out;
  if (stage_ == 3) {
    int64_t position = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t part = ceil_div(params_[i].numel, world_);
      const int64_t lo = std::min(params_[i].numel, rank * part), hi = std::min(params_[i].numel, lo + part);
      if (hi > lo) out.push_back({i, lo, hi - lo, position});
      position += part;
    }
    return out;
  }
  int64_t base = 0;  // where group g's partition starts in the rank's concatenation
  size_t first = 0;
  for (size_t g = 0; g < group_sizes_.size(); ++g) {
    const int64_t size = partition_sizes_[rank][g];
    const int64_t start = rank * partition_sizes_[0][g], end = start + size;
    int64_t flat = 0;
    for (size_t i = 0; i < group_sizes_[g]; ++i) {
      const DeepSpeedParam& p = params_[first + i];
      const int64_t lo = std::max(flat, start), hi = std::min(flat + p.numel, end);
      if (hi > lo) out.push_back({first + i, lo - flat, hi - lo, base + lo - start});
      flat += p.numel + (alignment_paddings_[g].empty() ? 0 : alignment_paddings_[g][i]);
    }
    base += size;
    first += group_sizes_[g];
  }
  return out;
}

std::unique_ptr<DeepSpeedCheckpoint::Rank> DeepSpeedCheckpoint::open_rank(int rank) const {
  auto layout = std::make_unique<RankLayout>(optim_files_.at(rank), stage_, world_, group_sizes_.size());
  layout->file->verify();  // its CRC-32s: pieces are then read by range
  return std::make_unique<RankReader>(std::move(layout));
}

ckpt::TensorData DeepSpeedCheckpoint::read_buffer(const std::string& name, std::vector<uint8_t>& storage) const {
  const TorchSaveFile& model = *model_;
  const TensorRef& t = model.root().at("module", model_file_).at(name, model_file_ + ": module").as_tensor(model_file_ + ": module[" + name + "]");
  storage = model.read(t);
  ckpt::TensorData d;
  d.name = name;
  d.dtype = t.storage.dtype;
  d.shape = t.shape;
  d.data = storage.data();
  d.bytes = storage.size();
  return d;
}

nlohmann::json DeepSpeedCheckpoint::client_state(std::vector<std::string>& skipped) const {
  const TorchSaveFile& model = *model_;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : model.root().entries) {
    if (k->kind != Value::Kind::String || own_keys().count(k->text)) continue;
    nlohmann::json j;
    if (try_to_json(*v, j)) {
      out[k->text] = std::move(j);
    } else {
      skipped.push_back(k->text);
    }
  }
  return out;
}

}  // namespace zero::interop
