// The rank mesh (include/zero/mesh.h).
#include "zero/mesh.h"

#include <algorithm>

#include "zero/comm.h"
#include "zero/error.h"

namespace zero {

Mesh::Coordinates Mesh::coordinates_of(int world_rank) const {
  Coordinates c;
  c.tp = world_rank % shape_.tp;
  c.dp = (world_rank / shape_.tp) % shape_.dp;
  c.pp = world_rank / (shape_.tp * shape_.dp);
  return c;
}

// Every group of each kind is created on every rank in the same order (a
// rank outside one gets nullptr from new_group), keeping the one it is in.
Mesh::Mesh(std::shared_ptr<comm::ProcessGroup> world, int tp, int pp)
    : world_(std::move(world)), shape_(mesh_shape(world_->size(), tp, pp)) {
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
      std::vector<int> ranks;
      for (int t = 0; t < s.tp; ++t) ranks.push_back(rank_at({t, d, p}));
      keep(tp_, ranks);
    }
  }
  for (int p = 0; p < s.pp; ++p) {  // data parallel: same tp rank and stage
    for (int t = 0; t < s.tp; ++t) {
      std::vector<int> ranks;
      for (int d = 0; d < s.dp; ++d) ranks.push_back(rank_at({t, d, p}));
      keep(dp_, ranks);
    }
  }
  for (int d = 0; d < s.dp; ++d) {  // pipeline: the stages in order
    for (int t = 0; t < s.tp; ++t) {
      std::vector<int> ranks;
      for (int p = 0; p < s.pp; ++p) ranks.push_back(rank_at({t, d, p}));
      keep(pp_, ranks);
    }
  }
  if (!tp_ || !dp_ || !pp_) throw CommError("mesh: this rank was left out of a group; every rank must build the mesh");
  build_node_groups();
}

// Note [Node groups]: with the world on several nodes, each data-parallel
// group D is cut into slices, one per node (nodes in the order D first
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
// list that is D itself reuses dp_group().
void Mesh::build_node_groups() {
  if (world_->nodes() == 1) {
    dp_intra_ = dp_;
    return;
  }
  const MeshShape& s = shape_;
  const int me = world_->rank();
  std::vector<std::vector<std::vector<int>>> slices_of;  // by dp group: its node slices
  for (int p = 0; p < s.pp; ++p) {
    for (int t = 0; t < s.tp; ++t) {
      std::vector<int> order;  // nodes in the order this group meets them
      std::vector<std::vector<int>> slices;
      for (int d = 0; d < s.dp; ++d) {
        const int r = rank_at({t, d, p});
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
  }
  auto keep = [&](std::shared_ptr<comm::ProcessGroup>& mine, const std::vector<int>& ranks,
                  const std::vector<int>& dp_ranks) {
    const bool member = std::find(ranks.begin(), ranks.end(), me) != ranks.end();
    if (ranks == dp_ranks) {
      if (member) mine = dp_;
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
