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

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "world_main.h"
#include "partition/partition.h"

namespace {

using namespace zero::partition;

// An optimizer that takes every tensor at once (as torch::optim's step):
// writes k + 1 into master tensor k in begin_step, and records what it was
// handed.
struct Recorder : BucketOptimizer {
  explicit Recorder(MasterStore& masters) : masters(masters) {}
  MasterStore& masters;
  bool keep_dtype = false;  // reads_training_dtype()
  int calls = 0;
  double scale = 0;
  std::vector<at::ScalarType> grad_dtypes;
  bool reads_training_dtype() const override { return keep_dtype; }
  bool per_bucket() const override { return false; }
  void begin_step(double grad_scale) override {
    ++calls;
    scale = grad_scale;
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < masters.size(); ++k) {
      at::Tensor m = masters.tensors()[k];
      grad_dtypes.push_back(m.grad().defined() ? m.grad().scalar_type() : at::ScalarType::Undefined);
      m.fill_(static_cast<float>(k + 1));
    }
  }
  void update(size_t, const at::Tensor&) override { ADD_FAILURE() << "update(k) called on a whole-step optimizer"; }
};

// An optimizer that updates one master tensor at a time (as the fused host
// kernels): update(k) writes 10 * step + k + 1 into master tensor k and its
// target, and records the order, what the master held as it came in, and
// the gradient's dtype.
struct BucketRecorder : BucketOptimizer {
  explicit BucketRecorder(MasterStore& masters) : masters(masters) {}
  MasterStore& masters;
  int step = 0;
  double scale = 0;
  std::vector<size_t> order;
  std::vector<float> found;         // per update: the master's first element as it came in
  std::vector<bool> targets;        // per update: a target was given
  std::vector<at::ScalarType> grad_dtypes;
  static float value(int step, size_t k) { return static_cast<float>(10 * step + static_cast<int>(k) + 1); }
  bool reads_training_dtype() const override { return true; }
  bool per_bucket() const override { return true; }
  void begin_step(double grad_scale) override {
    ++step;
    scale = grad_scale;
  }
  void update(size_t k, const at::Tensor& target) override {
    torch::NoGradGuard no_grad;
    at::Tensor m = masters.tensors()[k];
    order.push_back(k);
    found.push_back(m[0].item<float>());
    targets.push_back(target.defined());
    grad_dtypes.push_back(m.grad().defined() ? m.grad().scalar_type() : at::ScalarType::Undefined);
    m.fill_(value(step, k));
    if (target.defined()) target.fill_(value(step, k));
  }
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

