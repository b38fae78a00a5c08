#pragma once
// ZeRO++'s qgZ: a reduce-scatter over the data-parallel group done in two
// levels, exact within each node and int8 between nodes (Note [Quantized
// gradients]).
#include <torch/torch.h>

#include <deque>
#include <memory>

#include "zero/comm.h"

namespace zero::partition {

class QuantizedReduceScatter {
 public:
  // `node`: this rank's node, L ranks; `cross`: the ranks with this rank's
  // place on every node, N of them, numbered by node. The data-parallel
  // group is the N x L ranks, node by node.
  QuantizedReduceScatter(std::shared_ptr<comm::ProcessGroup> node, std::shared_ptr<comm::ProcessGroup> cross,
                         int64_t block);
  // reduce_scatter(output, input, Avg) over the data-parallel group: starts
  // the node's part now; the rest runs when the returned work, or a later
  // one, is waited for (the works complete in the order they started, so
  // every rank issues the cross-node collectives in the same order).
  comm::WorkHandle start(at::Tensor output, at::Tensor input);

 private:
  struct Pending;
  class Handle;
  void complete_through(const Pending* last);
  void complete(Pending& p);

  std::shared_ptr<comm::ProcessGroup> node_, cross_;
  int64_t block_;
  std::deque<std::shared_ptr<Pending>> pending_;
};

}  // namespace zero::partition
