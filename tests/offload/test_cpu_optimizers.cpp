// The fused CPU optimizers (offload/cpu_optimizer.h) against torch::optim's
// Adam, AdamW and Adagrad elementwise, against a double-precision formula
// without bias correction, their fp16/bf16 copies against torch's .to(),
// and their bits across thread counts, tile splits and SIMD paths. Every
// test runs each SIMD path this CPU has (the list is printed).
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/torch_compat.h"
#include "offload/cpu_optimizer.h"
#include "zero/error.h"

namespace {

using zero::offload::AdagradStep;
using zero::offload::AdamStep;
using zero::offload::CopyDtype;
using zero::offload::Simd;

const std::vector<int64_t> kSizes = {1, 7, 15, 17, 1023, (1 << 20) + 3};
constexpr int kSteps = 5;

std::vector<Simd> paths() {
  std::vector<Simd> out;
  for (Simd s : {Simd::kAvx512, Simd::kAvx2, Simd::kPortable})
    if (zero::offload::simd_supported(s)) out.push_back(s);
  return out;
}

std::string path_list() {
  std::string s;
  for (Simd p : paths()) s += (s.empty() ? "" : " ") + std::string(zero::offload::simd_name(p));
  return s;
}

float* fp(const at::Tensor& t) { return t.data_ptr<float>(); }

// |ours - ref| <= rtol * |ref| + floor * max|ref| for every element (a NaN
// fails). Reports the first mismatches and the count.
::testing::AssertionResult near(const std::string& what, const float* ours, const float* ref, int64_t n,
                                double rtol = 1e-6, double floor = 1e-7) {
  double maxabs = 0;
  for (int64_t i = 0; i < n; ++i) maxabs = std::max(maxabs, std::fabs(static_cast<double>(ref[i])));
  const double atol = floor * maxabs;
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(ours[i]) - static_cast<double>(ref[i]));
    if (!(d <= rtol * std::fabs(static_cast<double>(ref[i])) + atol)) {
      if (bad < 3)
        first << " [" << i << "] ours " << ours[i] << " ref " << ref[i] << " (|diff| " << d << ");";
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << n << " elements differ beyond " << rtol
                                       << " relative + " << atol << " absolute:" << first.str();
}

::testing::AssertionResult near(const std::string& what, const at::Tensor& ours, const at::Tensor& ref,
                                double rtol = 1e-6, double floor = 1e-7) {
  return near(what, fp(ours), fp(ref.contiguous()), ours.numel(), rtol, floor);
}

::testing::AssertionResult same_bits(const std::string& what, const void* a, const void* b, int64_t bytes) {
  if (std::memcmp(a, b, static_cast<size_t>(bytes)) == 0) return ::testing::AssertionSuccess();
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  int64_t i = 0;
  while (x[i] == y[i]) ++i;
  return ::testing::AssertionFailure() << what << ": bits differ, first at byte " << i;
}

bool half_is_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0; }

