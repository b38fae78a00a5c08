// GradReducer, each stage's strategy, on the world group (run by ctest on
// 1-3 ranks through zero-run): the reduced gradients against the average
// over ranks computed here from each rank's known contribution, whatever
// order the gradients arrive in, over accumulation micro-steps, with and
// without overlap, and with host copies (Note [Offload copies]).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <random>

#include "world_main.h"
#include "zero/comm.h"
#include "zero/error.h"
#include "partition/flat_layout.h"
#include "partition/grad_reducer.h"
#include "partition/host_grads.h"

namespace {

using namespace zero::partition;

std::vector<std::vector<ParamSpec>> model() {
  // "unused" gets no gradient; it shares the last bucket in flat order.
  return {{{"w1", 37}, {"b1", 5}, {"w2", 64}, {"b2", 3}}, {{"unused", 6}, {"w3", 9}}};
}

FlatLayout layout_for(int stage) {
  const int owners = stage == 0 ? 1 : g_world->size();
  const int rank = stage == 0 ? 0 : g_world->rank();
  return FlatLayout(model(), /*bucket_numel=*/40, owners, rank, false);
}

// Rank r's gradient of parameter i in micro-step s: small integers, so the
// average over ranks is exact in fp32.
at::Tensor contribution(int rank, int param, int step, int64_t numel) {
  return (torch::arange(numel, torch::kFloat).remainder(5) + 1) * (rank + 1) * (param + 1) * (step + 1);
}

// What every rank should hold: the flat gradient averaged over ranks and
// summed over micro-steps; "unused" gets no gradient.
at::Tensor expected_flat(const FlatLayout& layout, int steps) {
  at::Tensor flat = torch::zeros({layout.flat_numel()});
  const int W = g_world->size();
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const auto& p = layout.params()[i];
    if (p.name == "unused") continue;
    for (int s = 0; s < steps; ++s) {
      for (int r = 0; r < W; ++r) flat.slice(0, p.offset, p.offset + p.numel) += contribution(r, i, s, p.numel) / W;
    }
  }
  return flat;
}

// One backward: every used parameter's gradient, in flat order (as
// autograd produces them) or in an order that differs between ranks, then
// the end of backward.
void backward(GradReducer& reducer, const FlatLayout& layout, int step, bool boundary, bool shuffle = true) {
  reducer.begin_backward(boundary);
  std::vector<int> order;
  for (size_t i = 0; i < layout.params().size(); ++i) {
    if (layout.params()[i].name != "unused") order.push_back(static_cast<int>(i));
  }
  std::mt19937 rng(1000 * g_world->rank() + step);
  if (shuffle) std::shuffle(order.begin(), order.end(), rng);
  for (int i : order) {
    if (reducer.add(i, contribution(g_world->rank(), i, step, layout.params()[i].numel))) reducer.launch_ready();
  }
  reducer.end_backward();
}

// This rank's expected gradient of bucket k: its shard (the whole bucket at stage 0).
at::Tensor expected_shard(const FlatLayout& layout, const at::Tensor& flat, size_t k) {
  const int64_t start = layout.shard_start(k);
  return flat.slice(0, start, start + layout.buckets()[k].shard_numel);
}

ReducerOptions options_for(int stage, bool overlap) {
  ReducerOptions o;
  o.stage = stage;
  o.overlap_comm = overlap;
  o.grad_options = torch::TensorOptions().dtype(at::kFloat);
  return o;
}

class EachStage : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(EachStage, ReducesTheAverageOverRanksAndMicroSteps) {
  const auto [stage, overlap] = GetParam();
  const FlatLayout layout = layout_for(stage);
  auto reducer = GradReducer::for_stage(layout, g_world, nullptr, options_for(stage, overlap));
  for (int s = 0; s < 3; ++s) backward(*reducer, layout, s, /*boundary=*/s == 2);
  const at::Tensor flat = expected_flat(layout, 3);
  for (size_t k = 0; k < layout.buckets().size(); ++k) {
    EXPECT_TRUE(torch::equal(reducer->shard_grad(k), expected_shard(layout, flat, k))) << "bucket " << k;
  }
  // After zero() the next step starts from nothing.
  reducer->zero();
  backward(*reducer, layout, 0, true);
  const at::Tensor one = expected_flat(layout, 1);
  for (size_t k = 0; k < layout.buckets().size(); ++k) {
    EXPECT_TRUE(torch::equal(reducer->shard_grad(k), expected_shard(layout, one, k))) << "bucket " << k;
  }
}

// Bytes, with gradients arriving in flat order as backward produces them:
// a full buffer at stages 0-1; the partition and a pool of one bucket
// buffer (two with overlap) at stages 2-3. (Out of order, a bucket still
// being filled borrows a buffer of its own.)
TEST_P(EachStage, HoldsTheBuffersOfItsStage) {
  const auto [stage, overlap] = GetParam();
  const FlatLayout layout = layout_for(stage);
  auto reducer = GradReducer::for_stage(layout, g_world, nullptr, options_for(stage, overlap));
  for (int s = 0; s < 2; ++s) backward(*reducer, layout, s, /*boundary=*/s == 1, /*shuffle=*/false);
  const int64_t expected_bytes =
      stage <= 1 ? layout.flat_numel() * 4
                 : (layout.partition_numel() + (overlap ? 2 : 1) * layout.max_bucket_numel()) * 4;
  EXPECT_EQ(reducer->bytes(), expected_bytes);
}

