// Ulysses sequence parallelism (include/zero/sequence_parallel.h).
#include "zero/sequence_parallel.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>
#include <xxhash.h>

#include <cstdio>
#include <string>

#include "parallel/autograd_group.h"
#include "zero/error.h"

namespace zero::sp {
namespace {

using parallel_detail::ref;

void check_4d(const char* op, const at::Tensor& x) {
  if (x.dim() != 4) {
    throw EngineError(std::string("sequence parallel: ") + op + " takes [batch, time, heads, head_dim]; got " +
                      std::to_string(x.dim()) + " dimensions");
  }
}

// [B, T/P, H, D] -> [B, T, H/P, D]: chunk q of the heads goes to rank q;
// what comes from rank p is its tokens, placed p-th along time.
at::Tensor to_heads(const at::Tensor& x, const Group& g) {
  const int64_t P = g->size(), B = x.size(0), Tl = x.size(1), H = x.size(2), D = x.size(3);
  if (H % P != 0) {
    throw EngineError("sequence parallel: " + std::to_string(H) + " heads do not split over " + std::to_string(P) +
                      " ranks; the sequence-parallel size must divide the attention heads");
  }
  at::Tensor send = x.reshape({B, Tl, P, H / P, D}).permute({2, 0, 1, 3, 4}).contiguous();
  at::Tensor recv = at::empty_like(send);
  g->all_to_all(recv.view({-1}), send.view({-1}));
  return recv.permute({1, 0, 2, 3, 4}).reshape({B, P * Tl, H / P, D});
}

// [B, T, H/P, D] -> [B, T/P, H, D]: chunk q of the time goes to rank q;
// what comes from rank p is its heads, placed p-th along heads.
at::Tensor to_seq(const at::Tensor& x, const Group& g) {
  const int64_t P = g->size(), B = x.size(0), T = x.size(1), h = x.size(2), D = x.size(3);
  if (T % P != 0) {
    throw EngineError("sequence parallel: " + std::to_string(T) + " tokens do not split over " + std::to_string(P) +
                      " ranks");
  }
  at::Tensor send = x.reshape({B, P, T / P, h, D}).permute({1, 0, 2, 3, 4}).contiguous();
  at::Tensor recv = at::empty_like(send);
  g->all_to_all(recv.view({-1}), send.view({-1}));
  return recv.permute({1, 2, 0, 3, 4}).reshape({B, T / P, P * h, D});
}

at::Tensor summed(const at::Tensor& x, const Group& g) {
  at::Tensor out = x.contiguous().clone();
  g->all_reduce(out, comm::ReduceOp::Sum);
  return out;
}

// Each all-to-all is the other's backward; a sum's backward is a sum.
using SeqToHeads = parallel_detail::GroupMapping<to_heads, to_seq>;
using HeadsToSeq = parallel_detail::GroupMapping<to_seq, to_heads>;
using SumOver = parallel_detail::GroupMapping<summed, summed>;

bool alone(const Group& g) { return !g || g->size() == 1; }

}  // namespace

at::Tensor seq_to_heads(const at::Tensor& x, const Group& group) {
  check_4d("seq_to_heads", x);
  if (alone(group)) return x;
  return SeqToHeads::apply(x, ref(group));
}

at::Tensor heads_to_seq(const at::Tensor& x, const Group& group) {
  check_4d("heads_to_seq", x);
  if (alone(group)) return x;
  return HeadsToSeq::apply(x, ref(group));
}

at::Tensor kv_for_heads(const at::Tensor& x, const Group& group) {
  check_4d("kv_for_heads", x);
  if (alone(group)) return x;
  const int64_t P = group->size(), heads = x.size(2);
  if (heads >= P) {
    if (heads % P != 0) {
      throw EngineError("sequence parallel: " + std::to_string(heads) + " key/value heads do not split over " +
                        std::to_string(P) + " ranks; use a sequence-parallel size that divides them, or one they divide");
    }
    return x;
  }
  if (P % heads != 0) {
    throw EngineError("sequence parallel: " + std::to_string(heads) + " key/value heads do not divide " +
                      std::to_string(P) + " ranks; use a sequence-parallel size that is a multiple of them");
  }
  return x.repeat_interleave(P / heads, /*dim=*/2);
}

// Every rank of the group must slice the same rows, or each would train on
// a sequence made of pieces of several: one 64-bit digest of the rows,
// compared over the group (comm::disagreement), names a rank that differs.
void check_same_rows(const at::Tensor& x, const Group& group) {
  const at::Tensor rows = x.contiguous().cpu();
  char digest[32];
  std::snprintf(digest, sizeof(digest), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(rows.data_ptr(), rows.nbytes())));
  std::string shape;
  for (int64_t d : rows.sizes()) shape += (shape.empty() ? "" : "x") + std::to_string(d);
  const std::string differs = comm::disagreement(*group, {{"the rows to slice (shape, XXH3)", shape + " " + digest}});
  if (!differs.empty()) {
    throw EngineError("sequence parallel: the ranks of one sequence-parallel group were given different rows: " +
                      differs + "; give every rank of an sp group the same batch (the engine's data loader splits "
                      "over mesh().dp_group(), whose ranks' sp peers read the same rows)");
  }
}

at::Tensor own_tokens(const at::Tensor& x, const Group& group) {
  if (alone(group)) return x;
  const int64_t P = group->size(), T = x.size(1);
  if (T % P != 0) {
    throw EngineError("sequence parallel: a sequence of " + std::to_string(T) + " tokens does not split over " +
                      std::to_string(P) + " ranks; pad it to a multiple of " + std::to_string(P));
  }
  check_same_rows(x, group);
  return x.narrow(1, group->rank() * (T / P), T / P);
}

int64_t first_position(int64_t local_tokens, const Group& group) {
  return alone(group) ? 0 : group->rank() * local_tokens;
}

at::Tensor sum_over(const at::Tensor& x, const Group& group) {
  if (alone(group)) return x;
  return SumOver::apply(x, ref(group));
}

at::Tensor mean_over(const at::Tensor& local_sum, const at::Tensor& local_count, const Group& group) {
  if (alone(group)) return local_sum / local_count;
  return sum_over(local_sum, group) / summed(local_count, group);  // a count: nothing to differentiate
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels, const Group& group) {
  namespace F = torch::nn::functional;
  at::Tensor flat = logits.to(torch::kFloat).reshape({-1, logits.size(-1)});
  at::Tensor targets = labels.reshape({-1});
  if (alone(group)) return F::cross_entropy(flat, targets);
  at::Tensor local = F::cross_entropy(flat, targets, F::CrossEntropyFuncOptions().reduction(torch::kSum));
  return mean_over(local, (targets != -100).sum().to(torch::kFloat), group);
}

}  // namespace zero::sp
