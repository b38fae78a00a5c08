// Lamb (optim/lamb.h) on ZeRO shards against a whole-parameter reference
// written here, on one and several simulated ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <vector>

#include "optim/lamb.h"
#include "zero/error.h"

namespace {

using zero::optim::Lamb;
using zero::optim::LambOptions;
using zero::optim::LambParamOptions;
using zero::optim::LambSegment;

constexpr float kPadValue = 7.0F;  // padding sentinel: must never change

// The whole-parameter LAMB of DeepSpeed's FusedLamb, in double.
struct Reference {
  struct Param {
    at::Tensor w, m, v;
    LambOptions o;
  };
  std::vector<Param> params;
  int64_t t = 0;

  void step(const std::vector<at::Tensor>& grads) {
    ++t;
    for (size_t i = 0; i < params.size(); ++i) {
      Param& p = params[i];
      const LambOptions& o = p.o;
      const at::Tensor g = grads[i].to(at::kDouble);
      p.m = o.beta1 * p.m + (1 - o.beta1) * g;
      p.v = o.beta2 * p.v + (1 - o.beta2) * g * g;
      const at::Tensor denom = o.eps_inside_sqrt ? at::sqrt(p.v + o.eps) : at::sqrt(p.v) + o.eps;
      const at::Tensor u = p.m / denom + o.weight_decay * p.w;
      const double wn = p.w.norm().item<double>();
      const double un = u.norm().item<double>();
      const double ratio = (wn > 0 && un > 0) ? std::min(std::max(wn / un, o.min_coeff), o.max_coeff) : 1.0;
      const double step_size =
          o.bias_correction ? o.lr * std::sqrt(1 - std::pow(o.beta2, t)) / (1 - std::pow(o.beta1, t)) : o.lr;
      p.w = p.w - step_size * ratio * u;
    }
  }
};

// Parameters in groups, each group flattened into one bucket padded to a
// multiple of the world size plus one more element per rank, then split into
// `world` contiguous shards.
struct Layout {
  std::vector<std::vector<int64_t>> groups;  // param ids per group
  std::vector<int64_t> sizes;                // elements per param
  int64_t world = 1;

  int64_t bucket_numel(size_t g) const {
    int64_t n = 0;
    for (int64_t p : groups[g]) n += sizes[p];
    return n;
  }
  int64_t shard_numel(size_t g) const { return (bucket_numel(g) + world - 1) / world + 1; }
  int64_t offset(size_t g, int64_t param) const {
    int64_t off = 0;
    for (int64_t p : groups[g]) {
      if (p == param) return off;
      off += sizes[p];
    }
    return -1;
  }
  // Flat bucket of group g from whole per-param tensors, padding = pad.
  at::Tensor flatten(size_t g, const std::vector<at::Tensor>& whole, const at::Tensor& pad) const {
    at::Tensor flat = pad.clone();
    for (int64_t p : groups[g]) flat.narrow(0, offset(g, p), sizes[p]).copy_(whole[p]);
    return flat;
  }
  at::Tensor shard(size_t g, const at::Tensor& flat, int64_t rank) const {
    return flat.narrow(0, rank * shard_numel(g), shard_numel(g)).clone();
  }
  std::vector<std::vector<LambSegment>> segments(int64_t rank) const {
    std::vector<std::vector<LambSegment>> out;
    for (size_t g = 0; g < groups.size(); ++g) {
      const int64_t lo = rank * shard_numel(g), hi = lo + shard_numel(g);
      std::vector<LambSegment> segs;
      for (int64_t p : groups[g]) {
        const int64_t b = std::max(offset(g, p), lo), e = std::min(offset(g, p) + sizes[p], hi);
        if (b < e) segs.push_back({p, b - lo, e - b});
      }
      out.push_back(segs);
    }
    return out;
  }
};

struct Case {
  Layout layout;
  std::vector<LambOptions> group_options;
  std::vector<at::Tensor> init;                // whole params, fp32
  std::vector<std::vector<at::Tensor>> grads;  // [step][param], fp32
  std::vector<std::vector<at::Tensor>> pad_grads;  // [step][group] flat bucket-sized grads for padding
};

Case make_case(int64_t steps) {
  Case c;
  c.layout.groups = {{0, 1}, {2}};
  c.layout.sizes = {7, 13, 5};
  LambOptions a;
  a.lr = 0.05;
  a.weight_decay = 0.01;
  LambOptions b;
  b.lr = 0.02;
  b.beta1 = 0.8;
  b.beta2 = 0.99;
  b.eps = 1e-6;
  b.bias_correction = false;
  b.eps_inside_sqrt = true;
  b.max_coeff = 0.5;
  c.group_options = {a, b};
  torch::manual_seed(1234);
  for (int64_t n : c.layout.sizes) c.init.push_back(torch::randn({n}));
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<at::Tensor> g;
    for (int64_t n : c.layout.sizes) g.push_back(torch::randn({n}) * 0.1);
    c.grads.push_back(g);
    // Random grads in the padding too: the padding must stay untouched anyway.
    c.pad_grads.push_back({torch::randn({64}), torch::randn({64})});
  }
  return c;
}

