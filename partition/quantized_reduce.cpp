// Note [Quantized gradients]: ZeRO++'s qgZ replaces stage 3's reduce-scatter
// of gradients, which sends (W-1)/W of every bucket in full precision over
// a ring that crosses the node link, by two levels. With W = N x L ranks,
// rank r = n L + l owns shard r of the bucket.
// 1. Within the node, exact: a reduce-scatter over the L ranks of the
//    bucket viewed as [N, L, S] and transposed to [L, N, S], so that local
//    rank l receives the node's sums of shards l, L + l, ..., (N-1) L + l.
// 2. Across nodes, int8 (Note [Block quantization]): the ranks with the
//    same l on each node all-gather those N rows quantized; each adds the
//    rows for its own shard from the other nodes to its own exact row, and
//    divides by W.
// Only the quantized rows cross the node link: N x S bytes and a scale per
// block from each rank, against 4 (W-1)/W x N L S bytes of a ring's fp32
// reduce-scatter (an all-to-all would send (N-1) of the N rows; gloo has
// none here, so the all-gather carries the rank's own row too). A row's
// error is at most half a quantization step of each other node's sum.
#include "partition/quantized_reduce.h"

#include "partition/block_quant.h"

namespace zero::partition {

struct QuantizedReduceScatter::Pending {
  at::Tensor output, node_sums;  // node_sums: [N, S], this rank's rows of the node's sums
  comm::WorkHandle node_work;
  bool done = false;
};

class QuantizedReduceScatter::Handle final : public comm::Work {
 public:
  Handle(QuantizedReduceScatter* owner, std::shared_ptr<Pending> pending)
      : owner_(owner), pending_(std::move(pending)) {}
  void wait() override {
    if (!pending_->done) owner_->complete_through(pending_.get());
  }
  // Never "done" before a wait: a reducer that finishes completed works
  // first would otherwise order the cross-node collectives by timing.
  bool is_completed() override { return pending_->done; }

 private:
  QuantizedReduceScatter* owner_;
  std::shared_ptr<Pending> pending_;
};

QuantizedReduceScatter::QuantizedReduceScatter(std::shared_ptr<comm::ProcessGroup> node,
                                               std::shared_ptr<comm::ProcessGroup> cross, int64_t block)
    : node_(std::move(node)), cross_(std::move(cross)), block_(block) {}

comm::WorkHandle QuantizedReduceScatter::start(at::Tensor output, at::Tensor input) {
  const int64_t nodes = cross_->size(), per_node = node_->size(), shard = output.numel();
  auto p = std::make_shared<Pending>();
  p->output = output;
  p->node_sums = at::empty({nodes, shard}, input.options());
  const at::Tensor by_local_rank = input.view({nodes, per_node, shard}).transpose(0, 1).contiguous();
  p->node_work = node_->reduce_scatter_async(p->node_sums.view(-1), by_local_rank.view(-1), comm::ReduceOp::Sum);
  pending_.push_back(p);
  return std::make_shared<Handle>(this, p);
}

void QuantizedReduceScatter::complete_through(const Pending* last) {
  while (!pending_.empty()) {
    std::shared_ptr<Pending> p = pending_.front();
    pending_.pop_front();
    complete(*p);
    if (p.get() == last) return;
  }
}

void QuantizedReduceScatter::complete(Pending& p) {
  p.node_work->wait();
  const int64_t nodes = cross_->size(), shard = p.output.numel();
  const int64_t row_bytes = packed_bytes(shard, block_);
  const auto bytes = p.node_sums.options().dtype(at::kByte);
  at::Tensor packed = at::empty({nodes * row_bytes}, bytes);
  for (int64_t n = 0; n < nodes; ++n) {
    quantize_into(p.node_sums[n], packed.slice(0, n * row_bytes, (n + 1) * row_bytes), block_);
  }
  at::Tensor every = at::empty({nodes * nodes * row_bytes}, bytes);
  cross_->all_gather(every, packed);
  const int64_t mine = cross_->rank();
  at::Tensor sum = p.node_sums[mine].to(at::kFloat);  // this node's own row, exact
  at::Tensor row = at::empty({shard}, sum.options());
  for (int64_t from = 0; from < nodes; ++from) {
    if (from == mine) continue;
    const int64_t at = (from * nodes + mine) * row_bytes;
    dequantize_into(every.slice(0, at, at + row_bytes), row, block_);
    sum.add_(row);
  }
  p.output.copy_(sum.div_(static_cast<double>(nodes * node_->size())));
  p.done = true;
}

}  // namespace zero::partition
