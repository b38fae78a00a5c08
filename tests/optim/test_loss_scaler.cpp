// zero::LossScaler over scripted overflow sequences. Expectations are
// derived by hand from DeepSpeed's DynamicLossScaler.update_scale rules, and
// one long script is checked against the states DeepSpeed's class itself
// produced (deepspeed/runtime/fp16/loss_scaler.py, DeepSpeed 0.16.5).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "optim/loss_scaler.h"
#include "zero/config.h"
#include "zero/error.h"

namespace {

using zero::Fp16Config;
using zero::LossScaler;
using zero::LossScalerState;

Fp16Config dynamic(int64_t power, int64_t window, int64_t hysteresis, bool consecutive = false,
                   double min_scale = 1.0) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

// Feeds a script of 'O' (overflow) and 'C' (clean); returns the scale after each.
std::vector<double> run(LossScaler& s, const std::string& script) {
  std::vector<double> scales;
  for (char ch : script) {
    const bool overflow = ch == 'O';
    EXPECT_EQ(s.update(overflow), overflow);
    scales.push_back(s.scale());
  }
  return scales;
}

TEST(LossScaler, DefaultsStartAt2To16) {
  Fp16Config c;
  c.enabled = true;
  LossScaler s(c);
  EXPECT_TRUE(s.dynamic());
  EXPECT_DOUBLE_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.state().cur_hysteresis, 2);
  EXPECT_EQ(s.state().last_overflow_iter, -1);
  EXPECT_EQ(s.state().cur_iter, 0);
}

TEST(LossScaler, HysteresisTwoFirstOverflowOnlyConsumesIt) {
  LossScaler s(dynamic(16, 1000, 2));
  EXPECT_TRUE(s.update(true));
  EXPECT_DOUBLE_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.state().cur_hysteresis, 1);
  EXPECT_TRUE(s.update(true));
  EXPECT_DOUBLE_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.state().cur_hysteresis, 1);   // stays used up: the next overflow halves again
  EXPECT_TRUE(s.update(true));
  EXPECT_DOUBLE_EQ(s.scale(), 16384.0);
  EXPECT_EQ(s.state().last_overflow_iter, 2);
  EXPECT_EQ(s.state().cur_iter, 3);
}

TEST(LossScaler, HysteresisOneHalvesAtOnce) {
  LossScaler s(dynamic(10, 1000, 1));
  EXPECT_EQ(run(s, "OOCO"), (std::vector<double>{512, 256, 256, 128}));
}

TEST(LossScaler, WindowOfCleanStepsDoubles) {
  LossScaler s(dynamic(10, 4, 2));
  // From the start: (cur_iter + 1) % 4 == 0 -> doubles on the 4th clean step.
  EXPECT_EQ(run(s, "CCCC"), (std::vector<double>{1024, 1024, 1024, 2048}));
  EXPECT_EQ(run(s, "CCCC"), (std::vector<double>{2048, 2048, 2048, 4096}));
  // An overflow at iteration 8 (hysteresis consumed, no halving); the window
  // restarts there: doubles at iteration 8 + 4 = 12.
  EXPECT_EQ(run(s, "O"), (std::vector<double>{4096}));
  EXPECT_EQ(s.state().cur_hysteresis, 1);
  EXPECT_EQ(s.state().last_overflow_iter, 8);
  EXPECT_EQ(run(s, "CCC"), (std::vector<double>{4096, 4096, 4096}));
  EXPECT_EQ(s.state().cur_hysteresis, 1);   // not refilled by clean steps alone
  EXPECT_EQ(run(s, "C"), (std::vector<double>{8192}));
  EXPECT_EQ(s.state().cur_hysteresis, 2);   // refilled when the scale doubles
}

TEST(LossScaler, WithoutConsecutiveHysteresisOverflowsAddUp) {
  LossScaler s(dynamic(10, 1000, 2, /*consecutive=*/false));
  // O: hysteresis 2 -> 1; C: nothing; O: halves.
  EXPECT_EQ(run(s, "OCO"), (std::vector<double>{1024, 1024, 512}));
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaler s(dynamic(10, 1000, 2, /*consecutive=*/true));
  // Only two overflows in a row halve.
  EXPECT_EQ(run(s, "OCOCOC"), (std::vector<double>{1024, 1024, 1024, 1024, 1024, 1024}));
  EXPECT_EQ(s.state().cur_hysteresis, 2);
  EXPECT_EQ(run(s, "OO"), (std::vector<double>{1024, 512}));
}

