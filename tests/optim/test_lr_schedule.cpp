// zero::LrSchedule against closed forms written here, in terms of n = the
// number of optimizer steps applied so far (lr_at(n) is the lr of step n+1).
// DeepSpeed's formulas are stated in its last_batch_iteration, which is
// n - 1 after n scheduler.step() calls; the forms below are rewritten in n,
// so they check the index convention as well as the arithmetic.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "optim/lr_schedule.h"
#include "zero/config.h"
#include "zero/error.h"

namespace {

using zero::LrSchedule;
using zero::SchedulerConfig;

const double kPi = std::acos(-1.0);

SchedulerConfig warmup(const std::string& type, double min_lr, double max_lr, int64_t warmup_steps,
                       const std::string& warmup_type) {
  SchedulerConfig c;
  c.type = type;
  c.params.warmup_min_lr = min_lr;
  c.params.warmup_max_lr = max_lr;
  c.params.warmup_num_steps = warmup_steps;
  c.params.warmup_type = warmup_type;
  return c;
}

TEST(LrSchedule, NoSchedulerIsTheOptimizerLr) {
  LrSchedule s(SchedulerConfig{}, 3e-4);
  for (int64_t n : {0, 1, 2, 1000, 1000000}) {
    EXPECT_DOUBLE_EQ(s.lr_at(n), 3e-4) << n;
    EXPECT_FALSE(s.momentum_at(n).has_value()) << n;
  }
}

TEST(LrSchedule, WarmupLogFirstTwoStepsUseTheMinimum) {
  const double lo = 1e-4, hi = 2e-3;
  const int64_t W = 100;
  LrSchedule s(warmup("WarmupLR", lo, hi, W, "log"), 0.5);
  // DeepSpeed: min + (max - min) * log(lbi + 1) / log(W) with lbi = n - 1.
  auto expected = [&](int64_t n) {
    if (n == 0) return lo;                           // what the constructor writes
    if (n > W) return hi;                            // lbi >= W
    return lo + (hi - lo) * std::log(static_cast<double>(n)) / std::log(static_cast<double>(W));
  };
  EXPECT_DOUBLE_EQ(s.lr_at(0), lo);   // first optimizer step
  EXPECT_DOUBLE_EQ(s.lr_at(1), lo);   // second: log(1) = 0
  for (int64_t n : {0, 1, 2, 3, 10, 50, 99, 100, 101, 102, 5000}) EXPECT_NEAR(s.lr_at(n), expected(n), 1e-15) << n;
  EXPECT_NEAR(s.lr_at(W), hi, 1e-15);   // end of warmup (lbi = W - 1): log(W)/log(W)
  EXPECT_FALSE(s.momentum_at(5).has_value());
}

TEST(LrSchedule, WarmupLinear) {
  const double lo = 0.0, hi = 1e-3;
  const int64_t W = 8;
  LrSchedule s(warmup("WarmupLR", lo, hi, W, "linear"), 0.5);
  // lbi / W with lbi = n - 1; reaches max at lbi = W, i.e. n = W + 1.
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(2), hi * 1.0 / 8.0);
  EXPECT_DOUBLE_EQ(s.lr_at(5), hi * 4.0 / 8.0);
  EXPECT_DOUBLE_EQ(s.lr_at(W), hi * 7.0 / 8.0);
  EXPECT_DOUBLE_EQ(s.lr_at(W + 1), hi);
  EXPECT_DOUBLE_EQ(s.lr_at(1000), hi);
}

TEST(LrSchedule, WarmupStepsBelowTwoCountAsTwo) {
  // DeepSpeed: warmup_num_steps = max(2, warmup_num_steps).
  for (int64_t given : {0, 1, 2}) {
    LrSchedule lin(warmup("WarmupLR", 0.0, 1.0, given, "linear"), 1.0);
    EXPECT_DOUBLE_EQ(lin.lr_at(2), 0.5) << given;
    EXPECT_DOUBLE_EQ(lin.lr_at(3), 1.0) << given;
    LrSchedule log(warmup("WarmupLR", 0.0, 1.0, given, "log"), 1.0);
    EXPECT_DOUBLE_EQ(log.lr_at(1), 0.0) << given;
    EXPECT_DOUBLE_EQ(log.lr_at(2), 1.0) << given;   // log(2)/log(2)
  }
}

