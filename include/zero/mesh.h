#pragma once
// The rank mesh of hybrid parallelism: tensor parallel (tp) x data parallel
// (dp) x pipeline parallel (pp) over the world, in Megatron's order: tp
// varies fastest (a tensor-parallel group is consecutive ranks, one node),
// then dp, then pp:
//
//   world rank = tp_rank + tp * (dp_rank + dp * pp_rank)
//
//   auto mesh = zero::Mesh(world, /*tp=*/2, /*pp=*/2);     // collective, every rank
//   mesh.tp_group()->all_reduce(partial_sum);              // the rank's TP group
//
// The groups are sub-groups of the world (ProcessGroup::new_group), gloo or
// NCCL as the world's tensors go; ZeRO partitions over dp_group().
#include <memory>
#include <vector>

#include "zero/comm.h"
#include "zero/mesh_shape.h"

namespace zero {

class Mesh {
 public:
  struct Coordinates {
    int tp = 0, dp = 0, pp = 0;
  };

  // Every rank of `world` constructs it with the same sizes.
  Mesh(std::shared_ptr<comm::ProcessGroup> world, int tp, int pp);

  const MeshShape& shape() const { return shape_; }
  const Coordinates& coordinates() const { return at_; }
  // The world rank at these coordinates (Megatron's order above).
  int rank_at(const Coordinates& c) const { return c.tp + shape_.tp * (c.dp + shape_.dp * c.pp); }
  Coordinates coordinates_of(int world_rank) const;

  // This rank's groups; with a size of 1 a group holds this rank alone.
  const std::shared_ptr<comm::ProcessGroup>& world() const { return world_; }
  const std::shared_ptr<comm::ProcessGroup>& tp_group() const { return tp_; }
  const std::shared_ptr<comm::ProcessGroup>& dp_group() const { return dp_; }
  const std::shared_ptr<comm::ProcessGroup>& pp_group() const { return pp_; }

  // Nodes (comm::ProcessGroup::node()): how many the world runs on.
  int nodes() const { return world_->nodes(); }
  // The data-parallel group split along nodes, for collectives that stay
  // on a node before they cross the link between nodes (ZeRO++'s hpZ and
  // qgZ). Note [Node groups] in parallel/mesh.cpp.
  //   dp_intra_node_group(): the ranks of dp_group() on this rank's node,
  //     in dp order (every rank of one node: shared memory);
  //   dp_inter_node_group(): one rank of dp_group() on each node, the one
  //     at this rank's place among its node's (every rank over the link).
  // On one node these are dp_group() and null: nothing crosses a link. Both
  // are null when nodes hold different numbers of some dp group's ranks
  // (no regular hierarchy).
  const std::shared_ptr<comm::ProcessGroup>& dp_intra_node_group() const { return dp_intra_; }
  const std::shared_ptr<comm::ProcessGroup>& dp_inter_node_group() const { return dp_inter_; }

 private:
  void build_node_groups();

  std::shared_ptr<comm::ProcessGroup> world_, tp_, dp_, pp_, dp_intra_, dp_inter_;
  MeshShape shape_;
  Coordinates at_;
};

}  // namespace zero
