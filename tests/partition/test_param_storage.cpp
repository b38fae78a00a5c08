// ParamStorage (Note [Stage 3 storage] in partition/param_storage.h) on
// the world group (run by ctest on 1-3 ranks through zero-run), for each
// place a released shard can live: the bytes each bucket's buffer holds
// after release, gather, prefetch and read-ahead, checked against the
// values every rank wrote, read back element by element.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>

#include "world_main.h"
#include "zero/comm.h"
#include "partition/block_quant.h"
#include "partition/param_storage.h"
#include "zero/unit.h"

namespace {

using zero::partition::ParamStorage;
using zero::partition::StorageOptions;

// Bucket k's shard numel; bucket 0 stays gathered ("persistent").
constexpr int64_t kShard[] = {7, 5, 12};
constexpr int kBuckets = 3;

// Element i of bucket k as written by `writer` (-1: the first values, the same on every rank).
float value(int k, int64_t i, int writer) { return static_cast<float>(1000 * k + i + 100000 * (writer + 1)); }

at::Tensor expected_full(int k, int writer_offset) {
  const int n = g_world->size();
  at::Tensor t = torch::empty({kShard[k] * n});
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int owner = static_cast<int>(i / kShard[k]);
    t[i] = value(k, i, writer_offset < 0 ? -1 : owner + writer_offset);
  }
  return t;
}

class EachPlace : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    StorageOptions options;
    options.offload_param = *zero::offload_device_named(GetParam());
    if (options.offload_param == zero::OffloadDevice::nvme) {
      dir_ = std::filesystem::temp_directory_path() /
             ("zero_param_storage_" + std::to_string(::getpid()));
      std::filesystem::create_directories(dir_);
      options.swap.nvme_path = dir_.string();
      options.swap.rank = g_world->rank();
      options.swap.block_size = 4096;
    }
    storage_ = std::make_unique<ParamStorage>(g_world, g_world->size(), options);
    for (int k = 0; k < kBuckets; ++k) {
      fulls_.push_back(expected_full(k, -1));
      views_.push_back(fulls_.back().slice(0, 1, 4).view({3, 1}));  // as a parameter would be
      storage_->add(fulls_.back(), g_world->rank() * kShard[k], kShard[k], /*persistent=*/k == 0,
                    {{views_.back(), 1, {3, 1}}});
    }
    for (int k = 0; k < kBuckets; ++k) storage_->release(k);
    storage_->seal();
  }
  void TearDown() override {
    storage_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  int64_t released_shard_bytes() const { return (kShard[1] + kShard[2]) * static_cast<int64_t>(sizeof(float)); }

  std::filesystem::path dir_;
  std::vector<at::Tensor> fulls_, views_;
  std::unique_ptr<ParamStorage> storage_;
};

TEST_P(EachPlace, ReleaseEmptiesTheBufferAndGatherRefillsItExactly) {
  EXPECT_TRUE(storage_->gathered(0));
  EXPECT_TRUE(torch::equal(fulls_[0], expected_full(0, -1)));
  for (int k = 1; k < kBuckets; ++k) {
    EXPECT_FALSE(storage_->gathered(k));
    EXPECT_EQ(fulls_[k].storage().nbytes(), 0u) << k;
    // DeepSpeed's released parameter: no elements, its shape kept apart.
    EXPECT_EQ(views_[k].numel(), 0) << k;
    EXPECT_EQ(zero::gathered_shape(views_[k]), (std::vector<int64_t>{3, 1})) << k;
    EXPECT_EQ(zero::gathered_numel(views_[k]), 3) << k;
  }
  EXPECT_EQ(views_[0].sizes(), (std::vector<int64_t>{3, 1})) << "a bucket that stays gathered keeps its parameters whole";
  // The shards kept apart count wherever they are (offloaded_bytes says where).
  EXPECT_EQ(storage_->bytes(), static_cast<int64_t>(fulls_[0].nbytes()) + released_shard_bytes());
  storage_->gather(1, /*async=*/false, /*exact=*/true);
  storage_->gather(2, /*async=*/true, /*exact=*/true);
  storage_->wait_gathered(2);
  for (int k = 1; k < kBuckets; ++k) {
    ASSERT_TRUE(storage_->gathered(k));
    EXPECT_TRUE(torch::equal(fulls_[k], expected_full(k, -1))) << k;
    EXPECT_TRUE(torch::equal(views_[k], expected_full(k, -1).slice(0, 1, 4).view({3, 1}))) << "the parameter's view sees it";
  }
  storage_->release_all();
  EXPECT_FALSE(storage_->gathered(1));
  EXPECT_EQ(views_[1].numel(), 0);
  EXPECT_TRUE(storage_->gathered(0));
}

