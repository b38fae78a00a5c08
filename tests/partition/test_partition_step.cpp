// ShardedParams::step (partition/step.cpp, Note [The step]) on 1-3 gloo ranks
// (world_main.h), with a recording BucketOptimizer in place of the
// engine's: the partition attaches each bucket's reduced gradient to its
// master tensor, takes the global norm, clips, hands the optimizer one
// factor, sends what the optimizer wrote back to the parameters and clears
// the gradients. Every rank computes the same gradients, so the reduced
// ones are known: the norm and the factor are checked against their
// formulas (to the rounding of the ranks' average), the parameters against
// what the optimizer wrote.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "world_main.h"
#include "partition/partition.h"

namespace {

using namespace zero::partition;

// Writes k + 1 into master tensor k, and records what it was handed.
struct Recorder : BucketOptimizer {
  bool keep_dtype = false;  // reads_training_dtype()
  int calls = 0;
  double scale = 0;
  std::vector<at::ScalarType> grad_dtypes;
  void update(MasterStore& masters, double grad_scale) override {
    ++calls;
    scale = grad_scale;
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < masters.size(); ++k) {
      at::Tensor m = masters.tensors()[k];
      grad_dtypes.push_back(m.grad().defined() ? m.grad().scalar_type() : at::ScalarType::Undefined);
      m.fill_(static_cast<float>(k + 1));
    }
  }
  bool reads_training_dtype() const override { return keep_dtype; }
};

const std::vector<std::string> kNames = {"a", "b", "c"};
const std::vector<std::vector<int64_t>> kShapes = {{5, 3}, {7}, {11}};

// The gradient of parameter i, the same on every rank: multiples of 0.25,
// exact in bf16. `poison`: rank 0's first element is infinite.
at::Tensor grad_of(size_t i, bool poison) {
  int64_t numel = 1;
  for (int64_t d : kShapes[i]) numel *= d;
  at::Tensor g = (torch::arange(numel, torch::kFloat).remainder(4) + 1) * 0.25 * static_cast<double>(i + 1);
  if (poison && i == 0 && g_world->rank() == 0) g[0] = std::numeric_limits<float>::infinity();
  return g.reshape(kShapes[i]);
}

struct Model {
  std::vector<at::Tensor> params;
  std::unique_ptr<ShardedParams> sharded;

  Model(int stage, at::ScalarType dtype, std::vector<int> replicas = {}) {
    ShardedParams::Group group;
    for (size_t i = 0; i < kNames.size(); ++i) {
      params.push_back(torch::zeros(kShapes[i]).requires_grad_());
      group.names.push_back(kNames[i]);
      group.params.push_back(params.back());
    }
    group.replicas = std::move(replicas);
    Options options;
    options.stage = stage;
    options.bucket_numel = 18;  // in reverse order: c and b, then a; each bucket padded to the ranks
    options.dtype = dtype;
    options.norm_group = g_world;
    sharded = std::make_unique<ShardedParams>(std::vector<ShardedParams::Group>{group}, g_world, options);
  }

  // One backward whose gradients are grad_of(i) times `scale`.
  void backward(double scale = 1.0, bool poison = false) {
    sharded->begin_backward(/*boundary=*/true);
    at::Tensor loss = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i) {
      loss = loss + (params[i] * (grad_of(i, poison) * scale).to(params[i].scalar_type())).sum().to(at::kFloat);
    }
    loss.backward();
    sharded->end_backward();
  }

  // The norm's formula: each parameter's squares over its replicas.
  static double expected_norm(const std::vector<int>& replicas = {}) {
    double sum = 0;
    for (size_t i = 0; i < kNames.size(); ++i) {
      const double squares = grad_of(i, false).pow(2).sum().item<double>();
      sum += squares / (replicas.empty() ? 1 : replicas[i]);
    }
    return std::sqrt(sum);
  }

  // Every element of every parameter holds its bucket's number + 1 (what
  // Recorder wrote), or `zero` for none.
  void expect_published(bool zero) const {
    for (const auto& lp : sharded->layout().params()) {
      size_t i = 0;
      while (kNames[i] != lp.name) ++i;
      const float want = zero ? 0.0f : static_cast<float>(lp.bucket + 1);
      EXPECT_TRUE(params[i].to(at::kFloat).eq(want).all().item<bool>()) << lp.name << " should hold " << want;
    }
  }
};

