// The model-state memory estimate (partition/estimate.h) against the formulas of
// zero's accounting, and `zero-config --estimate` run as a user would.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "config_test_util.h"
#include "activations/estimate.h"
#include "partition/estimate.h"

namespace {

using zero::EstimateInput;
using zero::MemoryEstimate;
using zero_test::source_path;

// Mixed-precision (bf16/fp16) Adam at `stage`.
EstimateInput mixed_adam(int64_t params, int64_t world_size, int stage) {
  EstimateInput in;
  in.params = params;
  in.world_size = world_size;
  in.stage = stage;
  in.dtype_bytes = 2;
  in.mixed_precision = true;
  in.state_bytes_per_element = 8;
  return in;
}

TEST(ConfigEstimate, MixedPrecisionAdamGivesDeepSpeedsFigures) {
  const int64_t psi = 1536000000;   // divisible by every N below: no padding
  for (int64_t n : {1, 2, 4, 8, 64}) {
    // DeepSpeed's model-state bytes per rank (the ZeRO paper's 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N), without the bucket.
    const int64_t expected[4] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
    for (int stage = 0; stage <= 3; ++stage) {
      MemoryEstimate m = zero::estimate_memory(mixed_adam(psi, n, stage));
      EXPECT_EQ(m.device.total() - m.reduce_buffers, expected[stage]) << "stage " << stage << ", N " << n;
      EXPECT_EQ(m.host.total(), 0);
      EXPECT_EQ(m.nvme.total(), 0);
      EXPECT_EQ(m.padded_params, psi);
      EXPECT_EQ(m.reduce_buffers, stage >= 2 ? int64_t{500000000} * 2 : 0) << stage;   // one buffer of 5e8 bf16
      // max_live 1e9 and half the reuse distance 1e9 (the last units of forward kept for backward)
      EXPECT_EQ(m.gathered_params_max, stage == 3 ? int64_t{1500000000} * 2 : 0) << stage;
    }
  }
  // Per kind at stage 2: 2Ψ params, 2Ψ/N grads (+ bucket), 4Ψ/N master, 8Ψ/N Adam.
  MemoryEstimate m = zero::estimate_memory(mixed_adam(psi, 8, 2));
  EXPECT_EQ(m.device.params, 2 * psi);
  EXPECT_EQ(m.device.gradients, 2 * psi / 8 + m.reduce_buffers);
  EXPECT_EQ(m.device.fp32_master, 4 * psi / 8);
  EXPECT_EQ(m.device.optimizer_states, 8 * psi / 8);
}

TEST(ConfigEstimate, BucketAndGatheredParamsAreBoundedByTheModel) {
  EstimateInput in = mixed_adam(1000, 4, 3);
  in.stage3_param_persistence_threshold = 0;  // the bucket is released between uses (ReleasedBuckets below: not)
  MemoryEstimate m = zero::estimate_memory(in);
  EXPECT_EQ(m.reduce_buffers, 1000 * 2);         // min(reduce_bucket_size, P) * b
  EXPECT_EQ(m.gathered_params_max, 1000 * 2);    // min(Ψ, stage3_max_live_parameters) * b
  in.params = 4000000000;
  in.reduce_bucket_size = 200000000;
  in.stage3_max_live_parameters = 300000000;
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.reduce_buffers, int64_t{200000000} * 2);
  EXPECT_EQ(m.gathered_params_max, int64_t{300000000 + 500000000} * 2);  // max_live + reuse distance / 2
  EXPECT_EQ(m.device.gradients, int64_t{1000000000} * 2 + m.reduce_buffers);
  EXPECT_EQ(m.reduce_buffer_count, 1);
  // overlap_comm: a second buffer fills while the first is reduced.
  in.overlap_comm = true;
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.reduce_buffer_count, 2);
  EXPECT_EQ(m.reduce_buffers, 2 * int64_t{200000000} * 2);
  EXPECT_EQ(m.device.gradients, int64_t{1000000000} * 2 + 2 * int64_t{200000000} * 2);
  in.stage = 1;   // stage 1 keeps the whole gradient: no reduce buffers
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.reduce_buffers, 0);
  EXPECT_EQ(m.device.gradients, int64_t{4000000000} * 2);
}

// The engine's pool of reduce buffers (partition/grad_reducer.cpp): each
// the largest bucket, one, two with overlap_comm only once there is a second
// bucket; at stage 3 buckets end at units, so with the model's units known
// the largest is the larger of a unit and what is outside every unit, and
// never smaller than the largest tensor. Every bucket below
// stage3_param_persistence_threshold stays gathered.
TEST(ConfigEstimate, ReduceBuffersAreTheEnginesPool) {
  EstimateInput in = mixed_adam(1000000, 2, 2);
  in.overlap_comm = true;
  in.reduce_bucket_size = 500000000;  // larger than the model: one bucket, one buffer
  MemoryEstimate m = zero::estimate_memory(in);
  EXPECT_EQ(m.reduce_buffer_count, 1);
  EXPECT_EQ(m.reduce_buffers, 1000000 * 2);
  in.reduce_bucket_size = 300000;     // four buckets: two buffers
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.reduce_buffer_count, 2);
  EXPECT_EQ(m.reduce_buffers, 2 * 300000 * 2);
  in.largest_tensor = 400000;         // a tensor is not split: its bucket is the largest
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.reduce_buffers, 2 * 400000 * 2);
  // Stage 3: units of 200000, 200000 outside them (kept whole on each rank).
  in.stage = 3, in.largest_tensor = 0, in.reduce_bucket_size = 500000000;
  in.unit_params = 200000, in.root_params = 200000;
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.reduce_buffers, 2 * 200000 * 2);
  EXPECT_EQ(m.device.params, (500000 + 100000) * 2);  // the shard and the other half of the root
  in.stage3_param_persistence_threshold = 200001;       // every bucket below it: all stay gathered
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.device.params, 1000000 * 2);
  EXPECT_EQ(m.gathered_params_max, 0);
}