TEST_P(EachPlace, UpdatedShardsReachEveryRank) {
  const int rank = g_world->rank();
  for (int k = 0; k < kBuckets; ++k) {
    storage_->prepare_write(k);
    at::Tensor mine = torch::empty({kShard[k]});
    for (int64_t i = 0; i < kShard[k]; ++i) mine[i] = value(k, rank * kShard[k] + i, rank + 7);
    storage_->shard(k).copy_(mine);
    if (auto work = storage_->send_shard(k)) work->wait();
  }
  storage_->wait_writes();
  EXPECT_TRUE(torch::equal(fulls_[0], expected_full(0, 7))) << "a bucket that stays gathered is gathered in place";
  for (int k = 1; k < kBuckets; ++k) {
    EXPECT_FALSE(storage_->gathered(k));
    storage_->gather(k, /*async=*/false, /*exact=*/true);
    EXPECT_TRUE(torch::equal(fulls_[k], expected_full(k, 7))) << k;
  }
}

TEST_P(EachPlace, ReadAheadIsUsedByTheNextGatherOrDropped) {
  storage_->read_ahead(1);
  storage_->release_all();  // the read was for nothing
  storage_->read_ahead(2);
  storage_->gather(2, /*async=*/true, /*exact=*/true);
  storage_->wait_gathered(2);
  EXPECT_TRUE(torch::equal(fulls_[2], expected_full(2, -1)));
  storage_->gather(1, /*async=*/true, /*exact=*/true);
  storage_->wait_gathered(1);
  EXPECT_TRUE(torch::equal(fulls_[1], expected_full(1, -1)));
}

TEST_P(EachPlace, CountsOffloadedBytesWhereTheyAre) {
  const std::string place = GetParam();
  EXPECT_EQ(storage_->offloaded_bytes(/*nvme=*/false), place == "cpu" ? released_shard_bytes() : 0);
  EXPECT_EQ(storage_->offloaded_bytes(/*nvme=*/true), place == "nvme" ? released_shard_bytes() : 0);
}

// memory_report().gathered_params_peak: what is gathered of the buckets that
// are released between uses, now and at most, against the buckets' sizes.
TEST_P(EachPlace, CountsGatheredBytesAndTheirPeak) {
  auto full_bytes = [](int k) { return kShard[k] * g_world->size() * static_cast<int64_t>(sizeof(float)); };
  const int64_t setup_peak = storage_->gathered_peak();  // SetUp held buckets 1 and 2 before releasing them
  EXPECT_EQ(setup_peak, full_bytes(1) + full_bytes(2));
  EXPECT_EQ(storage_->gathered_bytes(), 0);
  storage_->gather(0, /*async=*/false, /*exact=*/true);  // persistent: never counted
  storage_->gather(2, /*async=*/false, /*exact=*/true);
  EXPECT_EQ(storage_->gathered_bytes(), full_bytes(2));
  storage_->release(2);
  storage_->release(2);  // a second release changes nothing
  EXPECT_EQ(storage_->gathered_bytes(), 0);
  storage_->gather(1, /*async=*/true, /*exact=*/true);
  storage_->gather(1, /*async=*/true, /*exact=*/true);  // nor a second gather
  storage_->wait_gathered(1);
  EXPECT_EQ(storage_->gathered_bytes(), full_bytes(1));
  storage_->release_all();
  EXPECT_EQ(storage_->gathered_bytes(), 0);
  EXPECT_EQ(storage_->gathered_peak(), setup_peak) << "the peak is a high-water mark";
}

