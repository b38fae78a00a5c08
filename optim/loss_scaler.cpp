// The fp16 loss scale: DeepSpeed's DynamicLossScaler.update_scale and static
// LossScaler, step for step. See optim/loss_scaler.h for the rules.
#include "optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "zero/error.h"
#include "zero/log.h"

namespace zero {
namespace {

std::string show(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

LossScaler::LossScaler(const Fp16Config& config) {
  if (!config.enabled) {
    dynamic_ = false;
    state_.scale = 1.0;
  } else if (config.loss_scale > 0.0) {
    dynamic_ = false;
    state_.scale = config.loss_scale;
  } else {
    dynamic_ = true;
    if (config.initial_scale_power < 0 || config.initial_scale_power > 127)
      throw EngineError("fp16.initial_scale_power " + std::to_string(config.initial_scale_power) +
                        " is out of range; use 0..127");
    if (config.loss_scale_window < 1)
      throw EngineError("fp16.loss_scale_window must be at least 1, not " + std::to_string(config.loss_scale_window));
    if (config.hysteresis < 1)
      throw EngineError("fp16.hysteresis must be at least 1, not " + std::to_string(config.hysteresis));
    if (!(config.min_loss_scale > 0.0) || !std::isfinite(config.min_loss_scale))
      throw EngineError("fp16.min_loss_scale must be a positive number, not " + show(config.min_loss_scale));
    state_.scale = std::ldexp(1.0, static_cast<int>(config.initial_scale_power));
    min_scale_ = config.min_loss_scale;
    window_ = config.loss_scale_window;
    hysteresis_ = config.hysteresis;
    consecutive_hysteresis_ = config.consecutive_hysteresis;
  }
  state_.cur_hysteresis = hysteresis_;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic_) {
    if (overflow)
      log::info("fp16", "overflow: skipping step, static loss scale " + show(state_.scale) +
                            " (iteration " + std::to_string(state_.cur_iter) + ")");
    ++state_.cur_iter;
    return overflow;
  }
  if (overflow) {
    if (hysteresis_ == 1 || state_.cur_hysteresis == 1) {
      if (state_.scale == min_scale_)
        throw EngineError("fp16 gradients overflowed (inf/nan) at iteration " + std::to_string(state_.cur_iter) +
                          " while the loss scale was already at fp16.min_loss_scale = " + show(min_scale_) +
                          ": it cannot decrease any more. Look for inf/nan in the loss or the data, "
                          "lower fp16.min_loss_scale, or train in bf16");
      const double next = std::max(state_.scale / 2.0, min_scale_);
      log::info("fp16", "overflow: skipping step, loss scale " + show(state_.scale) + " -> " + show(next));
      state_.scale = next;
    } else {
      log::info("fp16", "overflow: skipping step, loss scale stays " + show(state_.scale) + ", hysteresis " +
                            std::to_string(state_.cur_hysteresis) + " -> " +
                            std::to_string(state_.cur_hysteresis - 1));
      --state_.cur_hysteresis;
    }
    state_.last_overflow_iter = state_.cur_iter;
  } else {
    if (consecutive_hysteresis_) state_.cur_hysteresis = hysteresis_;
    if ((state_.cur_iter - state_.last_overflow_iter) % window_ == 0) {
      if (!consecutive_hysteresis_) state_.cur_hysteresis = hysteresis_;
      const double next = state_.scale * 2.0;
      log::info("fp16", "loss scale " + show(state_.scale) + " -> " + show(next) + " after " +
                            std::to_string(window_) + " steps without overflow");
      state_.scale = next;
    }
  }
  ++state_.cur_iter;
  return overflow;
}

void LossScaler::set_state(const LossScalerState& s) {
  if (!(s.scale > 0.0) || !std::isfinite(s.scale))
    throw EngineError("fp16 loss scaler state: scale " + show(s.scale) + " is not a positive finite number");
  if (s.cur_hysteresis < 1)
    throw EngineError("fp16 loss scaler state: cur_hysteresis " + std::to_string(s.cur_hysteresis) +
                      " is below 1");
  const double scale = dynamic_ ? s.scale : state_.scale;
  state_ = s;
  state_.scale = scale;
  state_.cur_hysteresis = std::min(s.cur_hysteresis, hysteresis_);
}

}  // namespace zero