TEST(ConfigEstimate, PadsToAMultipleOfTheWorldSize) {
  // Ψ = 10 on 4 ranks: P = 12, S = 3.
  const int64_t p = 12, s = 3, b = 2;
  MemoryEstimate m = zero::estimate_memory(mixed_adam(10, 4, 1));
  EXPECT_EQ(m.padded_params, p);
  EXPECT_EQ(m.shard_params, s);
  EXPECT_EQ(m.device.params, p * b);
  EXPECT_EQ(m.device.gradients, p * b);
  EXPECT_EQ(m.device.fp32_master, s * 4);
  EXPECT_EQ(m.device.optimizer_states, s * 8);
  EstimateInput released = mixed_adam(10, 4, 3);
  released.stage3_param_persistence_threshold = 0;
  m = zero::estimate_memory(released);
  EXPECT_EQ(m.device.params, s * b);
  EXPECT_EQ(m.device.gradients, s * b + p * b);   // the bucket holds all of P
  // Stage 0 shards nothing, so pads nothing (Note [Flat layout]: one owner).
  m = zero::estimate_memory(mixed_adam(10, 4, 0));
  EXPECT_EQ(m.padded_params, 10);
  EXPECT_EQ(m.device.total(), 16 * 10);
  // A large model one parameter past a multiple of 8.
  const int64_t psi = 7000000001;
  m = zero::estimate_memory(mixed_adam(psi, 8, 2));
  EXPECT_EQ(m.padded_params, 7000000008);
  EXPECT_EQ(m.shard_params, 875000001);
  EXPECT_EQ(m.device.total() - m.reduce_buffers, 2 * int64_t{7000000008} + 14 * int64_t{875000001});
  EXPECT_GT(m.device.total() - m.reduce_buffers, 2 * psi + 14 * psi / 8);
}

TEST(ConfigEstimate, Fp32TrainingHasNoMasterCopy) {
  const int64_t psi = 800000000, n = 8, s = psi / n;
  EstimateInput fp32 = mixed_adam(psi, n, 1);
  fp32.dtype_bytes = 4;
  fp32.mixed_precision = false;
  MemoryEstimate f = zero::estimate_memory(fp32);
  MemoryEstimate h = zero::estimate_memory(mixed_adam(psi, n, 1));
  EXPECT_EQ(f.device.fp32_master, 0);
  EXPECT_EQ(f.device.params, 4 * psi);
  EXPECT_EQ(f.device.gradients, 4 * psi);
  EXPECT_EQ(f.device.optimizer_states, 8 * s);
  EXPECT_EQ(f.device.total(), 8 * psi + 8 * s);
  EXPECT_EQ(h.device.fp32_master, 4 * s);
  EXPECT_EQ(h.device.params, 2 * psi);
  EXPECT_EQ(h.device.total(), 4 * psi + 12 * s);
  // Stage 3: fp32 keeps 4 + 4 + 8 bytes per shard element as well.
  fp32.stage = 3;
  f = zero::estimate_memory(fp32);
  EXPECT_EQ(f.device.total() - f.reduce_buffers, 16 * s);
  EXPECT_EQ(f.reduce_buffers, int64_t{500000000} * 4);
  EXPECT_EQ(f.gathered_params_max, psi * 4);   // below max_live 1e9
}

TEST(ConfigEstimate, OptimizerStateBytes) {
  EXPECT_EQ(zero::optimizer_state_bytes("Adam", false, 0.0), 8);
  EXPECT_EQ(zero::optimizer_state_bytes("AdamW", true, 0.0), 12);
  EXPECT_EQ(zero::optimizer_state_bytes("SGD", false, 0.0), 0);
  EXPECT_EQ(zero::optimizer_state_bytes("SGD", false, 0.9), 4);
  EXPECT_EQ(zero::optimizer_state_bytes("Adagrad", false, 0.0), 4);
  EXPECT_EQ(zero::optimizer_state_bytes("Lamb", false, 0.0), 8);
  EXPECT_THROW(zero::optimizer_state_bytes("RMSprop", false, 0.0), zero::PartitionError);

  // SGD without momentum holds no optimizer state at any stage.
  for (int stage = 0; stage <= 3; ++stage) {
    EstimateInput in = mixed_adam(1000000, 4, stage);
    in.state_bytes_per_element = zero::optimizer_state_bytes("SGD", false, 0.0);
    MemoryEstimate m = zero::estimate_memory(in);
    EXPECT_EQ(m.all().optimizer_states, 0) << stage;
    EXPECT_GT(m.device.fp32_master, 0) << stage;
  }
}

TEST(ConfigEstimate, CpuOptimizerOffloadMovesMasterStatesAndGradientShard) {
  const int64_t psi = 1600000000, n = 8, s = psi / n, k = 8, b = 2;
  for (int stage = 1; stage <= 3; ++stage) {
    EstimateInput in = mixed_adam(psi, n, stage);
    MemoryEstimate on_device = zero::estimate_memory(in);
    in.offload_optimizer = zero::OffloadDevice::cpu;
    MemoryEstimate m = zero::estimate_memory(in);
    EXPECT_EQ(m.host.fp32_master, s * 4) << stage;
    EXPECT_EQ(m.host.optimizer_states, s * k) << stage;
    EXPECT_EQ(m.host.gradients, s * b) << stage;  // the reduced bf16 gradient shard, as the CPU optimizer reads it
    // Two staging buffers of a bucket's shard for the updated bf16 values on their way to the device.
    EXPECT_EQ(m.host.params, 2 * (in.reduce_bucket_size / n) * b) << stage;
    EXPECT_EQ(m.nvme.total(), 0) << stage;
    EXPECT_EQ(m.device.fp32_master, 0) << stage;
    EXPECT_EQ(m.device.optimizer_states, 0) << stage;
    // Stages 2-3 send each reduced bucket straight to the host (with
    // accumulation too): the device keeps the reduce buffers only; stage 1
    // its P*b.
    const int64_t grad_shard_left = stage >= 2 ? s * b : 0;
    EXPECT_EQ(m.device.total(), on_device.device.total() - s * 4 - s * k - grad_shard_left) << stage;
    EXPECT_EQ(m.device.params, on_device.device.params) << stage;
  }
  // fp32 training: the host keeps the CPU optimizer's fp32 copy of the shard.
  EstimateInput in = mixed_adam(psi, n, 2);
  in.dtype_bytes = 4;
  in.mixed_precision = false;
  in.offload_optimizer = zero::OffloadDevice::cpu;
  MemoryEstimate m = zero::estimate_memory(in);
  EXPECT_EQ(m.host.fp32_master, s * 4);
  EXPECT_EQ(m.host.params, 2 * (in.reduce_bucket_size / n) * 4);  // fp32 staging buffers
  EXPECT_EQ(m.host.gradients, s * 4);
  EXPECT_EQ(m.device.total(), 4 * psi + m.reduce_buffers);  // fp32 parameters and the reduce buffer
  // CPU ranks: the optimizer reads the gradient shard where it was reduced
  // and writes the parameters in place.
  in.accelerator = false;
  EXPECT_EQ(zero::estimate_memory(in).host.gradients, 0);
  EXPECT_EQ(zero::estimate_memory(in).host.params, 0);
  EXPECT_EQ(zero::estimate_memory(in).device.gradients, s * 4 + m.reduce_buffers);
}

