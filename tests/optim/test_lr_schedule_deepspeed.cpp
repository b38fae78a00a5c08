// zero::LrSchedule against values produced by DeepSpeed itself: the
// scheduler classes of deepspeed/runtime/lr_schedules.py (DeepSpeed 0.16.5,
// the version with "Add first Step in LR Schedulers") driven the way the
// engine drives them: an optimizer with lr 0.01 and betas (0.9, 0.999), the
// scheduler built with its defaults for last_batch_iteration, and for
// n = 0, 1, ... the lr and beta1 in the optimizer's param group recorded
// before the n-th scheduler.step() (i.e. what optimizer step n + 1 uses).
// Printed with Python's repr, so each literal is the exact double.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "optim/lr_schedule.h"
#include "zero/config.h"

namespace {

using zero::LrSchedule;
using zero::SchedulerConfig;

struct Row {
  const char* schedule;
  int64_t n;
  double lr;
  double beta1;   // 0.9: the optimizer's own (the schedule leaves it alone)
};

// clang-format off
const std::vector<Row> kDeepSpeed = {
    {"warmup_log", 0, 0.001, 0.9},
    {"warmup_log", 1, 0.001, 0.9},
    {"warmup_log", 2, 0.0037092699609758304, 0.9},
    {"warmup_log", 5, 0.007290730039024168, 0.9},
    {"warmup_log", 9, 0.009588182584953923, 0.9},
    {"warmup_log", 10, 0.009999999999999998, 0.9},
    {"warmup_log", 11, 0.010000000000000002, 0.9},
    {"warmup_log", 12, 0.010000000000000002, 0.9},
    {"warmup_log", 15, 0.010000000000000002, 0.9},
    {"warmup_log", 20, 0.010000000000000002, 0.9},
    {"warmup_log", 29, 0.010000000000000002, 0.9},
    {"warmup_log", 30, 0.010000000000000002, 0.9},
    {"warmup_log", 31, 0.010000000000000002, 0.9},
    {"warmup_log", 39, 0.010000000000000002, 0.9},
    {"warmup_linear", 0, 0.001, 0.9},
    {"warmup_linear", 1, 0.001, 0.9},
    {"warmup_linear", 2, 0.0019000000000000002, 0.9},
    {"warmup_linear", 5, 0.004600000000000001, 0.9},
    {"warmup_linear", 9, 0.008200000000000002, 0.9},
    {"warmup_linear", 10, 0.0091, 0.9},
    {"warmup_linear", 11, 0.010000000000000002, 0.9},
    {"warmup_linear", 12, 0.010000000000000002, 0.9},
    {"warmup_linear", 15, 0.010000000000000002, 0.9},
    {"warmup_linear", 20, 0.010000000000000002, 0.9},
    {"warmup_linear", 29, 0.010000000000000002, 0.9},
    {"warmup_linear", 30, 0.010000000000000002, 0.9},
    {"warmup_linear", 31, 0.010000000000000002, 0.9},
    {"warmup_linear", 39, 0.010000000000000002, 0.9},
    {"decay_linear", 0, 0.0, 0.9},
    {"decay_linear", 1, 0.0, 0.9},
    {"decay_linear", 2, 0.002, 0.9},
    {"decay_linear", 5, 0.008, 0.9},
    {"decay_linear", 9, 0.016, 0.9},
    {"decay_linear", 10, 0.018000000000000002, 0.9},
    {"decay_linear", 11, 0.02, 0.9},
    {"decay_linear", 12, 0.019, 0.9},
    {"decay_linear", 15, 0.016, 0.9},
    {"decay_linear", 20, 0.011000000000000001, 0.9},
    {"decay_linear", 29, 0.002, 0.9},
    {"decay_linear", 30, 0.001, 0.9},
    {"decay_linear", 31, 0.0, 0.9},
    {"decay_linear", 39, 0.0, 0.9},
    {"cosine_log", 0, 0.0, 0.9},
    {"cosine_log", 1, 0.001, 0.9},
    {"cosine_log", 2, 0.003709269960975831, 0.9},
    {"cosine_log", 5, 0.007290730039024168, 0.9},
    {"cosine_log", 9, 0.009588182584953923, 0.9},
    {"cosine_log", 10, 0.009999999999999998, 0.9},
    {"cosine_log", 11, 0.009941519617826905, 0.9},
    {"cosine_log", 12, 0.00976751845240198, 0.9},
    {"cosine_log", 15, 0.0086087572106361, 0.9},
    {"cosine_log", 20, 0.00525, 0.9},
    {"cosine_log", 29, 0.0005584803821730962, 0.9},
    {"cosine_log", 30, 0.0005, 0.9},
    {"cosine_log", 31, 0.0005584803821730957, 0.9},
    {"cosine_log", 39, 0.004506936291058902, 0.9},
    {"onecycle", 0, 0.001, 0.85},
    {"onecycle", 1, 0.0032500000000000025, 0.9249999999999999},
    {"onecycle", 2, 0.0055, 0.9},
    {"onecycle", 5, 0.0085, 0.8666666666666667},
    {"onecycle", 9, 0.0025000000000000014, 0.9333333333333332},
    {"onecycle", 10, 0.001, 0.95},
    {"onecycle", 11, 0.0008571428571428571, 0.9816666666666667},
    {"onecycle", 12, 0.00075, 1.0133333333333332},
    {"onecycle", 15, 0.0005454545454545455, 1.1083333333333334},
    {"onecycle", 20, 0.00037499999999999995, 1.2666666666666668},
    {"onecycle", 29, 0.00024000000000000003, 1.5516666666666665},
    {"onecycle", 30, 0.00023076923076923074, 1.5833333333333333},
    {"onecycle", 31, 0.00022222222222222223, 1.615},
    {"onecycle", 39, 0.00017142857142857145, 1.8683333333333334},
    {"range_stair", 0, 0.002, 0.9},
    {"range_stair", 1, 0.002, 0.9},
    {"range_stair", 2, 0.002, 0.9},
    {"range_stair", 5, 0.003, 0.9},
    {"range_stair", 9, 0.005, 0.9},
    {"range_stair", 10, 0.005, 0.9},
    {"range_stair", 11, 0.005, 0.9},
    {"range_stair", 12, 0.006, 0.9},
    {"range_stair", 15, 0.007, 0.9},
    {"range_stair", 20, 0.008, 0.9},
    {"range_stair", 29, 0.011, 0.9},
    {"range_stair", 30, 0.012, 0.9},
    {"range_stair", 31, 0.012, 0.9},
    {"range_stair", 39, 0.015, 0.9},
    {"range_cont", 0, 0.002, 0.9},
    {"range_cont", 1, 0.0023333333333333335, 0.9},
    {"range_cont", 2, 0.0026666666666666666, 0.9},
    {"range_cont", 5, 0.003666666666666667, 0.9},
    {"range_cont", 9, 0.005, 0.9},
    {"range_cont", 10, 0.005333333333333334, 0.9},
    {"range_cont", 11, 0.005666666666666666, 0.9},
    {"range_cont", 12, 0.006, 0.9},
    {"range_cont", 15, 0.007, 0.9},
    {"range_cont", 20, 0.008666666666666668, 0.9},
    {"range_cont", 29, 0.011666666666666665, 0.9},
    {"range_cont", 30, 0.012, 0.9},
    {"range_cont", 31, 0.012333333333333335, 0.9},
    {"range_cont", 39, 0.015, 0.9},
    {"warmup_resume", 0, 0.01, 0.9},
    {"warmup_resume", 1, 0.0055000000000000005, 0.9},
    {"warmup_resume", 2, 0.0064, 0.9},
    {"warmup_resume", 5, 0.0091, 0.9},
    {"warmup_resume", 9, 0.010000000000000002, 0.9},
    {"warmup_resume", 10, 0.010000000000000002, 0.9},
    {"warmup_resume", 11, 0.010000000000000002, 0.9},
    {"warmup_resume", 12, 0.010000000000000002, 0.9},
    {"warmup_resume", 15, 0.010000000000000002, 0.9},
    {"warmup_resume", 20, 0.010000000000000002, 0.9},
    {"warmup_resume", 29, 0.010000000000000002, 0.9},
    {"warmup_resume", 30, 0.010000000000000002, 0.9},
    {"warmup_resume", 31, 0.010000000000000002, 0.9},
    {"warmup_resume", 39, 0.010000000000000002, 0.9},
};
// clang-format on

std::map<std::string, SchedulerConfig> configs() {
  std::map<std::string, SchedulerConfig> m;
  auto warmup = [](const char* type, double lo, double hi, int64_t w, const char* kind) {
    SchedulerConfig c;
    c.type = type;
    c.params.warmup_min_lr = lo;
    c.params.warmup_max_lr = hi;
    c.params.warmup_num_steps = w;
    c.params.warmup_type = kind;
    return c;
  };
  m["warmup_log"] = warmup("WarmupLR", 0.001, 0.01, 10, "log");
  m["warmup_linear"] = warmup("WarmupLR", 0.001, 0.01, 10, "linear");
  m["decay_linear"] = warmup("WarmupDecayLR", 0.0, 0.02, 10, "linear");
  m["decay_linear"].params.total_num_steps = 30;
  SchedulerConfig cos;
  cos.type = "WarmupCosineLR";
  cos.params.total_num_steps = 30;
  cos.params.warmup_min_ratio = 0.1;
  cos.params.warmup_num_steps = 10;
  cos.params.cos_min_ratio = 0.05;
  cos.params.warmup_type = "log";
  m["cosine_log"] = cos;
  SchedulerConfig oc;
  oc.type = "OneCycle";
  oc.params.cycle_min_lr = 0.001;
  oc.params.cycle_max_lr = 0.01;
  oc.params.decay_lr_rate = 0.5;
  oc.params.cycle_first_step_size = 4;
  oc.params.cycle_second_step_size = 6;
  oc.params.decay_step_size = 3;
  oc.params.cycle_momentum = true;
  oc.params.cycle_min_mom = 0.85;
  oc.params.cycle_max_mom = 0.95;
  oc.params.decay_mom_rate = 0.1;
  m["onecycle"] = oc;
  SchedulerConfig rt;
  rt.type = "LRRangeTest";
  rt.params.lr_range_test_min_lr = 0.002;
  rt.params.lr_range_test_step_size = 3;
  rt.params.lr_range_test_step_rate = 0.5;
  rt.params.lr_range_test_staircase = true;
  m["range_stair"] = rt;
  rt.params.lr_range_test_staircase = false;
  m["range_cont"] = rt;
  m["warmup_resume"] = warmup("WarmupLR", 0.001, 0.01, 10, "linear");
  m["warmup_resume"].params.last_batch_iteration = 4;
  return m;
}

TEST(LrScheduleDeepSpeed, MatchesDeepSpeedStepByStep) {
  const auto cfgs = configs();
  for (const Row& row : kDeepSpeed) {
    LrSchedule s(cfgs.at(row.schedule), /*base_lr=*/0.01, /*optimizer_has_betas=*/true);
    EXPECT_DOUBLE_EQ(s.lr_at(row.n), row.lr) << row.schedule << " n=" << row.n;
    const double beta1 = s.momentum_at(row.n).value_or(0.9);
    EXPECT_DOUBLE_EQ(beta1, row.beta1) << row.schedule << " n=" << row.n;
  }
}

}  // namespace
