// zero::llama::blockwise_causal_attention (zero/llama.h): causal attention
// over blocks of query rows, as FlashAttention computes it (Dao et al.,
// arXiv 2205.14135), in LibTorch operations: each block's scores against
// the keys up to its last row, a softmax kept as its log-sum-exp, and the
// backward recomputing each block's probabilities from it. What exists at a
// time is one block's scores, [B, H, block, T], not the whole [B, H, T, T]:
// activation memory grows with T, not T^2, which long sequences need.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "zero/error.h"
#include "zero/llama.h"

namespace zero::llama {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Scores of query rows [start, end) against keys [0, end), the future masked.
at::Tensor block_scores(const at::Tensor& q, const at::Tensor& k, int64_t start, int64_t end, double scale) {
  at::Tensor s = torch::matmul(q.narrow(2, start, end - start), k.narrow(2, 0, end).transpose(2, 3)) * scale;
  at::Tensor future =
      torch::ones({end - start, end}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(start + 1);
  return s.masked_fill(future, -std::numeric_limits<float>::infinity());
}

class BlockwiseAttention : public torch::autograd::Function<BlockwiseAttention> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            int64_t block) {
    const auto dtype = q_in.scalar_type();
    const at::Tensor q = q_in.to(torch::kFloat), k = k_in.to(torch::kFloat), v = v_in.to(torch::kFloat);
    const int64_t T = q.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    at::Tensor out = torch::empty_like(q);
    at::Tensor lse = torch::empty({q.size(0), q.size(1), T}, q.options());
    for (int64_t start = 0; start < T; start += block) {
      const int64_t end = std::min(T, start + block);
      at::Tensor s = block_scores(q, k, start, end, scale);
      at::Tensor m = std::get<0>(s.max(-1, /*keepdim=*/true));
      at::Tensor p = (s - m).exp_();
      at::Tensor l = p.sum(-1, /*keepdim=*/true);
      out.narrow(2, start, end - start).copy_(torch::matmul(p, v.narrow(2, 0, end)) / l);
      lse.narrow(2, start, end - start).copy_((m + l.log()).squeeze(-1));
    }
    ctx->save_for_backward({q_in, k_in, v_in, out, lse});
    ctx->saved_data["block"] = block;
    return out.to(dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto dtype = saved[0].scalar_type();
    const at::Tensor q = saved[0].to(torch::kFloat), k = saved[1].to(torch::kFloat), v = saved[2].to(torch::kFloat);
    const at::Tensor& out = saved[3];
    const at::Tensor& lse = saved[4];
    const int64_t block = ctx->saved_data["block"].toInt(), T = q.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    const at::Tensor d_out = grads[0].to(torch::kFloat);
    const at::Tensor delta = (d_out * out).sum(-1, /*keepdim=*/true);  // rowsum(dO o O)
    at::Tensor dq = torch::empty_like(q), dk = torch::zeros_like(k), dv = torch::zeros_like(v);
    for (int64_t start = 0; start < T; start += block) {
      const int64_t end = std::min(T, start + block), rows = end - start;
      at::Tensor p = (block_scores(q, k, start, end, scale) - lse.narrow(2, start, rows).unsqueeze(-1)).exp_();
      const at::Tensor d_out_b = d_out.narrow(2, start, rows);
      dv.narrow(2, 0, end).add_(torch::matmul(p.transpose(2, 3), d_out_b));
      at::Tensor ds = p.mul_(torch::matmul(d_out_b, v.narrow(2, 0, end).transpose(2, 3)) - delta.narrow(2, start, rows));
      dq.narrow(2, start, rows).copy_(torch::matmul(ds, k.narrow(2, 0, end)) * scale);
      dk.narrow(2, 0, end).add_(torch::matmul(ds.transpose(2, 3), q.narrow(2, start, rows)) * scale);
    }
    return {dq.to(dtype), dk.to(dtype), dv.to(dtype), at::Tensor()};
  }
};

}  // namespace

at::Tensor blockwise_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t block) {
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.sizes() != q.sizes()) {
    throw EngineError("blockwise attention takes q, k and v of one shape [batch, heads, time, head_dim] "
                      "(key/value heads repeated to the query heads)");
  }
  if (block < 1) throw EngineError("blockwise attention: a block of " + std::to_string(block) + " rows; use at least 1");
  return BlockwiseAttention::apply(q, k, v, block);
}

}  // namespace zero::llama