TEST(LrSchedule, WarmupDecayLinearToZero) {
  const double lo = 1e-5, hi = 1e-3;
  const int64_t W = 10, T = 50;
  SchedulerConfig c = warmup("WarmupDecayLR", lo, hi, W, "linear");
  c.params.total_num_steps = T;
  LrSchedule s(c, 0.5);
  // After warmup (lbi >= W): gamma = max(0, (T - lbi) / (T - W)), lbi = n - 1.
  auto expected = [&](int64_t n) {
    const int64_t lbi = n - 1;
    double gamma;
    if (n == 0) gamma = 0.0;
    else if (lbi < W) gamma = static_cast<double>(lbi) / W;
    else gamma = std::max(0.0, static_cast<double>(T - lbi) / (T - W));
    return lo + (hi - lo) * gamma;
  };
  EXPECT_DOUBLE_EQ(s.lr_at(0), lo);
  EXPECT_DOUBLE_EQ(s.lr_at(1), lo);
  EXPECT_DOUBLE_EQ(s.lr_at(W + 1), hi);                         // peak: lbi = W
  EXPECT_DOUBLE_EQ(s.lr_at(W + 1 + 20), lo + (hi - lo) * 0.5);  // mid-decay
  EXPECT_DOUBLE_EQ(s.lr_at(T + 1), lo);                         // lbi = T: gamma 0
  EXPECT_DOUBLE_EQ(s.lr_at(T + 100), lo);                       // past the end: stays at min
  for (int64_t n : {0, 1, 2, 5, 10, 11, 12, 30, 49, 50, 51, 52, 200}) EXPECT_NEAR(s.lr_at(n), expected(n), 1e-18) << n;
}

TEST(LrSchedule, WarmupDecayWithTotalBelowWarmup) {
  // DeepSpeed only warns; after the warmup gamma = max(0, (T - lbi) / max(1, T - W)) = 0.
  SchedulerConfig c = warmup("WarmupDecayLR", 0.0, 1.0, 10, "linear");
  c.params.total_num_steps = 5;
  LrSchedule s(c, 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.9);
  EXPECT_DOUBLE_EQ(s.lr_at(11), 0.0);
}

TEST(LrSchedule, WarmupCosine) {
  const double base = 6e-4, min_ratio = 0.1, cos_min = 0.01;
  const int64_t W = 20, T = 120;
  SchedulerConfig c;
  c.type = "WarmupCosineLR";
  c.params.total_num_steps = T;
  c.params.warmup_num_steps = W;
  c.params.warmup_min_ratio = min_ratio;
  c.params.cos_min_ratio = cos_min;
  c.params.warmup_type = "log";
  LrSchedule s(c, base);
  auto cosine = [&](int64_t n) {   // n - 1 >= W: done = n - W of T - W
    const double t = static_cast<double>(n - W) / static_cast<double>(T - W);
    return base * std::max(0.0, cos_min + (1.0 - cos_min) * (1.0 + std::cos(kPi * t)) / 2.0);
  };
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);               // DeepSpeed's get_lr() before any step
  EXPECT_DOUBLE_EQ(s.lr_at(1), base * min_ratio);  // log(1) = 0
  EXPECT_NEAR(s.lr_at(10), base * (min_ratio + (1 - min_ratio) * std::log(10.0) / std::log(20.0)), 1e-18);
  EXPECT_NEAR(s.lr_at(W), base, 1e-18);            // end of warmup
  EXPECT_NEAR(s.lr_at(W + 1), cosine(W + 1), 1e-18);
  EXPECT_NEAR(s.lr_at(70), base * (cos_min + (1 - cos_min) * 0.5), 1e-18);  // mid-decay: cos(pi/2)
  EXPECT_NEAR(s.lr_at(T), base * cos_min, 1e-18);  // the end: cos(pi)
  // Past total_num_steps DeepSpeed keeps evaluating the cosine, so the lr
  // rises again (it reaches base at done = 2 (T - W)). zero does the same.
  EXPECT_NEAR(s.lr_at(T + 1), cosine(T + 1), 1e-18);
  EXPECT_GT(s.lr_at(T + 1), s.lr_at(T));
  EXPECT_NEAR(s.lr_at(2 * T - W), base, 1e-15);
  for (int64_t n = W + 1; n <= T + 10; n += 7) EXPECT_NEAR(s.lr_at(n), cosine(n), 1e-18) << n;
}