// qwZ: a unit's gather carries every rank's shard quantized (Note [Block
// quantization]); gather_parameters' exact gather carries the values.
TEST(QuantizedGather, EachShardArrivesAsItsQuantizationAndExactGathersAreExact) {
  constexpr int64_t kBlock = 8, kNumel = 21;
  StorageOptions options;
  options.quantized_block = kBlock;
  ParamStorage storage(g_world, g_world->size(), options);
  const int n = g_world->size();
  torch::manual_seed(9);  // the same on every rank
  const at::Tensor values = torch::randn({kNumel * n}) * 3;
  at::Tensor full = values.clone();
  storage.add(full, g_world->rank() * kNumel, kNumel, /*persistent=*/false, {});
  storage.release(0);
  at::Tensor want = torch::empty_like(values);
  for (int r = 0; r < n; ++r) {
    const at::Tensor shard = values.slice(0, r * kNumel, (r + 1) * kNumel);
    at::Tensor packed = torch::empty({zero::partition::packed_bytes(kNumel, kBlock)}, torch::kByte);
    zero::partition::quantize_into(shard, packed, kBlock);
    zero::partition::dequantize_into(packed, want.slice(0, r * kNumel, (r + 1) * kNumel), kBlock);
  }
  storage.gather(0, /*async=*/true, /*exact=*/false);
  storage.wait_gathered(0);
  EXPECT_TRUE(torch::equal(full, want));
  EXPECT_FALSE(torch::equal(full, values)) << "the quantization changed something";
  storage.release(0);
  storage.gather(0, /*async=*/false, /*exact=*/true);
  EXPECT_TRUE(torch::equal(full, values));
}

// hpZ (Note [Secondary partition]): the gather after a unit's forward
// comes from the node's secondary partition, not from the shards, until
// the backward is done or the shard changes. Nodes here: pairs of ranks
// (one rank each with an odd world).
TEST(SecondaryPartition, TheNextGatherComesFromTheNodeUntilReleaseAllOrAWrite) {
  constexpr int64_t kBlock = 8, kNumel = 12;
  const int n = g_world->size(), per_node = n % 2 == 0 ? 2 : 1;
  std::shared_ptr<zero::comm::ProcessGroup> node;
  for (int first = 0; first < n; first += per_node) {
    std::vector<int> ranks;
    for (int r = first; r < first + per_node; ++r) ranks.push_back(r);
    auto group = g_world->new_group(ranks);
    if (group) node = group;
  }
  StorageOptions options;
  options.quantized_block = kBlock;
  options.secondary_group = node;
  ParamStorage storage(g_world, n, options);
  torch::manual_seed(9);
  const at::Tensor values = torch::randn({kNumel * n});
  at::Tensor full = values.clone();
  storage.add(full, g_world->rank() * kNumel, kNumel, /*persistent=*/false, {});
  storage.release(0);
  const int64_t shards_only = storage.bytes();
  storage.gather(0, /*async=*/false, /*exact=*/false);  // forward's: from every rank, quantized
  const at::Tensor forward = full.clone();
  storage.release(0);
  EXPECT_EQ(storage.bytes(), shards_only + kNumel * n / per_node * 4) << "1/L of the buffer is kept";

  storage.shard(0).fill_(50);  // no write announced: a later gather that read the shards would see it
  const auto world_before = g_world->stats().all_gather_bytes;
  storage.gather(0, /*async=*/true, /*exact=*/false);  // backward's: within the node
  storage.wait_gathered(0);
  EXPECT_TRUE(torch::equal(full, forward)) << "the secondary partition's values";
  EXPECT_EQ(g_world->stats().all_gather_bytes, world_before) << "nothing crossed the node";
  storage.release(0);

  storage.release_all();  // the backward is done
  EXPECT_EQ(storage.bytes(), shards_only);
  storage.gather(0, /*async=*/false, /*exact=*/false);
  EXPECT_TRUE(torch::equal(full.slice(0, g_world->rank() * kNumel, (g_world->rank() + 1) * kNumel),
                           torch::full({kNumel}, 50.0f)))
      << "from the shards again";
  storage.release(0);
  storage.prepare_write(0);  // an update drops the secondary too
  storage.shard(0).fill_(-2);
  storage.send_shard(0);
  storage.gather(0, /*async=*/false, /*exact=*/false);
  EXPECT_TRUE(torch::equal(full.slice(0, g_world->rank() * kNumel, (g_world->rank() + 1) * kNumel),
                           torch::full({kNumel}, -2.0f)));
}

INSTANTIATE_TEST_SUITE_P(Places, EachPlace, ::testing::Values("none", "cpu", "nvme"),
                         [](const auto& info) { return info.param; });

}  // namespace