// Our copy against torch's conversion of our updated fp32 parameter: the
// same bits for every non-NaN value, a NaN for a NaN.
::testing::AssertionResult copy_matches_torch(const std::string& what, const at::Tensor& param,
                                              const std::vector<uint16_t>& copy, CopyDtype dt) {
  if (dt == CopyDtype::kNone) return ::testing::AssertionSuccess();
  const bool half = dt == CopyDtype::kHalf;
  const at::Tensor t = param.to(half ? at::kHalf : at::kBFloat16).contiguous();
  const auto* ref = static_cast<const uint16_t*>(t.data_ptr());
  const float* p = fp(param);
  int64_t bad = 0;
  std::ostringstream first;
  for (int64_t i = 0; i < param.numel(); ++i) {
    const bool ok = std::isnan(p[i]) ? (half ? half_is_nan(copy[i]) : bf16_is_nan(copy[i])) : copy[i] == ref[i];
    if (!ok) {
      if (bad < 3) {
        uint32_t u;
        std::memcpy(&u, &p[i], 4);
        first << std::hex << " [" << std::dec << i << "] fp32 0x" << std::hex << u << " ours 0x" << copy[i]
              << " torch 0x" << ref[i] << std::dec << ";";
      }
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << (half ? " fp16" : " bf16") << " copy: " << bad << " of "
                                       << param.numel() << " differ from torch's .to():" << first.str();
}

const char* copy_name(CopyDtype dt) {
  return dt == CopyDtype::kHalf ? "fp16" : dt == CopyDtype::kBFloat16 ? "bf16" : "none";
}

// Our arrays for one run.
struct Ours {
  at::Tensor p, s1, s2;  // s1: exp_avg or sum, s2: exp_avg_sq
  std::vector<uint16_t> copy;
  explicit Ours(const at::Tensor& p0)
      : p(p0.clone()), s1(torch::zeros_like(p0)), s2(torch::zeros_like(p0)), copy(p0.numel(), 0xDEAD) {}
};

// ---- torch::optim::Adam / AdamW ------------------------------------------------------------------

enum class Kind { kAdam, kAdamW, kAdagrad };
const char* kind_name(Kind k) { return k == Kind::kAdam ? "Adam" : k == Kind::kAdamW ? "AdamW" : "Adagrad"; }

struct Hyper {
  float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.99f, eps = 1e-6f, weight_decay = 0.1f, lr_decay = 0.01f;
};

std::unique_ptr<torch::optim::Optimizer> make_torch(Kind k, const Hyper& h, const at::Tensor& p) {
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  switch (k) {
    case Kind::kAdam:
      return std::make_unique<torch::optim::Adam>(
          std::vector<at::Tensor>{p}, torch::optim::AdamOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd));
    case Kind::kAdamW:
      return std::make_unique<torch::optim::AdamW>(
          std::vector<at::Tensor>{p}, torch::optim::AdamWOptions(lr).betas({b1, b2}).eps(eps).weight_decay(wd));
    case Kind::kAdagrad:
      return std::make_unique<torch::optim::Adagrad>(
          std::vector<at::Tensor>{p},
          torch::optim::AdagradOptions(lr).lr_decay(h.lr_decay).weight_decay(wd).eps(eps).initial_accumulator_value(0));
  }
  return nullptr;
}

// torch's states for p after a step: (exp_avg, exp_avg_sq) or (sum, undefined).
std::pair<at::Tensor, at::Tensor> torch_states(Kind k, torch::optim::Optimizer& opt, const at::Tensor& p) {
  auto& st = *opt.state().at(zero::compat::optimizer_state_key(p));
  switch (k) {
    case Kind::kAdam: {
      auto& s = static_cast<torch::optim::AdamParamState&>(st);
      return {s.exp_avg(), s.exp_avg_sq()};
    }
    case Kind::kAdamW: {
      auto& s = static_cast<torch::optim::AdamWParamState&>(st);
      return {s.exp_avg(), s.exp_avg_sq()};
    }
    case Kind::kAdagrad: return {static_cast<torch::optim::AdagradParamState&>(st).sum(), at::Tensor()};
  }
  return {};
}

void our_step(Kind k, const Hyper& h, int64_t step, Ours& o, const at::Tensor& g, CopyDtype dt, Simd simd) {
  const int64_t n = o.p.numel();
  uint16_t* copy = dt == CopyDtype::kNone ? nullptr : o.copy.data();
  if (k == Kind::kAdagrad) {
    AdagradStep a;
    a.lr = h.lr;
    a.lr_decay = h.lr_decay;
    a.eps = h.eps;
    a.weight_decay = h.weight_decay;
    a.step = step;
    zero::offload::adagrad_step(a, n, fp(o.p), fp(g), fp(o.s1), copy, dt, simd);
  } else {
    AdamStep a;
    a.lr = h.lr;
    a.beta1 = h.beta1;
    a.beta2 = h.beta2;
    a.eps = h.eps;
    a.weight_decay = h.weight_decay;
    a.decoupled_weight_decay = k == Kind::kAdamW;
    a.step = step;
    zero::offload::adam_step(a, n, fp(o.p), fp(g), fp(o.s1), fp(o.s2), copy, dt, simd);
  }
}

// Parameters around 0.1 (so that an update of lr is a large part of them),
// some exactly zero, gradients of mixed scales with some zeros.
at::Tensor make_params(int64_t n) {
  at::Tensor p = torch::randn({n}) * 0.1;
  if (n > 4) p.index_put_({torch::indexing::Slice(0, n, 5)}, 0.0);
  return p;
}
at::Tensor make_grad(int64_t n) {
  at::Tensor g = torch::randn({n}) * torch::exp(torch::randn({n}));
  if (n > 6) g.index_put_({torch::indexing::Slice(1, n, 7)}, 0.0);
  return g;
}

// kSteps steps of ours (each path, with a copy) and torch's on the same
// parameters and gradients; parameters, states and the copy checked after each step.
void against_torch(Kind kind, CopyDtype dt) {
  const Hyper h;
  std::cout << "[ paths ] " << kind_name(kind) << " copy " << copy_name(dt) << ": " << path_list() << "\n";
  for (int64_t n : kSizes) {
    torch::manual_seed(1000 + n);
    const at::Tensor p0 = make_params(n);
    at::Tensor tp = p0.clone();
    auto opt = make_torch(kind, h, tp);
    std::vector<Ours> ours;
    for (size_t i = 0; i < paths().size(); ++i) ours.emplace_back(p0);
    for (int64_t step = 1; step <= kSteps; ++step) {
      const at::Tensor g = make_grad(n);
      tp.mutable_grad() = g.clone();
      opt->step();
      auto [t1, t2] = torch_states(kind, *opt, tp);
      for (size_t i = 0; i < paths().size(); ++i) {
        const Simd simd = paths()[i];
        const std::string what = std::string(kind_name(kind)) + " " + zero::offload::simd_name(simd) + " n=" +
                                 std::to_string(n) + " step " + std::to_string(step);
        our_step(kind, h, step, ours[i], g, dt, simd);
        ASSERT_TRUE(near(what + " param", ours[i].p, tp));
        // States may cancel towards zero (m = 0.9 m + 0.1 g of opposite
        // signs): a floor of 1e-6 of their largest magnitude.
        ASSERT_TRUE(near(what + (kind == Kind::kAdagrad ? " sum" : " exp_avg"), ours[i].s1, t1, 1e-6, 1e-6));
        if (t2.defined()) ASSERT_TRUE(near(what + " exp_avg_sq", ours[i].s2, t2, 1e-6, 1e-6));
        ASSERT_TRUE(copy_matches_torch(what, ours[i].p, ours[i].copy, dt));
      }
    }
  }
}

TEST(CpuOptimizers, AdamMatchesTorch) { against_torch(Kind::kAdam, CopyDtype::kNone); }
TEST(CpuOptimizers, AdamWMatchesTorch) { against_torch(Kind::kAdamW, CopyDtype::kNone); }
TEST(CpuOptimizers, AdagradMatchesTorch) { against_torch(Kind::kAdagrad, CopyDtype::kNone); }
TEST(CpuOptimizers, AdamWWithFp16CopyMatchesTorch) { against_torch(Kind::kAdamW, CopyDtype::kHalf); }
TEST(CpuOptimizers, AdamWithBf16CopyMatchesTorch) { against_torch(Kind::kAdam, CopyDtype::kBFloat16); }
TEST(CpuOptimizers, AdagradWithBf16CopyMatchesTorch) { against_torch(Kind::kAdagrad, CopyDtype::kBFloat16); }

// fp16/bf16 gradients (the training dtype's reduced gradients, as the
// engine hands them over) scaled as they are read: against torch::optim on
// the widened, scaled fp32 gradient, and the same bits as our step on that
// fp32 gradient. 0.375 is not a power of two, so the scale rounds.
void sixteen_bit_grads_against_torch(Kind kind, at::ScalarType grad_type) {
  const Hyper h;
  const float scale = 0.375f;
  const auto gt = grad_type == at::kHalf ? zero::offload::GradDtype::kHalf : zero::offload::GradDtype::kBFloat16;
  for (int64_t n : kSizes) {
    torch::manual_seed(3000 + n);
    const at::Tensor p0 = make_params(n);
    at::Tensor tp = p0.clone();
    auto opt = make_torch(kind, h, tp);
    for (Simd simd : paths()) {
      Ours ours(p0), widened(p0);
      at::Tensor ref = p0.clone();
      auto ref_opt = make_torch(kind, h, ref);
      for (int64_t step = 1; step <= 3; ++step) {
        const at::Tensor g16 = make_grad(n).to(grad_type);
        const at::Tensor g32 = g16.to(at::kFloat).mul(scale);
        ref.mutable_grad() = g32.clone();
        ref_opt->step();
        const std::string what = std::string(kind_name(kind)) + " " + zero::offload::simd_name(simd) +
                                 (grad_type == at::kHalf ? " fp16" : " bf16") + " grads n=" + std::to_string(n) +
                                 " step " + std::to_string(step);
        const zero::offload::GradArray grad(static_cast<const uint16_t*>(g16.data_ptr()), gt);
        if (kind == Kind::kAdagrad) {
          AdagradStep a;
          a.lr = h.lr, a.lr_decay = h.lr_decay, a.eps = h.eps, a.weight_decay = h.weight_decay, a.step = step;
          zero::offload::adagrad_step(a, n, fp(widened.p), fp(g32), fp(widened.s1), nullptr, CopyDtype::kNone, simd);
          a.grad_scale = scale;
          zero::offload::adagrad_step(a, n, fp(ours.p), grad, fp(ours.s1), nullptr, CopyDtype::kNone, simd);
        } else {
          AdamStep a;
          a.lr = h.lr, a.beta1 = h.beta1, a.beta2 = h.beta2, a.eps = h.eps, a.weight_decay = h.weight_decay;
          a.decoupled_weight_decay = kind == Kind::kAdamW, a.step = step;
          zero::offload::adam_step(a, n, fp(widened.p), fp(g32), fp(widened.s1), fp(widened.s2), nullptr,
                                   CopyDtype::kNone, simd);
          a.grad_scale = scale;
          zero::offload::adam_step(a, n, fp(ours.p), grad, fp(ours.s1), fp(ours.s2), nullptr, CopyDtype::kNone, simd);
        }
        ASSERT_TRUE(near(what + " param", ours.p, ref));
        ASSERT_TRUE(same_bits(what + " param vs the fp32 gradient", fp(ours.p), fp(widened.p), n * 4));
        ASSERT_TRUE(same_bits(what + " state vs the fp32 gradient", fp(ours.s1), fp(widened.s1), n * 4));
      }
    }
  }
}

TEST(CpuOptimizers, AdamWWithBf16GradientsMatchesTorch) { sixteen_bit_grads_against_torch(Kind::kAdamW, at::kBFloat16); }
TEST(CpuOptimizers, AdamWithFp16GradientsMatchesTorch) { sixteen_bit_grads_against_torch(Kind::kAdam, at::kHalf); }
TEST(CpuOptimizers, AdagradWithFp16GradientsMatchesTorch) { sixteen_bit_grads_against_torch(Kind::kAdagrad, at::kHalf); }

// The comparison is tight enough to see a wrong bias correction (step off by
// one) or a wrong epsilon: the tests above can fail.
TEST(CpuOptimizers, ComparisonCatchesWrongStepOrEps) {
  const Hyper h;
  const int64_t n = 1023;
  torch::manual_seed(7);
  const at::Tensor p0 = make_params(n);
  for (Simd simd : paths()) {
    at::Tensor tp = p0.clone();
    auto opt = make_torch(Kind::kAdamW, h, tp);
    Ours wrong_step(p0), wrong_eps(p0);
    Hyper h_eps = h;
    h_eps.eps = h.eps * 1.01f;
    bool step_caught = false, eps_caught = false;
    for (int64_t step = 1; step <= 3; ++step) {
      const at::Tensor g = make_grad(n);
      tp.mutable_grad() = g.clone();
      opt->step();
      our_step(Kind::kAdamW, h, step + 1, wrong_step, g, CopyDtype::kNone, simd);
      our_step(Kind::kAdamW, h_eps, step, wrong_eps, g, CopyDtype::kNone, simd);
      step_caught = step_caught || !near("", wrong_step.p, tp);
      eps_caught = eps_caught || !near("", wrong_eps.p, tp);
    }
    EXPECT_TRUE(step_caught) << zero::offload::simd_name(simd);
    EXPECT_TRUE(eps_caught) << zero::offload::simd_name(simd);
  }
}

// ---- bias_correction = false, against the formula in double ---------------------------------------

TEST(CpuOptimizers, AdamWithoutBiasCorrectionMatchesFormula) {
  std::cout << "[ paths ] " << path_list() << "\n";
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.99f, eps = 1e-6f, wd = 0.1f;
  for (bool decoupled : {false, true}) {
    for (int64_t n : {int64_t{17}, int64_t{1023}, int64_t{(1 << 20) + 3}}) {
      torch::manual_seed(2000 + n);
      const at::Tensor p0 = make_params(n);
      std::vector<double> rp(p0.data_ptr<float>(), p0.data_ptr<float>() + n), rm(n, 0.0), rv(n, 0.0);
      std::vector<Ours> ours;
      for (size_t i = 0; i < paths().size(); ++i) ours.emplace_back(p0);
      for (int64_t step = 1; step <= kSteps; ++step) {
        const at::Tensor g = make_grad(n);
        const float* gp = fp(g);
        for (int64_t j = 0; j < n; ++j) {
          double gj = gp[j];
          if (!decoupled) gj += double{wd} * rp[j];
          if (decoupled) rp[j] *= 1.0 - double{lr} * double{wd};
          rm[j] = double{b1} * rm[j] + (1.0 - double{b1}) * gj;
          rv[j] = double{b2} * rv[j] + (1.0 - double{b2}) * gj * gj;
          rp[j] -= double{lr} * rm[j] / (std::sqrt(rv[j]) + double{eps});
        }
        std::vector<float> ref(rp.begin(), rp.end());
        for (size_t i = 0; i < paths().size(); ++i) {
          AdamStep a;
          a.lr = lr;
          a.beta1 = b1;
          a.beta2 = b2;
          a.eps = eps;
          a.weight_decay = wd;
          a.decoupled_weight_decay = decoupled;
          a.bias_correction = false;
          a.step = step;
          Ours& o = ours[i];
          zero::offload::adam_step(a, n, fp(o.p), gp, fp(o.s1), fp(o.s2), nullptr, CopyDtype::kNone, paths()[i]);
          ASSERT_TRUE(near(std::string(zero::offload::simd_name(paths()[i])) + (decoupled ? " AdamW" : " Adam") +
                               " n=" + std::to_string(n) + " step " + std::to_string(step),
                           fp(o.p), ref.data(), n));
        }
      }
    }
  }
}

// ---- fp16 / bf16 copies: every kind of float ------------------------------------------------------

// With lr = 0 and zero gradients the parameter stays as it is, so the copy is
// the conversion of any fp32 value we like: random bit patterns (all
// exponents, infinities, NaNs, subnormals) and the rounding edge cases.
TEST(CpuOptimizers, CopiesRoundLikeTorch) {
  std::cout << "[ paths ] " << path_list() << "\n";
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFBFFFFFu,
      0x477FE000u,  // 65504: fp16 max
      0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0xC77FF000u,  // around the fp16 overflow tie (65520)
      0x7F7FFFFFu, 0xFF7FFFFFu,                            // fp32 max: bf16 inf
      0x38800000u, 0x387FFFFFu, 0x387FF000u, 0x387FE000u,  // around the smallest normal fp16 (2^-14)
      0x33800000u, 0x33000000u, 0x33000001u, 0x33C00000u,  // 2^-24, the 2^-25 tie, above it, 1.5*2^-24
      0x33400000u, 0x32FFFFFFu, 0x00000001u, 0x807FFFFFu,  // 0.75*2^-24, below the tie, fp32 subnormals
      0x3F801000u, 0x3F803000u, 0x3F800FFFu, 0x3F801001u,  // fp16 ties at 1 (even, odd) and neighbours
      0x3F808000u, 0x3F818000u, 0x3F807FFFu, 0x3F808001u,  // bf16 ties at 1 (even, odd) and neighbours
      0x7F7F8000u, 0x7F7F7FFFu, 0xBF7F8000u,
  };
  torch::manual_seed(3);
  const at::Tensor r = torch::randint(0, 1LL << 32, {(1 << 16) + 11}, at::kLong);
  const int64_t* rp = r.data_ptr<int64_t>();
  for (int64_t i = 0; i < r.numel(); ++i) bits.push_back(static_cast<uint32_t>(rp[i]));
  const int64_t n = static_cast<int64_t>(bits.size());
  at::Tensor p0 = torch::empty({n});
  std::memcpy(fp(p0), bits.data(), bits.size() * 4);
  const at::Tensor g = torch::zeros({n});
  for (Simd simd : paths()) {
    for (CopyDtype dt : {CopyDtype::kHalf, CopyDtype::kBFloat16}) {
      const std::string what = std::string(zero::offload::simd_name(simd)) + " " + copy_name(dt);
      Ours a(p0), b(p0);
      AdamStep h;
      h.lr = 0.0f;
      zero::offload::adam_step(h, n, fp(a.p), fp(g), fp(a.s1), fp(a.s2), a.copy.data(), dt, simd);
      AdagradStep ha;
      ha.lr = 0.0f;
      zero::offload::adagrad_step(ha, n, fp(b.p), fp(g), fp(b.s1), b.copy.data(), dt, simd);
      // The parameter did not move (NaNs aside), so the copy saw every value.
      const at::Tensor unchanged = (a.p == p0) | torch::isnan(p0);
      ASSERT_TRUE(unchanged.all().item<bool>()) << what;
      ASSERT_TRUE((b.p.eq(p0) | torch::isnan(p0)).all().item<bool>()) << what;
      EXPECT_TRUE(copy_matches_torch(what + " adam", a.p, a.copy, dt));
      EXPECT_TRUE(copy_matches_torch(what + " adagrad", b.p, b.copy, dt));
      EXPECT_TRUE(same_bits(what + " adam vs adagrad copy", a.copy.data(), b.copy.data(), n * 2));
    }
  }
}

