// FlatLayout: buckets, offsets and shards (Note [Flat layout] in internal/flat_layout.h).
#include "partition/flat_layout.h"

#include <algorithm>

#include "zero/error.h"

namespace zero::partition {
namespace {
int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }
}  // namespace

FlatLayout::FlatLayout(const std::vector<std::vector<ParamSpec>>& groups, int64_t bucket_numel, int owners, int rank,
                       bool split_units)
    : owners_(owners), rank_(rank) {
  if (owners < 1 || rank < 0 || rank >= owners) {
    throw PartitionError("flat layout: rank " + std::to_string(rank) + " is not one of " + std::to_string(owners) + " owners");
  }
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
    LayoutBucket current;
    int64_t filled = 0;
    auto close = [&] {
      if (current.params.empty()) return;
      current.offset = flat_numel_;
      current.numel = round_up(std::max<int64_t>(filled, 1), owners_);
      current.shard_numel = current.numel / owners_;
      current.partition_offset = partition_numel_;
      int64_t offset = current.offset;
      for (int i : current.params) {
        params_[i].offset = offset;
        params_[i].bucket = static_cast<int>(buckets_.size());
        offset += params_[i].numel;
      }
      flat_numel_ += current.numel;
      partition_numel_ += current.shard_numel;
      max_bucket_numel_ = std::max(max_bucket_numel_, current.numel);
      buckets_.push_back(current);
      current = LayoutBucket();
      current.group = g;
      filled = 0;
    };
    current.group = g;
    for (int k = static_cast<int>(groups[g].size()) - 1; k >= 0; --k) {
      const ParamSpec& p = groups[g][k];
      const int unit = split_units ? p.unit : -1;
      if (filled > 0 && (filled + p.numel > bucket_numel || unit != current.unit ||
                         p.norm_weight != current.norm_weight)) {
        close();
      }
      current.unit = unit;
      current.norm_weight = p.norm_weight;
      current.params.push_back(static_cast<int>(params_.size()));
      params_.push_back({p.name, p.numel, g, 0, 0});
      filled += p.numel;
      numel_ += p.numel;
    }
    close();
  }
}

int64_t FlatLayout::shard_start(size_t k) const { return buckets_[k].offset + rank_ * buckets_[k].shard_numel; }

std::vector<std::vector<FlatLayout::Piece>> FlatLayout::shard_pieces() const {
  std::vector<std::vector<Piece>> out(buckets_.size());
  for (const Fragment& f : fragments()) out[f.bucket].push_back({f.param, f.start, f.length});
  return out;
}

std::vector<FlatLayout::Fragment> FlatLayout::fragments() const {
  std::vector<Fragment> out;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const int64_t lo = shard_start(k), hi = lo + buckets_[k].shard_numel;  // flat index space
    for (int i : buckets_[k].params) {
      const int64_t start = params_[i].offset, end = start + params_[i].numel;
      const int64_t from = std::max(start, lo), to = std::min(end, hi);
      if (from < to) out.push_back({i, from - start, static_cast<int64_t>(k), from - lo, to - from});
    }
  }
  return out;
}

// Buckets go to the host in flat order while the share offloaded stays below
// the ratio by at least half the next bucket (the nearest split at a bucket
// boundary). Every rank has the same buckets, so the same split.
std::vector<bool> FlatLayout::offloaded_buckets(double ratio) const {
  std::vector<bool> out(buckets_.size(), false);
  const double wanted = ratio * static_cast<double>(partition_numel_);
  int64_t offloaded = 0;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    if (ratio < 1.0 && offloaded + buckets_[k].shard_numel / 2.0 >= wanted) break;
    out[k] = true;
    offloaded += buckets_[k].shard_numel;
  }
  return out;
}

}  // namespace zero::partition