TEST(LrSchedule, WarmupCosineLinearWarmup) {
  SchedulerConfig c;
  c.type = "WarmupCosineLR";
  c.params.total_num_steps = 100;
  c.params.warmup_num_steps = 10;
  c.params.warmup_min_ratio = 0.0;
  c.params.warmup_type = "linear";
  LrSchedule s(c, 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.9);
}

TEST(LrSchedule, WarmupCosineWithoutCosinePhaseFailsOnlyWhenReached) {
  // total_num_steps == max(2, warmup_num_steps): DeepSpeed divides by zero
  // once past the warmup; a run that stops before still works.
  SchedulerConfig c;
  c.type = "WarmupCosineLR";
  c.params.total_num_steps = 10;
  c.params.warmup_num_steps = 10;
  LrSchedule s(c, 1.0);
  EXPECT_NEAR(s.lr_at(10), 1.0, 1e-15);
  try {
    s.lr_at(11);
    FAIL() << "expected EngineError";
  } catch (const zero::EngineError& e) {
    EXPECT_NE(std::string(e.what()).find("total_num_steps"), std::string::npos) << e.what();
  }
}

SchedulerConfig one_cycle() {
  SchedulerConfig c;
  c.type = "OneCycle";
  c.params.cycle_min_lr = 1e-4;
  c.params.cycle_max_lr = 1e-3;
  c.params.cycle_first_step_size = 10;
  c.params.cycle_second_step_size = 30;
  c.params.cycle_min_mom = 0.85;
  c.params.cycle_max_mom = 0.95;
  return c;
}

TEST(LrSchedule, OneCyclePhases) {
  SchedulerConfig c = one_cycle();
  c.params.decay_step_size = 5;
  c.params.decay_lr_rate = 0.2;
  c.params.decay_mom_rate = 0.01;
  LrSchedule s(c, 0.5, /*optimizer_has_betas=*/true);
  const double lo = 1e-4, hi = 1e-3, mlo = 0.85, mhi = 0.95;
  const int64_t up = 10, down = 30, total = up + down;
  // DeepSpeed's scale uses lbi + 1 = n: up for n <= up, down until n = total.
  auto scale = [&](int64_t n) {
    return n <= up ? static_cast<double>(n) / up : static_cast<double>(total - n) / down;
  };
  EXPECT_DOUBLE_EQ(s.lr_at(0), lo);
  EXPECT_DOUBLE_EQ(*s.momentum_at(0), mlo);   // DeepSpeed's constructor writes cycle_min_mom
  for (int64_t n : {1, 2, 5, 9, 10, 11, 25, 39, 40}) {
    EXPECT_NEAR(s.lr_at(n), lo + (hi - lo) * scale(n), 1e-18) << n;
    EXPECT_NEAR(*s.momentum_at(n), mhi - (mhi - mlo) * scale(n), 1e-15) << n;
  }
  EXPECT_NEAR(s.lr_at(up), hi, 1e-18);                           // the peak
  EXPECT_NEAR(*s.momentum_at(up), mlo, 1e-15);
  EXPECT_NEAR(s.lr_at(up + 15), lo + (hi - lo) * 0.5, 1e-18);   // half-way down
  EXPECT_NEAR(s.lr_at(total), lo, 1e-18);
  // Decay (lbi >= total): interval = (n - total) / decay_step_size, continuous.
  for (int64_t n : {41, 42, 45, 50, 140}) {
    const double interval = static_cast<double>(n - total) / 5.0;
    EXPECT_NEAR(s.lr_at(n), lo / (1.0 + 0.2 * interval), 1e-18) << n;
    EXPECT_NEAR(*s.momentum_at(n), mhi * (1.0 + 0.01 * interval), 1e-15) << n;
  }
}

