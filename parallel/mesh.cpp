// The rank mesh (include/zero/mesh.h).
#include "zero/mesh.h"

#include <algorithm>

#include "zero/comm.h"
#include "zero/error.h"

namespace zero {

Mesh::Coordinates Mesh::coordinates_of(int world_rank) const {
  Coordinates c;
  c.tp = world_rank % shape_.tp;
  c.sp = (world_rank / shape_.tp) % shape_.sp;
  c.dp = (world_rank / (shape_.tp * shape_.sp)) % shape_.dp;
  c.pp = world_rank / (shape_.tp * shape_.sp * shape_.dp);
  return c;
}

std::vector<std::vector<int>> Mesh::zero_group_ranks() const {
  const MeshShape& s = shape_;
  std::vector<std::vector<int>> lists;
  for (int p = 0; p < s.pp; ++p) {
    for (int t = 0; t < s.tp; ++t) {
      std::vector<int> ranks;  // world ranks grow with sp first, then dp
      for (int d = 0; d < s.dp; ++d) {
        for (int q = 0; q < s.sp; ++q) ranks.push_back(rank_at({t, d, p, q}));
      }
      lists.push_back(std::move(ranks));
    }
  }
  return lists;
}

// Every group of each kind is created on every rank in the same order (a
// rank outside one gets nullptr from new_group), keeping the one it is in.
Mesh::Mesh(std::shared_ptr<comm::ProcessGroup> world, int tp, int pp, int sp)
    : world_(std::move(world)), shape_(mesh_shape(world_->size(), tp, pp, sp)) {
  at_ = coordinates_of(world_->rank());
  const MeshShape& s = shape_;
  // A group of the whole world is the world itself: no second set of
  // connections, and its traffic shows in the world's stats().
  auto keep = [this](std::shared_ptr<comm::ProcessGroup>& mine, const std::vector<int>& ranks) {
    auto group = static_cast<int>(ranks.size()) == world_->size() ? world_ : world_->new_group(ranks);
    if (group) mine = std::move(group);
  };
  for (int p = 0; p < s.pp; ++p) {  // tensor parallel: tp consecutive ranks
    for (int d = 0; d < s.dp; ++d) {
      for (int q = 0; q < s.sp; ++q) {
        std::vector<int> ranks;
        for (int t = 0; t < s.tp; ++t) ranks.push_back(rank_at({t, d, p, q}));
        keep(tp_, ranks);
      }
    }
  }
  for (int p = 0; p < s.pp; ++p) {  // data parallel: same tp rank, sp rank and stage
    for (int q = 0; q < s.sp; ++q) {
      for (int t = 0; t < s.tp; ++t) {
        std::vector<int> ranks;
        for (int d = 0; d < s.dp; ++d) ranks.push_back(rank_at({t, d, p, q}));
        keep(dp_, ranks);
      }
    }
  }
  for (int d = 0; d < s.dp; ++d) {  // pipeline: the stages in order
    for (int q = 0; q < s.sp; ++q) {
      for (int t = 0; t < s.tp; ++t) {
        std::vector<int> ranks;
        for (int p = 0; p < s.pp; ++p) ranks.push_back(rank_at({t, d, p, q}));
        keep(pp_, ranks);
      }
    }
  }
  // Sequence parallel and ZeRO's group come after the others, so that a
  // mesh without sp creates the groups it always did, in the same order
  // (and so under the same names). Without sp the sp group is this rank
  // alone: the tp group when that is one rank too.
  if (s.sp > 1 || s.tp > 1) {
    for (int p = 0; p < s.pp; ++p) {
      for (int d = 0; d < s.dp; ++d) {
        for (int t = 0; t < s.tp; ++t) {
          std::vector<int> ranks;
          for (int q = 0; q < s.sp; ++q) ranks.push_back(rank_at({t, d, p, q}));
          keep(sp_, ranks);
        }
      }
    }
  } else {
    sp_ = tp_;
  }
  if (s.sp > 1) {
    for (const auto& ranks : zero_group_ranks()) keep(zero_, ranks);
  } else {
    zero_ = dp_;
  }
  if (!tp_ || !dp_ || !pp_ || !sp_ || !zero_)
    throw CommError("mesh: this rank was left out of a group; every rank must build the mesh");
  build_node_groups();
}

// Note [Node groups]: with the world on several nodes, each of ZeRO's
// groups D (data parallel, or sp x dp with sequence parallelism) is cut into slices, one per node (nodes in the order D first
// meets them, ranks in D's order). A slice is an intra-node group; the j-th
// ranks of all slices form an inter-node group. That needs every slice to
// be the same size; ZeRO++ (DeepSpeed's hpZ and qgZ) has the same rule.
// With D = {0, 1, 2, 3} on 2 nodes of 2: intra {0, 1} and {2, 3}, inter
// {0, 2} and {1, 3}: a dp rank is (inter rank) x (intra rank), and a
// collective over D can run as one within the node and one across nodes.
// The groups are built only when the world spans nodes, so one node's jobs
// create no groups beyond tp, dp and pp (their names, which number the
// world's sub-groups, stay as they were). Every rank computes the same lists
// from ProcessGroup::node(), so every rank calls new_group in one order; a
// list that is D itself reuses zero_group().
void Mesh::build_node_groups() {
  if (world_->nodes() == 1) {
    dp_intra_ = zero_;
    return;
  }
  const int me = world_->rank();
  std::vector<std::vector<std::vector<int>>> slices_of;  // by ZeRO group: its node slices
  for (const auto& group : zero_group_ranks()) {
    std::vector<int> order;  // nodes in the order this group meets them
    std::vector<std::vector<int>> slices;
    for (const int r : group) {
      const int node = world_->node(r);
      const size_t at = static_cast<size_t>(std::find(order.begin(), order.end(), node) - order.begin());
      if (at == order.size()) {
        order.push_back(node);
        slices.emplace_back();
      }
      slices[at].push_back(r);
    }
    for (const auto& slice : slices) {
      if (slice.size() != slices.front().size()) return;  // no regular hierarchy: both stay null
    }
    slices_of.push_back(std::move(slices));
  }
  auto keep = [&](std::shared_ptr<comm::ProcessGroup>& mine, const std::vector<int>& ranks,
                  const std::vector<int>& dp_ranks) {
    const bool member = std::find(ranks.begin(), ranks.end(), me) != ranks.end();
    if (ranks == dp_ranks) {
      if (member) mine = zero_;
      return;
    }
    auto group = world_->new_group(ranks);
    if (member) mine = std::move(group);
  };
  for (const auto& slices : slices_of) {
    std::vector<int> dp_ranks;
    for (const auto& slice : slices) dp_ranks.insert(dp_ranks.end(), slice.begin(), slice.end());
    std::sort(dp_ranks.begin(), dp_ranks.end());  // D in dp order: world ranks grow with d
    for (const auto& slice : slices) keep(dp_intra_, slice, dp_ranks);
    for (size_t j = 0; j < slices.front().size(); ++j) {
      std::vector<int> across;
      for (const auto& slice : slices) across.push_back(slice[j]);
      keep(dp_inter_, across, dp_ranks);
    }
  }
}

}  // namespace zero
