#include "engine/checkpoint_io.h"

#include <set>

#include "zero/error.h"
#include "zero/log.h"

namespace zero::engine {

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

at::Tensor view_of(const ckpt::TensorData& data) {
  const auto dtype = from_ckpt(data.dtype);
  return torch::from_blob(const_cast<void*>(data.data), {static_cast<int64_t>(data.bytes / c10::elementSize(dtype))},
                          dtype);
}

std::string fragment_name(const std::string& kind, const std::string& param, int64_t offset) {
  return kind + "/" + param + "/" + std::to_string(offset);
}

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

NvmeWindow::NvmeWindow(offload::SwappedTensors* store, MasterOptimizer& optimizer, const std::vector<at::Tensor>& masters,
                       bool write_back)
    : store_(store), write_back_(write_back) {
  if (!store_) return;
  for (const auto& master : masters) {  // the store's ids of each bucket's master weights and states
    ids_.emplace_back();
    std::vector<at::Tensor> tensors{master};
    for (const auto& name : optimizer.state_names()) tensors.push_back(optimizer.state(master, name, false));
    for (const auto& t : tensors) {
      const int id = t.defined() ? store_->find(t) : -1;
      if (id >= 0) ids_.back().push_back(id);
    }
  }
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

}  // namespace zero::engine