TEST(LrSchedule, OneCycleWithoutDecayHoldsMinLrAndMaxMomentum) {
  SchedulerConfig c = one_cycle();   // decay_step_size 0: no decay
  c.params.decay_lr_rate = 0.5;
  c.params.decay_mom_rate = 0.5;
  LrSchedule s(c, 0.5);
  for (int64_t n : {41, 100, 100000}) {
    EXPECT_DOUBLE_EQ(s.lr_at(n), 1e-4) << n;
    EXPECT_DOUBLE_EQ(*s.momentum_at(n), 0.95) << n;
  }
  // A decay step size with a zero lr rate decays only the momentum.
  c.params.decay_step_size = 10;
  c.params.decay_lr_rate = 0.0;
  LrSchedule t(c, 0.5);
  EXPECT_DOUBLE_EQ(t.lr_at(60), 1e-4);
  EXPECT_NEAR(*t.momentum_at(60), 0.95 * (1.0 + 0.5 * 2.0), 1e-15);
}

TEST(LrSchedule, OneCycleStairCountsChangeNothing) {
  // DeepSpeed's OneCycle stores cycle_first/second_stair_count and never
  // reads them: the cycle is continuous whatever they are.
  SchedulerConfig plain = one_cycle();
  SchedulerConfig stairs = one_cycle();
  stairs.params.cycle_first_stair_count = 3;
  stairs.params.cycle_second_stair_count = 5;
  LrSchedule a(plain, 0.5), b(stairs, 0.5);
  for (int64_t n = 0; n < 60; ++n) {
    EXPECT_DOUBLE_EQ(a.lr_at(n), b.lr_at(n)) << n;
    EXPECT_DOUBLE_EQ(*a.momentum_at(n), *b.momentum_at(n)) << n;
  }
}

TEST(LrSchedule, OneCycleMomentumNeedsBetas) {
  LrSchedule sgd(one_cycle(), 0.5, /*optimizer_has_betas=*/false);
  EXPECT_FALSE(sgd.momentum_at(0).has_value());
  EXPECT_FALSE(sgd.momentum_at(5).has_value());
  EXPECT_NEAR(sgd.lr_at(5), 1e-4 + 9e-4 * 0.5, 1e-18);   // the lr still cycles
  SchedulerConfig off = one_cycle();
  off.params.cycle_momentum = false;
  EXPECT_FALSE(LrSchedule(off, 0.5).momentum_at(5).has_value());
  EXPECT_DOUBLE_EQ(LrSchedule::kOneCycleBeta2, 0.99);
}

TEST(LrSchedule, FromConfigTakesLrAndBetasFromTheOptimizer) {
  zero::OptimizerConfig adam;
  adam.type = "AdamW";
  adam.params.lr = 0.25;
  zero::OptimizerConfig sgd;
  sgd.type = "SGD";
  EXPECT_DOUBLE_EQ(LrSchedule::from_config(SchedulerConfig{}, adam).lr_at(3), 0.25);
  EXPECT_TRUE(LrSchedule::from_config(one_cycle(), adam).momentum_at(3).has_value());
  EXPECT_FALSE(LrSchedule::from_config(one_cycle(), sgd).momentum_at(3).has_value());
}

