#pragma once
// The sizes of the rank mesh (include/zero/mesh.h), without LibTorch: the
// ds_config's checks and zero-config use them, and those build torch-free.
namespace zero {

struct MeshShape {
  int tp = 1, dp = 1, pp = 1;
  int sp = 1;  // sequence parallel: ranks that share one sequence (Ulysses)
  int world() const { return tp * sp * dp * pp; }
  // The ranks ZeRO partitions over: data x sequence parallel, as DeepSpeed's
  // sequence-data-parallel group.
  int zero() const { return dp * sp; }
};

// The shape for `world` ranks at tp x sp x pp; dp = world / (tp * sp * pp).
// A world that tp * sp * pp does not divide throws ConfigError naming the
// sizes that would work.
MeshShape mesh_shape(int world, int tp, int pp, int sp = 1);

}  // namespace zero
