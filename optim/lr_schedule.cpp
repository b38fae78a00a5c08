// DeepSpeed's learning-rate schedules as functions of the step count. The
// arithmetic follows deepspeed/runtime/lr_schedules.py operation by
// operation (same derived constants, same order), so values agree with
// DeepSpeed's to the last bit where the C library's log/cos agree with
// Python's math module. See Note [Which lr the k-th optimizer step uses].
#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "zero/error.h"
#include "zero/log.h"

namespace zero {
namespace {

constexpr double kPi = 3.14159265358979323846;   // Python's math.pi

std::string where(const std::string& type, const char* key) { return "scheduler " + type + ": " + key; }

}  // namespace

LrSchedule::LrSchedule(const SchedulerConfig& config, double base_lr, bool optimizer_has_betas)
    : config_(config), base_lr_(base_lr) {
  const std::string& type = config_.type;
  const SchedulerParams& p = config_.params;
  if (type.empty()) {
    kind_ = Kind::Constant;
  } else if (type == "WarmupLR") {
    kind_ = Kind::Warmup;
  } else if (type == "WarmupDecayLR") {
    kind_ = Kind::WarmupDecay;
  } else if (type == "WarmupCosineLR") {
    kind_ = Kind::WarmupCosine;
  } else if (type == "OneCycle") {
    kind_ = Kind::OneCycle;
  } else if (type == "LRRangeTest") {
    kind_ = Kind::RangeTest;
  } else {
    throw EngineError("scheduler type \"" + type +
                      "\" is not one zero implements; use WarmupLR, WarmupDecayLR, WarmupCosineLR, "
                      "OneCycle or LRRangeTest");
  }
  if (kind_ != Kind::Constant && p.last_batch_iteration < -1)
    throw EngineError(where(type, "last_batch_iteration") + " is " + std::to_string(p.last_batch_iteration) +
                      "; it must be -1 (start) or the index of the last batch done");

  if (kind_ == Kind::Warmup || kind_ == Kind::WarmupDecay || kind_ == Kind::WarmupCosine) {
    if (p.warmup_type != "log" && p.warmup_type != "linear")
      throw EngineError(where(type, "warmup_type") + " is \"" + p.warmup_type + "\"; use \"log\" or \"linear\"");
    linear_warmup_ = p.warmup_type == "linear";
    warmup_steps_ = std::max<int64_t>(2, p.warmup_num_steps);
    inverse_log_warmup_ = 1.0 / std::log(static_cast<double>(warmup_steps_));
    if (kind_ != Kind::Warmup && !p.total_num_steps)
      throw EngineError(where(type, "total_num_steps") +
                        " is not set; give it in the config or set Config::scheduler.params.total_num_steps");
  }
  if (kind_ == Kind::OneCycle) {
    if (p.cycle_first_step_size <= 0 || p.cycle_second_step_size <= 0)
      throw EngineError(where(type, "cycle_first_step_size") + " and cycle_second_step_size must be positive (" +
                        std::to_string(p.cycle_first_step_size) + ", " +
                        std::to_string(p.cycle_second_step_size) + ")");
    const double first = static_cast<double>(p.cycle_first_step_size);
    const double second = static_cast<double>(p.cycle_second_step_size);
    cycle_total_ = first + second;
    cycle_step_ratio_ = first / cycle_total_;
    // DeepSpeed: decay_step_size 0 turns both decays off; a rate of 0 turns
    // off its own decay. cycle_first/second_stair_count are stored and never
    // read by DeepSpeed's OneCycle, so they change nothing here either.
    skip_lr_decay_ = p.decay_step_size == 0 || p.decay_lr_rate == 0.0;
    skip_mom_decay_ = p.decay_step_size == 0 || p.decay_mom_rate == 0.0;
    cycle_momentum_ = p.cycle_momentum && optimizer_has_betas;
    if (p.cycle_momentum && !optimizer_has_betas)
      log::warn("lr_schedule",
                "scheduler OneCycle: cycle_momentum is off because the optimizer has no betas (as in DeepSpeed); "
                "only the learning rate cycles");
  }
  if (kind_ == Kind::RangeTest && p.lr_range_test_step_size <= 0)
    throw EngineError(where(type, "lr_range_test_step_size") + " must be positive, not " +
                      std::to_string(p.lr_range_test_step_size));
}

LrSchedule LrSchedule::from_config(const SchedulerConfig& scheduler, const OptimizerConfig& optimizer) {
  const auto kind = optimizer_kind_named(optimizer.type);  // none given: the lr alone
  const bool betas = kind && (is_adam(*kind) || *kind == OptimizerKind::lamb);
  return LrSchedule(scheduler, optimizer.params.lr, betas);
}

void LrSchedule::set_steps(int64_t steps) {
  if (steps < 0) throw EngineError("lr schedule: step count " + std::to_string(steps) + " is negative");
  steps_ = steps;
}

double LrSchedule::lr_at(int64_t steps) const {
  if (steps < 0) throw EngineError("lr schedule: step count " + std::to_string(steps) + " is negative");
  if (kind_ == Kind::Constant) return base_lr_;
  const SchedulerParams& p = config_.params;
  if (steps == 0) {
    // What DeepSpeed's constructor writes into the optimizer, or nothing
    // when resuming from a given last_batch_iteration.
    if (p.last_batch_iteration != -1) return base_lr_;
    switch (kind_) {
      case Kind::Warmup:
      case Kind::WarmupDecay: return p.warmup_min_lr;
      case Kind::WarmupCosine: return 0.0;
      case Kind::OneCycle: return p.cycle_min_lr;
      case Kind::RangeTest: return p.lr_range_test_min_lr;
      case Kind::Constant: break;
    }
    return base_lr_;
  }
  return lr_at_iteration(p.last_batch_iteration + steps);
}

std::optional<double> LrSchedule::momentum_at(int64_t steps) const {
  if (steps < 0) throw EngineError("lr schedule: step count " + std::to_string(steps) + " is negative");
  if (kind_ != Kind::OneCycle || !cycle_momentum_) return std::nullopt;
  const SchedulerParams& p = config_.params;
  if (steps == 0) {
    if (p.last_batch_iteration != -1) return std::nullopt;
    return p.cycle_min_mom;   // DeepSpeed's constructor sets betas = (cycle_min_mom, 0.99)
  }
  return momentum_at_iteration(p.last_batch_iteration + steps);
}

double LrSchedule::warmup_fraction(int64_t it) const {
  if (linear_warmup_) return static_cast<double>(it) / static_cast<double>(warmup_steps_);
  return inverse_log_warmup_ * std::log(static_cast<double>(it + 1));
}

double LrSchedule::one_cycle_scale(int64_t it) const {
  const double batch = static_cast<double>(it + 1);
  const double cycle = std::floor(1.0 + batch / cycle_total_);
  const double x = 1.0 + batch / cycle_total_ - cycle;
  if (x <= cycle_step_ratio_) return x / cycle_step_ratio_;
  return (x - 1.0) / (cycle_step_ratio_ - 1.0);
}

double LrSchedule::lr_at_iteration(int64_t it) const {
  const SchedulerParams& p = config_.params;
  switch (kind_) {
    case Kind::Constant: return base_lr_;
    case Kind::Warmup:
    case Kind::WarmupDecay: {
      double gamma = 1.0;
      if (it < warmup_steps_) {
        gamma = warmup_fraction(it);
      } else if (kind_ == Kind::WarmupDecay) {
        const int64_t total = *p.total_num_steps;
        gamma = std::max(0.0, static_cast<double>(total - it) /
                                  std::max(1.0, static_cast<double>(total - warmup_steps_)));
      }
      return p.warmup_min_lr + (p.warmup_max_lr - p.warmup_min_lr) * gamma;
    }
    case Kind::WarmupCosine: {
      double ratio;
      if (it < warmup_steps_) {
        ratio = p.warmup_min_ratio + warmup_fraction(it) * (1.0 - p.warmup_min_ratio);
      } else {
        const int64_t done = it - warmup_steps_ + 1;
        const int64_t span = *p.total_num_steps - warmup_steps_;
        if (span == 0)   // DeepSpeed fails here too (ZeroDivisionError)
          throw EngineError("scheduler WarmupCosineLR: the schedule ran past its warmup, and total_num_steps (" +
                            std::to_string(*p.total_num_steps) + ") equals the warmup length (max(2, "
                            "warmup_num_steps) = " + std::to_string(warmup_steps_) +
                            "), so there is no cosine phase; raise total_num_steps");
        const double c = (1.0 + std::cos(kPi * static_cast<double>(done) / static_cast<double>(span))) / 2.0;
        ratio = std::max(0.0, p.cos_min_ratio + (1.0 - p.cos_min_ratio) * c);
      }
      return base_lr_ * ratio;
    }
    case Kind::OneCycle: {
      if (static_cast<double>(it) < cycle_total_)
        return p.cycle_min_lr + (p.cycle_max_lr - p.cycle_min_lr) * one_cycle_scale(it);
      if (skip_lr_decay_) return p.cycle_min_lr;
      const double interval = (static_cast<double>(it) - cycle_total_ + 1.0) / static_cast<double>(p.decay_step_size);
      return p.cycle_min_lr / (1.0 + p.decay_lr_rate * interval);
    }
    case Kind::RangeTest: {
      double interval = static_cast<double>(it + 1) / static_cast<double>(p.lr_range_test_step_size);
      if (p.lr_range_test_staircase) interval = std::floor(interval);
      return p.lr_range_test_min_lr * (1.0 + p.lr_range_test_step_rate * interval);
    }
  }
  return base_lr_;
}

double LrSchedule::momentum_at_iteration(int64_t it) const {
  const SchedulerParams& p = config_.params;
  if (static_cast<double>(it) < cycle_total_)
    return p.cycle_max_mom - (p.cycle_max_mom - p.cycle_min_mom) * one_cycle_scale(it);
  if (skip_mom_decay_) return p.cycle_max_mom;
  const double interval = (static_cast<double>(it) - cycle_total_ + 1.0) / static_cast<double>(p.decay_step_size);
  return p.cycle_max_mom * (1.0 + p.decay_mom_rate * interval);
}

}  // namespace zero