TEST(PartitionStep, ClipsWithOneFactorAndPublishesWhatTheOptimizerWrote) {
  for (int stage : {0, 1, 2}) {
    Model m(stage, at::kFloat);
    ASSERT_EQ(m.sharded->num_buckets(), 2u);
    m.backward();
    Recorder optimizer;
    StepRequest request;
    const double norm = Model::expected_norm();
    request.clip = 0.5 * norm;
    const StepResult r = m.sharded->step(optimizer, request);
    EXPECT_FALSE(r.skipped);
    EXPECT_NEAR(r.norm, norm, 1e-6 * norm) << "stage " << stage;
    EXPECT_NEAR(optimizer.scale, request.clip / (r.norm + 1e-6), 1e-12) << "stage " << stage;
    EXPECT_LT(optimizer.scale, 0.51) << "clipped to half the norm";
    ASSERT_EQ(optimizer.calls, 1);
    for (auto dtype : optimizer.grad_dtypes) EXPECT_EQ(dtype, at::kFloat);
    for (const auto& master : m.sharded->masters().tensors()) EXPECT_FALSE(master.grad().defined()) << "detached";
    m.expect_published(false);
  }
}

TEST(PartitionStep, BelowTheBoundTheFactorIsTheLossScalesInverse) {
  Model m(2, at::kFloat);
  m.backward(/*scale=*/8.0);
  Recorder optimizer;
  StepRequest request;
  request.loss_scale = 8.0;
  request.clip = 2 * Model::expected_norm();
  const StepResult r = m.sharded->step(optimizer, request);
  EXPECT_NEAR(r.norm, Model::expected_norm(), 1e-6 * r.norm) << "the norm of the unscaled gradients";
  EXPECT_EQ(optimizer.scale, 1.0 / 8.0);
}

// An overflow on one rank skips the step on every rank; the gradients are
// cleared, so the next step sees only its own.
TEST(PartitionStep, NotFiniteSkipsOnEveryRankAndClears) {
  Model m(2, at::kFloat);
  m.backward(1.0, /*poison=*/true);
  Recorder optimizer;
  StepRequest request;
  request.skip_if_not_finite = true;
  StepResult r = m.sharded->step(optimizer, request);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(optimizer.calls, 0);
  m.expect_published(/*zero=*/true);
  m.backward();
  r = m.sharded->step(optimizer, request);
  EXPECT_FALSE(r.skipped);
  EXPECT_NEAR(r.norm, Model::expected_norm(), 1e-6 * r.norm);
  m.expect_published(false);
}

TEST(PartitionStep, GradientsStayInTheTrainingDtypeForHostKernelsOnly) {
  for (bool keep : {false, true}) {
    Model m(2, at::kBFloat16);
    m.backward();
    Recorder optimizer;
    optimizer.keep_dtype = keep;
    m.sharded->step(optimizer, StepRequest{});
    for (auto dtype : optimizer.grad_dtypes) EXPECT_EQ(dtype, keep ? at::kBFloat16 : at::kFloat);
    m.expect_published(false);  // k + 1: exact in bf16
  }
}

// Note [Gradient norm]: a parameter held by other ranks of the norm group
// too (a tensor-parallel replica) counts once over them.
TEST(PartitionStep, ReplicasWeighTheNorm) {
  const std::vector<int> replicas = {2, 1, 3};
  Model m(2, at::kFloat, replicas);
  m.backward();
  Recorder optimizer;
  const StepResult r = m.sharded->step(optimizer, StepRequest{});
  EXPECT_NEAR(r.norm, Model::expected_norm(replicas), 1e-6 * r.norm);
  EXPECT_GT(std::abs(r.norm - Model::expected_norm()), 1e-3 * r.norm) << "the weights changed nothing";
}

}  // namespace
