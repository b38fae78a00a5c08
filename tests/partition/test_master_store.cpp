// MasterStore (partition/master_store.h) over a real ParamStorage on
// the world group (run by ctest on 1-3 ranks through zero-run): where the
// master weights live, and the way back to the parameters, checked against
// the values every rank wrote into its master shard, read back element by
// element from the gathered buffers. The page-locked staging buffers serve
// accelerator shards only; the GPU benches exercise them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "world_main.h"
#include "zero/comm.h"
#include "partition/flat_layout.h"
#include "partition/master_store.h"
#include "partition/param_storage.h"

namespace {

using namespace zero::partition;

// Two parameter groups; bucket_numel 40 puts w1 and b1 in their own
// buckets and group 1 in a third.
std::vector<std::vector<ParamSpec>> model() { return {{{"w1", 37}, {"b1", 5}}, {{"w2", 9}, {"b2", 4}}}; }

// Small integers, exact in bf16: element i of bucket k as rank `writer` sets it.
float value(size_t k, int64_t i, int writer) { return static_cast<float>(10 * k + i % 7 + 20 * (writer + 1)); }

struct Parts {
  FlatLayout layout;
  ParamStorage storage;
  MasterStore masters;
  std::vector<at::Tensor> fulls;  // each bucket's buffer, as the parameters' views would see it