  Model(int stage, at::ScalarType dtype, std::vector<int> replicas = {},
        const std::function<void(Options&)>& adjust = {}) {
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
    if (adjust) adjust(options);
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
  // Recorder wrote) plus `base`, or `zero` for none.
  void expect_published(bool zero, float base = 0.0f) const {
    for (const auto& lp : sharded->layout().params()) {
      size_t i = 0;
      while (kNames[i] != lp.name) ++i;
      const float want = zero ? 0.0f : base + static_cast<float>(lp.bucket + 1);
      EXPECT_TRUE(params[i].to(at::kFloat).eq(want).all().item<bool>()) << lp.name << " should hold " << want;
    }
  }
};

TEST(PartitionStep, ClipsWithOneFactorAndPublishesWhatTheOptimizerWrote) {
  for (int stage : {0, 1, 2}) {
    Model m(stage, at::kFloat);
    ASSERT_EQ(m.sharded->num_buckets(), 2u);
    m.backward();
    Recorder optimizer(m.sharded->masters());
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
  Recorder optimizer(m.sharded->masters());
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
  Recorder optimizer(m.sharded->masters());
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
    Recorder optimizer(m.sharded->masters());
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
  Recorder optimizer(m.sharded->masters());
  const StepResult r = m.sharded->step(optimizer, StepRequest{});
  EXPECT_NEAR(r.norm, Model::expected_norm(replicas), 1e-6 * r.norm);
  EXPECT_GT(std::abs(r.norm - Model::expected_norm()), 1e-3 * r.norm) << "the weights changed nothing";
}

// Note [The step], item 5: with offload the partition drives a per-bucket
// optimizer bucket by bucket; each update is written into the parameters'
// shard in the training dtype and sent on, at stages 2 and 3.
TEST(PartitionStep, APerBucketOptimizerIsDrivenBucketByBucket) {
  for (int stage : {2, 3}) {
    Model m(stage, at::kBFloat16, {}, [](Options& o) {
      o.offload_optimizer = true;
      o.host_grad_copies = true;
    });
    BucketRecorder optimizer(m.sharded->masters());
    const size_t n = m.sharded->num_buckets();
    for (int step = 1; step <= 2; ++step) {
      m.backward();
      StepRequest request;
      request.loss_scale = 4.0;
      const StepResult r = m.sharded->step(optimizer, request);
      EXPECT_FALSE(r.skipped);
      EXPECT_EQ(optimizer.scale, 0.25) << "stage " << stage;
      m.expect_published(false, 10.0f * static_cast<float>(step));
    }
    ASSERT_EQ(optimizer.order.size(), 2 * n) << "each bucket once per step, stage " << stage;
    for (size_t i = 0; i < optimizer.order.size(); ++i) {
      const size_t k = i % n;
      EXPECT_EQ(optimizer.order[i], k) << "in bucket order, stage " << stage;
      EXPECT_TRUE(optimizer.targets[i]) << "the host master is apart from the shard: a target to write";
      EXPECT_EQ(optimizer.grad_dtypes[i], at::kBFloat16) << "the training dtype, as the host kernels read it";
      EXPECT_EQ(optimizer.found[i], i < n ? 0.0f : BucketRecorder::value(1, k)) << "the master kept its update";
    }
  }
}

// Note [Partial offload]: the buckets kept where the parameters are go
// first, so that their updates run while the host updates its share.
TEST(PartitionStep, PartialOffloadUpdatesTheKeptBucketsFirst) {
  Model m(2, at::kFloat, {}, [](Options& o) {
    o.offload_optimizer = true;
    o.offload_ratio = 0.5;
    o.host_grad_copies = true;
  });
  const MasterStore& masters = m.sharded->masters();
  std::vector<size_t> kept, host;
  for (size_t k = 0; k < m.sharded->num_buckets(); ++k) (masters.on_host(k) ? host : kept).push_back(k);
  ASSERT_FALSE(kept.empty());
  ASSERT_FALSE(host.empty());
  std::vector<size_t> want = kept;
  want.insert(want.end(), host.begin(), host.end());
  BucketRecorder optimizer(m.sharded->masters());
  m.backward();
  m.sharded->step(optimizer, StepRequest{});
  EXPECT_EQ(optimizer.order, want);
  m.expect_published(false, 10.0f);
}

// offload_optimizer "nvme": each sub-group's master weights come back from
// their files for its update and go back after it; nothing stays resident.
TEST(PartitionStep, NvmeSubGroupsComeBackForTheirUpdate) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::temp_directory_path() / ("zero_partition_step_" + std::to_string(::getpid()));
  fs::create_directories(folder);
  {
    Model m(2, at::kBFloat16, {}, [&](Options& o) {
      o.offload_optimizer = true;
      o.host_grad_copies = true;
      zero::offload::SwapOptions swap;
      swap.nvme_path = folder.string();
      swap.rank = g_world->rank();
      o.master_swap = swap;
      o.sub_group_numel = 1;  // a sub-group per bucket
    });
    MasterStore& masters = m.sharded->masters();
    ASSERT_NE(masters.nvme_store(), nullptr);
    masters.nvme_states_added();  // no states: the master weights alone
    EXPECT_EQ(masters.nvme_store()->resident_bytes(), 0);
    BucketRecorder optimizer(masters);
    const size_t n = m.sharded->num_buckets();
    for (int step = 1; step <= 2; ++step) {
      m.backward();
      const StepResult r = m.sharded->step(optimizer, StepRequest{});
      EXPECT_FALSE(r.skipped);
      EXPECT_EQ(masters.nvme_store()->resident_bytes(), 0) << "every sub-group written back, step " << step;
      m.expect_published(false, 10.0f * static_cast<float>(step));
    }
    ASSERT_EQ(optimizer.found.size(), 2 * n);
    for (size_t i = 0; i < optimizer.found.size(); ++i) {
      EXPECT_EQ(optimizer.found[i], i < n ? 0.0f : BucketRecorder::value(1, i % n)) << "read back from its file";
    }
  }
  fs::remove_all(folder);
}

}  // namespace
