// zero-config --estimate: the model-state memory per rank at each stage
// (partition/estimate.h) and, given a model shape, its activations
// (activations/estimate.h), as a table or JSON.
#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/byte_units.h"
#include "tools/config/options.h"
#include "zero/config.h"
#include "zero/error.h"
#include "partition/estimate.h"
#include "zero/mesh_shape.h"

namespace zero_config_tool {
namespace {

struct EstimateSetup {
  zero::EstimateInput base;   // stage and offload are set per row
  zero::MeshShape mesh;       // the config's tp x pp over the world; ZeRO shards over dp
  std::string dtype;          // "fp32", "fp16", "bf16"
  std::string optimizer;      // as the config spells it, or "Adam" assumed
  bool optimizer_assumed = false;
};

EstimateSetup estimate_setup(const zero::Config& c, int64_t params, int world_size) {
  EstimateSetup e;
  const auto& z = c.zero_optimization;
  e.dtype = c.fp16.enabled ? "fp16" : c.bf16.enabled ? "bf16" : "fp32";
  e.optimizer = c.optimizer.type;
  if (e.optimizer.empty()) {   // the engine needs one; Adam is the usual choice
    e.optimizer = "Adam";
    e.optimizer_assumed = true;
  }
  zero::EstimateInput& in = e.base;
  // With tensor or pipeline parallelism each rank holds 1/(tp x pp) of the
  // model (replicated norms and biases left out) and ZeRO shards that
  // over the data-parallel ranks (times the sequence-parallel ones).
  e.mesh = zero::mesh_shape(world_size, static_cast<int>(c.parallelism.tensor_parallel()),
                            static_cast<int>(c.parallelism.pipeline_parallel()),
                            static_cast<int>(c.parallelism.sequence_parallel()));
  const int64_t model_parallel = static_cast<int64_t>(e.mesh.tp) * e.mesh.pp;
  in.params = (params + model_parallel - 1) / model_parallel;
  in.world_size = e.mesh.zero();
  in.dtype_bytes = e.dtype == "fp32" ? 4 : 2;
  in.mixed_precision = e.dtype != "fp32";
  in.state_bytes_per_element =
      zero::optimizer_state_bytes(e.optimizer, c.optimizer.params.amsgrad, c.optimizer.params.momentum);
  in.reduce_bucket_size = z.reduce_bucket_size;
  in.overlap_comm = z.overlap_comm;
  in.stage3_max_live_parameters = z.stage3_max_live_parameters;
  in.stage3_max_reuse_distance = z.stage3_max_reuse_distance;
  in.stage3_prefetch_bucket_size = z.stage3_prefetch_bucket_size;
  in.stage3_param_persistence_threshold = z.stage3_param_persistence_threshold;
  in.hpz_partition_size = z.zero_hpz_partition_size;
  in.sub_group_size = z.sub_group_size;
  in.nvme_gradients = z.offload_optimizer.nvme_gradients;
  in.offload_optimizer_buffer_count = z.offload_optimizer.buffer_count;
  in.offload_param_buffer_count = z.offload_param.buffer_count;
  in.offload_param_buffer_size = z.offload_param.buffer_size;
  int64_t accumulation = 1;
  try {  // the batch may not resolve for this world size; offload's figures then assume no accumulation
    zero::Config resolved = c;
    resolved.resolve(world_size);
    accumulation = resolved.batch.gradient_accumulation_steps.value_or(1);
  } catch (const zero::Error&) {
  }
  // An update in backward that needs no global norm takes the boundary's
  // gradients from memory: without accumulation none is ever written.
  const bool update_in_backward = z.offload_optimizer.super_offload && c.gradient_clipping == 0.0 && !c.fp16.enabled;
  in.nvme_gradients_written = !(update_in_backward && accumulation == 1);
  in.update_in_backward = update_in_backward;
  return e;
}

// The input for one stage: the config's offload choices where that stage allows them.
zero::EstimateInput stage_input(const zero::Config& c, zero::EstimateInput in, int stage) {
  const auto& z = c.zero_optimization;
  in.stage = stage;
  if (stage != 3) in.hpz_partition_size = 1;  // hpZ is stage 3's
  const zero::OffloadDevice optimizer = z.offload_optimizer.where(), param = z.offload_param.where();
  in.offload_optimizer = zero::offload_optimizer_allowed(optimizer, stage) ? optimizer : zero::OffloadDevice::none;
  in.offload_optimizer_ratio = in.offload_optimizer != zero::OffloadDevice::none ? z.offload_optimizer.ratio : 1.0;
  in.offload_param = zero::offload_param_allowed(param, stage) ? param : zero::OffloadDevice::none;
  return in;
}

std::string with_commas(int64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// A count as a config would write it: 7e9, 1.5e9, 5e8, 1000; else 7,000,000,001.
std::string count(int64_t v) {
  if (v < 10000) return std::to_string(v);
  int exponent = 0;
  int64_t mantissa = v;
  while (mantissa % 10 == 0) {
    mantissa /= 10;
    ++exponent;
  }
  if (mantissa >= 10000) return with_commas(v);
  const int digits = static_cast<int>(std::to_string(mantissa).size());
  std::string m = std::to_string(mantissa);
  if (digits > 1) m = m.substr(0, 1) + "." + m.substr(1);
  return m + "e" + std::to_string(exponent + digits - 1);
}

// Decimal units, one for the whole table: GB unless everything is smaller.
using zero::core::ByteUnit;
std::string in_unit(int64_t bytes, ByteUnit u) { return zero::core::in_unit(static_cast<double>(bytes), u); }
std::string human(int64_t bytes) { return zero::core::human_bytes(static_cast<double>(bytes)); }

std::string pad_left(const std::string& s, size_t width) { return s.size() >= width ? s : std::string(width - s.size(), ' ') + s; }

nlohmann::ordered_json bytes_json(const zero::MemoryBytes& m) {
  nlohmann::ordered_json j;
  j["params"] = m.params;
  j["gradients"] = m.gradients;
  j["fp32_master"] = m.fp32_master;
  j["optimizer_states"] = m.optimizer_states;
  j["total"] = m.total();
  return j;
}

// ---- activations (activations/estimate.h) -------------------------------------

struct ActivationRows {
  zero::ActivationShape shape;
  int64_t none, every_unit, configured, configured_units;
};

ActivationRows activation_rows(const Options& o, const zero::Config& c, const EstimateSetup& setup) {
  ActivationRows r;
  r.shape = o.activations;
  r.shape.bytes_per_element = setup.base.dtype_bytes;
  const auto& a = c.activation_checkpointing;
  r.configured_units = zero::checkpointed_units(r.shape.depth, a.checkpoint_every.value_or(0), a.number_checkpoints.value_or(0));
  r.none = zero::activation_bytes(r.shape, 0);
  r.every_unit = zero::activation_bytes(r.shape, r.shape.depth);
  r.configured = zero::activation_bytes(r.shape, r.configured_units);
  return r;
}

nlohmann::ordered_json activations_json(const Options& o, const zero::Config& c, const EstimateSetup& setup) {
  const ActivationRows r = activation_rows(o, c, setup);
  nlohmann::ordered_json j;
  j["micro_batch"] = r.shape.micro_batch;
  j["context"] = r.shape.context;
  j["width"] = r.shape.width;
  j["depth"] = r.shape.depth;
  j["heads"] = r.shape.heads;
  j["vocab"] = r.shape.vocab;
  j["bytes_per_element"] = r.shape.bytes_per_element;
  j["per_block"] = zero::block_activation_bytes(r.shape);
  j["without_checkpointing"] = r.none;
  j["checkpoint_every_unit"] = r.every_unit;
  j["configured_checkpointed_units"] = r.configured_units;
  j["configured"] = r.configured;
  return j;
}

std::string activations_text(const Options& o, const zero::Config& c, const EstimateSetup& setup) {
  const ActivationRows r = activation_rows(o, c, setup);
  const zero::ActivationShape& s = r.shape;
  std::ostringstream out;
  out << "\nActivations per rank for one micro batch (" << s.micro_batch << " x context " << s.context << ", width "
      << s.width << ", depth " << s.depth << ", " << s.heads << " heads, vocab " << s.vocab << ", "
      << setup.dtype << "),\nthe same at every stage:\n";
  out << "  without checkpointing        " << pad_left(human(r.none), 12) << "   (" << human(zero::block_activation_bytes(s))
      << " per block)\n";
  out << "  checkpointing every unit     " << pad_left(human(r.every_unit), 12)
      << "   (each block's input, one block recomputed at a time)\n";
  if (r.configured_units > 0 && r.configured_units < s.depth)
    out << "  as configured (" << r.configured_units << " of " << s.depth << " units) " << pad_left(human(r.configured), 12)
        << "\n";
  out << "Per block: 34sbh + 5as^2b bytes at 2 bytes per element (Korthikanti et al. 2022), dropout masks\n"
         "included; outside the blocks the head's input and the fp32 log-softmax of the logits. Measured\n"
         "figures: engine.memory_report().activations_peak.\n";
  return out.str();
}

}  // namespace

// Stage 3 against stage 2 where the parameters live (the device, or host
// memory on CPU ranks): stage 3's model states plus the units it keeps
// gathered, which stage3_max_reuse_distance can make the whole model.
int64_t peak_where_params_live(const zero::MemoryEstimate& m, bool cpu_ranks) {
  return (cpu_ranks ? m.host.total() : m.device.total()) + m.gathered_params_max + m.secondary_params_max;
}

// checkpoint.in_memory: a copy of a rank's shard is its fp32 master weights
// and optimizer states (Note [In-memory copies] in engine/memory_copies.h).
int64_t in_memory_copy_bytes(const zero::MemoryEstimate& m, int64_t state_bytes_per_element) {
  return m.shard_params * (4 + state_bytes_per_element);
}

int run_estimate(const Options& o) {
  zero::Config config = zero::Config::from_file(o.file);
  const auto& z = config.zero_optimization;
  EstimateSetup setup = estimate_setup(config, o.params, o.world_size);
  std::vector<std::string> warnings = config.warnings();
  // A bucket larger than the model makes each reduce buffer the whole
  // model's gradients: stage 2 then holds more than stage 1.
  if (z.reduce_bucket_size > setup.base.params)
    warnings.push_back("zero_optimization.reduce_bucket_size " + count(z.reduce_bucket_size) + " is larger than the " +
                       count(setup.base.params) + " parameters a rank reduces: each reduce buffer holds all of their "
                       "gradients, so stages 2 and 3 can hold more than stage 1; set it to a fraction of the model "
                       "(e.g. " + count(std::max<int64_t>(1, setup.base.params / 4)) + ")");
  if (!o.json)
    for (const auto& w : warnings) std::cerr << "zero-config: warning: " << w << "\n";
  setup.base.accelerator = !o.cpu_ranks;
  if (o.shape) {  // a GPT block is a unit; the embeddings and the final norm are outside every unit
    const int64_t w = o.activations.width;
    setup.base.unit_params = 12 * w * w + 13 * w;
    setup.base.root_params = std::max<int64_t>(-1, setup.base.params - o.activations.depth * setup.base.unit_params);
    // The token embedding or the MLP's first weight (4w x w), whichever is larger.
    setup.base.largest_tensor = std::max(o.activations.vocab * w, 4 * w * w);
  }
  std::vector<zero::EstimateInput> inputs;
  std::vector<zero::MemoryEstimate> rows;
  for (int stage = 0; stage <= 3; ++stage) {
    inputs.push_back(stage_input(config, setup.base, stage));
    rows.push_back(zero::estimate_memory(inputs.back()));
    if (o.cpu_ranks) rows.back() = zero::device_as_host(rows.back());
  }
  zero::EstimateInput releasing = inputs[3];
  releasing.stage3_max_reuse_distance = 0;
  zero::MemoryEstimate stage3_releasing = zero::estimate_memory(releasing);
  if (o.cpu_ranks) stage3_releasing = zero::device_as_host(stage3_releasing);

  if (o.json) {
    nlohmann::ordered_json doc;
    doc["file"] = o.file;
    doc["params"] = o.params;
    doc["world_size"] = o.world_size;
    doc["tensor_parallel"] = setup.mesh.tp;
    doc["pipeline_parallel"] = setup.mesh.pp;
    doc["data_parallel"] = setup.mesh.dp;
    doc["sequence_parallel"] = setup.mesh.sp;
    doc["config_stage"] = z.stage;
    doc["dtype"] = setup.dtype;
    doc["optimizer"] = setup.optimizer;
    doc["optimizer_assumed"] = setup.optimizer_assumed;
    doc["state_bytes_per_element"] = setup.base.state_bytes_per_element;
    doc["cpu_ranks"] = o.cpu_ranks;
    doc["warnings"] = warnings;
    doc["stages"] = nlohmann::ordered_json::array();
    for (int stage = 0; stage <= 3; ++stage) {
      const zero::MemoryEstimate& m = rows[stage];
      nlohmann::ordered_json r;
      r["stage"] = stage;
      r["selected"] = stage == z.stage;
      r["offload_optimizer"] = zero::name(inputs[stage].offload_optimizer);
      r["offload_param"] = zero::name(inputs[stage].offload_param);
      r["padded_params"] = m.padded_params;
      r["shard_params"] = m.shard_params;
      r["device"] = bytes_json(m.device);
      r["host"] = bytes_json(m.host);
      r["nvme"] = bytes_json(m.nvme);
      r["reduce_buffers"] = m.reduce_buffers;
      r["reduce_buffer_count"] = m.reduce_buffer_count;
      r["gathered_params_max"] = m.gathered_params_max;
      r["secondary_params_max"] = m.secondary_params_max;
      r["peak_where_params_live"] = peak_where_params_live(m, o.cpu_ranks);
      if (stage == 3) r["peak_where_params_live_reuse_0"] = peak_where_params_live(stage3_releasing, o.cpu_ranks);
      if (config.checkpoint.in_memory_interval > 0) r["in_memory_copy"] = in_memory_copy_bytes(m, setup.base.state_bytes_per_element);
      doc["stages"].push_back(r);
    }
    if (o.shape) doc["activations"] = activations_json(o, config, setup);
    std::cout << doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return 0;
  }

  int64_t largest = 0;
  for (const auto& m : rows) largest = std::max({largest, m.all().total(), m.device.total()});
  const ByteUnit u = zero::core::byte_unit_for(static_cast<double>(largest));
  const int b = setup.base.dtype_bytes;
  std::ostringstream out;
  const std::string written = count(o.params), exact = with_commas(o.params);
  out << "Model states per rank for " << written << " parameters" << (written != exact ? " (" + exact + ")" : "")
      << ", world size " << o.world_size << ", from " << o.file << "\n";
  if (setup.mesh.tp * setup.mesh.pp > 1) {
    out << "tensor parallel " << setup.mesh.tp << " x pipeline " << setup.mesh.pp << ": each rank holds "
        << count(setup.base.params) << " of them (1/" << setup.mesh.tp * setup.mesh.pp
        << ", replicated norms and biases left out), sharded over " << setup.mesh.dp << " data-parallel rank(s)\n";
  }
  out << setup.dtype << " training" << (setup.base.mixed_precision ? " with an fp32 master copy" : "") << ", "
      << setup.optimizer << (setup.optimizer_assumed ? " (assumed: the config has no optimizer)" : "") << " with "
      << setup.base.state_bytes_per_element << " bytes of state per parameter\n\n";
  const std::vector<std::pair<std::string, size_t>> columns = {
      {"stage", 7},       {"params", 10},     {"grads", 10},    {"fp32 master", 13},
      {"optimizer", 11},  {"device total", 14}, {"host total", 12}, {"nvme total", 12}};
  for (const auto& [name, width] : columns) out << pad_left(name, width);
  out << "   (" << u.name << ")\n";
  for (int stage = 0; stage <= 3; ++stage) {
    const zero::MemoryEstimate& m = rows[stage];
    const zero::MemoryBytes all = m.all();
    std::vector<std::string> cells = {(stage == z.stage ? "* " : "") + std::to_string(stage),
                                      in_unit(all.params, u),
                                      in_unit(all.gradients, u),
                                      in_unit(all.fp32_master, u),
                                      in_unit(all.optimizer_states, u),
                                      in_unit(m.device.total(), u),
                                      in_unit(m.host.total(), u),
                                      in_unit(m.nvme.total(), u)};
    for (size_t i = 0; i < cells.size(); ++i) out << pad_left(cells[i], columns[i].second);
    out << "\n";
  }
  const zero::MemoryEstimate& s3 = rows[3];
  out << "\n* the config's stage. " << u.name << " = " << count(static_cast<int64_t>(u.bytes))
      << " bytes. Each kind column counts that kind wherever it lives;\n"
         "  the totals say where.\n";
  if (o.cpu_ranks) out << "- CPU ranks (--cpu-ranks): the parameters' device is host memory; its bytes are in host total.\n";
  if (const int64_t k = config.checkpoint.in_memory_interval; k > 0) {
    const int64_t copy = in_memory_copy_bytes(rows[static_cast<size_t>(z.stage)], setup.base.state_bytes_per_element);
    out << "- checkpoint.in_memory every " << k << " step(s): a copy of each rank's shard, " << human(copy)
        << " a rank, in its node's\n  /dev/shm (tmpfs, not counted above); with more than one node each node also "
           "keeps the previous\n  node's: " << human(2 * copy) << " a rank. While a copy is made the one before "
           "stays: up to twice that.\n";
  }
  const std::string where = o.cpu_ranks ? "in host memory" : "on the device";
  if (setup.base.unit_params > 0) {
    out << "- Stage 3: plus the parameters of the units being gathered: up to " << human(s3.gathered_params_max)
        << " more " << where << ",\n  the block running (" << count(setup.base.unit_params)
        << " parameters) and the next one when stage3_prefetch_bucket_size allows it";
    if (z.stage3_max_reuse_distance > 0) {
      out << ",\n  and the last blocks of forward kept for backward (stage3_max_reuse_distance "
          << count(z.stage3_max_reuse_distance) << "; 0 releases them)";
    }
    out << ".\n";
  } else {
    out << "- Stage 3: plus the parameters of the units being gathered (stage3_prefetch_bucket_size /\n"
           "  max_live_parameters): up to "
        << human(s3.gathered_params_max) << " more " << where << ",\n  min(params, stage3_max_live_parameters "
        << count(z.stage3_max_live_parameters) << " + stage3_max_reuse_distance / 2) x " << b << " bytes.\n";
  }
  if (s3.secondary_params_max > 0) {
    out << "- Stage 3 with hpZ (zero_hpz_partition_size " << z.zero_hpz_partition_size
        << "): plus the secondary partition, 1/" << z.zero_hpz_partition_size
        << " of each unit gathered\n  in forward kept until its backward: up to " << human(s3.secondary_params_max)
        << " more " << where << " at the end of forward.\n";
  }
  const zero::MemoryEstimate& s2 = rows[2];
  {
    const int64_t peak2 = peak_where_params_live(s2, o.cpu_ranks), peak3 = peak_where_params_live(s3, o.cpu_ranks);
    const int64_t peak3_releasing = peak_where_params_live(stage3_releasing, o.cpu_ranks);
    out << "- Stage 3 against stage 2 " << where << ": stage 3 peaks at " << human(peak3)
        << " with the units it keeps gathered,\n  stage 2 at " << human(peak2) << ": stage "
        << (peak3 <= peak2 ? "3" : "2") << " holds less";
    if (z.stage3_max_reuse_distance > 0 && peak3_releasing < peak3)
      out << ". With stage3_max_reuse_distance 0, stage 3 peaks at " << human(peak3_releasing) << " (stage "
          << (peak3_releasing <= peak2 ? "3" : "2") << " holds less),\n  at the price of gathering each unit again "
          << "in backward";
    out << ".\n";
  }
  out << "- Stages 2-3: grads include " << (z.overlap_comm ? "two reduce buffers" : "one reduce buffer") << " of "
      << human(s2.reduce_buffers / std::max(1, s2.reduce_buffer_count)) << " (reduce_bucket_size "
      << count(z.reduce_bucket_size) << (z.overlap_comm ? ";\n  overlap_comm fills one while the other is reduced)"
                                                        : "; overlap_comm off)")
      << ".\n";
  out << "- Padding: stages 1-3 pad to " << with_commas(rows[1].padded_params) << " parameters, "
      << with_commas(rows[1].shard_params) << " per rank: a lower bound,\n"
         "  as the engine pads every bucket to a multiple of the world size.\n";
  using zero::OffloadDevice;
  const OffloadDevice opt = z.offload_optimizer.where();
  if (opt == OffloadDevice::cpu)
    out << "- offload_optimizer cpu (stages 1-3): fp32 master, optimizer states, a copy of the gradient shard\n"
           "  in the training dtype and two staging buffers of a bucket's shard (the updated parameters on their\n"
           "  way to the device), in host memory. At stages 2-3 the device keeps no gradients of the offloaded\n"
           "  share (with gradient accumulation they add up on the host, through the device).\n";
  if (opt != OffloadDevice::none && z.offload_optimizer.ratio < 1.0)
    out << "- partial offload (ratio " << z.offload_optimizer.ratio << "): that share of the shard on the "
        << (opt == OffloadDevice::cpu ? "host" : "NVMe") << ", the rest of the master\n"
           "  weights and states on the device (the engine splits at bucket boundaries).\n";
  if (opt == OffloadDevice::nvme)
    out << "- offload_optimizer nvme (stage 3 only): fp32 master and optimizer states on NVMe; the host keeps\n"
           "  the gradient shard, two staging buffers, and up to 3 sub-groups of min(sub_group_size "
        << count(z.sub_group_size) << ", shard)\n  elements of master weights and states in flight.\n";
  const OffloadDevice par = z.offload_param.where();
  if (par == OffloadDevice::cpu) out << "- offload_param cpu (stage 3 only): the parameter shard in host memory.\n";
  if (par == OffloadDevice::nvme)
    out << "- offload_param nvme (stage 3 only): the parameter shard on NVMe, each bucket's read just before its\n"
           "  unit is gathered (its memory is part of the gathered units; buffer_count and buffer_size are not used).\n";
  out << "Not counted" << (o.shape ? "" : ": activations") << (o.shape ? ": " : ", ")
      << "the module's buffers, communication and temporary buffers, allocator\n"
         "fragmentation.\n";
  if (o.shape) out << activations_text(o, config, setup);
  std::cout << out.str();
  return 0;
}

}  // namespace zero_config_tool
