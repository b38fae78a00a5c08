// qgZ's two-level reduce-scatter (Note [Quantized gradients]) against the
// exact reduce-scatter over the same ranks and input.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "partition/quantized_reduce.h"
#include "world_main.h"

namespace {

using zero::partition::QuantizedReduceScatter;

// Nodes of `per_node` consecutive ranks: this rank's node and its cross group.
std::pair<std::shared_ptr<zero::comm::ProcessGroup>, std::shared_ptr<zero::comm::ProcessGroup>> groups(int per_node) {
  const int n = g_world->size();
  std::shared_ptr<zero::comm::ProcessGroup> node, cross;
  for (int first = 0; first < n; first += per_node) {
    std::vector<int> ranks;
    for (int r = first; r < first + per_node; ++r) ranks.push_back(r);
    if (auto g = g_world->new_group(ranks)) node = g;
  }
  for (int l = 0; l < per_node; ++l) {
    std::vector<int> ranks;
    for (int r = l; r < n; r += per_node) ranks.push_back(r);
    if (auto g = g_world->new_group(ranks)) cross = g;
  }
  return {node, cross};
}

// Each rank's gradients differ; one bucket of three shards' worth per rank.
at::Tensor input_of(int rank, int64_t shard) {
  torch::manual_seed(40 + rank);
  return torch::randn({g_world->size() * shard}) * (1 + rank);
}

TEST(QuantizedReduceScatter, EqualsTheExactReductionWithinHalfAStepPerNode) {
  const int w = g_world->size();
  constexpr int64_t kShard = 300, kBlock = 64;
  for (int per_node : {1, 2, w}) {
    if (w % per_node != 0) continue;
    SCOPED_TRACE("ranks a node: " + std::to_string(per_node));
    auto [node, cross] = groups(per_node);
    QuantizedReduceScatter reduce(node, cross, kBlock);
    const at::Tensor input = input_of(g_world->rank(), kShard);
    at::Tensor exact = torch::empty({kShard});
    g_world->reduce_scatter(exact, input.clone(), zero::comm::ReduceOp::Avg);
    const auto cross_before = cross->stats().all_gather_bytes;
    const auto world_before = g_world->stats();
    at::Tensor got = torch::empty({kShard});
    reduce.start(got, input.clone())->wait();
    // The bound: half a step of each other node's sum, block by block, over w.
    const int nodes = w / per_node, me = g_world->rank(), mine_node = me / per_node;
    at::Tensor bound = torch::zeros({kShard});
    for (int other = 0; other < nodes; ++other) {
      if (other == mine_node) continue;
      at::Tensor node_sum = torch::zeros({kShard});
      for (int r = other * per_node; r < (other + 1) * per_node; ++r)
        node_sum += input_of(r, kShard).slice(0, me * kShard, (me + 1) * kShard);
      for (int64_t b = 0; b < kShard; b += kBlock) {
        const int64_t e = std::min(kShard, b + kBlock);
        bound.slice(0, b, e) += node_sum.slice(0, b, e).abs().max() / 254 / w;
      }
    }
    const at::Tensor error = (got - exact).abs();
    EXPECT_TRUE((error <= bound * (1 + 1e-5) + 1e-6).all().item<bool>()) << (error - bound).max().item<double>();
    if (nodes > 1) {
      EXPECT_GT(error.max().item<double>(), 0.0) << "something was quantized";
      // Only int8 rows and their scales cross; the fp32 reduce-scatter sent 4 (w-1)/w of a bucket.
      const double crossed = double(cross->stats().all_gather_bytes - cross_before);
      EXPECT_LE(crossed, (nodes - 1) * nodes * (kShard + 4 * 5) + 0.0);
    } else {
      EXPECT_LE(error.max().item<double>(), 1e-5) << "one node: exact";
    }
    EXPECT_EQ(g_world->stats().total(), world_before.total()) << "nothing on the whole group";
  }
}

TEST(QuantizedReduceScatter, WorksCompleteInTheOrderTheyStarted) {
  const int w = g_world->size();
  auto [node, cross] = groups(w % 2 == 0 ? 2 : 1);
  QuantizedReduceScatter reduce(node, cross, 64);
  std::vector<at::Tensor> outs, exact;
  std::vector<zero::comm::WorkHandle> works;
  for (int i = 0; i < 3; ++i) {
    const at::Tensor in = input_of(g_world->rank() + 10 * i, 100);
    exact.push_back(torch::empty({100}));
    g_world->reduce_scatter(exact.back(), in.clone(), zero::comm::ReduceOp::Avg);
    outs.push_back(torch::zeros({100}));
    works.push_back(reduce.start(outs.back(), in.clone()));
  }
  EXPECT_FALSE(works[0]->is_completed());
  works[2]->wait();  // completes 0 and 1 first, on every rank
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(works[i]->is_completed());
    EXPECT_LT((outs[i] - exact[i]).abs().max().item<double>(), 0.02 * exact[i].abs().max().item<double>()) << i;
  }
  works[0]->wait();  // already done: nothing more
}

}  // namespace