// ---- bits: thread counts, tile splits, paths ---------------------------------------------------------

struct Snapshot {
  at::Tensor p, s1, s2;
  std::vector<uint16_t> copy;
};

// Three steps of `kind` over n elements, each step split into calls at `cuts`
// (offsets, ascending; empty: one call), inside `run` (a thread setting).
Snapshot run_steps(Kind kind, Simd simd, CopyDtype dt, int64_t n, const std::vector<int64_t>& cuts,
                   const std::function<void(const std::function<void()>&)>& run) {
  const Hyper h;
  torch::manual_seed(4);
  Ours o(make_params(n));
  for (int64_t step = 1; step <= 3; ++step) {
    const at::Tensor g = make_grad(n);
    run([&] {
      std::vector<int64_t> bounds = {0};
      for (int64_t c : cuts) bounds.push_back(c);
      bounds.push_back(n);
      for (size_t k = 0; k + 1 < bounds.size(); ++k) {
        const int64_t off = bounds[k], len = bounds[k + 1] - bounds[k];
        uint16_t* copy = dt == CopyDtype::kNone ? nullptr : o.copy.data() + off;
        if (kind == Kind::kAdagrad) {
          AdagradStep a;
          a.lr = h.lr;
          a.lr_decay = h.lr_decay;
          a.weight_decay = h.weight_decay;
          a.step = step;
          zero::offload::adagrad_step(a, len, fp(o.p) + off, fp(g) + off, fp(o.s1) + off, copy, dt, simd);
        } else {
          AdamStep a;
          a.lr = h.lr;
          a.beta1 = h.beta1;
          a.beta2 = h.beta2;
          a.eps = h.eps;
          a.weight_decay = h.weight_decay;
          a.decoupled_weight_decay = kind == Kind::kAdamW;
          a.step = step;
          zero::offload::adam_step(a, len, fp(o.p) + off, fp(g) + off, fp(o.s1) + off, fp(o.s2) + off, copy, dt,
                                   simd);
        }
      }
    });
  }
  return {o.p, o.s1, o.s2, o.copy};
}

