#pragma once
// A DeepSpeed checkpoint folder read as data (through torchsave/, nothing
// executed): which parameters it holds, where each rank's flat partition
// keeps them, its counters, and the tensors themselves, read a piece at a
// time. Torch-free.
//
// Note [DeepSpeed layout]: DeepSpeed 0.19's engine.save_checkpoint(dir)
// writes, with data-parallel world size W and no model parallelism,
//   dir/latest                                      the newest tag
//   dir/<tag>/mp_rank_00_model_states.pt            stages 0-2
//   dir/<tag>/zero_pp_rank_R_mp_rank_00_model_states.pt   stage 3, R < W
//   dir/<tag>/[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt   R < W
// ("bf16_" when bf16 training). A model-states file holds "module" (the
// state dict; stage 3's partitioned weights in it are empty), "param_shapes"
// (per parameter group, name -> torch.Size in flat order), "buffer_names",
// "frozen_param_shapes", "shared_params" (tied names), "lr_scheduler"
// ({"last_batch_iteration"}), "global_steps", "skipped_steps",
// "dp_world_size", "mp_world_size" and "ds_config". Any other top-level key
// is the client_state the program passed. An optimizer-states file holds
// "optimizer_state_dict" with "zero_stage", "partition_count",
// "loss_scaler", "base_optimizer_state" ({"state": {group: {"step",
// "exp_avg", "exp_avg_sq"}}, "param_groups": [{"lr", ...}]}) and the fp32
// master weights of rank R's partition:
//   stages 1-2: "single_partition_of_fp32_groups"[g], elements
//     [R*P, (R+1)*P) of group g's flat buffer, in which the parameters of
//     param_shapes[g] follow each other, "param_alignment_paddings"[g][i]
//     elements after parameter i, the end padded to W*P; the last rank's
//     is saved without that end padding (shorter than P);
//   stage 3: "fp32_flat_groups" (sub-groups, read as one concatenation):
//     each parameter in turn contributes its part R, ceil(numel/W) elements
//     (the last parts padded).
// The optimizer's state tensors (group g's "exp_avg", ...) lie as the fp32
// tensor of group g does (the last rank's may keep the end padding). DeepSpeed's zero_to_fp32.py assembles
// weights by the same rules.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"

namespace zero::torchsave {
class TorchSaveFile;
}

namespace zero::interop {

struct DeepSpeedParam {
  std::string name;  // as in the DeepSpeed model's state dict
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

// A stretch of one parameter inside one rank's flat partition (all its
// groups read as one concatenation).
struct DeepSpeedPiece {
  size_t param = 0;          // index into params()
  int64_t param_offset = 0;  // first element, in the flattened parameter
  int64_t length = 0;
  int64_t rank_offset = 0;   // first element, in the rank's partition
};

class DeepSpeedCheckpoint {
 public:
  // Reads the layout: the model states, and every rank's optimizer file's
  // pickle (one file open at a time; tensors are not read). `tag` empty:
  // the one dir/latest names. Throws CheckpointError naming the file or key
  // at fault: a missing rank file, a latest naming no folder, mixed world
  // sizes, model or pipeline parallelism, frozen parameters, an unknown
  // stage, partitions that do not add up.
  DeepSpeedCheckpoint(const std::string& dir, const std::string& tag);
  ~DeepSpeedCheckpoint();

  const std::string& tag() const { return tag_; }
  const std::string& folder() const { return folder_; }  // dir/<tag>
  int stage() const { return stage_; }
  int world_size() const { return world_; }
  const std::string& dtype() const { return dtype_; }  // training dtype: "F32", "BF16" or "F16"
  const nlohmann::json& ds_config() const { return ds_config_; }
  const std::string& optimizer() const { return optimizer_; }  // ds_config's optimizer.type
  const std::vector<DeepSpeedParam>& params() const { return params_; }
  const std::vector<std::string>& buffers() const { return buffers_; }
  // The optimizer's per-element states ("exp_avg", "exp_avg_sq"); empty
  // before its first step.
  const std::vector<std::string>& state_kinds() const { return state_kinds_; }

  struct Counters {
    int64_t global_steps = 0, skipped_steps = 0, optimizer_steps = 0, gradient_accumulation_steps = 1;
    std::optional<int64_t> scheduler_steps;  // last_batch_iteration + 1, with a scheduler
    std::optional<double> lr;                // the optimizer's lr (group 0): the next step's
    // fp16's dynamic loss scaler, as DeepSpeed keeps it.
    std::optional<double> loss_scale;
    int64_t cur_iter = 0, last_overflow_iter = -1, cur_hysteresis = 1;
  };
  const Counters& counters() const { return counters_; }
  // The model-states file's other keys (the program's client_state) that
  // are plain data, as JSON; the names of those that are not, in `skipped`.
  nlohmann::json client_state(std::vector<std::string>& skipped) const;

  // The pieces rank R's partition holds, in partition order.
  std::vector<DeepSpeedPiece> pieces(int rank) const;
  // The optimizer file of rank R opened for reading "fp32" (master weights)
  // or a state kind, by position in its partition, as F32; its data's
  // CRC-32s are checked first (one pass over the file).
  class Rank {
   public:
    virtual ~Rank() = default;
    virtual void read_f32(const std::string& kind, int64_t rank_offset, int64_t length, float* dst) const = 0;
    virtual const std::string& path() const = 0;
  };
  std::unique_ptr<Rank> open_rank(int rank) const;
  // A buffer of the model states (rank 0's file), as stored.
  ckpt::TensorData read_buffer(const std::string& name, std::vector<uint8_t>& storage) const;

  struct RankLayout;  // an optimizer file's layout (deepspeed_checkpoint.cpp)

 private:
  void read_model_states();
  void read_optimizer_layout();
  void check_groups_fit() const;

  std::string dir_, tag_, folder_, model_file_;
  std::unique_ptr<torchsave::TorchSaveFile> model_;  // rank 0's model states
  int stage_ = 0, world_ = 0;
  std::string dtype_, optimizer_;
  nlohmann::json ds_config_;
  std::vector<DeepSpeedParam> params_;
  std::vector<size_t> group_sizes_;  // stages 1-2: parameters per group, in order
  std::vector<std::vector<int64_t>> alignment_paddings_;  // stages 1-2: per group, per parameter
  // Stages 1-2: each rank's partition of each group ([rank][group]). Every
  // rank's is rank 0's size but the last's, which DeepSpeed saves without
  // the group's end padding.
  std::vector<std::vector<int64_t>> partition_sizes_;
  std::vector<std::string> buffers_, state_kinds_;
  std::vector<std::string> optim_files_;  // per rank
  Counters counters_;
};

// The file names DeepSpeed gives rank R's files.
std::string deepspeed_optim_file(int rank, bool bf16);
std::string deepspeed_model_file(int stage, int rank);

}  // namespace zero::interop
