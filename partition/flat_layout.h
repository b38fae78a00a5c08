#pragma once
// The flat layout of the trainable parameters: index arithmetic only, no
// tensors and no communication (Note [Flat layout]).
//
// Note [Flat layout]: parameters of one group are laid out in reverse
// registration order (the order backward produces their gradients) and cut
// into buckets of at most reduce_bucket_size elements (a larger parameter
// gets a bucket of its own); a bucket never mixes parameter groups, stage-3
// units or norm weights (a tensor-parallel replica counts 1/tp). Each bucket is padded to a multiple of the number of owners (the
// world size at stages 1-3, 1 at stage 0) and rank r owns the r-th
// contiguous shard of every bucket, ignoring parameter boundaries
// (Megatron's distributed optimizer). A rank's partition is its shards of all
// buckets; one reduce-scatter per bucket lands exactly on it, one all-gather
// per bucket rebuilds the bucket.
#include <cstdint>
#include <string>
#include <vector>

namespace zero::partition {

// One trainable parameter as the layout sees it.
struct ParamSpec {
  std::string name;
  int64_t numel = 0;
  int unit = -1;  // stage 3: its unit, -1 for none (the root)
  // What its gradient's squares count for in the global norm (Note
  // [Gradient norm]): 1/copies held outside the data-parallel group.
  double norm_weight = 1.0;
};

struct LayoutParam {
  std::string name;
  int64_t numel = 0;
  int group = 0;
  int bucket = 0;
  int64_t offset = 0;  // in the flat index space
};

struct LayoutBucket {
  int group = 0;
  int unit = -1;            // stage 3: the unit it belongs to (-1: root)
  double norm_weight = 1.0; // of its parameters (ParamSpec::norm_weight)
  int64_t offset = 0;       // in the flat index space
  int64_t numel = 0;        // padded to a multiple of the owners
  int64_t shard_numel = 0;  // numel / owners
  int64_t partition_offset = 0;  // where this rank's shard sits in its partition
  std::vector<int> params;  // indices into params(), in flat order
};

class FlatLayout {
 public:
  // `groups`: the parameters of each group in registration order. Units
  // split buckets only when `split_units` (stage 3).
  FlatLayout(const std::vector<std::vector<ParamSpec>>& groups, int64_t bucket_numel, int owners, int rank,
             bool split_units);

  const std::vector<LayoutParam>& params() const { return params_; }
  const std::vector<LayoutBucket>& buckets() const { return buckets_; }
  int owners() const { return owners_; }
  int rank() const { return rank_; }
  int64_t numel() const { return numel_; }            // trainable elements, unpadded
  int64_t flat_numel() const { return flat_numel_; }  // padded
  int64_t partition_numel() const { return partition_numel_; }
  int64_t max_bucket_numel() const { return max_bucket_numel_; }
  // Where this rank's shard of bucket k starts in the flat index space.
  int64_t shard_start(size_t k) const;

  // The pieces of parameters in this rank's shard of each bucket, bucket by
  // bucket (buckets are grouped, so also group by group).
  struct Piece {
    int64_t param, start, length;  // start: in the shard
  };
  std::vector<std::vector<Piece>> shard_pieces() const;

  // Note [Checkpoint layout] (ckpt/checkpoint.h): the same pieces in model space.
  struct Fragment {
    int64_t param;         // index into params()
    int64_t param_offset;  // first element in the flattened parameter
    int64_t bucket;        // the bucket, whose shard is that bucket's master tensor
    int64_t start;         // first element in the shard
    int64_t length;
  };
  std::vector<Fragment> fragments() const;

  // Per bucket, whether its optimizer runs on the host when about `ratio`
  // of the partition is offloaded (whole buckets in flat order; Note
  // [Partial offload] in master_store.h).
  std::vector<bool> offloaded_buckets(double ratio) const;

 private:
  int owners_ = 1;
  int rank_ = 0;
  std::vector<LayoutParam> params_;
  std::vector<LayoutBucket> buckets_;
  int64_t numel_ = 0, flat_numel_ = 0, partition_numel_ = 0, max_bucket_numel_ = 0;
};

}  // namespace zero::partition
