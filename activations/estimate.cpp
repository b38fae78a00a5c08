// The activation estimate (activations/estimate.h).
#include "activations/estimate.h"

#include <algorithm>

namespace zero {

int64_t block_activation_bytes(const ActivationShape& s) {
  const int64_t sbh = s.context * s.micro_batch * s.width, e = s.bytes_per_element;
  const int64_t as2b = s.heads * s.context * s.context * s.micro_batch;
  const int64_t attention = 5 * sbh * e + 2 * as2b * e + as2b + sbh;
  const int64_t mlp = 9 * sbh * e + sbh;
  const int64_t norms = 2 * sbh * e;
  return attention + mlp + norms;
}

int64_t outside_blocks_activation_bytes(const ActivationShape& s) {
  const int64_t sb = s.context * s.micro_batch;
  return 2 * sb * s.width * s.bytes_per_element + 4 * sb * s.vocab;
}

int64_t kept_activation_bytes(const ActivationShape& s, int64_t checkpointed) {
  checkpointed = std::clamp<int64_t>(checkpointed, 0, s.depth);
  const int64_t input = s.context * s.micro_batch * s.width * s.bytes_per_element;
  return (s.depth - checkpointed) * block_activation_bytes(s) + checkpointed * input + outside_blocks_activation_bytes(s);
}

int64_t activation_bytes(const ActivationShape& s, int64_t checkpointed) {
  const bool any = std::clamp<int64_t>(checkpointed, 0, s.depth) > 0;
  return kept_activation_bytes(s, checkpointed) + (any ? block_activation_bytes(s) : 0);
}

bool checkpointed_unit(int64_t i, int64_t units, int64_t checkpoint_every, int64_t number_checkpoints) {
  if (checkpoint_every > 0) return i % checkpoint_every == 0;
  if (number_checkpoints <= 0) return false;
  const int64_t k = std::min(number_checkpoints, units);
  return (i + 1) * k / units > i * k / units;
}

int64_t checkpointed_units(int64_t depth, int64_t checkpoint_every, int64_t number_checkpoints) {
  int64_t n = 0;
  for (int64_t i = 0; i < depth; ++i) n += checkpointed_unit(i, depth, checkpoint_every, number_checkpoints) ? 1 : 0;
  return n;
}

int64_t gpt_params(const ActivationShape& s) {
  const int64_t h = s.width, L = s.depth;
  return 12 * L * h * h + 13 * L * h + (s.vocab + s.context) * h + 2 * h;
}

}  // namespace zero
