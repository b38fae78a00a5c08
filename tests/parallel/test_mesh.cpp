// The rank mesh (include/zero/mesh.h) on 1, 2 and 4 gloo ranks: every
// (tp, pp) that divides the world, each rank's coordinates against
// Megatron's formula, and each group's members read back through an
// all-gather of world ranks; worlds that do not divide, a clear error.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "world_main.h"
#include "zero/error.h"
#include "zero/mesh.h"

namespace {

// The world ranks of this rank's group, gathered over the group itself.
std::vector<int> members(const std::shared_ptr<zero::comm::ProcessGroup>& group) {
  at::Tensor mine = torch::tensor({static_cast<int64_t>(g_world->rank())});
  at::Tensor all = torch::empty({group->size()}, torch::kLong);
  group->all_gather(all, mine);
  std::vector<int> out;
  for (int64_t i = 0; i < all.numel(); ++i) out.push_back(static_cast<int>(all[i].item<int64_t>()));
  return out;
}

TEST(Mesh, EveryLayoutThatDividesTheWorld) {
  const int world = g_world->size(), me = g_world->rank();
  for (int tp = 1; tp <= world; ++tp) {
    for (int pp = 1; tp * pp <= world; ++pp) {
      if (world % (tp * pp) != 0) continue;
      SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp));
      zero::Mesh mesh(g_world, tp, pp);
      const int dp = world / (tp * pp);
      EXPECT_EQ(mesh.shape().dp, dp);
      // Megatron's order, written out: tp fastest, then dp, then pp.
      const auto c = mesh.coordinates();
      EXPECT_EQ(c.tp, me % tp);
      EXPECT_EQ(c.dp, (me / tp) % dp);
      EXPECT_EQ(c.pp, me / (tp * dp));
      EXPECT_EQ(mesh.rank_at(c), me);
      std::vector<int> tp_members, dp_members, pp_members;
      for (int t = 0; t < tp; ++t) tp_members.push_back(t + tp * (c.dp + dp * c.pp));
      for (int d = 0; d < dp; ++d) dp_members.push_back(c.tp + tp * (d + dp * c.pp));
      for (int p = 0; p < pp; ++p) pp_members.push_back(c.tp + tp * (c.dp + dp * p));
      EXPECT_EQ(members(mesh.tp_group()), tp_members);
      EXPECT_EQ(members(mesh.dp_group()), dp_members);
      EXPECT_EQ(members(mesh.pp_group()), pp_members);
      EXPECT_EQ(mesh.tp_group()->rank(), c.tp);
      EXPECT_EQ(mesh.dp_group()->rank(), c.dp);
      EXPECT_EQ(mesh.pp_group()->rank(), c.pp);
    }
  }
}

TEST(Mesh, AWorldThatDoesNotDivideNamesTheLayoutsThatFit) {
  try {
    zero::mesh_shape(6, 4, 1);
    FAIL() << "6 ranks accepted tp 4";
  } catch (const zero::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("does not divide into tensor parallel 4 x pipeline 1"), std::string::npos) << m;
    EXPECT_NE(m.find("2x3"), std::string::npos) << m;
    EXPECT_EQ(m.find("4x1"), std::string::npos) << m;
  }
  EXPECT_THROW(zero::mesh_shape(4, 0, 1), zero::ConfigError);
  const zero::MeshShape s = zero::mesh_shape(8, 2, 2);
  EXPECT_EQ(s.dp, 2);
  EXPECT_EQ(s.world(), 8);
}

}  // namespace