::testing::AssertionResult same(const std::string& what, const Snapshot& a, const Snapshot& b) {
  const int64_t n = a.p.numel();
  for (auto r : {same_bits(what + " param", fp(a.p), fp(b.p), n * 4),
                 same_bits(what + " state 1", fp(a.s1), fp(b.s1), n * 4),
                 same_bits(what + " state 2", fp(a.s2), fp(b.s2), n * 4),
                 same_bits(what + " copy", a.copy.data(), b.copy.data(), n * 2)})
    if (!r) return r;
  return ::testing::AssertionSuccess();
}

void default_arena(const std::function<void()>& f) { f(); }

TEST(CpuOptimizers, BitsIndependentOfThreadCount) {
  const int many = std::max(4, static_cast<int>(std::thread::hardware_concurrency()));
  std::cout << "[ paths ] " << path_list() << "; threads 1 and " << many << "\n";
  const int64_t n = (1 << 20) + 3;
  auto one_thread = [](const std::function<void()>& f) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 1);
    f();
  };
  auto many_threads = [many](const std::function<void()>& f) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, many);
    tbb::task_arena arena(many);
    arena.execute([&] {
      EXPECT_EQ(tbb::this_task_arena::max_concurrency(), many);
      f();
    });
  };
  for (Simd simd : paths()) {
    for (auto [kind, dt] : {std::pair{Kind::kAdamW, CopyDtype::kBFloat16}, std::pair{Kind::kAdam, CopyDtype::kHalf},
                            std::pair{Kind::kAdagrad, CopyDtype::kHalf}}) {
      const std::string what = std::string(zero::offload::simd_name(simd)) + " " + kind_name(kind);
      const Snapshot a = run_steps(kind, simd, dt, n, {}, one_thread);
      const Snapshot b = run_steps(kind, simd, dt, n, {}, many_threads);
      EXPECT_TRUE(same(what + " 1 vs " + std::to_string(many) + " threads", a, b));
    }
  }
}