std::vector<at::Tensor> run_reference(const Case& c) {
  Reference ref;
  ref.params.resize(c.init.size());
  for (size_t g = 0; g < c.layout.groups.size(); ++g) {
    for (int64_t p : c.layout.groups[g]) {
      ref.params[p].w = c.init[p].to(at::kDouble);
      ref.params[p].m = at::zeros_like(ref.params[p].w);
      ref.params[p].v = at::zeros_like(ref.params[p].w);
      ref.params[p].o = c.group_options[g];
    }
  }
  for (const auto& g : c.grads) ref.step(g);
  std::vector<at::Tensor> out;
  for (auto& p : ref.params) out.push_back(p.w);
  return out;
}

struct Rank {
  std::vector<at::Tensor> shards;  // one per group
  std::unique_ptr<Lamb> lamb;
};

std::vector<Rank> make_ranks(const Case& c, int64_t world, at::ScalarType dtype = at::kFloat) {
  Layout layout = c.layout;
  layout.world = world;
  std::vector<Rank> ranks(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      const at::Tensor pad = at::full({layout.shard_numel(g) * world}, kPadValue);
      ranks[r].shards.push_back(layout.shard(g, layout.flatten(g, c.init, pad), r).to(dtype));
      groups.emplace_back(std::vector<at::Tensor>{ranks[r].shards.back()},
                          std::make_unique<LambParamOptions>(c.group_options[g]));
    }
    ranks[r].lamb = std::make_unique<Lamb>(std::move(groups), layout.segments(r),
                                           static_cast<int64_t>(layout.sizes.size()), [](at::Tensor&) {});
  }
  return ranks;
}

void set_grads(const Case& c, int64_t world, int64_t step, std::vector<Rank>& ranks) {
  Layout layout = c.layout;
  layout.world = world;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const at::Tensor pad = c.pad_grads[step][g].narrow(0, 0, layout.shard_numel(g) * world);
    const at::Tensor flat = layout.flatten(g, c.grads[step], pad);
    for (int64_t r = 0; r < world; ++r) {
      ranks[r].shards[g].mutable_grad() = layout.shard(g, flat, r).to(ranks[r].shards[g].scalar_type());
    }
  }
}

// Whole params gathered from the ranks' shards; checks the padding.
std::vector<at::Tensor> gather(const Case& c, int64_t world, const std::vector<Rank>& ranks) {
  Layout layout = c.layout;
  layout.world = world;
  std::vector<at::Tensor> out(layout.sizes.size());
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    std::vector<at::Tensor> parts;
    for (const Rank& r : ranks) parts.push_back(r.shards[g]);
    const at::Tensor flat = at::cat(parts);
    at::Tensor is_param = at::zeros({flat.numel()}, at::kBool);
    for (int64_t p : layout.groups[g]) {
      out[p] = flat.narrow(0, layout.offset(g, p), layout.sizes[p]).clone();
      is_param.narrow(0, layout.offset(g, p), layout.sizes[p]).fill_(true);
    }
    const at::Tensor padding = flat.masked_select(is_param.logical_not());
    EXPECT_GT(padding.numel(), 0);
    EXPECT_TRUE(padding.eq(kPadValue).all().item<bool>()) << "padding of group " << g << " changed: " << padding;
  }
  return out;
}

double max_rel_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return ((g - w).abs() / w.abs().clamp_min(1e-30)).max().item<double>();
}

void expect_close(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t p = 0; p < got.size(); ++p) {
    const double err = max_rel_error(got[p], want[p]);
    worst = std::max(worst, err);
    EXPECT_LE(err, tol) << "param " << p << "\n got " << got[p] << "\n want " << want[p];
  }
  std::cout << "  max relative error " << worst << " (" << got[0].scalar_type() << ")\n";
}

constexpr int64_t kSteps = 10;
constexpr double kTol = 1e-6;
// fp32 shards: 10 steps of fp32 rounding reach about 1e-6 relative error
// against the double reference, so fp32 gets 1e-5; fp64 shards check the
// arithmetic itself at kTol.
double tolerance(at::ScalarType dtype) { return dtype == at::kFloat ? 1e-5 : kTol; }