TEST(LossScaler, OverflowAtMinimumScaleIsAnError) {
  LossScaler s(dynamic(3, 1000, 1, false, /*min_scale=*/2.0));
  EXPECT_EQ(run(s, "OO"), (std::vector<double>{4, 2}));
  const LossScalerState before = s.state();
  try {
    s.update(true);
    FAIL() << "expected EngineError";
  } catch (const zero::EngineError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("min_loss_scale"), std::string::npos) << m;
    EXPECT_NE(m.find("already"), std::string::npos) << m;
  }
  EXPECT_DOUBLE_EQ(s.state().scale, before.scale);   // untouched by the throw
  EXPECT_EQ(s.state().cur_iter, before.cur_iter);
  EXPECT_FALSE(s.update(false));                    // a clean step still works
}

TEST(LossScaler, HalvingStopsAtMinimumThenErrors) {
  // max(scale / 2, min): 8 -> 4 -> 3 (clamped) -> error.
  LossScaler s(dynamic(3, 1000, 1, false, /*min_scale=*/3.0));
  EXPECT_EQ(run(s, "OO"), (std::vector<double>{4, 3}));
  EXPECT_THROW(s.update(true), zero::EngineError);
}

TEST(LossScaler, HysteresisLeftAtMinimumIsNoError) {
  // DeepSpeed checks the minimum only when it would halve.
  LossScaler s(dynamic(0, 1000, 3));   // starts at 2^0 = 1 = min_loss_scale
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_DOUBLE_EQ(s.scale(), 1.0);
  EXPECT_THROW(s.update(true), zero::EngineError);
}

TEST(LossScaler, StaticScaleNeverChangesButOverflowStillSkips) {
  Fp16Config c = dynamic(16, 2, 2);
  c.loss_scale = 128.0;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_DOUBLE_EQ(s.scale(), 128.0);
  EXPECT_TRUE(s.update(true));    // skip the step
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(s.update(false));
  EXPECT_DOUBLE_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.state().cur_iter, 13);
}

