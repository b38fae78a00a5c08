// ShardedParams as checkpoints see it: where each parameter's values lie
// in the master weights (pieces, fragments), and the gradients summed so far
// when a save falls in the middle of an accumulation.
#include "zero/error.h"
#include "zero/partition.h"

namespace zero::partition {

std::vector<std::vector<ShardedParams::Piece>> ShardedParams::master_pieces() const {
  std::vector<std::vector<Piece>> out;
  for (size_t g = 0; g < master_.size(); ++g) {
    for (const auto& b : buckets_) {
      if (b.group != static_cast<int>(g)) continue;
      const int64_t lo = rank_in_owners_ * b.shard_numel, hi = lo + b.shard_numel;
      std::vector<Piece> pieces;
      for (int i : b.params) {
        const int64_t start = params_[i].offset - b.offset, end = start + params_[i].tensor.numel();
        if (std::max(start, lo) < std::min(end, hi)) {
          pieces.push_back({i, std::max(start, lo) - lo, std::min(end, hi) - std::max(start, lo)});
        }
      }
      out.push_back(std::move(pieces));
    }
  }
  return out;
}

std::vector<ShardedParams::Fragment> ShardedParams::fragments() const {
  std::vector<Fragment> out;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const Bucket& b = buckets_[k];
    const int64_t lo = b.offset + rank_in_owners_ * b.shard_numel, hi = lo + b.shard_numel;  // flat index space
    for (int i : b.params) {
      const int64_t start = params_[i].offset, end = start + params_[i].tensor.numel();
      const int64_t from = std::max(start, lo), to = std::min(end, hi);
      if (from < to) out.push_back({i, from - start, static_cast<int64_t>(k), from - lo, to - from});
    }
  }
  return out;
}

// Mid-accumulation gradients (a checkpoint between micro-steps): at stages
// 2-3 every bucket's shard in bucket order, those in host copies (Note
// [Offload copies]) too, so that the layout is the same with and without
// offload. Assembled in host memory when some are there.
at::Tensor ShardedParams::accumulated_grads() const {
  if (flat_grads_.defined()) return flat_grads_;
  bool off_device = false;
  for (const auto& b : buckets_) off_device = off_device || b.grad_off_device;
  if (!off_device) return partition_grads_;
  wait_for_host_grad_copies();
  std::vector<at::Tensor> shards;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const Bucket& b = buckets_[k];
    if (!b.grad_off_device) {
      shards.push_back(partition_slice(b).to(at::kCPU));
    } else {  // zeros when no backward ran since the last step
      shards.push_back(b.grad_on_host ? master_grads_[k] : at::zeros_like(master_grads_[k]));
    }
  }
  return at::cat(shards);
}

void ShardedParams::restore_accumulated_grads(const at::Tensor& grads) {
  const int64_t expected = flat_grads_.defined() ? flat_grads_.numel() : partition_numel_;
  if (grads.numel() != expected) {
    throw PartitionError("accumulated gradients of " + std::to_string(grads.numel()) + " elements do not fit this rank's " +
                         std::to_string(expected));
  }
  const at::Tensor values = grads.reshape(-1);
  if (flat_grads_.defined()) {
    flat_grads_.copy_(values);
    return;
  }
  int64_t start = 0;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    const at::Tensor shard = values.slice(0, start, start + b.shard_numel);
    start += b.shard_numel;
    if (b.grad_off_device) {
      master_grads_[k].copy_(shard);
      b.grad_on_host = true;  // later reductions add to it
    } else {
      partition_slice(b).copy_(shard);
    }
  }
  partition_fresh_ = false;  // later reductions add to it
}

}  // namespace zero::partition
