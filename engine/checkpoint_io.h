#pragma once
// What the engine's save and load share over ckpt/ (Note [Checkpoint
// layout] in ckpt/checkpoint.h): dtype and fragment names, the model's
// tensors as a checkpoint lists them, the random generators, and the
// window through which NVMe offload brings master weights and states.
#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "data/data_loader.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "offload/swapped_tensors.h"
#include "partition/master_store.h"
#include "zero/tensor_parallel.h"

namespace zero::engine {

ckpt::DType to_ckpt(at::ScalarType t);
at::ScalarType from_ckpt(ckpt::DType d);
// A tensor a checkpoint file holds, viewed (not copied) as a flat tensor.
at::Tensor view_of(const ckpt::TensorData& data);

// The engine's record in a manifest ("engine"): counters, lr and the loss
// scaler. Read back with every field type- and range-checked: a file's
// value that is not what save writes is a CheckpointError naming the key.
struct EngineRecord {
  int64_t global_steps = 0, skipped_steps = 0, micro_steps = 0;
  int64_t gradient_accumulation_steps = 1;
  int64_t optimizer_steps = 0;
  std::optional<int64_t> scheduler_steps;  // absent: global_steps - skipped_steps
  std::optional<double> lr;       // the lr the last step used
  // The lr the next step uses (lr_at(scheduler_steps)): what DeepSpeed
  // keeps in its optimizer's param group, for zero-ckpt export.
  std::optional<double> next_lr;
  // A client optimizer's rate per parameter group (Note [Client optimizer]).
  std::vector<double> client_lrs;
  bool mid_accumulation = false;
  std::optional<LossScalerState> loss_scaler;  // fp16
  // engine.data_loader's loaders, in the order they were made (Note [Data
  // that resumes] in data/data_loader.h); absent in older checkpoints.
  std::vector<SavedLoaderPosition> data_loaders;

  nlohmann::json to_json() const;
  // `where` names the manifest in errors.
  static EngineRecord from_json(const nlohmann::json& e, const std::string& where);
};

// The model's named tensors as a checkpoint describes them: every parameter
// once (a tied one under its first name), and the buffers.
// Parameters split by tensor parallelism are listed in their full shapes;
// a frozen one is refused (it would be saved as one rank's slice).
struct ModelTensors {
  std::vector<ckpt::ParamInfo> params;
  std::vector<std::pair<std::string, at::Tensor>> frozen, buffers;
};
ModelTensors describe(torch::nn::Module& module, const std::map<std::string, tp::Split>& splits);

// Names for an error message, one per line, the first 20 and a count of the rest.
std::string listing(const std::vector<std::string>& names);

// The pieces of fragment `f` (of parameter `name`) in the full parameter's
// coordinates: one piece, f itself, unless the parameter is split.
std::vector<tp::FullRange> full_pieces(const std::map<std::string, tp::Split>& splits, const std::string& name,
                                       int64_t param_offset, int64_t length);

// The random generators a rank saves, as "rng/<device type>": the CPU's,
// and its accelerator's when the module trains on one (dropout there).
std::vector<std::pair<std::string, at::Generator>> generators(torch::nn::Module& module);

// NVMe offload (ZeRO-Infinity): a checkpoint brings the master weights and
// optimizer states in one bucket at a time, reading the next bucket
// meanwhile, and lets each go once used, so that it needs the host memory
// of two buckets rather than of the rank's whole partition. A save lets
// them go as they are (their files are current); a load writes them back.
// Without a store it does nothing.
class NvmeWindow {
 public:
  NvmeWindow(partition::MasterStore& masters, bool write_back);
  ~NvmeWindow();
  // Bucket k resident (the one before let go, the one after being read).
  void enter(size_t k);
  // Nothing resident or in flight any more.
  void finish();

 private:
  void leave(size_t k);
  offload::SwappedTensors* store_;
  std::vector<std::vector<int>> ids_;  // per bucket: its master weights and states
  bool write_back_;
  int64_t current_ = -1;
};

}  // namespace zero::engine
