// zero::mesh_shape (include/zero/mesh_shape.h): torch-free, so the config
// checks a layout against the world size with it.
#include <cstdint>
#include <string>

#include "zero/error.h"
#include "zero/mesh_shape.h"

namespace zero {

MeshShape mesh_shape(int world, int tp, int pp, int sp) {
  if (tp < 1 || pp < 1 || sp < 1) {
    throw ConfigError("tensor-parallel size " + std::to_string(tp) + ", pipeline size " + std::to_string(pp) +
                      " and sequence-parallel size " + std::to_string(sp) + " must be at least 1");
  }
  // In 64 bits, each product checked before the next: sizes near 2^31 must not overflow.
  const int64_t tp_pp = int64_t{tp} * pp;
  if (tp_pp > world || tp_pp * sp > world || world % (tp_pp * sp) != 0) {
    std::string fits;
    for (int64_t t = 1; t <= world; ++t) {
      for (int64_t p = 1; t * p <= world; ++p) {
        if (t * p * sp <= world && world % (t * p * sp) == 0)
          fits += (fits.empty() ? "" : ", ") + std::to_string(t) + "x" + std::to_string(p);
      }
    }
    const std::string with_sp = sp > 1 ? " x sequence parallel " + std::to_string(sp) : "";
    throw ConfigError("a world of " + std::to_string(world) + " rank(s) does not divide into tensor parallel " +
                      std::to_string(tp) + " x pipeline " + std::to_string(pp) + with_sp +
                      " (data parallel = world / (tp * pp * sp)); tp x pp that fit " + std::to_string(world) +
                      " ranks" + (sp > 1 ? " at sp " + std::to_string(sp) : "") + ": " +
                      (fits.empty() ? "none" : fits));
  }
  return MeshShape{tp, static_cast<int>(world / (tp_pp * sp)), pp, sp};
}

}  // namespace zero
