// The Engine's checkpoint calls: save_checkpoint and load_checkpoint over
// engine::TrainingParts (checkpoint_save.cpp, checkpoint_load.cpp), and the
// whole model gathered into one state dict or one 16-bit safetensors file
// (DeepSpeed's save_16bit_model).
#include <torch/torch.h>

#include <filesystem>

#include "ckpt/checkpoint.h"
#include "engine/checkpoint_io.h"
#include "engine/engine_impl.h"
#include "zero/engine.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero {

void Engine::save_checkpoint(const std::string& dir, const std::string& tag, const std::string& client_state,
                             const SaveOptions& options) {
  impl_->check_thread("engine.save_checkpoint", /*binds=*/false);
  impl_->check_loaded("engine.save_checkpoint");
  if (impl_->sharded->step_in_progress()) {
    throw EngineError("engine.save_checkpoint between a boundary's engine.backward() and its engine.step() with "
                      "super_offload: part of the step's update is done (Note [Updates in backward]); call "
                      "engine.step() first, then save");
  }
  impl_->boundary->flush();  // the curves reach at least the checkpoint
  engine::save_checkpoint(*impl_, dir, tag, client_state, options);
}

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag, const LoadOptions& options) {
  impl_->check_thread("engine.load_checkpoint", /*binds=*/false);
  impl_->check_stopped("engine.load_checkpoint");
  impl_->sharded->abandon_update_in_backward();  // the checkpoint replaces what it updated
  std::string client_state = engine::load_checkpoint(*impl_, dir, tag, options);
  impl_->backward_pending = false;  // the micro-step restarts from the checkpoint's
  return client_state;
}

std::optional<std::string> Engine::load_checkpoint_if_present(const std::string& dir, const std::string& tag,
                                                               const LoadOptions& options) {
  // Note [In-memory copies]: a copy in memory at least as new as the disk's is read instead.
  if (impl_->memory_copies && tag.empty()) {
    if (auto copy = impl_->memory_copies->newest(dir)) return load_checkpoint(copy->first, copy->second, options);
  }
  // DeepSpeed's load_checkpoint returns (None, None) when there is no `latest`.
  const bool present = tag.empty() ? std::filesystem::exists(std::filesystem::path(dir) / "latest")
                                   : std::filesystem::exists(std::filesystem::path(dir) / tag);
  at::Tensor seen = torch::tensor({present ? 1 : 0}, torch::kInt);
  impl_->pg->all_reduce(seen, comm::ReduceOp::Sum);
  const int ranks = seen.item<int>();
  if (ranks == 0) return std::nullopt;
  if (ranks != impl_->pg->size()) {
    throw CheckpointError("load_checkpoint_if_present: " + std::to_string(ranks) + " of " +
                          std::to_string(impl_->pg->size()) + " ranks see a checkpoint at " + dir +
                          (tag.empty() ? "/latest" : "/" + tag) + " (this rank " + (present ? "does" : "does not") +
                          "); every rank must see the same folder (a shared filesystem)");
  }
  return load_checkpoint(dir, tag, options);
}

std::vector<std::pair<std::string, at::Tensor>> Engine::gathered_state_dict() {
  auto scope = gather_parameters(*impl_->module);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : impl_->module->named_parameters()) out.emplace_back(p.key(), p.value().detach().clone());
  for (const auto& b : impl_->module->named_buffers()) out.emplace_back(b.key(), b.value().detach().clone());
  return out;
}

bool Engine::save_16bit_model(const std::string& dir, const std::string& filename) {
  const auto shape = impl_->mesh->shape();
  if (shape.tp > 1 || shape.pp > 1) {
    throw EngineError("save_16bit_model: with tp " + std::to_string(shape.tp) + " x pp " + std::to_string(shape.pp) +
                      " no rank holds the whole model; save_checkpoint, then write one file with zero-ckpt export --to hf");
  }
  const auto& z = impl_->config.zero_optimization;
  if (z.stage == 3 && !z.stage3_gather_16bit_weights_on_model_save) {
    // DeepSpeed's rule: at stage 3 the whole model is gathered onto rank 0
    // for this only when the config allows it; otherwise nothing is saved.
    log::warn_once("save_16bit_model stage 3", "engine",
                   "save_16bit_model did not save " + dir + ": at stage 3 it gathers the whole model only when "
                   "zero_optimization.stage3_gather_16bit_weights_on_model_save is true (DeepSpeed's rule); set it, or "
                   "save_checkpoint and write the weights with zero-ckpt export --to hf");
    return false;
  }
  const auto state = gathered_state_dict();  // a collective
  std::string error;
  if (impl_->pg->rank() == 0) {
    try {
      std::filesystem::create_directories(dir);
      std::vector<ckpt::TensorData> tensors;
      std::vector<at::Tensor> kept;
      for (const auto& [name, t] : state) {
        kept.push_back(t.contiguous().cpu());
        ckpt::TensorData d;
        d.name = name;
        d.dtype = engine::to_ckpt(kept.back().scalar_type());
        d.shape = kept.back().sizes().vec();
        d.data = kept.back().data_ptr();
        d.bytes = kept.back().nbytes();
        tensors.push_back(d);
      }
      ckpt::write_safetensors((std::filesystem::path(dir) / filename).string(), tensors, {{"format", "pt"}});
    } catch (const std::exception& e) {
      error = std::string("save_16bit_model: ") + e.what();
    }
  }
  error = comm::agreed_error(*impl_->pg, error, "save_16bit_model");
  if (!error.empty()) throw CheckpointError(error);
  return true;
}

}  // namespace zero
