// FlatLayout (Note [Flat layout]) against an element-by-element walk of the
// flat index space: which parameter each element belongs to, and which rank
// owns it. No tensors, no communication.
#include <gtest/gtest.h>

#include <map>

#include "zero/error.h"
#include "partition/flat_layout.h"

namespace {

using zero::partition::FlatLayout;
using zero::partition::ParamSpec;

// Two groups; the first has units 0, 0, 1, -1 (registration order).
std::vector<std::vector<ParamSpec>> model() {
  return {{{"a", 5, 0}, {"b", 3, 0}, {"c", 11, 1}, {"d", 2, -1}}, {{"e", 4, -1}, {"f", 1, -1}}};
}

TEST(FlatLayout, BucketsFollowReverseRegistrationOrderAndNeverMixGroups) {
  const FlatLayout layout(model(), /*bucket_numel=*/8, /*owners=*/1, /*rank=*/0, /*split_units=*/false);
  std::vector<std::vector<std::string>> names;
  for (const auto& b : layout.buckets()) {
    names.emplace_back();
    for (int i : b.params) names.back().push_back(layout.params()[i].name);
  }
  // Group 0 reversed: d(2) c(11) b(3) a(5); a bucket closes before it
  // would pass 8 elements, c alone is larger. Group 1 reversed: f(1) e(4).
  const std::vector<std::vector<std::string>> expected = {{"d"}, {"c"}, {"b", "a"}, {"f", "e"}};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(layout.buckets()[3].group, 1);
  EXPECT_EQ(layout.numel(), 26);
}

TEST(FlatLayout, UnitsSplitBucketsWhenAsked) {
  const FlatLayout layout(model(), /*bucket_numel=*/100, 1, 0, /*split_units=*/true);
  std::vector<int> units;
  for (const auto& b : layout.buckets()) units.push_back(b.unit);
  EXPECT_EQ(units, (std::vector<int>{-1, 1, 0, -1}));  // d | c | b a | f e
  const FlatLayout merged(model(), 100, 1, 0, /*split_units=*/false);
  EXPECT_EQ(merged.buckets().size(), 2u);  // one per group
}

// Every element of the flat space, walked one by one: padding or (param,
// offset), owned by rank (element - bucket offset) / shard size.
TEST(FlatLayout, ShardsAndFragmentsCoverEveryElementOnce) {
  for (int owners : {1, 2, 3, 4}) {
    std::map<std::pair<int64_t, int64_t>, int> owner_of;  // (param, offset) -> rank
    for (int rank = 0; rank < owners; ++rank) {
      const FlatLayout layout(model(), 8, owners, rank, true);
      int64_t flat = 0, partition = 0;
      for (const auto& b : layout.buckets()) {
        EXPECT_EQ(b.offset, flat);
        EXPECT_EQ(b.numel % owners, 0);
        EXPECT_EQ(b.shard_numel * owners, b.numel);
        EXPECT_EQ(b.partition_offset, partition);
        int64_t used = 0;
        for (int i : b.params) used += layout.params()[i].numel;
        EXPECT_LT(b.numel - used, owners);  // no more padding than needed
        flat += b.numel;
        partition += b.shard_numel;
      }
      EXPECT_EQ(layout.flat_numel(), flat);
      EXPECT_EQ(layout.partition_numel(), partition);
      for (const auto& f : layout.fragments()) {
        const auto& b = layout.buckets()[f.bucket];
        const auto& p = layout.params()[f.param];
        EXPECT_EQ(p.bucket, f.bucket);
        for (int64_t e = 0; e < f.length; ++e) {
          const int64_t element = p.offset + f.param_offset + e;  // flat index
          EXPECT_EQ((element - b.offset) / b.shard_numel, rank);
          EXPECT_EQ(element - layout.shard_start(f.bucket), f.start + e);
          EXPECT_TRUE(owner_of.emplace(std::make_pair(f.param, f.param_offset + e), rank).second)
              << "element " << e << " of " << p.name << " is in two fragments";
        }
      }
      const auto pieces = layout.shard_pieces();
      size_t n = 0;
      for (const auto& bucket : pieces) n += bucket.size();
      EXPECT_EQ(n, layout.fragments().size());
    }
    EXPECT_EQ(static_cast<int64_t>(owner_of.size()), 26) << owners << " owners";
  }
}

TEST(FlatLayout, PartialOffloadTakesWholeBucketsInFlatOrder) {
  // Four buckets of 4 elements each (one parameter each).
  const FlatLayout layout({{{"a", 4}, {"b", 4}, {"c", 4}, {"d", 4}}}, 4, 1, 0, false);
  auto count = [&](double ratio) {
    int n = 0;
    for (bool on : layout.offloaded_buckets(ratio)) n += on;
    return n;
  };
  EXPECT_EQ(count(1.0), 4);
  EXPECT_EQ(count(0.0), 0);
  EXPECT_EQ(count(0.5), 2);
  EXPECT_EQ(count(0.3), 1);   // 1.2 buckets wanted: the nearest boundary is 1
  EXPECT_EQ(count(0.45), 2);  // 1.8 buckets wanted: 2
  const auto half = layout.offloaded_buckets(0.5);
  EXPECT_TRUE(half[0] && half[1] && !half[2] && !half[3]);
}

TEST(FlatLayout, RankOutsideTheOwnersIsAnError) {
  EXPECT_THROW(FlatLayout(model(), 8, 2, 2, false), zero::PartitionError);
}

}  // namespace