// Partial offload: round(ratio * S) elements of master weights, states and
// gradient copies on the host, the rest of the master weights and states on
// the device; nothing on the host at ratio 0 (not even staging buffers).
TEST(ConfigEstimate, PartialOffloadSplitsMasterAndStates) {
  const int64_t psi = 1600000000, n = 8, s = psi / n, k = 8, b = 2;
  for (int stage = 1; stage <= 3; ++stage) {
    EstimateInput in = mixed_adam(psi, n, stage);
    in.offload_optimizer = zero::OffloadDevice::cpu;
    const MemoryEstimate all = zero::estimate_memory(in);
    in.offload_optimizer_ratio = 0.25;
    const MemoryEstimate m = zero::estimate_memory(in);
    const int64_t off = s / 4;
    EXPECT_EQ(m.host.fp32_master, off * 4) << stage;
    EXPECT_EQ(m.host.optimizer_states, off * k) << stage;
    EXPECT_EQ(m.host.gradients, off * b) << stage;
    EXPECT_EQ(m.host.params, all.host.params) << stage;   // the same two staging buffers
    EXPECT_EQ(m.device.fp32_master, (s - off) * 4) << stage;
    EXPECT_EQ(m.device.optimizer_states, (s - off) * k) << stage;
    // The rest's gradients stay on the device (stages 2-3; stage 1 keeps P*b anyway).
    EXPECT_EQ(m.device.gradients, all.device.gradients + (stage >= 2 ? (s - off) * b : 0)) << stage;
    EXPECT_EQ(m.all().total(), all.all().total() - (stage >= 2 ? 0 : (s - off) * b)) << stage;
    in.offload_optimizer_ratio = 0.0;
    const MemoryEstimate none = zero::estimate_memory(in);
    EXPECT_EQ(none.host.total(), 0) << stage;
    in.offload_optimizer = zero::OffloadDevice::none;
    in.offload_optimizer_ratio = 1.0;
    EXPECT_EQ(none.device.total(), zero::estimate_memory(in).device.total()) << stage;
  }
  // NVMe: the share on disk, sub-groups of it in flight on the host, the rest on the device.
  EstimateInput in = mixed_adam(psi, n, 3);
  in.offload_optimizer = zero::OffloadDevice::nvme;
  in.offload_optimizer_ratio = 0.5;
  in.sub_group_size = 40000000;   // 2.5 sub-groups of the 1e8-element share
  const MemoryEstimate nvme = zero::estimate_memory(in);
  EXPECT_EQ(nvme.nvme.fp32_master, s / 2 * 4);
  EXPECT_EQ(nvme.nvme.optimizer_states, s / 2 * k);
  EXPECT_EQ(nvme.host.fp32_master, s / 2 * 4);  // three sub-groups in flight: the whole share (the third holds 2e7)
  EXPECT_EQ(nvme.device.optimizer_states, s / 2 * k);
  in.offload_optimizer = zero::OffloadDevice::cpu;
  in.offload_optimizer_ratio = 1.5;
  EXPECT_THROW(zero::estimate_memory(in), zero::PartitionError);
}

TEST(ConfigEstimate, NvmeAndParamOffloadAtStage3) {
  const int64_t psi = 1600000000, n = 8, s = psi / n, b = 2;
  EstimateInput in = mixed_adam(psi, n, 3);
  const MemoryEstimate on_device = zero::estimate_memory(in);

  in.offload_param = zero::OffloadDevice::cpu;
  MemoryEstimate m = zero::estimate_memory(in);
  EXPECT_EQ(m.device.params, 0);
  EXPECT_EQ(m.host.params, s * b);
  EXPECT_EQ(m.device.total(), on_device.device.total() - s * b);
  EXPECT_EQ(m.gathered_params_max, on_device.gathered_params_max);   // units are still gathered on the device

  in.offload_param = zero::OffloadDevice::nvme;
  in.offload_optimizer = zero::OffloadDevice::nvme;
  in.sub_group_size = 50000000;  // 4 sub-groups of the 2e8-element shard
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.device.total(), m.reduce_buffers);   // only the reduce buffer stays
  EXPECT_EQ(m.nvme.params, s * b);
  EXPECT_EQ(m.nvme.fp32_master, s * 4);
  EXPECT_EQ(m.nvme.optimizer_states, s * 8);
  EXPECT_EQ(m.nvme.gradients, 0);
  EXPECT_EQ(m.host.gradients, s * b);  // the bf16 gradient shard stays in host memory
  // The two staging buffers of updated shards; a shard read from NVMe is
  // part of the gathered units (offload_param's buffer_count and
  // buffer_size are DeepSpeed's and not used).
  EXPECT_EQ(m.host.params, 2 * (in.reduce_bucket_size / n) * b);
  // Three sub-groups in flight (read-ahead, current, write-behind) of master weights and states.
  EXPECT_EQ(m.host.fp32_master, 3 * int64_t{50000000} * 4);
  EXPECT_EQ(m.host.optimizer_states, 3 * int64_t{50000000} * 8);

  in.sub_group_size = 100000000;   // 2 sub-groups: both in host memory at once
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.host.fp32_master, 2 * int64_t{100000000} * 4);
  in.sub_group_size = 150000000;   // 2 sub-groups, the second of the 5e7 left: the shard, not 3e8
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.host.fp32_master, s * 4);
  in.sub_group_size = 1000000000;   // larger than the shard: the whole shard is one sub-group
  m = zero::estimate_memory(in);
  EXPECT_EQ(m.host.fp32_master, s * 4);
  EXPECT_EQ(m.host.optimizer_states, s * 8);
}

