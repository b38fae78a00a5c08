// Model-state memory per rank (partition/estimate.h). Torch-free.
#include "partition/estimate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "zero/error.h"

namespace zero {

namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw PartitionError("memory estimate: " + message);
}

}  // namespace

MemoryBytes MemoryEstimate::all() const {
  MemoryBytes a;
  for (const MemoryBytes* m : {&device, &host, &nvme}) {
    a.params += m->params;
    a.gradients += m->gradients;
    a.fp32_master += m->fp32_master;
    a.optimizer_states += m->optimizer_states;
  }
  return a;
}

bool offload_optimizer_allowed(OffloadDevice device, int stage) {
  switch (device) {
  case OffloadDevice::none: return true;
  case OffloadDevice::cpu: return stage >= 1;
  case OffloadDevice::nvme: return stage == 3;
  }
  return false;
}

bool offload_param_allowed(OffloadDevice device, int stage) { return device == OffloadDevice::none || stage == 3; }

bool offload_optimizer_allowed(const std::string& device, int stage) {
  const auto d = offload_device_named(device);
  return d && offload_optimizer_allowed(*d, stage);
}

bool offload_param_allowed(const std::string& device, int stage) {
  const auto d = offload_device_named(device);
  return d && offload_param_allowed(*d, stage);
}

int optimizer_state_bytes(OptimizerKind kind, bool amsgrad, double momentum) {
  switch (kind) {
  case OptimizerKind::adam:
  case OptimizerKind::adamw: return amsgrad ? 12 : 8;   // exp_avg, exp_avg_sq (+ max_exp_avg_sq)
  case OptimizerKind::sgd: return momentum > 0.0 ? 4 : 0;  // momentum_buffer
  case OptimizerKind::adagrad: return 4;                   // sum
  case OptimizerKind::lamb: return 8;                      // exp_avg, exp_avg_sq
  }
  return 0;
}

int optimizer_state_bytes(const std::string& type, bool amsgrad, double momentum) {
  if (const auto kind = optimizer_kind_named(type)) return optimizer_state_bytes(*kind, amsgrad, momentum);
  throw PartitionError("memory estimate: unknown optimizer type \"" + type +
                       "\"; known: Adam, AdamW, SGD, Adagrad, Lamb");
}

