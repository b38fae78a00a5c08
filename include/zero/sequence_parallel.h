#pragma once
// Ulysses sequence parallelism (DeepSpeed-Ulysses, arXiv 2309.14509): the
// P ranks of a sequence-parallel group (Mesh::sp_group()) each hold T/P
// consecutive tokens of one sequence. Around attention two all-to-alls swap
// the split: before it, each rank trades its tokens of all heads for all
// tokens of H/P heads; after it, the reverse.
//
//   q = zero::sp::seq_to_heads(q, sp);   // [B, T/P, H, D] -> [B, T, H/P, D]
//   y = attention(q, k, v);              // whole sequence, this rank's heads
//   y = zero::sp::heads_to_seq(y, sp);   // [B, T, H/P, D] -> [B, T/P, H, D]
//
// Rank r holds heads [r H/P, (r+1) H/P) after seq_to_heads and tokens
// [r T/P, (r+1) T/P) before it. Each is the other's backward, and each is the
// identity on a group of one. Each moves (P-1)/P of its input (CommStats'
// all_to_all_bytes).
#include <torch/types.h>

#include <cstdint>
#include <memory>

#include "zero/comm.h"

namespace zero::sp {

using Group = std::shared_ptr<comm::ProcessGroup>;

at::Tensor seq_to_heads(const at::Tensor& x, const Group& group);
at::Tensor heads_to_seq(const at::Tensor& x, const Group& group);

// Key/value heads for Ulysses with grouped-query attention. With at least P
// key/value heads they split as the query heads do (P must divide them);
// with fewer, each is repeated P / heads times first (P must be a multiple
// of them), so that every rank gets the one whole head its query heads use:
// DeepSpeed's UlyssesSPAttentionHF does the same. x: [B, T/P, heads, D].
at::Tensor kv_for_heads(const at::Tensor& x, const Group& group);

// Rank r's tokens [r T/P, (r+1) T/P) of x [B, T, ...]; T must divide by P.
// A collective: the ranks compare a digest of x, and rows that differ on
// some rank of the group throw EngineError naming it (each would otherwise
// train on a sequence stitched from several).
at::Tensor own_tokens(const at::Tensor& x, const Group& group);
// The position of this rank's first token.
int64_t first_position(int64_t local_tokens, const Group& group);

// The sum of x over the group, the same on every rank; backward sums the
// gradients over the group too. A loss built on it (sum of every rank's
// token losses over their count) is the whole sequence's loss on every
// rank, and each rank backpropagates P times its own tokens' share of it;
// ZeRO's average over sp x dp divides the P back out (as DeepSpeed's
// differentiable all-gather of the ranks' losses does).
at::Tensor sum_over(const at::Tensor& x, const Group& group);

// sum_over(local_sum) / the count summed over the group (a plain division
// on a group of one): the mean over every rank's tokens of a loss each rank
// summed over its own.
at::Tensor mean_over(const at::Tensor& local_sum, const at::Tensor& local_count, const Group& group);

// Mean next-token cross-entropy (float32) over every rank's tokens: logits
// [B, T/P, V] and labels [B, T/P] of this rank, already shifted over the
// whole sequence (the label of a rank's last token is the next rank's first
// token), -100 for none. The same value on every rank of the group.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels, const Group& group);

}  // namespace zero::sp