// CPU ranks: the parameters' device is host memory, so everything the
// device would hold is host memory, and the offload optimizer reads the
// gradient shard where it was reduced (no host copy, no staging buffers).
TEST(ConfigEstimate, CpuRanksHoldTheDevicesBytesInHostMemory) {
  const int64_t psi = 1600000000, n = 2, s = psi / n;
  EstimateInput in;
  in.params = psi;
  in.world_size = n;
  in.stage = 3;
  in.state_bytes_per_element = 8;
  in.reduce_bucket_size = 50000000;
  in.sub_group_size = 50000000;
  in.offload_optimizer = zero::OffloadDevice::nvme;
  in.offload_param = zero::OffloadDevice::nvme;
  in.accelerator = false;
  const MemoryEstimate split = zero::estimate_memory(in);
  const MemoryEstimate m = zero::device_as_host(split);
  EXPECT_EQ(m.host.total(), split.host.total() + split.device.total());
  EXPECT_EQ(m.device.total(), 0);
  EXPECT_EQ(m.host.params, 0);
  EXPECT_EQ(m.host.gradients, s * 4 + int64_t{50000000} * 4);  // the fp32 gradient shard and one reduce buffer
  EXPECT_EQ(m.host.fp32_master, 3 * int64_t{50000000} * 4);  // sub-groups in flight
  EXPECT_EQ(m.host.optimizer_states, 3 * int64_t{50000000} * 8);
  EXPECT_EQ(m.nvme.total(), s * 16);  // fp32 parameters, master weights and two moments

  // offload_optimizer.nvme_gradients: the gradient shard moves to NVMe; the
  // host keeps the reduce buffer and the larger of the step's two sub-groups
  // read (ahead, current) and backward's three bucket shards (landing, two
  // written).
  const int64_t sub = 50000000, bucket_shard = 50000000 / n;
  in.nvme_gradients = true;
  const MemoryEstimate g = zero::device_as_host(zero::estimate_memory(in));
  EXPECT_EQ(g.nvme.gradients, s * 4);
  EXPECT_EQ(g.host.gradients, int64_t{50000000} * 4 + 2 * sub * 4);
  EXPECT_EQ(g.host.total(), m.host.total() - s * 4 + 2 * sub * 4);
  // super_offload's update in backward: the sub-group being filled and the
  // bucket landing; without accumulation no gradient reaches a file.
  in.update_in_backward = true;
  in.nvme_gradients_written = false;
  EXPECT_EQ(zero::estimate_memory(in).nvme.gradients, 0);
  EXPECT_EQ(zero::device_as_host(zero::estimate_memory(in)).host.gradients,
            int64_t{50000000} * 4 + (sub + bucket_shard) * 4);
  in.update_in_backward = false;
  in.nvme_gradients_written = true;
  in.sub_group_size = 10000000;  // smaller sub-groups: backward's buckets bound it
  EXPECT_EQ(zero::device_as_host(zero::estimate_memory(in)).host.gradients,
            int64_t{50000000} * 4 + 3 * bucket_shard * 4);
}

// Stage 3's gathered bound: with the unit's size known, the unit running
// and the next one when it fits the prefetch and live budgets.
TEST(ConfigEstimate, GatheredUnitsFollowThePrefetchRule) {
  EstimateInput in;
  in.params = 1000000000;
  in.world_size = 4;
  in.stage = 3;
  in.dtype_bytes = 2;
  in.stage3_max_reuse_distance = 0;  // every unit released after its forward
  EXPECT_EQ(zero::estimate_memory(in).gathered_params_max, int64_t{1000000000} * 2);  // unknown: min(params, max_live)
  in.unit_params = 20000000;  // below the 5e7 prefetch budget: two units
  EXPECT_EQ(zero::estimate_memory(in).gathered_params_max, 2 * int64_t{20000000} * 2);
  in.unit_params = 60000000;  // above it: the unit alone
  EXPECT_EQ(zero::estimate_memory(in).gathered_params_max, int64_t{60000000} * 2);
  in.unit_params = 20000000;
  in.stage3_max_live_parameters = 30000000;  // two would pass the live budget
  EXPECT_EQ(zero::estimate_memory(in).gathered_params_max, int64_t{20000000} * 2);
}

// Note [Reuse distance]: the last units of forward stay gathered into
// backward, R/2 + U elements at most, and the unit backward prefetches.
TEST(ConfigEstimate, GatheredUnitsIncludeThoseKeptForReuse) {
  EstimateInput in;
  in.params = 1000000000;
  in.world_size = 4;
  in.stage = 3;
  in.dtype_bytes = 2;
  in.unit_params = 20000000;
  in.stage3_max_reuse_distance = 100000000;  // units after which 2 x (elements after) < 1e8: about 5e7
  EXPECT_EQ(zero::estimate_memory(in).gathered_params_max, (50000000 + 20000000 + 20000000) * int64_t{2});
  in.stage3_max_reuse_distance = 1;  // only the last unit, reused at once: as the prefetch rule
  EXPECT_EQ(zero::estimate_memory(in).gathered_params_max, 2 * int64_t{20000000} * 2);
  in.stage3_max_reuse_distance = 1000000000;  // DeepSpeed's default: 5e8 + U and the prefetched unit
  EXPECT_EQ(zero::estimate_memory(in).gathered_params_max, (500000000 + 40000000) * int64_t{2});
  in.params = 100000000;  // a model below half the distance: all of it
  EXPECT_EQ(zero::estimate_memory(in).gathered_params_max, int64_t{100000000} * 2);
  in.unit_params = 0;  // unknown units: max_live + R/2, within the model
  EXPECT_EQ(zero::estimate_memory(in).gathered_params_max, int64_t{100000000} * 2);
}

