#include "engine/checkpoint_io.h"

#include <cmath>
#include <set>

#include "core/torch_compat.h"
#include "zero/error.h"
#include "zero/log.h"
#include "zero/unit.h"

namespace zero::engine {

ckpt::DType to_ckpt(at::ScalarType t) {
  if (t == compat::float8_e4m3fn()) return ckpt::DType::F8_E4M3;
  if (t == compat::float8_e5m2()) return ckpt::DType::F8_E5M2;
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
    case ckpt::DType::F8_E4M3:
    case ckpt::DType::F8_E5M2: {
      const auto t = d == ckpt::DType::F8_E4M3 ? compat::float8_e4m3fn() : compat::float8_e5m2();
      if (t) return *t;
      throw CheckpointError(std::string(ckpt::dtype_name(d)) + " tensors need LibTorch 2.1 or newer; this build of zero has " +
                            compat::torch_version() + " (rebuild with ZERO_TORCH=wheel, or read them as F32)");
    }
  }
  throw CheckpointError("unknown checkpoint dtype " + std::to_string(static_cast<int>(d)));
}

at::Tensor view_of(const ckpt::TensorData& data) {
  const auto dtype = from_ckpt(data.dtype);
  return torch::from_blob(const_cast<void*>(data.data), {static_cast<int64_t>(data.bytes / c10::elementSize(dtype))},
                          dtype);
}

std::string listing(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 20; ++i) out += "\n  " + names[i];
  if (names.size() > 20) out += "\n  ... and " + std::to_string(names.size() - 20) + " more";
  return out;
}

ModelTensors describe(torch::nn::Module& module, const std::map<std::string, tp::Split>& splits) {
  ModelTensors out;
  std::set<const void*> seen;
  for (const auto& item : module.named_parameters()) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    auto split = splits.find(item.key());
    if (split != splits.end() && !p.requires_grad()) {
      throw CheckpointError("checkpoint: " + item.key() + " is frozen and split by tensor parallelism, which "
                            "checkpoints do not store; train it, or keep frozen layers whole");
    }
    out.params.push_back({item.key(), split != splits.end() ? split->second.full_shape : gathered_shape(p),
                          p.requires_grad()});
    if (!p.requires_grad()) out.frozen.emplace_back(item.key(), p);
  }
  for (const auto& item : module.named_buffers()) out.buffers.emplace_back(item.key(), item.value());
  return out;
}

std::vector<tp::FullRange> full_pieces(const std::map<std::string, tp::Split>& splits, const std::string& name,
                                       int64_t param_offset, int64_t length) {
  auto it = splits.find(name);
  if (it == splits.end()) return {{param_offset, param_offset, length}};
  return tp::full_ranges(it->second, param_offset, length);
}

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

// ---- NvmeWindow ----

NvmeWindow::NvmeWindow(partition::MasterStore& masters, bool write_back)
    : store_(masters.nvme_store()), write_back_(write_back) {
  if (!store_) return;
  for (size_t k = 0; k < masters.size(); ++k) ids_.push_back(masters.nvme_ids(k));  // its master weights and states
}

NvmeWindow::~NvmeWindow() {
  try {
    finish();
  } catch (const std::exception& e) {  // an error of the caller's is already on its way
    log::warn("ckpt", std::string("NVMe offload after a failed checkpoint: ") + e.what());
  }
}

void NvmeWindow::enter(size_t k) {
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

void NvmeWindow::finish() {
  if (!store_) return;
  current_ = -1;
  if (write_back_) {
    store_->swap_out_all();
  } else {
    for (const auto& ids : ids_) store_->drop(ids);
  }
}

void NvmeWindow::leave(size_t k) {
  if (!write_back_) {
    store_->drop(ids_[k]);
    return;
  }
  store_->swap_out(ids_[k]);
  if (k > 0) store_->wait_out(ids_[k - 1]);
}

namespace {

using nlohmann::json;

// Counters past 2^53 are not what a run reaches (nor what a double holds exactly).
constexpr int64_t kMaxCount = int64_t{1} << 53;

[[noreturn]] void bad_field(const std::string& where, const std::string& key, const json& v, const std::string& expected) {
  const std::string field = key.empty() ? "\"engine\"" : "\"engine\"." + key;
  throw CheckpointError("load_checkpoint: " + where + ": " + field + " is " + v.dump() + ", not " + expected +
                        "; the manifest is damaged or was edited: load another tag");
}

// `prefix`: the path to `e` inside "engine" ("loss_scaler.").
int64_t count_field(const json& e, const std::string& key, int64_t fallback, int64_t min, const std::string& where,
                    const std::string& prefix = "") {
  if (!e.contains(key)) return fallback;
  const json& v = e[key];
  const bool in_range = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(kMaxCount)) &&
                        v.get<int64_t>() >= min && v.get<int64_t>() <= kMaxCount;
  if (!in_range) bad_field(where, prefix + key, v, "an integer in [" + std::to_string(min) + ", 2^53]");
  return v.get<int64_t>();
}

double number_field(const json& e, const std::string& key, double fallback, bool positive, const std::string& where,
                    const std::string& prefix = "") {
  if (!e.contains(key)) return fallback;
  const json& v = e[key];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 || (positive && v.get<double>() == 0))
    bad_field(where, prefix + key, v, positive ? "a finite number above 0" : "a finite number, 0 or above");
  return v.get<double>();
}

}  // namespace