// An element gives the same bits in the vector body or in a tail, at the
// start or the end of a tile: one call against calls cut at odd offsets.
TEST(CpuOptimizers, BitsIndependentOfSplits) {
  std::cout << "[ paths ] " << path_list() << "\n";
  const int64_t n = 3 * 16384 + 77;
  const std::vector<int64_t> cuts = {1, 8, 23, 40, 16384 + 5, 16384 + 6, 2 * 16384 - 3, 3 * 16384 + 70};
  for (Simd simd : paths()) {
    for (auto [kind, dt] : {std::pair{Kind::kAdamW, CopyDtype::kBFloat16}, std::pair{Kind::kAdam, CopyDtype::kHalf},
                            std::pair{Kind::kAdagrad, CopyDtype::kNone}}) {
      const std::string what = std::string(zero::offload::simd_name(simd)) + " " + kind_name(kind);
      const Snapshot whole = run_steps(kind, simd, dt, n, {}, default_arena);
      const Snapshot pieces = run_steps(kind, simd, dt, n, cuts, default_arena);
      EXPECT_TRUE(same(what + " one call vs cut", whole, pieces));
    }
  }
}

// The AVX2 and AVX-512 paths perform the same operations in the same order.
TEST(CpuOptimizers, Avx2AndAvx512GiveTheSameBits) {
  const bool both = zero::offload::simd_supported(Simd::kAvx2) && zero::offload::simd_supported(Simd::kAvx512);
  std::cout << "[ paths ] " << (both ? "avx2 vs avx512" : "(this CPU lacks one of avx2, avx512: nothing compared)")
            << "\n";
  if (!both) return;
  const int64_t n = 16384 + 13;
  for (auto [kind, dt] : {std::pair{Kind::kAdamW, CopyDtype::kBFloat16}, std::pair{Kind::kAdam, CopyDtype::kHalf},
                          std::pair{Kind::kAdagrad, CopyDtype::kHalf}}) {
    const Snapshot a = run_steps(kind, Simd::kAvx2, dt, n, {}, default_arena);
    const Snapshot b = run_steps(kind, Simd::kAvx512, dt, n, {}, default_arena);
    EXPECT_TRUE(same(std::string(kind_name(kind)) + " avx2 vs avx512", a, b));
  }
}