// Buffers are not cleared in bulk (Note [First gradient copies]): a
// parameter that had a gradient last step and has none in this one holds
// zeros, and so does every bucket read after zero() with no backward.
TEST_P(EachStage, ParametersWithoutAGradientThisStepHoldZeros) {
  const auto [stage, overlap] = GetParam();
  const FlatLayout layout = layout_for(stage);
  auto reducer = GradReducer::for_stage(layout, g_world, nullptr, options_for(stage, overlap));
  reducer->begin_backward(true);  // every parameter, "unused" too, gets a gradient
  for (size_t i = 0; i < layout.params().size(); ++i) {
    if (reducer->add(int(i), contribution(g_world->rank(), int(i), 5, layout.params()[i].numel))) reducer->launch_ready();
  }
  reducer->end_backward();
  reducer->zero();
  for (size_t k = 0; k < layout.buckets().size(); ++k) {
    EXPECT_TRUE(torch::equal(reducer->shard_grad(k), torch::zeros({layout.buckets()[k].shard_numel}))) << "bucket " << k;
  }
  backward(*reducer, layout, 0, /*boundary=*/true);  // "unused" gets none
  const at::Tensor flat = expected_flat(layout, 1);
  for (size_t k = 0; k < layout.buckets().size(); ++k) {
    EXPECT_TRUE(torch::equal(reducer->shard_grad(k), expected_shard(layout, flat, k))) << "bucket " << k;
  }
}

// A checkpoint between micro-steps: what accumulated() returns, restored
// into a new reducer, continues to the same result as without the break.
TEST_P(EachStage, AccumulatedGradientsResume) {
  const auto [stage, overlap] = GetParam();
  const FlatLayout layout = layout_for(stage);
  auto first = GradReducer::for_stage(layout, g_world, nullptr, options_for(stage, overlap));
  backward(*first, layout, 0, false);
  const at::Tensor saved = first->accumulated().clone();
  auto second = GradReducer::for_stage(layout, g_world, nullptr, options_for(stage, overlap));
  second->restore(saved);
  backward(*second, layout, 1, true);
  const at::Tensor flat = expected_flat(layout, 2);
  for (size_t k = 0; k < layout.buckets().size(); ++k) {
    EXPECT_TRUE(torch::equal(second->shard_grad(k), expected_shard(layout, flat, k))) << "bucket " << k;
  }
  EXPECT_THROW(second->restore(torch::zeros({saved.numel() + 1})), zero::PartitionError);
}

INSTANTIATE_TEST_SUITE_P(Stages, EachStage,
                         ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return "Stage" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "Overlap" : "");
                         });

// Stages 2-3 with host copies: the first buckets' reductions go to the host
// every micro-step and keep no slice of the device's partition; the others
// stay in the partition and are copied at the boundary.
TEST(HostCopies, OffloadedBucketsLandOnTheHost) {
  const FlatLayout layout = layout_for(2);
  std::vector<bool> copied = layout.offloaded_buckets(0.5);
  HostGrads host(layout, copied, /*off_device=*/true, at::kFloat, /*pinned=*/false);
  auto reducer = GradReducer::for_stage(layout, g_world, &host, options_for(2, false));
  for (int s = 0; s < 2; ++s) backward(*reducer, layout, s, s == 1, /*shuffle=*/false);
  const at::Tensor flat = expected_flat(layout, 2);
  int64_t device_numel = 0;
  for (size_t k = 0; k < layout.buckets().size(); ++k) {
    const at::Tensor want = expected_shard(layout, flat, k);
    if (copied[k]) {
      EXPECT_FALSE(reducer->shard_grad(k).defined());
      EXPECT_TRUE(torch::equal(host.for_step(k), want)) << "bucket " << k;
    } else {
      EXPECT_TRUE(torch::equal(reducer->shard_grad(k), want)) << "bucket " << k;
      device_numel += layout.buckets()[k].shard_numel;
    }
  }
  EXPECT_EQ(reducer->bytes(), (device_numel + layout.max_bucket_numel()) * 4);
  // The mid-accumulation layout is every bucket's shard in bucket order.
  EXPECT_TRUE(torch::equal(reducer->accumulated(), torch::cat([&] {
    std::vector<at::Tensor> shards;
    for (size_t k = 0; k < layout.buckets().size(); ++k) shards.push_back(expected_shard(layout, flat, k));
    return shards;
  }())));
  host.clear();
  EXPECT_TRUE(torch::equal(host.for_step(0), torch::zeros_like(host.copy(0))));  // nothing this step
}

TEST(Arrival, ASecondGradientAfterItsBucketWasReducedIsAnError) {
  const FlatLayout layout = layout_for(2);
  auto reducer = GradReducer::for_stage(layout, g_world, nullptr, options_for(2, false));
  reducer->begin_backward(true);
  // Bucket 0 (b2, the last parameter of group 0) completes and is reduced.
  for (int i : layout.buckets()[0].params) {
    if (reducer->add(i, torch::ones({layout.params()[i].numel}))) reducer->launch_ready();
  }
  ASSERT_TRUE(reducer->reduced(0));
  const int first = layout.buckets()[0].params.front();
  EXPECT_THROW(reducer->add(first, torch::ones({layout.params()[first].numel})), zero::PartitionError);
  reducer->end_backward();
}

}  // namespace
