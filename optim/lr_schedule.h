#pragma once
// zero::LrSchedule: DeepSpeed's learning-rate schedulers (WarmupLR,
// WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest), with the formulas of
// deepspeed/runtime/lr_schedules.py, as a pure function of the number of
// optimizer steps taken. Torch-free.
//
// Note [Which lr the k-th optimizer step uses]
// DeepSpeed builds the scheduler with last_batch_iteration = -1, and the
// constructor writes an initial lr into the optimizer (since DeepSpeed 0.15.3,
// "Add first Step in LR Schedulers"). It does not call step() there. The
// engine then runs optimizer.step() followed by lr_scheduler.step() for every
// step that did not overflow (_take_model_step); a skipped step does not move
// the scheduler. So, with n = the number of optimizer steps applied so far:
//   lr_at(0)  = what the constructor writes (used by the FIRST step):
//               WarmupLR, WarmupDecayLR: warmup_min_lr;
//               WarmupCosineLR: 0 (DeepSpeed's get_lr() before any step);
//               OneCycle: cycle_min_lr (and momentum cycle_min_mom);
//               LRRangeTest: lr_range_test_min_lr;
//               no scheduler: the optimizer's lr.
//   lr_at(n)  = DeepSpeed's get_lr() at last_batch_iteration = n - 1, n >= 1.
// The k-th applied step (k = 1, 2, ...) uses lr_at(k - 1). The warmup formula
// at last_batch_iteration 0 is the minimum again, so with WarmupLR the first
// two steps both use warmup_min_lr, exactly as in DeepSpeed.
// When the config gives last_batch_iteration = L >= 0 (DeepSpeed's resume
// knob), the constructor leaves the optimizer alone: lr_at(0) is the
// optimizer's own lr (momentum_at(0) is nullopt), and lr_at(n) is get_lr() at
// last_batch_iteration L + n.
#include <cstdint>
#include <optional>
#include <string>

#include "zero/config.h"

namespace zero {

class LrSchedule {
 public:
  // What OneCycle writes as beta2 whenever it sets the momentum: DeepSpeed
  // assigns betas = (momentum, 0.99), replacing the optimizer's own beta2.
  static constexpr double kOneCycleBeta2 = 0.99;

  // `config.type` "" means a constant lr equal to `base_lr` (the optimizer's
  // lr). `optimizer_has_betas`: whether the optimizer has Adam-style betas
  // (Adam, AdamW, Lamb). Without them OneCycle does not cycle momentum and
  // one warning says so, as in DeepSpeed. Throws EngineError for an unknown
  // type or warmup_type, or parameters the formulas cannot use.
  LrSchedule(const SchedulerConfig& config, double base_lr, bool optimizer_has_betas = true);
  // base_lr = optimizer.params.lr; betas for Adam, AdamW and Lamb.
  static LrSchedule from_config(const SchedulerConfig& scheduler, const OptimizerConfig& optimizer);

  const std::string& type() const { return config_.type; }

  // The lr for the optimizer step that follows `steps` applied optimizer
  // steps (see Note [Which lr the k-th optimizer step uses]). steps >= 0.
  double lr_at(int64_t steps) const;
  // OneCycle with cycle_momentum (and an optimizer with betas): the beta1 to
  // set before that step, with beta2 = kOneCycleBeta2. nullopt: leave the
  // optimizer's momentum as it is.
  std::optional<double> momentum_at(int64_t steps) const;

  // The schedule's only state: the number of optimizer steps applied (steps
  // skipped on fp16 overflow do not count). Checkpoints save steps() and
  // restore it with set_steps(). DeepSpeed's equivalent state_dict() value is
  // last_batch_iteration = params.last_batch_iteration + steps().
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps);
  void advance() { ++steps_; }                 // after an applied optimizer step
  double lr() const { return lr_at(steps_); }  // for the next optimizer step
  std::optional<double> momentum() const { return momentum_at(steps_); }

 private:
  enum class Kind { Constant, Warmup, WarmupDecay, WarmupCosine, OneCycle, RangeTest };

  // DeepSpeed's get_lr() / get_mom() at last_batch_iteration `it` >= 0.
  double lr_at_iteration(int64_t it) const;
  double momentum_at_iteration(int64_t it) const;
  double warmup_fraction(int64_t it) const;     // 0 -> 1 over the warmup
  double one_cycle_scale(int64_t it) const;     // 0 -> 1 -> 0 over the cycle

  SchedulerConfig config_;
  Kind kind_ = Kind::Constant;
  double base_lr_ = 0.0;
  bool cycle_momentum_ = false;
  int64_t steps_ = 0;
  // Derived as DeepSpeed derives them.
  int64_t warmup_steps_ = 2;        // max(2, warmup_num_steps)
  double inverse_log_warmup_ = 0.0; // 1 / log(warmup_steps_)
  bool linear_warmup_ = false;
  double cycle_total_ = 0.0;        // first + second step size
  double cycle_step_ratio_ = 0.0;   // first / total
  bool skip_lr_decay_ = true;
  bool skip_mom_decay_ = true;
};

}  // namespace zero