// hpZ (Note [Secondary partition]): at the end of forward every unit has
// left 1/L of itself on the rank, ceil(P/L) elements in the training dtype.
TEST(ConfigEstimate, HpzKeepsASecondaryPartitionOfTheModelPerNode) {
  EstimateInput in = mixed_adam(1000000001, 8, 3);   // P = 1000000008 (padded to 8 ranks)
  in.hpz_partition_size = 4;
  const MemoryEstimate with = zero::estimate_memory(in);
  EXPECT_EQ(with.padded_params, 1000000008);
  EXPECT_EQ(with.secondary_params_max, 250000002 * int64_t{2});
  in.hpz_partition_size = 1;
  const MemoryEstimate without = zero::estimate_memory(in);
  EXPECT_EQ(without.secondary_params_max, 0);
  EXPECT_EQ(with.device.total(), without.device.total()) << "the shards themselves are unchanged";
  EXPECT_EQ(with.gathered_params_max, without.gathered_params_max);
  in = mixed_adam(1000000001, 8, 2);   // not stage 3: nothing gathered, nothing kept
  in.hpz_partition_size = 4;
  EXPECT_EQ(zero::estimate_memory(in).secondary_params_max, 0);
  in = mixed_adam(1000, 8, 3);
  in.hpz_partition_size = 3;   // does not divide the 8 ranks
  try {
    zero::estimate_memory(in);
    ADD_FAILURE() << "accepted";
  } catch (const zero::PartitionError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_hpz_partition_size 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data-parallel size 8"), std::string::npos) << e.what();
  }
}