json EngineRecord::to_json() const {
  json e;
  e["global_steps"] = global_steps;
  e["skipped_steps"] = skipped_steps;
  e["micro_steps"] = micro_steps;
  e["gradient_accumulation_steps"] = gradient_accumulation_steps;
  e["optimizer_steps"] = optimizer_steps;
  if (scheduler_steps) e["scheduler_steps"] = *scheduler_steps;
  if (lr) e["lr"] = *lr;
  if (next_lr) e["next_lr"] = *next_lr;
  if (!client_lrs.empty()) e["client_lrs"] = client_lrs;
  e["mid_accumulation"] = mid_accumulation;
  if (loss_scaler) {
    e["loss_scaler"] = {{"scale", loss_scaler->scale},
                        {"cur_hysteresis", loss_scaler->cur_hysteresis},
                        {"last_overflow_iter", loss_scaler->last_overflow_iter},
                        {"cur_iter", loss_scaler->cur_iter}};
  }
  if (!data_loaders.empty()) {
    json loaders = json::array();
    for (const SavedLoaderPosition& p : data_loaders) {
      loaders.push_back({{"epoch", p.epoch},
                         {"samples", p.samples},
                         {"dataset_size", p.dataset_size},
                         {"global_batch", p.global_batch},
                         {"seed", p.seed},
                         {"shuffle", p.shuffle}});
    }
    e["data_loaders"] = loaders;
  }
  return e;
}

EngineRecord EngineRecord::from_json(const json& e, const std::string& where) {
  if (!e.is_object()) bad_field(where, "", e, "an object");
  EngineRecord r;
  r.global_steps = count_field(e, "global_steps", 0, 0, where);
  r.skipped_steps = count_field(e, "skipped_steps", 0, 0, where);
  if (r.skipped_steps > r.global_steps) bad_field(where, "skipped_steps", e["skipped_steps"], "at most global_steps");
  r.micro_steps = count_field(e, "micro_steps", 0, 0, where);
  r.gradient_accumulation_steps = count_field(e, "gradient_accumulation_steps", 1, 1, where);
  r.optimizer_steps = count_field(e, "optimizer_steps", 0, 0, where);
  const int64_t taken = r.global_steps - r.skipped_steps;
  if (e.contains("scheduler_steps")) {
    r.scheduler_steps = count_field(e, "scheduler_steps", 0, 0, where);
    if (*r.scheduler_steps > taken) bad_field(where, "scheduler_steps", e["scheduler_steps"], "at most global_steps - skipped_steps");
  }
  if (e.contains("lr")) r.lr = number_field(e, "lr", 0.0, false, where);
  if (e.contains("next_lr")) r.next_lr = number_field(e, "next_lr", 0.0, false, where);
  if (e.contains("client_lrs")) {
    const json& lrs = e["client_lrs"];
    if (!lrs.is_array() || lrs.empty() || lrs.size() > 10000) bad_field(where, "client_lrs", lrs, "an array of rates, one per group");
    for (size_t g = 0; g < lrs.size(); ++g) {
      const json& v = lrs[g];
      if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) {
        bad_field(where, "client_lrs[" + std::to_string(g) + "]", v, "a finite number, 0 or above");
      }
      r.client_lrs.push_back(v.get<double>());
    }
  }
  if (e.contains("mid_accumulation")) {
    if (!e["mid_accumulation"].is_boolean()) bad_field(where, "mid_accumulation", e["mid_accumulation"], "true or false");
    r.mid_accumulation = e["mid_accumulation"].get<bool>();
  }
  if (e.contains("loss_scaler")) {
    const json& l = e["loss_scaler"];
    if (!l.is_object()) bad_field(where, "loss_scaler", l, "an object");
    LossScalerState st;
    const std::string p = "loss_scaler.";
    st.scale = number_field(l, "scale", 1.0, true, where, p);
    st.cur_hysteresis = count_field(l, "cur_hysteresis", 1, 0, where, p);
    st.last_overflow_iter = count_field(l, "last_overflow_iter", -1, -1, where, p);
    st.cur_iter = count_field(l, "cur_iter", 0, 0, where, p);
    r.loss_scaler = st;
  }
  if (e.contains("data_loaders")) {
    const json& loaders = e["data_loaders"];
    if (!loaders.is_array() || loaders.size() > 10000) bad_field(where, "data_loaders", loaders, "an array of loader positions");
    for (size_t i = 0; i < loaders.size(); ++i) {
      const json& l = loaders[i];
      const std::string p = "data_loaders[" + std::to_string(i) + "].";
      if (!l.is_object()) bad_field(where, p.substr(0, p.size() - 1), l, "an object");
      SavedLoaderPosition saved;
      saved.epoch = count_field(l, "epoch", 0, 0, where, p);
      saved.samples = count_field(l, "samples", 0, 0, where, p);
      saved.dataset_size = count_field(l, "dataset_size", 1, 1, where, p);
      saved.global_batch = count_field(l, "global_batch", 1, 1, where, p);
      if (!l.contains("seed") || !l["seed"].is_number_unsigned()) bad_field(where, p + "seed", l.value("seed", json()), "an integer, 0 or above");
      saved.seed = l["seed"].get<uint64_t>();
      if (!l.contains("shuffle") || !l["shuffle"].is_boolean()) bad_field(where, p + "shuffle", l.value("shuffle", json()), "true or false");
      saved.shuffle = l["shuffle"].get<bool>();
      r.data_loaders.push_back(saved);
    }
  }
  return r;
}

}  // namespace zero::engine