TEST(Lamb, OneRankMatchesReference) {
  const Case c = make_case(kSteps);
  const auto want = run_reference(c);
  for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto ranks = make_ranks(c, 1, dtype);
    for (int64_t s = 0; s < kSteps; ++s) {
      set_grads(c, 1, s, ranks);
      ranks[0].lamb->step();
    }
    EXPECT_EQ(ranks[0].lamb->step_count(), kSteps);
    const auto got = gather(c, 1, ranks);
    expect_close(got, want, tolerance(dtype));
    // The weights did move (the comparison is not vacuous).
    for (size_t p = 0; p < got.size(); ++p) {
      EXPECT_GT((got[p].to(at::kDouble) - c.init[p]).abs().max().item<double>(), 1e-3);
    }
  }
}

// The same parameters split over 2 and 3 ranks (a parameter split across
// ranks, a shard holding pieces of two parameters): the partial norms are
// summed across the simulated ranks between the two phases of the step.
TEST(Lamb, ShardedMatchesReference) {
  const Case c = make_case(kSteps);
  const auto want = run_reference(c);
  for (at::ScalarType dtype : {at::kDouble, at::kFloat})
  for (int64_t world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world) + " " + c10::toString(dtype));
    auto ranks = make_ranks(c, world, dtype);
    for (int64_t s = 0; s < kSteps; ++s) {
      set_grads(c, world, s, ranks);
      std::vector<at::Tensor> partials;
      for (auto& r : ranks) partials.push_back(r.lamb->partial_norms());
      at::Tensor total = partials[0].clone();
      for (int64_t r = 1; r < world; ++r) total += partials[r];
      for (auto& r : ranks) r.lamb->apply(total);
    }
    expect_close(gather(c, world, ranks), want, tolerance(dtype));
  }
}

// One-parameter-per-shard optimizer on one rank, for the coefficient cases.
struct Single {
  at::Tensor w;
  std::unique_ptr<Lamb> lamb;
  // fp64, so that the step deltas of large weights are exact enough to compare.
  Single(const at::Tensor& init, const LambOptions& o) : w(init.to(at::kDouble)) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{w}, std::make_unique<LambParamOptions>(o));
    lamb = std::make_unique<Lamb>(std::move(groups), std::vector<std::vector<LambSegment>>{{{0, 0, w.numel()}}}, 1,
                                  [](at::Tensor&) {});
  }
  // One step with grad g; returns w_after - w_before.
  at::Tensor step(const at::Tensor& g) {
    const at::Tensor before = w.clone();
    w.mutable_grad() = g.to(at::kDouble);
    lamb->step();
    return w - before;
  }
};

// The step-1 LAMB update u (before the trust ratio and the step size).
at::Tensor first_u(const at::Tensor& w, const at::Tensor& g, const LambOptions& o) {
  const at::Tensor gd = g.to(at::kDouble), wd = w.to(at::kDouble);
  const at::Tensor m = (1 - o.beta1) * gd, v = (1 - o.beta2) * gd * gd;
  return m / (at::sqrt(v) + o.eps) + o.weight_decay * wd;
}
// step_size * u at step 1 (bias correction on).
at::Tensor first_step_update(const at::Tensor& w, const at::Tensor& g, const LambOptions& o) {
  return o.lr * std::sqrt(1 - o.beta2) / (1 - o.beta1) * first_u(w, g, o);
}

TEST(Lamb, TrustRatioClampsAndZeroNorms) {
  LambOptions o;
  o.lr = 1e-2;
  torch::manual_seed(7);
  const at::Tensor g = torch::randn({9});
  {  // huge weights: ||w||/||u|| >> max_coeff
    Single s(torch::randn({9}) * 1000, o);
    const at::Tensor w0 = s.w.clone();
    const at::Tensor delta = s.step(g);
    EXPECT_DOUBLE_EQ(s.lamb->lamb_coeffs()[0], o.max_coeff);
    EXPECT_LE(max_rel_error(delta, -o.max_coeff * first_step_update(w0, g, o)), kTol);
  }
  {  // tiny weights: ratio << min_coeff
    Single s(torch::randn({9}) * 1e-6, o);
    const at::Tensor w0 = s.w.clone();
    const at::Tensor delta = s.step(g);
    EXPECT_DOUBLE_EQ(s.lamb->lamb_coeffs()[0], o.min_coeff);
    EXPECT_LE(max_rel_error(delta, -o.min_coeff * first_step_update(w0, g, o)), kTol);
  }
  {  // in range: the ratio itself
    LambOptions wide = o;
    wide.max_coeff = 1e6;
    wide.min_coeff = 1e-6;
    Single s(torch::randn({9}), wide);
    const at::Tensor w0 = s.w.clone();
    s.step(g);
    const at::Tensor u = first_u(w0, g, wide);
    const double ratio = w0.to(at::kDouble).norm().item<double>() / u.norm().item<double>();
    EXPECT_NEAR(s.lamb->lamb_coeffs()[0], ratio, 1e-6 * ratio);
  }
  {  // zero weights: ||w|| = 0 -> ratio 1 (DeepSpeed), the weights still move
    Single s(torch::zeros({9}), o);
    const at::Tensor delta = s.step(g);
    EXPECT_EQ(s.lamb->lamb_coeffs()[0], 1.0);
    EXPECT_LE(max_rel_error(delta, -first_step_update(torch::zeros({9}), g, o)), kTol);
  }
  {  // zero update (zero grad, no weight decay): ratio 1, nothing moves
    Single s(torch::randn({9}), o);
    const at::Tensor delta = s.step(torch::zeros({9}));
    EXPECT_EQ(s.lamb->lamb_coeffs()[0], 1.0);
    EXPECT_EQ(delta.abs().max().item<double>(), 0.0);
  }
}