TEST(ConfigEstimate, RejectsOffloadItsStageDoesNotAllow) {
  auto message = [](EstimateInput in) -> std::string {
    try {
      zero::estimate_memory(in);
    } catch (const zero::PartitionError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a zero::PartitionError";
    return "";
  };
  EstimateInput in = mixed_adam(1000, 2, 2);
  in.offload_param = zero::OffloadDevice::cpu;
  EXPECT_NE(message(in).find("offload_param"), std::string::npos);
  in = mixed_adam(1000, 2, 2);
  in.offload_optimizer = zero::OffloadDevice::nvme;
  EXPECT_NE(message(in).find("offload_optimizer"), std::string::npos);
  in = mixed_adam(1000, 2, 0);
  in.offload_optimizer = zero::OffloadDevice::cpu;
  EXPECT_NE(message(in).find("stage 0"), std::string::npos);
  in = mixed_adam(1000, 0, 1);
  EXPECT_NE(message(in).find("world_size"), std::string::npos);
  in = mixed_adam(1000, 2, 4);
  EXPECT_NE(message(in).find("stage"), std::string::npos);
  in = mixed_adam(1000, 2, 1);
  in.dtype_bytes = 8;
  EXPECT_NE(message(in).find("dtype_bytes"), std::string::npos);
  EXPECT_FALSE(zero::offload_optimizer_allowed("nvme", 2));
  EXPECT_TRUE(zero::offload_optimizer_allowed("cpu", 1));
  EXPECT_TRUE(zero::offload_param_allowed("none", 0));
  EXPECT_FALSE(zero::offload_param_allowed("cpu", 2));
}

// ---- zero-config --estimate ----------------------------------------------------

struct ToolRun {
  int status;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

ToolRun tool(const std::string& args) {
  const std::string base = ::testing::TempDir() + "/zero_config_estimate_" + std::to_string(::getpid());
  const std::string out = base + "_out.txt", err = base + "_err.txt";
  const std::string command = "env -u WORLD_SIZE '" + std::string(ZERO_CONFIG_TOOL) + "' " + args + " >'" + out +
                              "' 2>'" + err + "'";
  int raw = std::system(command.c_str());
  ToolRun run{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(out), slurp(err)};
  std::remove(out.c_str());
  std::remove(err.c_str());
  return run;
}

std::string file_arg(const std::string& relative) { return "'" + source_path(relative) + "'"; }

// The table rows: "<marker> <stage>" then eight numbers.
std::vector<std::string> table_rows(const std::string& out) {
  static const std::regex row(R"(^ *(\* )?[0-3]( +[0-9]+\.[0-9]{2}){7}$)");
  std::vector<std::string> rows;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (std::regex_match(line, row)) rows.push_back(line);
  return rows;
}

TEST(ConfigEstimateTool, PrintsOneRowPerStageAndMarksTheConfigsStage) {
  ToolRun r = tool(file_arg("configs/zero3.json") + " --estimate --params 7e9 --world-size 8");
  ASSERT_EQ(r.status, 0) << r.err;
  auto rows = table_rows(r.out);
  ASSERT_EQ(rows.size(), 4u) << r.out;
  for (int stage = 0; stage <= 3; ++stage)
    EXPECT_NE(rows[stage].find(std::to_string(stage)), std::string::npos) << rows[stage];
  EXPECT_NE(rows[3].find("* 3"), std::string::npos) << r.out;
  for (int stage = 0; stage < 3; ++stage) EXPECT_EQ(rows[stage].find('*'), std::string::npos) << rows[stage];
  // fp32 AdamW, 7e9 parameters: stage 0 holds 16 x 7e9 bytes; stage 3 16 x 7e9 / 8 plus two reduce
  // buffers of 5e8 fp32 elements (the config has overlap_comm on).
  EXPECT_NE(rows[0].find("112.00"), std::string::npos) << rows[0];
  EXPECT_NE(rows[3].find(" 18.00"), std::string::npos) << rows[3];
  EXPECT_NE(r.out.find("two reduce buffers of 2.00 GB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(GB)"), std::string::npos);
  EXPECT_NE(r.out.find("plus the parameters of the units being gathered"), std::string::npos) << r.out;

  // Both spellings of the parameter count mean the same.
  ToolRun same = tool(file_arg("configs/zero3.json") + " --estimate --params=7000000000 --world-size=8");
  EXPECT_EQ(same.status, 0);
  EXPECT_EQ(same.out, r.out);
}

TEST(ConfigEstimateTool, JsonMatchesTheLibrary) {
  ToolRun r = tool(file_arg("configs/zero2_offload_cpu.json") + " --estimate --params 1.5e9 --world-size 4 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["params"], 1500000000);
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["config_stage"], 2);
  EXPECT_EQ(j["dtype"], "fp32");
  EXPECT_EQ(j["optimizer"], "AdamW");
  ASSERT_EQ(j["stages"].size(), 4u);
  for (int stage = 0; stage <= 3; ++stage) {
    const auto& row = j["stages"][stage];
    EXPECT_EQ(row["stage"], stage);
    EXPECT_EQ(row["selected"], stage == 2);
    // offload_optimizer cpu applies at stages 1-3 only.
    EXPECT_EQ(row["offload_optimizer"], stage == 0 ? "none" : "cpu");
    EstimateInput in;
    in.params = 1500000000;
    in.world_size = 4;
    in.stage = stage;
    in.dtype_bytes = 4;
    in.state_bytes_per_element = 8;
    in.offload_optimizer = *zero::offload_device_named(row["offload_optimizer"].get<std::string>());
    in.overlap_comm = true;   // as the config says
    MemoryEstimate m = zero::estimate_memory(in);
    EXPECT_EQ(row["device"]["total"], m.device.total()) << stage;
    EXPECT_EQ(row["reduce_buffer_count"], stage >= 2 ? 2 : 0) << stage;
    EXPECT_EQ(row["host"]["total"], m.host.total()) << stage;
    EXPECT_EQ(row["device"]["optimizer_states"], stage == 0 ? 8 * 1500000000LL : 0) << stage;   // offloaded at 1-3
    EXPECT_EQ(row["nvme"]["total"], 0);
  }
}

// With tensor parallelism each rank's share is params / tp, sharded over
// world / tp data-parallel ranks: the library's figures for that input.
TEST(ConfigEstimateTool, TensorParallelSizeDividesTheModelAndTheDataRanks) {
  const std::string dir = ::testing::TempDir() + "/zero_estimate_tp_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/tp2.json";
  std::ofstream(file) << R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
                             "zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 2}})";
  ToolRun r = tool("'" + file + "' --estimate --params 7e9 --world-size 8 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tensor_parallel"], 2);
  EXPECT_EQ(j["data_parallel"], 4);
  for (int stage = 0; stage <= 3; ++stage) {
    EstimateInput in;
    in.params = 3500000000;
    in.world_size = 4;
    in.stage = stage;
    in.dtype_bytes = 2;
    in.mixed_precision = true;
    in.state_bytes_per_element = 8;
    EXPECT_EQ(j["stages"][stage]["device"]["total"], zero::estimate_memory(in).device.total()) << stage;
  }
  ToolRun odd = tool("'" + file + "' --estimate --params 7e9 --world-size 7");
  EXPECT_EQ(odd.status, 1);
  EXPECT_NE(odd.err.find("does not divide into tensor parallel 2"), std::string::npos) << odd.err;
  std::filesystem::remove_all(dir);
}

TEST(ConfigEstimateTool, NvmeOffloadAppliesAtStage3Only) {
  ToolRun r = tool(file_arg("configs/zero3_offload_nvme.json") + " --estimate --params 2e9 --world-size 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dtype"], "bf16");
  const auto& s3 = j["stages"][3];
  EXPECT_EQ(s3["offload_optimizer"], "nvme");
  EXPECT_EQ(s3["offload_param"], "nvme");
  EXPECT_EQ(s3["device"]["total"], s3["reduce_buffers"]);   // only the reduce buffers
  EXPECT_GT(s3["nvme"]["total"].get<int64_t>(), 0);
  for (int stage = 0; stage < 3; ++stage) {
    EXPECT_EQ(j["stages"][stage]["offload_optimizer"], "none") << stage;   // nvme needs stage 3
    EXPECT_EQ(j["stages"][stage]["nvme"]["total"], 0) << stage;
    EXPECT_EQ(j["stages"][stage]["host"]["total"], 0) << stage;
  }
}

TEST(ConfigEstimateTool, CpuRanksCountTheDeviceAsHostMemory) {
  const std::string args = file_arg("configs/zero3_offload_nvme.json") + " --estimate --params 2e9 --world-size 2 --json";
  ToolRun gpu = tool(args), cpu = tool(args + " --cpu-ranks");
  ASSERT_EQ(gpu.status, 0) << gpu.err;
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  auto g = nlohmann::json::parse(gpu.out), c = nlohmann::json::parse(cpu.out);
  EXPECT_EQ(c["cpu_ranks"], true);
  for (int stage = 0; stage <= 3; ++stage) EXPECT_EQ(c["stages"][stage]["device"]["total"], 0) << stage;
  // Without offload (stages 0-2 here) the host holds what the device would.
  for (int stage = 0; stage < 3; ++stage) {
    EXPECT_EQ(c["stages"][stage]["host"]["total"], g["stages"][stage]["device"]["total"]) << stage;
  }
  EXPECT_EQ(c["stages"][3]["nvme"]["total"], g["stages"][3]["nvme"]["total"]);
  EXPECT_EQ(tool(file_arg("configs/zero3_offload_nvme.json") + " --cpu-ranks").status, 2) << "--cpu-ranks without --estimate";
}

TEST(ConfigEstimateTool, SgdWithoutMomentumHoldsNoOptimizerState) {
  const std::string path = ::testing::TempDir() + "/zero_config_estimate_sgd_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": 1}})";
  ToolRun r = tool("'" + path + "' --estimate --params 1e6 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["state_bytes_per_element"], 0);
  for (const auto& row : j["stages"]) EXPECT_EQ(row["device"]["optimizer_states"], 0);
  EXPECT_EQ(j["stages"][1]["device"]["total"], 1000000 * (2 + 2 + 4));   // N = 1: bf16 params, grads, fp32 master
  std::remove(path.c_str());
}