// ---- dispatch and errors -----------------------------------------------------------------------------

TEST(CpuOptimizers, DispatchAndEnvironment) {
  std::cout << "[ paths ] best " << zero::offload::simd_name(zero::offload::best_simd()) << ", supported "
            << path_list() << "\n";
  EXPECT_TRUE(zero::offload::simd_supported(Simd::kPortable));
  EXPECT_TRUE(zero::offload::simd_supported(zero::offload::best_simd()));
  EXPECT_STREQ(zero::offload::simd_name(Simd::kAvx512), "avx512");
  EXPECT_STREQ(zero::offload::simd_name(Simd::kAvx2), "avx2");
  EXPECT_STREQ(zero::offload::simd_name(Simd::kPortable), "portable");
  // AVX-512 implies the AVX2 path's features on every CPU that has it.
  if (zero::offload::simd_supported(Simd::kAvx512)) EXPECT_TRUE(zero::offload::simd_supported(Simd::kAvx2));

  const char* saved = std::getenv("ZERO_CPU_OPTIMIZER_SIMD");
  const std::string saved_value = saved ? saved : "";
  ::unsetenv("ZERO_CPU_OPTIMIZER_SIMD");
  EXPECT_EQ(zero::offload::default_simd(), zero::offload::best_simd());
  for (Simd s : {Simd::kPortable, Simd::kAvx2, Simd::kAvx512}) {
    ::setenv("ZERO_CPU_OPTIMIZER_SIMD", zero::offload::simd_name(s), 1);
    if (zero::offload::simd_supported(s)) {
      EXPECT_EQ(zero::offload::default_simd(), s);
    } else {
      EXPECT_THROW(zero::offload::default_simd(), zero::OffloadError);
    }
  }
  // The default overload follows the variable: portable and the best path
  // differ in the last bits (no FMA) on any CPU with AVX2.
  const int64_t n = 1000;
  torch::manual_seed(5);
  const at::Tensor p0 = make_params(n), g = make_grad(n);
  auto with_env = [&](const char* value, Ours& o) {
    ::setenv("ZERO_CPU_OPTIMIZER_SIMD", value, 1);
    AdamStep h;
    h.weight_decay = 0.1f;
    zero::offload::adam_step(h, n, fp(o.p), fp(g), fp(o.s1), fp(o.s2));
  };
  Ours forced(p0), explicit_portable(p0);
  with_env("portable", forced);
  AdamStep h;
  h.weight_decay = 0.1f;
  zero::offload::adam_step(h, n, fp(explicit_portable.p), fp(g), fp(explicit_portable.s1), fp(explicit_portable.s2),
                           nullptr, CopyDtype::kNone, Simd::kPortable);
  EXPECT_TRUE(same_bits("forced portable vs explicit portable", fp(forced.p), fp(explicit_portable.p), n * 4));

  ::setenv("ZERO_CPU_OPTIMIZER_SIMD", "sse9", 1);
  try {
    zero::offload::default_simd();
    ADD_FAILURE() << "an unknown path was accepted";
  } catch (const zero::OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("ZERO_CPU_OPTIMIZER_SIMD=sse9"), std::string::npos) << e.what();
  }
  if (saved) {
    ::setenv("ZERO_CPU_OPTIMIZER_SIMD", saved_value.c_str(), 1);
  } else {
    ::unsetenv("ZERO_CPU_OPTIMIZER_SIMD");
  }
}

