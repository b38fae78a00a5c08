// The rank mesh (include/zero/mesh.h).
#include "zero/mesh.h"

#include <string>

#include "zero/error.h"

namespace zero {

MeshShape mesh_shape(int world, int tp, int pp) {
  if (tp < 1 || pp < 1) {
    throw ConfigError("tensor-parallel size " + std::to_string(tp) + " and pipeline size " + std::to_string(pp) +
                      " must be at least 1");
  }
  if (world % (tp * pp) != 0) {
    std::string fits;
    for (int t = 1; t <= world; ++t) {
      for (int p = 1; t * p <= world; ++p) {
        if (world % (t * p) == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(t) + "x" + std::to_string(p);
      }
    }
    throw ConfigError("a world of " + std::to_string(world) + " rank(s) does not divide into tensor parallel " +
                      std::to_string(tp) + " x pipeline " + std::to_string(pp) +
                      " (data parallel = world / (tp * pp)); tp x pp that fit " + std::to_string(world) +
                      " ranks: " + fits);
  }
  return MeshShape{tp, world / (tp * pp), pp};
}

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
  auto keep = [](std::shared_ptr<comm::ProcessGroup>& mine, std::shared_ptr<comm::ProcessGroup> group) {
    if (group) mine = std::move(group);
  };
  for (int p = 0; p < s.pp; ++p) {  // tensor parallel: tp consecutive ranks
    for (int d = 0; d < s.dp; ++d) {
      std::vector<int> ranks;
      for (int t = 0; t < s.tp; ++t) ranks.push_back(rank_at({t, d, p}));
      keep(tp_, world_->new_group(ranks));
    }
  }
  for (int p = 0; p < s.pp; ++p) {  // data parallel: same tp rank and stage
    for (int t = 0; t < s.tp; ++t) {
      std::vector<int> ranks;
      for (int d = 0; d < s.dp; ++d) ranks.push_back(rank_at({t, d, p}));
      keep(dp_, world_->new_group(ranks));
    }
  }
  for (int d = 0; d < s.dp; ++d) {  // pipeline: the stages in order
    for (int t = 0; t < s.tp; ++t) {
      std::vector<int> ranks;
      for (int p = 0; p < s.pp; ++p) ranks.push_back(rank_at({t, d, p}));
      keep(pp_, world_->new_group(ranks));
    }
  }
  if (!tp_ || !dp_ || !pp_) throw CommError("mesh: this rank was left out of a group; every rank must build the mesh");
}

}  // namespace zero
