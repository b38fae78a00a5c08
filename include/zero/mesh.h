#pragma once
// The rank mesh of hybrid parallelism: tensor parallel (tp) x sequence
// parallel (sp) x data parallel (dp) x pipeline parallel (pp) over the
// world, in Megatron's order: tp varies fastest (a tensor-parallel group is
// consecutive ranks, one node), then sp (the ranks of one sequence are
// consecutive, as DeepSpeed's sequence-parallel groups are), then dp, then pp:
//
//   world rank = tp_rank + tp * (sp_rank + sp * (dp_rank + dp * pp_rank))
//
//   auto mesh = zero::Mesh(world, /*tp=*/2, /*pp=*/2);     // collective, every rank
//   mesh.tp_group()->all_reduce(partial_sum);              // the rank's TP group
//
// The groups are sub-groups of the world (ProcessGroup::new_group), gloo or
// NCCL as the world's tensors go. ZeRO partitions over zero_group(): the
// sp x dp ranks of one tp rank and stage (DeepSpeed's sequence-data-parallel
// group), which is dp_group() when sp is 1. The data loader splits batches
// over dp_group(): the sp ranks of one replica read one sequence.
#include <memory>
#include <vector>

#include "zero/comm.h"
#include "zero/mesh_shape.h"

namespace zero {

class Mesh {
 public:
  struct Coordinates {
    int tp = 0, dp = 0, pp = 0;
    int sp = 0;
  };

  // Every rank of `world` constructs it with the same sizes.
  Mesh(std::shared_ptr<comm::ProcessGroup> world, int tp, int pp, int sp = 1);

  const MeshShape& shape() const { return shape_; }
  const Coordinates& coordinates() const { return at_; }
  // The world rank at these coordinates (Megatron's order above).
  int rank_at(const Coordinates& c) const {
    return c.tp + shape_.tp * (c.sp + shape_.sp * (c.dp + shape_.dp * c.pp));
  }
  Coordinates coordinates_of(int world_rank) const;

  // This rank's groups; with a size of 1 a group holds this rank alone.
  const std::shared_ptr<comm::ProcessGroup>& world() const { return world_; }
  const std::shared_ptr<comm::ProcessGroup>& tp_group() const { return tp_; }
  const std::shared_ptr<comm::ProcessGroup>& dp_group() const { return dp_; }
  const std::shared_ptr<comm::ProcessGroup>& pp_group() const { return pp_; }
  const std::shared_ptr<comm::ProcessGroup>& sp_group() const { return sp_; }
  // What ZeRO partitions over and averages gradients across: sp x dp.
  const std::shared_ptr<comm::ProcessGroup>& zero_group() const { return zero_; }

  // Nodes (comm::ProcessGroup::node()): how many the world runs on.
  int nodes() const { return world_->nodes(); }
  // ZeRO's group (zero_group()) split along nodes, for collectives that stay
  // on a node before they cross the link between nodes (ZeRO++'s hpZ and
  // qgZ). Note [Node groups] in parallel/mesh.cpp.
  //   dp_intra_node_group(): the ranks of zero_group() on this rank's node,
  //     in its order (every rank of one node: shared memory);
  //   dp_inter_node_group(): one rank of zero_group() on each node, the one
  //     at this rank's place among its node's (every rank over the link).
  // On one node these are zero_group() and null: nothing crosses a link.
  // Both are null when nodes hold different numbers of some group's ranks
  // (no regular hierarchy).
  const std::shared_ptr<comm::ProcessGroup>& dp_intra_node_group() const { return dp_intra_; }
  const std::shared_ptr<comm::ProcessGroup>& dp_inter_node_group() const { return dp_inter_; }

 private:
  void build_node_groups();
  // The world ranks of every ZeRO group (sp x dp of one tp rank and stage), in rank order.
  std::vector<std::vector<int>> zero_group_ranks() const;

  std::shared_ptr<comm::ProcessGroup> world_, tp_, dp_, pp_, sp_, zero_, dp_intra_, dp_inter_;
  MeshShape shape_;
  Coordinates at_;
};

}  // namespace zero