TEST(CpuOptimizers, BadArgumentsThrow) {
  std::vector<float> p(4, 1.0f), g(4, 1.0f), m(4, 0.0f), v(4, 0.0f);
  AdamStep h;
  for (Simd simd : paths()) {
    EXPECT_THROW(zero::offload::adam_step(h, -1, p.data(), g.data(), m.data(), v.data(), nullptr, CopyDtype::kNone, simd),
                 zero::OffloadError);
    EXPECT_THROW(zero::offload::adam_step(h, 4, p.data(), nullptr, m.data(), v.data(), nullptr, CopyDtype::kNone, simd),
                 zero::OffloadError);
    EXPECT_THROW(zero::offload::adam_step(h, 4, p.data(), g.data(), m.data(), v.data(), nullptr, CopyDtype::kHalf, simd),
                 zero::OffloadError);
    AdamStep h0 = h;
    h0.step = 0;
    EXPECT_THROW(zero::offload::adam_step(h0, 4, p.data(), g.data(), m.data(), v.data(), nullptr, CopyDtype::kNone, simd),
                 zero::OffloadError);
    AdagradStep a;
    a.step = 0;
    EXPECT_THROW(zero::offload::adagrad_step(a, 4, p.data(), g.data(), m.data(), nullptr, CopyDtype::kNone, simd),
                 zero::OffloadError);
    // n = 0 touches nothing, null pointers included.
    EXPECT_NO_THROW(zero::offload::adam_step(h, 0, nullptr, nullptr, nullptr, nullptr, nullptr, CopyDtype::kNone, simd));
  }
  for (Simd s : {Simd::kAvx2, Simd::kAvx512})
    if (!zero::offload::simd_supported(s))
      EXPECT_THROW(zero::offload::adam_step(h, 4, p.data(), g.data(), m.data(), v.data(), nullptr, CopyDtype::kNone, s),
                   zero::OffloadError);
  EXPECT_EQ(p, std::vector<float>(4, 1.0f));  // nothing ran
}

}  // namespace