TEST(LrSchedule, RangeTestContinuousAndStaircase) {
  SchedulerConfig c;
  c.type = "LRRangeTest";
  c.params.lr_range_test_min_lr = 1e-5;
  c.params.lr_range_test_step_size = 4;
  c.params.lr_range_test_step_rate = 2.0;
  LrSchedule cont(c, 0.5);
  // min * (1 + rate * (lbi + 1) / step_size), lbi + 1 = n (n = 0 gives min too).
  for (int64_t n : {0, 1, 2, 3, 4, 5, 8, 9, 100}) {
    EXPECT_NEAR(cont.lr_at(n), 1e-5 * (1.0 + 2.0 * static_cast<double>(n) / 4.0), 1e-18) << n;
    EXPECT_FALSE(cont.momentum_at(n).has_value());
  }
  c.params.lr_range_test_staircase = true;
  LrSchedule stair(c, 0.5);
  for (int64_t n : {0, 1, 2, 3, 4, 5, 7, 8, 9, 100})
    EXPECT_NEAR(stair.lr_at(n), 1e-5 * (1.0 + 2.0 * static_cast<double>(n / 4)), 1e-18) << n;
  EXPECT_DOUBLE_EQ(stair.lr_at(3), 1e-5);
  EXPECT_DOUBLE_EQ(stair.lr_at(4), 3e-5);
}

TEST(LrSchedule, GivenLastBatchIterationResumesThere) {
  // DeepSpeed's constructor leaves the optimizer's lr alone unless
  // last_batch_iteration is -1; each step then continues from L.
  SchedulerConfig c = warmup("WarmupLR", 0.0, 1.0, 10, "linear");
  c.params.last_batch_iteration = 4;
  LrSchedule s(c, 0.125);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.125);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.5);   // lbi 5
  EXPECT_DOUBLE_EQ(s.lr_at(6), 1.0);   // lbi 10
  SchedulerConfig oc = one_cycle();
  oc.params.last_batch_iteration = 0;
  LrSchedule o(oc, 0.5);
  EXPECT_DOUBLE_EQ(o.lr_at(0), 0.5);
  EXPECT_FALSE(o.momentum_at(0).has_value());   // betas untouched too
  EXPECT_NEAR(o.lr_at(1), 1e-4 + 9e-4 * 2.0 / 10.0, 1e-18);
}

TEST(LrSchedule, StateIsTheStepCount) {
  LrSchedule s(warmup("WarmupLR", 0.0, 1.0, 4, "linear"), 1.0);
  EXPECT_EQ(s.steps(), 0);
  EXPECT_DOUBLE_EQ(s.lr(), 0.0);
  s.advance();
  s.advance();
  s.advance();
  EXPECT_EQ(s.steps(), 3);
  EXPECT_DOUBLE_EQ(s.lr(), s.lr_at(3));
  EXPECT_DOUBLE_EQ(s.lr(), 0.5);
  LrSchedule resumed(warmup("WarmupLR", 0.0, 1.0, 4, "linear"), 1.0);
  resumed.set_steps(s.steps());
  EXPECT_DOUBLE_EQ(resumed.lr(), s.lr());
  EXPECT_FALSE(resumed.momentum().has_value());
  EXPECT_THROW(resumed.set_steps(-1), zero::EngineError);
  EXPECT_THROW(resumed.lr_at(-1), zero::EngineError);
}

TEST(LrSchedule, RejectsWhatItCannotCompute) {
  SchedulerConfig bad;
  bad.type = "CosineAnnealingLR";
  EXPECT_THROW(LrSchedule(bad, 1.0), zero::EngineError);
  EXPECT_THROW(LrSchedule(warmup("WarmupLR", 0.0, 1.0, 4, "exp"), 1.0), zero::EngineError);
  SchedulerConfig no_total = warmup("WarmupDecayLR", 0.0, 1.0, 4, "log");
  EXPECT_THROW(LrSchedule(no_total, 1.0), zero::EngineError);
}

TEST(LrSchedule, FromAParsedConfig) {
  // "auto" warmup_max_lr takes the optimizer's lr (the parser does it).
  auto cfg = zero::Config::from_json(R"({
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
    "scheduler": {"type": "WarmupDecayLR",
                  "params": {"warmup_max_lr": "auto", "warmup_num_steps": 4,
                             "warmup_type": "linear", "total_num_steps": 12}}})");
  LrSchedule s = LrSchedule::from_config(cfg.scheduler, cfg.optimizer);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.001);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.002);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.001);
  EXPECT_DOUBLE_EQ(s.lr_at(13), 0.0);
}

}  // namespace