TEST(ConfigEstimateTool, HpzAddsTheSecondaryPartitionAtStage3) {
  const std::string path = ::testing::TempDir() + "/zero_config_estimate_hpz_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})";
  ToolRun r = tool("'" + path + "' --estimate --params 1e9 --world-size 4 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (int stage = 0; stage < 3; ++stage) EXPECT_EQ(j["stages"][stage]["secondary_params_max"], 0) << stage;
  EXPECT_EQ(j["stages"][3]["secondary_params_max"], int64_t{1000000000} / 2 * 2);   // half the bf16 model
  ToolRun text = tool("'" + path + "' --estimate --params 1e9 --world-size 4");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("zero_hpz_partition_size 2): plus the secondary partition"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("up to 1.00 GB more on the device"), std::string::npos) << text.out;
  ToolRun odd = tool("'" + path + "' --estimate --params 1e9 --world-size 3");
  EXPECT_NE(odd.status, 0);
  EXPECT_NE(odd.err.find("zero_hpz_partition_size 2 must divide the data-parallel size 3"), std::string::npos) << odd.err;
  std::remove(path.c_str());
}

TEST(ConfigEstimateTool, BadParamsExitTwo) {
  const std::string file = file_arg("configs/zero2.json");
  for (const std::string& args : {file + " --estimate --params abc", file + " --estimate --params 1.5",
                                  file + " --estimate --params 0", file + " --estimate --params -5",
                                  file + " --estimate --params 1e16", file + " --estimate --params 7e9x",
                                  file + " --estimate --params", file + " --estimate",
                                  file + " --params 7e9"}) {
    ToolRun r = tool(args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(r.err.rfind("zero-config: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_NE(r.err.find("--params"), std::string::npos) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
  ToolRun r = tool(file + " --estimate --params 1.5");
  EXPECT_NE(r.err.find("whole number"), std::string::npos) << r.err;
}

TEST(ConfigEstimateTool, HelpMentionsTheEstimate) {
  ToolRun r = tool("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* option : {"--estimate", "--params", "--world-size", "--json"})
    EXPECT_NE(r.out.find(option), std::string::npos) << option;
}

// Which of stages 2 and 3 peaks higher where the parameters live: stage 3's
// model states plus the units it keeps gathered, against stage 2's states,
// each the library's figures. At the default stage3_max_reuse_distance (1e9)
// stage 3 keeps forward's units for backward, the whole model; at reuse 0 it
// keeps the block running and the one prefetched.
TEST(ConfigEstimateTool, SaysWhetherStage3PeaksAboveStage2) {
  // The example GPT of bench/run_memory_peaks.sh (width 768, depth 6) with
  // GPT-2's vocabulary, fp32, 2 CPU ranks, configs/zero3.json's buckets.
  const std::string shape = " --estimate --micro 2 --context 64 --width 768 --depth 6 --heads 12 --world-size 2 --cpu-ranks";
  ToolRun r = tool(file_arg("configs/zero3.json") + shape + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const int64_t psi = j["params"].get<int64_t>();
  const int64_t unit = 12 * 768 * 768 + 13 * 768;
  auto peak = [&](int stage, int64_t reuse) {
    EstimateInput in;
    in.params = psi, in.world_size = 2, in.stage = stage, in.dtype_bytes = 4, in.state_bytes_per_element = 8;
    in.overlap_comm = true, in.accelerator = false, in.unit_params = unit;
    in.root_params = psi - 6 * unit, in.largest_tensor = 50257 * 768;  // the embeddings; GPT-2's token embedding
    in.stage3_max_reuse_distance = reuse;
    in.stage3_prefetch_bucket_size = 50000000;
    MemoryEstimate m = zero::device_as_host(zero::estimate_memory(in));
    return m.host.total() + m.gathered_params_max;
  };
  const int64_t stage2 = peak(2, 1000000000), stage3 = peak(3, 1000000000), stage3_releasing = peak(3, 0);
  EXPECT_EQ(j["stages"][2]["peak_where_params_live"].get<int64_t>(), stage2);
  EXPECT_EQ(j["stages"][3]["peak_where_params_live"].get<int64_t>(), stage3);
  EXPECT_EQ(j["stages"][3]["peak_where_params_live_reuse_0"].get<int64_t>(), stage3_releasing);
  // The whole model gathered (4 bytes a parameter) outweighs what stage 3
  // shards beyond stage 2 (half the parameters' 4 bytes on 2 ranks) ...
  EXPECT_GT(stage3, stage2);
  // ... two blocks gathered do not.
  EXPECT_LT(stage3_releasing, stage2);

  ToolRun text = tool(file_arg("configs/zero3.json") + shape);
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("Stage 3 against stage 2 in host memory"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("stage 2 holds less. With stage3_max_reuse_distance 0"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("(stage 3 holds less)"), std::string::npos) << text.out;
}

// A reduce bucket larger than the model: each reduce buffer holds all the
// gradients, and the estimate's stage 2 holds more than its stage 1. The
// warning says so, and not for a model larger than the bucket.
TEST(ConfigEstimateTool, WarnsWhenTheReduceBucketExceedsTheModel) {
  ToolRun small = tool(file_arg("configs/zero2.json") + " --estimate --params 1e7 --world-size 2 --json");
  ASSERT_EQ(small.status, 0) << small.err;
  auto j = nlohmann::json::parse(small.out);
  EXPECT_GT(j["stages"][2]["device"]["total"].get<int64_t>(), j["stages"][1]["device"]["total"].get<int64_t>());
  bool warned = false;
  for (const auto& w : j["warnings"])
    warned = warned || w.get<std::string>().find("reduce_bucket_size 5e8 is larger than the 1e7 parameters") != std::string::npos;
  EXPECT_TRUE(warned) << j["warnings"].dump();
  ToolRun text = tool(file_arg("configs/zero2.json") + " --estimate --params 1e7 --world-size 2");
  EXPECT_NE(text.err.find("zero-config: warning: zero_optimization.reduce_bucket_size 5e8 is larger"), std::string::npos)
      << text.err;
  ToolRun large = tool(file_arg("configs/zero2.json") + " --estimate --params 7e9 --world-size 2");
  EXPECT_EQ(large.err.find("reduce_bucket_size"), std::string::npos) << large.err;
}

// ---- activations (activations/estimate.h) ------------------------------------

TEST(ActivationEstimate, BlockIsKorthikantisCountAndCheckpointingKeepsInputs) {
  zero::ActivationShape s;
  s.micro_batch = 4, s.context = 2048, s.width = 4096, s.depth = 32, s.heads = 32, s.vocab = 50257;
  s.bytes_per_element = 2;
  const int64_t sbh = 4LL * 2048 * 4096, as2b = 32LL * 2048 * 2048 * 4;
  EXPECT_EQ(zero::block_activation_bytes(s), 34 * sbh + 5 * as2b);  // the paper's figure at 16 bits
  const int64_t outside = 2 * sbh * 2 + 4LL * 2048 * 4 * 50257;
  EXPECT_EQ(zero::activation_bytes(s, 0), 32 * (34 * sbh + 5 * as2b) + outside);
  // Every block checkpointed: 32 inputs, one block back during its recompute.
  EXPECT_EQ(zero::activation_bytes(s, 32), 32 * 2 * sbh + (34 * sbh + 5 * as2b) + outside);
  EXPECT_EQ(zero::kept_activation_bytes(s, 32), 32 * 2 * sbh + outside);  // before backward recomputes any
  EXPECT_EQ(zero::activation_bytes(s, 8), 24 * (34 * sbh + 5 * as2b) + 8 * 2 * sbh + (34 * sbh + 5 * as2b) + outside);
  EXPECT_EQ(zero::checkpointed_units(32, 1, 0), 32);
  EXPECT_EQ(zero::checkpointed_units(32, 3, 0), 11);  // units 0, 3, ..., 30
  EXPECT_EQ(zero::checkpointed_units(32, 0, 40), 32);
  EXPECT_EQ(zero::checkpointed_units(32, 0, 0), 0);
}

TEST(ActivationEstimate, GptParamsMatchTheExampleModel) {
  zero::ActivationShape s;  // the step-time bench's GPT: 42,600,192 parameters
  s.depth = 6, s.width = 768, s.context = 64, s.vocab = 29;
  EXPECT_EQ(zero::gpt_params(s), 42600192);
}

TEST(ConfigEstimateTool, ShapeFlagsAddActivationsWithAndWithoutCheckpointing) {
  ToolRun r = tool(file_arg("configs/zero3.json") +
                   " --estimate --micro 4 --context 2048 --width 4096 --depth 32 --heads 32 --world-size 8 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  zero::ActivationShape s;
  s.micro_batch = 4, s.context = 2048, s.width = 4096, s.depth = 32, s.heads = 32, s.vocab = 50257;
  s.bytes_per_element = j["dtype"] == "fp32" ? 4 : 2;
  EXPECT_EQ(j["params"].get<int64_t>(), zero::gpt_params(s));  // derived from the shape
  EXPECT_EQ(j["activations"]["without_checkpointing"].get<int64_t>(), zero::activation_bytes(s, 0));
  EXPECT_EQ(j["activations"]["checkpoint_every_unit"].get<int64_t>(), zero::activation_bytes(s, 32));
  EXPECT_EQ(j["activations"]["configured_checkpointed_units"].get<int64_t>(), 0);
  ToolRun text = tool(file_arg("configs/zero3.json") + " --estimate --micro 4 --context 2048 --width 4096 --depth 32");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("checkpointing every unit"), std::string::npos) << text.out;
  ToolRun missing = tool(file_arg("configs/zero3.json") + " --estimate --micro 4 --context 2048");
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.err.find("--width"), std::string::npos) << missing.err;
  ToolRun heads = tool(file_arg("configs/zero3.json") + " --estimate --micro 1 --context 8 --width 100 --depth 1 --heads 3");
  EXPECT_EQ(heads.status, 2);
  EXPECT_NE(heads.err.find("multiple of --heads"), std::string::npos) << heads.err;
}

}  // namespace

// checkpoint.in_memory: a copy of a rank's shard is its fp32 master weights
// and optimizer states, 4 + 8 bytes per element of the shard with AdamW
// (engine/memory_copies.h); no figure without the key.
TEST(ConfigEstimateTool, InMemoryCopyIsTheShardsMasterAndStates) {
  const std::string dir = ::testing::TempDir() + "/zero_estimate_in_memory_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string with = dir + "/with.json", without = dir + "/without.json";
  const std::string common = R"("train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
                                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}})";
  std::ofstream(with) << "{" << common << R"(, "checkpoint": {"in_memory": {"interval": 1}}})";
  std::ofstream(without) << "{" << common << "}";
  ToolRun r = tool("'" + with + "' --estimate --params 1e6 --world-size 4 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (int stage = 0; stage <= 3; ++stage) {
    const auto& s = j["stages"][stage];
    EXPECT_EQ(s["in_memory_copy"].get<int64_t>(), s["shard_params"].get<int64_t>() * (4 + 8)) << stage;
  }
  EXPECT_EQ(j["stages"][2]["in_memory_copy"], 250000 * 12);
  ToolRun text = tool("'" + with + "' --estimate --params 1e6 --world-size 4");
  EXPECT_NE(text.out.find("checkpoint.in_memory every 1 step(s): a copy of each rank's shard, 3.00 MB a rank"),
            std::string::npos) << text.out;
  ToolRun off = tool("'" + without + "' --estimate --params 1e6 --world-size 4 --json");
  ASSERT_EQ(off.status, 0) << off.err;
  EXPECT_FALSE(nlohmann::json::parse(off.out)["stages"][2].contains("in_memory_copy"));
  std::filesystem::remove_all(dir);
}