// The gradient norm's sum of squares: against a sequential double sum (to
// rounding), the same bits for 1 and many threads, and not finite with an inf.
TEST(CpuOptimizers, SumOfSquares) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{17}, int64_t{1023}, int64_t{(1 << 20) + 3}}) {
    at::Tensor x = torch::randn({n}, at::detail::createCPUGenerator(n));
    const float* p = x.data_ptr<float>();
    double reference = 0.0;
    for (int64_t i = 0; i < n; ++i) reference += static_cast<double>(p[i]) * p[i];
    double one = 0.0, many = 0.0;
    {
      tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 1);
      one = zero::offload::sum_of_squares(p, n);
    }
    {
      tbb::task_arena arena(4);
      arena.execute([&] { many = zero::offload::sum_of_squares(p, n); });
    }
    EXPECT_NEAR(one, reference, 1e-12 * reference) << n;
    EXPECT_EQ(one, many) << n;
    x[n / 2] = INFINITY;
    EXPECT_FALSE(std::isfinite(zero::offload::sum_of_squares(p, n))) << n;
  }
}

// fp16/bf16 gradients: the squares of their exact fp32 values, and an
// fp16 overflow (inf) or a NaN makes the sum not finite.
TEST(CpuOptimizers, SumOfSquaresOfSixteenBitGradients) {
  for (at::ScalarType type : {at::kHalf, at::kBFloat16}) {
    const auto gt = type == at::kHalf ? zero::offload::GradDtype::kHalf : zero::offload::GradDtype::kBFloat16;
    for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{(1 << 20) + 3}}) {
      // Subnormal, normal and large magnitudes (finite in fp16).
      at::Tensor x = (torch::randn({n}, at::detail::createCPUGenerator(n)) *
                      torch::exp(3 * torch::randn({n}, at::detail::createCPUGenerator(n + 1))))
                         .clamp(-60000, 60000)
                         .to(type);
      const at::Tensor wide = x.to(at::kFloat);
      double reference = 0.0;
      for (int64_t i = 0; i < n; ++i) reference += static_cast<double>(wide.data_ptr<float>()[i]) * wide.data_ptr<float>()[i];
      const zero::offload::GradArray grad(static_cast<const uint16_t*>(x.data_ptr()), gt);
      // Heavy tails: the sequential reference itself rounds by up to ~1e-10.
      EXPECT_NEAR(zero::offload::sum_of_squares(grad, n), reference, 1e-10 * reference) << n;
      x[n / 2] = INFINITY;
      EXPECT_FALSE(std::isfinite(zero::offload::sum_of_squares(grad, n))) << n;
      x[n / 2] = NAN;
      EXPECT_FALSE(std::isfinite(zero::offload::sum_of_squares(grad, n))) << n;
    }
  }
}