TEST(LossScaler, Fp16DisabledIsAStaticScaleOfOne) {
  LossScaler s(Fp16Config{});
  EXPECT_FALSE(s.dynamic());
  EXPECT_DOUBLE_EQ(s.scale(), 1.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_DOUBLE_EQ(s.scale(), 1.0);
}

TEST(LossScaler, StateRoundTrip) {
  LossScaler a(dynamic(12, 5, 3));
  run(a, "COOCCO");
  LossScaler b(dynamic(12, 5, 3));
  b.set_state(a.state());
  EXPECT_EQ(b.state().scale, a.state().scale);
  EXPECT_EQ(b.state().cur_hysteresis, a.state().cur_hysteresis);
  EXPECT_EQ(b.state().last_overflow_iter, a.state().last_overflow_iter);
  EXPECT_EQ(b.state().cur_iter, a.state().cur_iter);
  const std::string script = "OCCCCCCOOOCCCCCCCCCCC";
  EXPECT_EQ(run(a, script), run(b, script));

  // A static scaler keeps its configured scale; a resumed run with smaller
  // hysteresis clamps; nonsense is refused.
  Fp16Config st = dynamic(12, 5, 3);
  st.loss_scale = 64.0;
  LossScaler s(st);
  s.set_state({1024.0, 1, 7, 20});
  EXPECT_DOUBLE_EQ(s.scale(), 64.0);
  EXPECT_EQ(s.state().cur_iter, 20);
  LossScaler h(dynamic(12, 5, 2));
  h.set_state({1024.0, 3, 7, 20});
  EXPECT_EQ(h.state().cur_hysteresis, 2);
  EXPECT_DOUBLE_EQ(h.scale(), 1024.0);
  EXPECT_THROW(h.set_state({0.0, 1, -1, 0}), zero::EngineError);
  EXPECT_THROW(h.set_state({INFINITY, 1, -1, 0}), zero::EngineError);
  EXPECT_THROW(h.set_state({NAN, 1, -1, 0}), zero::EngineError);
  EXPECT_THROW(h.set_state({8.0, 0, -1, 0}), zero::EngineError);
}

// DeepSpeed's DynamicLossScaler(init_scale=2**10, scale_window=4,
// min_scale=1, delayed_shift=3, consecutive_hysteresis=...) fed this script;
// its (cur_scale, cur_hysteresis, last_overflow_iter, cur_iter) after each
// update_scale().
struct Expected {
  double scale;
  int64_t hysteresis, last_overflow, iter;
};
const char* const kScript = "CCOOCCCCCOCCOOOCCCCCCCCCOCOCCCCCCC";
const std::vector<Expected> kDeepSpeedPlain = {
    {1024, 3, -1, 1}, {1024, 3, -1, 2}, {1024, 2, 2, 3},    {1024, 1, 3, 4},    {1024, 1, 3, 5},
    {1024, 1, 3, 6},  {1024, 1, 3, 7},  {2048, 3, 3, 8},    {2048, 3, 3, 9},    {2048, 2, 9, 10},
    {2048, 2, 9, 11}, {2048, 2, 9, 12}, {2048, 1, 12, 13},  {1024, 1, 13, 14},  {512, 1, 14, 15},
    {512, 1, 14, 16}, {512, 1, 14, 17}, {512, 1, 14, 18},   {1024, 3, 14, 19},  {1024, 3, 14, 20},
    {1024, 3, 14, 21}, {1024, 3, 14, 22}, {2048, 3, 14, 23}, {2048, 3, 14, 24}, {2048, 2, 24, 25},
    {2048, 2, 24, 26}, {2048, 1, 26, 27}, {2048, 1, 26, 28}, {2048, 1, 26, 29}, {2048, 1, 26, 30},
    {4096, 3, 26, 31}, {4096, 3, 26, 32}, {4096, 3, 26, 33}, {4096, 3, 26, 34}};
const std::vector<Expected> kDeepSpeedConsecutive = {
    {1024, 3, -1, 1}, {1024, 3, -1, 2}, {1024, 2, 2, 3},    {1024, 1, 3, 4},    {1024, 3, 3, 5},
    {1024, 3, 3, 6},  {1024, 3, 3, 7},  {2048, 3, 3, 8},    {2048, 3, 3, 9},    {2048, 2, 9, 10},
    {2048, 3, 9, 11}, {2048, 3, 9, 12}, {2048, 2, 12, 13},  {2048, 1, 13, 14},  {1024, 1, 14, 15},
    {1024, 3, 14, 16}, {1024, 3, 14, 17}, {1024, 3, 14, 18}, {2048, 3, 14, 19}, {2048, 3, 14, 20},
    {2048, 3, 14, 21}, {2048, 3, 14, 22}, {4096, 3, 14, 23}, {4096, 3, 14, 24}, {4096, 2, 24, 25},
    {4096, 3, 24, 26}, {4096, 2, 26, 27}, {4096, 3, 26, 28}, {4096, 3, 26, 29}, {4096, 3, 26, 30},
    {8192, 3, 26, 31}, {8192, 3, 26, 32}, {8192, 3, 26, 33}, {8192, 3, 26, 34}};

void expect_deepspeed(bool consecutive, const std::vector<Expected>& expected) {
  LossScaler s(dynamic(10, 4, 3, consecutive));
  const std::string script = kScript;
  ASSERT_EQ(script.size(), expected.size());
  for (size_t i = 0; i < script.size(); ++i) {
    s.update(script[i] == 'O');
    const LossScalerState st = s.state();
    EXPECT_DOUBLE_EQ(st.scale, expected[i].scale) << "after update " << i;
    EXPECT_EQ(st.cur_hysteresis, expected[i].hysteresis) << "after update " << i;
    EXPECT_EQ(st.last_overflow_iter, expected[i].last_overflow) << "after update " << i;
    EXPECT_EQ(st.cur_iter, expected[i].iter) << "after update " << i;
  }
}

TEST(LossScaler, MatchesDeepSpeedScript) { expect_deepspeed(false, kDeepSpeedPlain); }
TEST(LossScaler, MatchesDeepSpeedScriptConsecutiveHysteresis) { expect_deepspeed(true, kDeepSpeedConsecutive); }

}  // namespace
