#pragma once
// Model-state memory per rank, estimated before training: what zero's
// engine holds for a model of `params` trainable parameters at each ZeRO
// stage (the figures of DeepSpeed's estimate_zero{2,3}_model_states_mem_needs,
// in zero's own accounting). Torch-free; `zero-config FILE --estimate` prints it.
//
//   zero::EstimateInput in;
//   in.params = 7'000'000'000;  in.world_size = 8;  in.stage = 2;
//   zero::MemoryEstimate m = zero::estimate_memory(in);   // m.device.total(), ...
//
// Ψ = params, N = world_size, b = dtype_bytes, K = state_bytes_per_element.
// Padding: every bucket is padded to a multiple of its owners (Note [Flat
// layout] in partition/flat_layout.h), so the estimate pads Ψ once:
//   P = ceil(Ψ/N)*N at stages 1-3 (Ψ at stage 0, where nothing is sharded),
//   S = P/N, the shard of one rank.
// This is a lower bound of the engine's padding (each bucket adds its own).
//
// Bytes held per rank, without offload:
//   params       stages 0-2: P*b            stage 3: S*b, and with R known
//                                           (root_params) R*(N-1)/N more: the
//                                           parameters outside every unit
//                                           stay gathered; P*b when every
//                                           bucket is below
//                                           stage3_param_persistence_threshold
//                                           (B below it: each stays gathered)
//   gradients    stages 0-1: P*b            stages 2-3: S*b + the reduce buffers,
//                                           each the largest bucket B*b: one,
//                                           two with overlap_comm when there
//                                           is more than one bucket
// B = min(reduce_bucket_size, P); at stage 3 buckets also end where units
// do, so with the largest unit U and the parameters outside every unit R
// known (unit_params, root_params), B = min(reduce_bucket_size, max(U, R)).
// A bucket holds whole tensors: B is at least the largest tensor, when
// known (largest_tensor).
//   fp32 master  mixed precision only:      stage 0: P*4, stages 1-3: S*4
//   optimizer    stage 0: P*K               stages 1-3: S*K
// Mixed-precision Adam, Ψ divisible by N, reduce buffers left out: 16Ψ, 4Ψ + 12Ψ/N,
// 2Ψ + 14Ψ/N, 16Ψ/N, DeepSpeed's figures.
// Not counted: activations, the module's buffers, temporaries, and at stage 3
// the parameters of the units being gathered: MemoryEstimate::gathered_params_max
// bounds them. Given the largest unit's size U (unit_params) it is the
// engine's rule (partition/units.cpp): the unit running, and the next one
// prefetched when U <= stage3_prefetch_bucket_size and 2U fits
// stage3_max_live_parameters: (U or 2U)*b. With stage3_max_reuse_distance
// R > 0 the last units of forward also stay gathered into backward (Note
// [Reuse distance]): up to K = min(Ψ, R/2 + U) elements, and K + U with the
// prefetch (the larger of the two rules). Without U: min(Ψ, max_live + R/2)*b.
//
// hpZ (zero_hpz_partition_size L > 1, stage 3): each unit's forward gather
// leaves a secondary copy of 1/L of it on the rank (Note [Secondary
// partition] in partition/param_storage.cpp), kept until its backward is
// done, so at the end of forward it is the whole model's:
// MemoryEstimate::secondary_params_max = ceil(P/L)*b where the gathered
// units live, not in device. L must divide N, as the engine requires.
//
// Offload (each valid only where the config allows it; anything else throws):
//   offload_optimizer "cpu" (stages 1-3): the fp32 master shard, the optimizer
//     states and a copy of the reduced gradient shard S*b (in the training
//     dtype, as the CPU optimizer reads it) live in host memory, and two
//     page-locked staging buffers of a bucket's shard carry the updated
//     parameters to the device (2*ceil(min(reduce_bucket_size, P)/N)*b,
//     reported as host params). At stages 2-3 the device's gradient
//     partition holds none of the offloaded share: each reduced bucket goes
//     straight to the host (with gradient accumulation the sum builds up
//     there, through the device), so the device keeps the reduce buffers.
//     With fp32 training the host still keeps an fp32 copy of the shard S*4
//     for the CPU optimizer to update (reported as fp32_master). Without an
//     accelerator (EstimateInput::accelerator false: CPU ranks) the
//     optimizer reads the gradients and writes the parameters where they
//     are: no host gradient shard, no staging.
//     Partial offload (offload_optimizer_ratio r < 1): the host holds
//     round(r*S) elements of master weights, states and gradient copies; the
//     device keeps the rest of the master weights (mixed precision) and
//     states. The engine splits at bucket boundaries, so its share differs
//     from r*S by up to half a bucket's shard.
//   offload_optimizer "nvme" (stage 3): master shard and states on NVMe; the
//     host keeps the gradient shard and staging buffers as with "cpu", and
//     the step's sub-groups in flight: up to 3 (read-ahead, current,
//     write-behind) of min(sub_group_size, S) elements of master weights and
//     states, no more than S in all (host fp32_master and optimizer_states; the engine makes a
//     sub-group of whole buckets, so a bucket larger than sub_group_size is
//     one sub-group). offload_optimizer_buffer_count is not used. Partial
//     offload likewise: round(r*S) elements on NVMe, the rest on the device.
//   offload_param "cpu" (stage 3): the parameter shard S*b lives in host memory.
//   offload_param "nvme" (stage 3): the shard on NVMe. Each bucket's shard
//     is read into its own memory just before the unit's all-gather and let
//     go after it, so what the host holds for it is part of the gathered
//     units, but for the shards of one unit more, read ahead (1/N of a
//     unit, when the unit's size is known); offload_param_buffer_count and
//     buffer_size (DeepSpeed's pinned read buffers) are not used.

