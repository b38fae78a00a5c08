// zero::mesh_shape (include/zero/mesh_shape.h): torch-free, so the config
// checks a layout against the world size with it.
#include <string>

#include "zero/error.h"
#include "zero/mesh_shape.h"

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

}  // namespace zero
