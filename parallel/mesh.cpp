// The rank mesh (include/zero/mesh.h).
#include "zero/mesh.h"

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
}

}  // namespace zero