namespace {

// Every field in its range, and the offload devices the stage allows.
void validate(const EstimateInput& in) {
  // 1e15 parameters at 32 bytes each stay far below INT64_MAX.
  require(in.params >= 0 && in.params <= 1000000000000000, "params must be in [0, 1e15]; got " + std::to_string(in.params));
  require(in.world_size >= 1 && in.world_size <= 1000000,
          "world_size must be in [1, 1000000]; got " + std::to_string(in.world_size));
  require(in.stage >= 0 && in.stage <= 3, "stage must be 0, 1, 2 or 3; got " + std::to_string(in.stage));
  require(in.dtype_bytes == 2 || in.dtype_bytes == 4,
          "dtype_bytes must be 2 (fp16/bf16) or 4 (fp32); got " + std::to_string(in.dtype_bytes));
  require(in.state_bytes_per_element >= 0 && in.state_bytes_per_element <= 16,
          "state_bytes_per_element must be in [0, 16]; got " + std::to_string(in.state_bytes_per_element));
  require(in.reduce_bucket_size >= 1, "reduce_bucket_size must be positive");
  require(in.root_params >= -1, "root_params must be -1 (unknown) or a number of parameters");
  require(in.largest_tensor >= 0, "largest_tensor must not be negative");
  require(in.stage3_max_live_parameters >= 0, "stage3_max_live_parameters must not be negative");
  require(in.stage3_max_reuse_distance >= 0, "stage3_max_reuse_distance must not be negative");
  require(in.stage3_prefetch_bucket_size >= 0, "stage3_prefetch_bucket_size must not be negative");
  require(in.stage3_param_persistence_threshold >= 0, "stage3_param_persistence_threshold must not be negative");
  require(in.unit_params >= 0, "unit_params must not be negative");
  require(in.hpz_partition_size >= 1 && in.world_size % in.hpz_partition_size == 0,
          "zero_hpz_partition_size " + std::to_string(in.hpz_partition_size) + " must divide the data-parallel size " +
              std::to_string(in.world_size) + " (it is the ranks of a node)");
  require(in.sub_group_size >= 1, "sub_group_size must be positive");
  require(in.offload_optimizer_buffer_count >= 0 && in.offload_optimizer_buffer_count <= 1024 &&
              in.offload_param_buffer_count >= 0 && in.offload_param_buffer_count <= 1024,
          "the NVMe buffer counts must be in [0, 1024]");
  require(in.offload_param_buffer_size >= 0 && in.offload_param_buffer_size <= 1000000000000,
          "offload_param_buffer_size must be in [0, 1e12]");
  require(in.offload_optimizer_ratio >= 0 && in.offload_optimizer_ratio <= 1,
          "offload_optimizer_ratio must be in [0, 1]");
  require(offload_optimizer_allowed(in.offload_optimizer, in.stage),
          std::string("offload_optimizer \"") + name(in.offload_optimizer) + "\" is not available at stage " + std::to_string(in.stage) +
              " (cpu needs stage 1-3, nvme stage 3)");
  require(offload_param_allowed(in.offload_param, in.stage),
          std::string("offload_param \"") + name(in.offload_param) + "\" needs stage 3; got stage " + std::to_string(in.stage));
}

// Stage 3: the elements of units gathered at once (partition/units.cpp):
// the unit running, and the next when the prefetch and live budgets allow;
// with a reuse distance, the last units of forward kept for backward too.
int64_t gathered_bound(const EstimateInput& in) {
  const int64_t reuse_tail = in.stage3_max_reuse_distance > 0 ? in.stage3_max_reuse_distance / 2 : 0;
  if (in.unit_params <= 0) return std::min(in.params, in.stage3_max_live_parameters + reuse_tail);
  const int64_t u = std::min(in.unit_params, in.params);
  const bool prefetched = u <= in.stage3_prefetch_bucket_size && 2 * u <= in.stage3_max_live_parameters && 2 * u <= in.params;
  const int64_t running = prefetched ? 2 * u : u;
  if (in.stage3_max_reuse_distance <= 0) return running;
  const int64_t kept = std::min(in.params, reuse_tail + u);
  return std::min(in.params, std::max(running, kept + (prefetched ? u : 0)));
}

// Stages 2-3: the largest bucket, in elements (estimate.h, B), and whether
// there is more than one.
std::pair<int64_t, bool> largest_bucket(const EstimateInput& in, int64_t p) {
  int64_t largest = std::min(in.reduce_bucket_size, p);
  if (in.stage == 3 && in.unit_params > 0 && in.root_params >= 0) {
    largest = std::min(largest, std::max(std::min(in.unit_params, p), std::min(in.root_params, p)));
  }
  largest = std::max(largest, std::min(in.largest_tensor, p));  // a tensor is never split between buckets
  return {largest, largest < p};
}

// Without offload, everything lives on the device.
void on_device(const EstimateInput& in, MemoryEstimate& m) {
  const int64_t n = in.world_size, b = in.dtype_bytes, k = in.state_bytes_per_element;
  const int64_t owners = in.stage == 0 ? 1 : n;
  m.padded_params = (in.params + owners - 1) / owners * owners;
  m.shard_params = m.padded_params / owners;
  const int64_t p = m.padded_params, s = m.shard_params;
  const bool sharded = in.stage >= 1;
  const int64_t held = sharded ? s : p;   // elements of master and optimizer states a rank holds
  MemoryBytes& d = m.device;
  // Stage 3: parameters outside every unit stay gathered (whole on every
  // rank), and so does every bucket below the persistence threshold: all of
  // them when the largest is (partition/sharded_params.cpp).
  const int64_t root = in.stage == 3 && in.root_params > 0 ? std::min(in.root_params, p) : 0;
  const int64_t root_gathered = root - root / n;
  const bool all_persistent = in.stage == 3 && largest_bucket(in, p).first < in.stage3_param_persistence_threshold;
  d.params = (in.stage == 3 && !all_persistent ? s + root_gathered : p) * b;
  if (in.stage >= 2) {
    // The engine's pool (partition/grad_reducer.cpp): one buffer of the
    // largest bucket, two with overlap_comm once a second bucket exists.
    const auto [largest, several] = largest_bucket(in, p);
    m.reduce_buffer_count = in.overlap_comm && several ? 2 : 1;
    m.reduce_buffers = m.reduce_buffer_count * largest * b;
    d.gradients = s * b + m.reduce_buffers;
  } else {
    d.gradients = p * b;
  }
  d.fp32_master = in.mixed_precision ? held * 4 : 0;
  d.optimizer_states = held * k;
  if (in.stage == 3 && !all_persistent) m.gathered_params_max = gathered_bound(in) * b;
  if (in.stage == 3 && in.hpz_partition_size > 1) {
    const int64_t l = in.hpz_partition_size;
    m.secondary_params_max = (p + l - 1) / l * b;
  }
}

// offload_optimizer (stages 1-3): the offloaded share of the master shard,
// its states and gradient copies move to the host or NVMe.
void optimizer_offloaded(const EstimateInput& in, MemoryEstimate& m) {
  const int64_t b = in.dtype_bytes, k = in.state_bytes_per_element;
  const int64_t owners = in.stage == 0 ? 1 : in.world_size;
  const int64_t p = m.padded_params, s = m.shard_params;
  MemoryBytes& d = m.device;
  const bool nvme = in.offload_optimizer == OffloadDevice::nvme;
  MemoryBytes& to = nvme ? m.nvme : m.host;
  // Partial offload: the host share of the shard (the engine splits at bucket boundaries).
  const int64_t off = std::llround(in.offload_optimizer_ratio * static_cast<double>(s));
  to.fp32_master = off * 4;   // with fp32 training too: the CPU optimizer's copy of the shard
  to.optimizer_states = off * k;
  // The reduced gradient shard the CPU optimizer reads, in the training dtype.
  if (in.accelerator) m.host.gradients = off * b;
  // With an accelerator, the CPU optimizer writes each bucket's updated
  // shard into one of two page-locked staging buffers on its way there
  // (without one, straight into the parameters).
  if (in.accelerator && off > 0) m.host.params += 2 * ((largest_bucket(in, p).first + owners - 1) / owners) * b;
  d.fp32_master = in.mixed_precision ? (s - off) * 4 : 0;
  d.optimizer_states = (s - off) * k;
  // The offloaded share's gradients leave the device partition (the
  // reduced bucket goes straight to the host).
  if (in.accelerator && in.stage >= 2) d.gradients -= off * b;
  if (nvme) {
    // The step's sub-groups in host memory: read-ahead, current, write-behind.
    const int64_t sub = std::min(in.sub_group_size, off);
    const int64_t resident = std::min<int64_t>(3, sub > 0 ? (off + sub - 1) / sub : 0);
    const int64_t in_flight = std::min(resident * sub, off);  // the last sub-group holds what is left
    m.host.fp32_master = in_flight * 4;
    m.host.optimizer_states = in_flight * k;
    if (in.nvme_gradients && in.stage >= 2) {
      // On NVMe instead of the host copies (accelerator) or the partition
      // (CPU ranks). In memory: the step's two sub-groups read (ahead and
      // current), or in backward the bucket being landed and the two
      // written behind it; with the update in backward, the sub-group
      // being filled and the bucket landing.
      if (in.nvme_gradients_written) m.nvme.gradients = off * b;
      if (!in.accelerator) d.gradients -= off * b;  // an accelerator's left above
      const int64_t bucket_shard = (largest_bucket(in, p).first + owners - 1) / owners;
      const int64_t read = std::min(2 * sub, off);
      const int64_t held = in.update_in_backward ? sub + bucket_shard : std::max(read, 3 * bucket_shard);
      m.host.gradients = std::min(off, held) * b;
    }
  }
}

// offload_param (stage 3): the parameter shard leaves the device.
void params_offloaded(const EstimateInput& in, MemoryEstimate& m) {
  const int64_t b = in.dtype_bytes, s = m.shard_params;
  MemoryBytes& d = m.device;
  MemoryBytes& to = in.offload_param == OffloadDevice::cpu ? m.host : m.nvme;
  to.params += s * b;
  d.params -= s * b;  // what stays is the parameters outside every unit, gathered
  // NVMe: the next unit's shards read ahead of its gather (partition/units.cpp).
  if (in.offload_param == OffloadDevice::nvme && in.unit_params > 0) {
    m.host.params += (std::min(in.unit_params, in.params) + in.world_size - 1) / in.world_size * b;
  }
}



}  // namespace

MemoryEstimate estimate_memory(const EstimateInput& in) {
  validate(in);
  MemoryEstimate m;
  on_device(in, m);
  if (in.offload_optimizer != OffloadDevice::none) optimizer_offloaded(in, m);
  if (in.offload_param != OffloadDevice::none) params_offloaded(in, m);
  return m;
}

MemoryEstimate device_as_host(MemoryEstimate m) {
  m.host.params += m.device.params;
  m.host.gradients += m.device.gradients;
  m.host.fp32_master += m.device.fp32_master;
  m.host.optimizer_states += m.device.optimizer_states;
  m.device = MemoryBytes{};
  return m;
}

}  // namespace zero
