#pragma once
// The sizes of the rank mesh (include/zero/mesh.h), without LibTorch: the
// ds_config's checks and zero-config use them, and those build torch-free.
namespace zero {

struct MeshShape {
  int tp = 1, dp = 1, pp = 1;
  int world() const { return tp * dp * pp; }
};

// The shape for `world` ranks at tp x pp; dp = world / (tp * pp). A world
// that tp * pp does not divide throws ConfigError naming the (tp, pp) pairs
// that would work.
MeshShape mesh_shape(int world, int tp, int pp);

}  // namespace zero
