#pragma once
// zero::LossScaler: the fp16 loss scale, with the semantics of DeepSpeed's
// ZeRO optimizers (deepspeed/runtime/fp16/loss_scaler.py, DynamicLossScaler
// and LossScaler, as used by zero/stage_1_and_2.py and stage3.py). Torch-free.
//
//   LossScaler scaler(cfg.fp16);
//   loss * scaler.scale() -> backward; overflow = any rank saw inf/nan
//   if (scaler.update(overflow)) skip the optimizer step (and the lr schedule)
//
// Static (fp16.loss_scale > 0): the scale never changes, but an overflow
// still skips the step: DeepSpeed's ZeRO optimizers check the gradients for
// inf/nan whatever the scaler, and skip on overflow.
// Dynamic (fp16.loss_scale == 0): starts at 2^initial_scale_power. update():
//  - overflow, hysteresis left (hysteresis > 1 and cur_hysteresis > 1):
//    cur_hysteresis -= 1, the scale stays;
//  - overflow, hysteresis used up: if the scale already equals min_loss_scale,
//    throws EngineError (DeepSpeed raises "Current loss scale already at
//    minimum"); else scale = max(scale / 2, min_loss_scale). cur_hysteresis
//    stays used up, so further overflows halve again;
//  - every overflow sets last_overflow_iter = cur_iter;
//  - clean step: with consecutive_hysteresis, cur_hysteresis = hysteresis;
//    then if (cur_iter - last_overflow_iter) % loss_scale_window == 0 the scale
//    doubles (no upper bound) and, without consecutive_hysteresis,
//    cur_hysteresis = hysteresis;
//  - cur_iter += 1 after every update (not on the throw).
// So from the start the scale doubles after loss_scale_window clean steps,
// and after an overflow at iteration i again at i + loss_scale_window, and
// every loss_scale_window clean steps after that.
// fp16 not enabled: a static scale of 1 (DeepSpeed's CreateLossScaler for
// other dtypes).
//
// Logging: update() writes one info line (subsystem "fp16") for every
// overflow ("zero.fp16: overflow: skipping step, loss scale 65536 -> 32768";
// with hysteresis left "... loss scale stays 65536, hysteresis 2 -> 1"; with
// a static scale "... static loss scale 128 (iteration 7)") and for every
// doubling ("loss scale 1024 -> 2048 after 1000 steps without overflow").
// The engine need not log these again.
#include <cstdint>

#include "zero/config.h"

namespace zero {

// The scaler's state for checkpoints (DeepSpeed's names).
struct LossScalerState {
  double scale = 1.0;
  int64_t cur_hysteresis = 1;
  int64_t last_overflow_iter = -1;
  int64_t cur_iter = 0;
};

class LossScaler {
 public:
  explicit LossScaler(const Fp16Config& config);

  bool dynamic() const { return dynamic_; }
  // The factor the loss is multiplied by before backward.
  double scale() const { return state_.scale; }

  // Records one optimizer step's overflow verdict (inf/nan in any rank's
  // gradients, agreed on by all ranks) and adjusts the scale. Returns true
  // when the step must be skipped, i.e. `overflow`. Throws EngineError on an
  // overflow at min_loss_scale once hysteresis is used up, leaving the state
  // unchanged.
  bool update(bool overflow);

  LossScalerState state() const { return state_; }
  // Restores a checkpoint's state. A dynamic scaler takes all of it; a
  // static one keeps the configured scale and takes the counters.
  // cur_hysteresis is clamped to the configured hysteresis (a run may resume
  // with a smaller one). Throws EngineError for a scale that is not a
  // positive finite number or cur_hysteresis < 1.
  void set_state(const LossScalerState& state);

 private:
  bool dynamic_ = false;
  double min_scale_ = 1.0;
  int64_t window_ = 1000;
  int64_t hysteresis_ = 1;          // DeepSpeed's delayed_shift
  bool consecutive_hysteresis_ = false;
  LossScalerState state_;
};

}  // namespace zero
