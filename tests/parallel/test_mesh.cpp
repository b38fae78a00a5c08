// The rank mesh (include/zero/mesh.h) on 1, 2 and 4 gloo ranks: every
// (tp, pp, sp) that divides the world, each rank's coordinates against
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
      for (int sp = 1; tp * pp * sp <= world; ++sp) {
        if (world % (tp * pp * sp) != 0) continue;
        SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " sp " + std::to_string(sp));
        zero::Mesh mesh(g_world, tp, pp, sp);
        const int dp = world / (tp * pp * sp);
        EXPECT_EQ(mesh.shape().dp, dp);
        EXPECT_EQ(mesh.shape().sp, sp);
        // Megatron's order, written out: tp fastest, then sp, then dp, then pp.
        const auto c = mesh.coordinates();
        EXPECT_EQ(c.tp, me % tp);
        EXPECT_EQ(c.sp, (me / tp) % sp);
        EXPECT_EQ(c.dp, (me / (tp * sp)) % dp);
        EXPECT_EQ(c.pp, me / (tp * sp * dp));
        EXPECT_EQ(mesh.rank_at(c), me);
        auto at = [&](int t, int q, int d, int p) { return t + tp * (q + sp * (d + dp * p)); };
        std::vector<int> tp_members, sp_members, dp_members, pp_members, zero_members;
        for (int t = 0; t < tp; ++t) tp_members.push_back(at(t, c.sp, c.dp, c.pp));
        for (int q = 0; q < sp; ++q) sp_members.push_back(at(c.tp, q, c.dp, c.pp));
        for (int d = 0; d < dp; ++d) dp_members.push_back(at(c.tp, c.sp, d, c.pp));
        for (int p = 0; p < pp; ++p) pp_members.push_back(at(c.tp, c.sp, c.dp, p));
        for (int r = 0; r < world; ++r) {  // ZeRO's: every rank of this tp rank and stage
          if (r % tp == c.tp && r / (tp * sp * dp) == c.pp) zero_members.push_back(r);
        }
        EXPECT_EQ(members(mesh.tp_group()), tp_members);
        EXPECT_EQ(members(mesh.sp_group()), sp_members);
        EXPECT_EQ(members(mesh.dp_group()), dp_members);
        EXPECT_EQ(members(mesh.pp_group()), pp_members);
        EXPECT_EQ(members(mesh.zero_group()), zero_members);
        EXPECT_EQ(mesh.tp_group()->rank(), c.tp);
        EXPECT_EQ(mesh.sp_group()->rank(), c.sp);
        EXPECT_EQ(mesh.dp_group()->rank(), c.dp);
        EXPECT_EQ(mesh.pp_group()->rank(), c.pp);
        EXPECT_EQ(mesh.zero_group()->rank(), c.sp + sp * c.dp);
        if (sp == 1) EXPECT_EQ(mesh.zero_group(), mesh.dp_group()) << "no sp: ZeRO's group is the dp group itself";
      }
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
  const zero::MeshShape with_sp = zero::mesh_shape(8, 1, 1, 4);
  EXPECT_EQ(with_sp.dp, 2);
  EXPECT_EQ(with_sp.zero(), 8);
  try {
    zero::mesh_shape(6, 1, 1, 4);
    FAIL() << "6 ranks accepted sp 4";
  } catch (const zero::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sequence parallel 4"), std::string::npos) << e.what();
  }
}

}  // namespace