TEST(Lamb, SetLrScalesTheStep) {
  LambOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  torch::manual_seed(3);
  const at::Tensor init = torch::randn({11});
  const at::Tensor g = torch::randn({11});
  Single base(init, o), scaled(init, o);
  scaled.lamb->param_groups()[0].options().set_lr(3e-2);
  EXPECT_DOUBLE_EQ(scaled.lamb->param_groups()[0].options().get_lr(), 3e-2);
  const at::Tensor d1 = base.step(g), d3 = scaled.step(g);
  EXPECT_LE(max_rel_error(d3, 3 * d1), kTol);
  EXPECT_GT(d1.abs().max().item<double>(), 0.0);
  // set_lr(0) freezes the weights.
  scaled.lamb->param_groups()[0].options().set_lr(0.0);
  EXPECT_EQ(scaled.step(g).abs().max().item<double>(), 0.0);
}

TEST(Lamb, StateBytesAndSaveLoad) {
  const Case c = make_case(6);
  auto a = make_ranks(c, 2);
  auto b = make_ranks(c, 2);
  EXPECT_EQ(a[0].lamb->state_bytes(), 0);
  auto run = [&](std::vector<Rank>& ranks, int64_t s) {
    set_grads(c, 2, s, ranks);
    at::Tensor total = ranks[0].lamb->partial_norms() + ranks[1].lamb->partial_norms();
    for (auto& r : ranks) r.lamb->apply(total);
  };
  for (int64_t s = 0; s < 3; ++s) run(a, s);
  int64_t shard_bytes = 0;
  for (const auto& t : a[0].shards) shard_bytes += t.numel() * 4;
  EXPECT_EQ(a[0].lamb->state_bytes(), 2 * shard_bytes);
  // b takes a's weights and optimizer state, then both run on identically.
  for (int64_t r = 0; r < 2; ++r) {
    std::stringstream buf;
    {
      torch::serialize::OutputArchive out;
      a[r].lamb->save(out);
      out.save_to(buf);
    }
    torch::serialize::InputArchive in;
    in.load_from(buf);
    b[r].lamb->load(in);
    EXPECT_EQ(b[r].lamb->step_count(), 3);
    torch::NoGradGuard no_grad;
    for (size_t g = 0; g < a[r].shards.size(); ++g) b[r].shards[g].copy_(a[r].shards[g]);
  }
  for (int64_t s = 3; s < 6; ++s) {
    run(a, s);
    run(b, s);
  }
  for (int64_t r = 0; r < 2; ++r) {
    for (size_t g = 0; g < a[r].shards.size(); ++g) EXPECT_TRUE(a[r].shards[g].equal(b[r].shards[g]));
  }
}

TEST(Lamb, MisuseIsReported) {
  LambOptions o;
  Single s(torch::randn({4}), o);
  EXPECT_THROW(s.lamb->step(), zero::EngineError);  // no grad
  s.w.mutable_grad() = torch::ones({4});
  at::Tensor partial = s.lamb->partial_norms();
  EXPECT_THROW(s.lamb->partial_norms(), zero::EngineError);
  EXPECT_THROW(s.lamb->apply(torch::zeros({2, 2}, at::kDouble)), zero::EngineError);
  s.lamb->apply(partial);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{torch::zeros({4})}, std::make_unique<LambParamOptions>());
  EXPECT_THROW(Lamb(groups, {{{0, 2, 3}}}, 1, [](at::Tensor&) {}), zero::EngineError);  // out of bounds
  EXPECT_THROW(Lamb(groups, {{{1, 0, 4}}}, 1, [](at::Tensor&) {}), zero::EngineError);  // no such param
  EXPECT_THROW(Lamb(groups, {}, 1, [](at::Tensor&) {}), zero::EngineError);             // segment lists
}

}  // namespace
