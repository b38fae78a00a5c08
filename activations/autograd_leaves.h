#pragma once
// What the recomputing autograd functions of activations/ share.
#include <torch/csrc/autograd/variable.h>

namespace zero {

// The leaves requiring grad that a recomputed graph reaches from `roots`,
// other than `listed` (recompute.cpp).
torch::autograd::variable_list unlisted_leaves(const torch::autograd::variable_list& roots,
                                               const torch::autograd::variable_list& listed);

}  // namespace zero