#include <cstdint>
#include <string>

#include "zero/choices.h"

namespace zero {

struct EstimateInput {
  int64_t params = 0;                  // Ψ, trainable parameters
  int64_t world_size = 1;              // N, data-parallel ranks
  int stage = 0;                       // 0..3
  int dtype_bytes = 4;                 // b: 2 (fp16, bf16) or 4 (fp32)
  int state_bytes_per_element = 8;     // K: see optimizer_state_bytes()
  bool mixed_precision = false;        // fp16/bf16 with an fp32 master copy
  int64_t reduce_bucket_size = 500000000;          // elements
  // Stages 2-3 reduce a bucket while backward fills the next: two reduce
  // buffers instead of one (a bucket that fills before an earlier one is
  // reduced can borrow a third; not counted).
  bool overlap_comm = false;
  int64_t stage3_max_live_parameters = 1000000000;  // elements
  int64_t stage3_max_reuse_distance = 1000000000;   // elements
  int64_t stage3_prefetch_bucket_size = 50000000;   // elements
  int64_t stage3_param_persistence_threshold = 100000;  // elements: a bucket below it stays gathered
  int64_t unit_params = 0;  // stage 3: the largest unit's parameters, when known (0: unknown)
  int64_t root_params = -1; // stage 3: the parameters outside every unit, when known (-1: unknown)
  int64_t largest_tensor = 0;  // the largest parameter's elements, when known (0: unknown)
  int64_t hpz_partition_size = 1;  // stage 3: zero_hpz_partition_size, the ranks of a node (1: no hpZ)
  OffloadDevice offload_optimizer = OffloadDevice::none;
  double offload_optimizer_ratio = 1.0;    // partial offload ("cpu"): the share on the host
  OffloadDevice offload_param = OffloadDevice::none;
  // The parameters live on an accelerator (the usual case). With CPU ranks
  // the offload optimizer reads the gradient shard where it was reduced, so
  // the host holds no second copy of it.
  bool accelerator = true;
  // NVMe staging buffers in host memory (DeepSpeed's defaults).
  int64_t sub_group_size = 1000000000;             // elements
  // offload_optimizer.nvme_gradients (stages 2-3 with "nvme"): the
  // offloaded share's reduced gradients live on NVMe; host memory holds the
  // buckets being written and the step's sub-groups' (Note [Gradients on
  // NVMe] in partition/host_grads.h).
  bool nvme_gradients = false;
  // ...and they reach the files (not with super_offload's update in
  // backward, no clipping, no fp16 and no accumulation: it takes them from
  // memory), so they take disk space.
  bool nvme_gradients_written = true;
  // super_offload's update runs in backward (no clipping, no fp16): the
  // boundary's gradients wait in memory for their sub-group's update only.
  bool update_in_backward = false;
  int64_t offload_optimizer_buffer_count = 4;
  int64_t offload_param_buffer_count = 5;
  int64_t offload_param_buffer_size = 100000000;   // elements
};

// Bytes of each kind of model state in one place.
struct MemoryBytes {
  int64_t params = 0;
  int64_t gradients = 0;
  int64_t fp32_master = 0;
  int64_t optimizer_states = 0;
  int64_t total() const { return params + gradients + fp32_master + optimizer_states; }
};

struct MemoryEstimate {
  int64_t padded_params = 0;   // P
  int64_t shard_params = 0;    // S
  MemoryBytes device;          // accelerator memory of one rank
  MemoryBytes host;            // host memory for one rank (pinned when offloading)
  MemoryBytes nvme;            // NVMe space for one rank
  // Stages 2-3: the reduce buffers inside device.gradients, each the size
  // of the largest bucket, B*b (above).
  int64_t reduce_buffers = 0;       // bytes, all of them
  int reduce_buffer_count = 0;      // 1, or 2 with overlap_comm and more than one bucket
  // Stage 3: up to this many more device bytes for the parameters of the
  // units being gathered (see above); not in device.
  int64_t gathered_params_max = 0;
  // Stage 3 with hpZ: up to this many more bytes, beside the gathered
  // units, for the secondary partition (see above); not in device.
  int64_t secondary_params_max = 0;
  // Each kind summed over the three places.
  MemoryBytes all() const;
};

// Throws zero::PartitionError naming the field when the input is out of range
// or asks for an offload its stage does not allow.
MemoryEstimate estimate_memory(const EstimateInput& in);

// CPU ranks (with accelerator false): the parameters' device is host
// memory, so `m`'s device bytes are added to its host bytes and device is
// zero (gathered_params_max and secondary_params_max are then host memory too).
MemoryEstimate device_as_host(MemoryEstimate m);

// K for an optimizer type as the config spells it ("Adam", "AdamW", "SGD",
// "Adagrad", "Lamb"): Adam/AdamW 8 (12 with amsgrad), SGD 4 with momentum
// else 0, Adagrad 4, Lamb 8. Throws zero::PartitionError for another type.
int optimizer_state_bytes(OptimizerKind kind, bool amsgrad, double momentum);
// The same for the type as a config spells it; an unknown one is a PartitionError.
int optimizer_state_bytes(const std::string& type, bool amsgrad, double momentum);

// Whether `device` ("none", "cpu", "nvme") may be used for the optimizer or
// the parameters at `stage`, as the config checks allow ("none" always).
bool offload_optimizer_allowed(OffloadDevice device, int stage);
bool offload_param_allowed(OffloadDevice device, int stage);
// The same for a device as a config spells it (false for a name outside the set).
bool offload_optimizer_allowed(const std::string& device, int stage);
bool offload_param_allowed(const std::string& device, int stage);

}  // namespace zero