  // Buckets in `dtype`, starting from 1.0 everywhere; `persistent`: stay
  // gathered (below stage 3); `offload_param` for the released ones.
  Parts(at::ScalarType dtype, std::vector<bool> on_host, bool persistent = true, const std::string& offload_param = "none")
      : layout(model(), 40, g_world->size(), g_world->rank(), false),
        storage(g_world, g_world->size(), storage_options(offload_param)),
        masters(layout, storage, on_host.empty() ? std::vector<bool>(layout.buckets().size(), false) : on_host, 2) {
    const bool mixed = dtype != at::kFloat;
    for (size_t k = 0; k < layout.buckets().size(); ++k) {
      const auto& b = layout.buckets()[k];
      at::Tensor values = torch::ones({b.numel});
      fulls.push_back(mixed ? values.to(dtype) : values);
      const int64_t start = g_world->rank() * b.shard_numel;
      storage.add(fulls.back(), start, b.shard_numel, persistent, {});
      masters.add(values.slice(0, start, start + b.shard_numel), mixed || offload_param != "none");
      storage.release(k);
    }
    storage.seal();
  }
  static StorageOptions storage_options(const std::string& offload_param) {
    StorageOptions o;
    o.offload_param = *zero::offload_device_named(offload_param);
    return o;
  }
  // Every rank writes value(k, i, rank) into its master shard.
  void write_masters() {
    for (size_t k = 0; k < masters.size(); ++k) {
      at::Tensor m = masters.tensors()[k];
      for (int64_t i = 0; i < m.numel(); ++i) m[i] = value(k, i, g_world->rank());
    }
  }
  // Bucket k's buffer as every rank's master shard makes it.
  at::Tensor expected_full(size_t k) const {
    const auto& b = layout.buckets()[k];
    at::Tensor t = torch::empty({b.numel});
    for (int64_t i = 0; i < b.numel; ++i) t[i] = value(k, i % b.shard_numel, static_cast<int>(i / b.shard_numel));
    return t;
  }
};

TEST(MasterStore, Fp32MastersAreTheParameterShards) {
  Parts p(at::kFloat, {});
  ASSERT_EQ(p.masters.size(), 3u);
  for (size_t k = 0; k < p.masters.size(); ++k) {
    EXPECT_TRUE(p.masters.tensors()[k].is_same(p.storage.shard(k))) << k;
    EXPECT_FALSE(p.masters.update_target(k).defined()) << k;
  }
  EXPECT_EQ(p.masters.bytes(), 0);
  // The optimizer's groups: buckets 0-1 hold group 0, bucket 2 group 1.
  ASSERT_EQ(p.masters.by_group().size(), 2u);
  EXPECT_EQ(p.masters.by_group()[0].size(), 2u);
  ASSERT_EQ(p.masters.by_group()[1].size(), 1u);
  EXPECT_TRUE(p.masters.by_group()[1][0].is_same(p.masters.tensors()[2]));
  // Updated in place, so publishing only gathers.
  p.write_masters();
  p.masters.publish();
  for (size_t k = 0; k < p.masters.size(); ++k) EXPECT_TRUE(torch::equal(p.fulls[k], p.expected_full(k))) << k;
}

TEST(MasterStore, MixedPrecisionPublishGathersEveryRanksMasters) {
  Parts p(at::kBFloat16, {});
  int64_t shard_bytes = 0;
  for (const auto& b : p.layout.buckets()) shard_bytes += b.shard_numel * 4;
  EXPECT_EQ(p.masters.bytes(), shard_bytes);  // fp32, apart from the bf16 parameters
  for (size_t k = 0; k < p.masters.size(); ++k) {
    EXPECT_EQ(p.masters.tensors()[k].scalar_type(), at::kFloat);
    EXPECT_TRUE(p.masters.update_target(k).is_same(p.storage.shard(k))) << k;  // the shard, written in place
  }
  p.write_masters();
  p.masters.publish();
  for (size_t k = 0; k < p.masters.size(); ++k) {
    EXPECT_TRUE(torch::equal(p.fulls[k].to(at::kFloat), p.expected_full(k))) << k;
  }
}

TEST(MasterStore, ABucketUpdatedSincePublishIsNotPublishedAgain) {
  Parts p(at::kBFloat16, {});
  p.write_masters();
  // An optimizer writes bucket 0's update itself, with values unlike its master's.
  p.masters.update_target(0).fill_(-3.0);
  p.masters.send_updated(0);
  p.masters.publish();
  EXPECT_TRUE(torch::equal(p.fulls[0].to(at::kFloat), torch::full({p.layout.buckets()[0].numel}, -3.0)));
  for (size_t k = 1; k < p.masters.size(); ++k) {
    EXPECT_TRUE(torch::equal(p.fulls[k].to(at::kFloat), p.expected_full(k))) << k;
  }
  // The next publish() starts afresh: every bucket from its master.
  p.masters.publish();
  EXPECT_TRUE(torch::equal(p.fulls[0].to(at::kFloat), p.expected_full(0)));
}

TEST(MasterStore, HostMastersAreCopiesEvenInFp32) {
  // Note [Partial offload]: bucket 0 offloaded, the others not.
  Parts p(at::kFloat, {true, false, false});
  EXPECT_TRUE(p.masters.on_host(0));
  EXPECT_FALSE(p.masters.on_host(1));
  EXPECT_FALSE(p.masters.tensors()[0].is_same(p.storage.shard(0)));
  EXPECT_TRUE(torch::equal(p.masters.tensors()[0], p.storage.shard(0)));  // same values to start from
  EXPECT_TRUE(p.masters.tensors()[1].is_same(p.storage.shard(1)));
  EXPECT_EQ(p.masters.bytes(), p.layout.buckets()[0].shard_numel * 4);
  // A host shard is written in place by the host optimizer.
  EXPECT_TRUE(p.masters.update_target(0).is_same(p.storage.shard(0)));
  p.write_masters();
  p.masters.publish();
  for (size_t k = 0; k < p.masters.size(); ++k) EXPECT_TRUE(torch::equal(p.fulls[k], p.expected_full(k))) << k;
}

TEST(MasterStore, ReleasedShardsInHostMemoryCarryTheUpdateToTheNextGather) {
  Parts p(at::kFloat, {}, /*persistent=*/false, "cpu");
  for (size_t k = 0; k < p.masters.size(); ++k) {
    EXPECT_FALSE(p.storage.gathered(k)) << k;
    EXPECT_FALSE(p.masters.tensors()[k].is_same(p.storage.shard(k))) << k;  // the shard leaves for the host
  }
  p.write_masters();
  p.masters.publish();
  for (size_t k = 0; k < p.masters.size(); ++k) {
    EXPECT_FALSE(p.storage.gathered(k)) << k;  // publishing does not gather a released bucket
    p.storage.gather(k, /*async=*/false, /*exact=*/true);
    EXPECT_TRUE(torch::equal(p.fulls[k], p.expected_full(k))) << k;
  }
}

}  // namespace
