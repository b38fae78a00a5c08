#pragma once
// Activation memory per rank of a GPT-style transformer, estimated before
// training, with and without activation checkpointing (torch-free; printed
// by `zero-config FILE --estimate --micro B --context S --width H --depth L`).
//
// Per block, s = context, b = micro batch, h = width, a = heads, e = bytes
// per activation element (2 in fp16/bf16, 4 in fp32), dropout masks 1 byte
// each (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
// Transformer Models", section 4.1; 34sbh + 5as²b at e = 2):
//   attention  5sbh·e + 2as²b·e + as²b + sbh   (LN output, Q, K, V, scores,
//              softmax, dropout of both, the projection's input)
//   MLP        9sbh·e + sbh                    (input, 4h before and after GELU, mask)
//   LayerNorms 2sbh·e
// Outside the blocks: the final LayerNorm's and the head's inputs, 2sbh·e,
// and the fp32 log-softmax of the logits, 4sbV.
// A checkpointed block keeps only its input, sbh·e; backward recomputes one
// block at a time, so one block's full activations come back at the peak.
#include <cstdint>

namespace zero {

struct ActivationShape {
  int64_t micro_batch = 1, context = 1, width = 1, depth = 1, heads = 1, vocab = 1;
  int bytes_per_element = 2;
};

int64_t block_activation_bytes(const ActivationShape& s);        // one block, nothing checkpointed
int64_t outside_blocks_activation_bytes(const ActivationShape& s);
// What forward leaves for backward when `checkpointed` of the `depth`
// blocks recompute (what engine.memory_report().activations_peak measures).
int64_t kept_activation_bytes(const ActivationShape& s, int64_t checkpointed);
// The peak during backward: the above and, with any checkpointed, one
// block's activations recomputed.
int64_t activation_bytes(const ActivationShape& s, int64_t checkpointed);
// Whether unit `i` of `units` recomputes under the config's checkpoint_every
// (every k-th from the first) or, without it, number_checkpoints (that many,
// evenly spaced); 0 means unset. The engine chooses its units with this.
bool checkpointed_unit(int64_t i, int64_t units, int64_t checkpoint_every, int64_t number_checkpoints);
// How many of `depth` units that chooses.
int64_t checkpointed_units(int64_t depth, int64_t checkpoint_every, int64_t number_checkpoints);
// The trainable parameters of the example GPT (examples/gpt) of that shape,
// tied embeddings: 12Lh² + 13Lh + (V + s)h + 2h.
int64_t gpt_params(const ActivationShape& s);

}  // namespace zero
