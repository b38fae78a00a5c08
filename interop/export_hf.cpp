// A zero checkpoint's weights written as Hugging Face's safetensors files.
// See export_hf.h.
#include "interop/export_hf.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "core/regular_file.h"
#include "interop/staging.h"
#include "zero/error.h"

namespace zero::interop {

using ckpt::fail;

namespace fs = std::filesystem;
using nlohmann::json;

namespace {


ckpt::DType dtype_named(const std::string& name, const std::string& where) {
  std::string n = name;
  for (auto& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return ckpt::DType::F32;
  if (n == "bf16" || n == "bfloat16") return ckpt::DType::BF16;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return ckpt::DType::F16;
  fail(where + ": dtype \"" + name + "\" is not one export writes (float32, bfloat16 or float16)");
}

// One tensor to write: a parameter (from its fp32 master fragments) or a
// whole "module/" tensor.
struct Item {
  std::string hf_name, zero_name;
  std::vector<int64_t> shape;
  bool parameter = true;
  ckpt::DType dtype = ckpt::DType::F32;  // as written
  uint64_t bytes = 0;
};

std::string shard_name(size_t i, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return name;
}

}  // namespace

uint64_t parse_size(const std::string& text) {
  std::string digits = text, unit;
  while (!digits.empty() && std::isalpha(static_cast<unsigned char>(digits.back()))) {
    unit.insert(unit.begin(), static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back()))));
    digits.pop_back();
  }
  static const std::map<std::string, uint64_t> units{{"", 1},           {"B", 1},          {"KB", 1000},
                                                     {"MB", 1000000},   {"GB", 1000000000}, {"TB", 1000000000000},
                                                     {"KIB", 1ull << 10}, {"MIB", 1ull << 20}, {"GIB", 1ull << 30}};
  auto u = units.find(unit);
  if (digits.empty() || digits.size() > 12 || digits.find_first_not_of("0123456789") != std::string::npos ||
      u == units.end() || std::stoull(digits) == 0)
    fail("\"" + text + "\" is not a shard size (e.g. 5GB, 500MB, 2GiB)");
  // Checked before multiplying: 17179869184GiB would wrap to 0.
  constexpr uint64_t kMaxShard = uint64_t{1} << 50;
  if (std::stoull(digits) > kMaxShard / u->second)
    fail("\"" + text + "\" is not a shard size: more than 1 PiB a file (e.g. 5GB, 500MB, 2GiB)");
  return std::stoull(digits) * u->second;
}

HfExportSummary export_hf(const HfExportOptions& o) {
  check_destination(o.from, o.out, "the zero checkpoint");
  const std::string tag = o.tag.empty() ? ckpt::read_latest(o.from) : o.tag;
  const ckpt::Manifest m = ckpt::read_manifest(o.from, tag);
  ckpt::FragmentReader reader(o.from, m);

  std::string config_text;
  json config;
  if (!o.config.empty()) {
    std::string error;
    if (!core::read_regular_file(o.config, uint64_t{16} << 20, config_text, error)) fail("cannot read the config: " + error);
    try {
      config = json::parse(config_text);
    } catch (const json::exception& e) {
      fail("the config " + o.config + " is not JSON: " + e.what());
    }
    if (!config.is_object()) fail("the config " + o.config + " is not a JSON object");
  }
  ckpt::DType dtype = ckpt::dtype_from_name(m.dtype);
  if (!o.dtype.empty()) {
    dtype = dtype_named(o.dtype, "--dtype");
  } else {
    for (const char* key : {"torch_dtype", "dtype"})
      if (config.contains(key) && config[key].is_string()) dtype = dtype_named(config[key].get<std::string>(), o.config + ": " + key);
  }

  // What to write, in order: the map's tensors, then the checkpoint's others.
  std::map<std::string, std::string> hf_name_of;
  for (const auto& [hf, zero] : o.rename) hf_name_of[zero] = hf;
  std::map<std::string, Item> by_zero_name;
  std::vector<std::string> order;
  for (const auto& p : m.params) {
    Item item;
    item.zero_name = p.name;
    item.shape = p.shape;
    item.parameter = p.trainable;
    if (p.trainable) {
      item.dtype = dtype;
    } else {
      item.dtype = reader.describe_whole(reader.file_holding("module/" + p.name), "module/" + p.name).dtype;
    }
    by_zero_name[p.name] = item;
    order.push_back(p.name);
  }
  for (const auto& b : m.buffers) {
    const ckpt::TensorData d = reader.describe_whole(reader.file_holding("module/" + b), "module/" + b);
    Item item;
    item.zero_name = b;
    item.shape = d.shape;
    item.parameter = false;
    item.dtype = d.dtype;
    by_zero_name[b] = item;
    order.push_back(b);
  }
  std::vector<Item> items;
  std::set<std::string> placed, hf_names;
  auto place = [&](const std::string& zero) {
    if (!placed.insert(zero).second) return;
    Item item = by_zero_name.at(zero);
    item.hf_name = hf_name_of.count(zero) ? hf_name_of[zero] : zero;
    if (!hf_names.insert(item.hf_name).second) fail("two tensors would both be named \"" + item.hf_name + "\"");
    // Floating frozen parameters and buffers take the export's dtype too.
    if (!item.parameter && ckpt::dtype_is_floating(item.dtype)) item.dtype = dtype;
    int64_t n = 1;
    for (int64_t d : item.shape) n *= d;
    item.bytes = static_cast<uint64_t>(n) * ckpt::dtype_size(item.dtype);
    items.push_back(std::move(item));
  };
  for (const auto& [hf, zero] : o.rename) {
    if (!by_zero_name.count(zero))
      fail("the name map maps \"" + hf + "\" to \"" + zero + "\", which " + o.from + "/" + tag + " does not hold");
    place(zero);
  }
  for (const auto& zero : order) place(zero);

  // Shards as huggingface_hub splits a state dict: in order, a new shard
  // when the next tensor would pass the limit (a larger tensor alone).
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!shards.back().empty() && in_shard + items[i].bytes > o.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += items[i].bytes;
    total += items[i].bytes;
  }

  Staging staging(o.out);
  std::vector<float> values;
  std::vector<uint8_t> converted, whole;
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors" : shard_name(s, shards.size());
    std::vector<ckpt::TensorData> tensors;
    for (size_t i : shards[s]) {
      ckpt::TensorData d;
      d.name = items[i].hf_name;
      d.dtype = items[i].dtype;
      d.shape = items[i].shape;
      d.bytes = items[i].bytes;
      tensors.push_back(d);
      weight_map[items[i].hf_name] = file;
    }
    // One tensor in memory at a time, brought in as the file is written.
    auto fetch = [&](size_t k) -> const void* {
      const Item& item = items[shards[s][k]];
      int64_t n = 1;
      for (int64_t d : item.shape) n *= d;
      if (item.parameter) {
        values.resize(static_cast<size_t>(n));
        reader.read_f32("fp32", item.zero_name, 0, n, values.data());
      } else {
        const std::string name = "module/" + item.zero_name;
        const ckpt::TensorData d = reader.read_whole(reader.file_holding(name), name, whole);
        if (d.dtype == item.dtype) return whole.data();
        values.resize(static_cast<size_t>(n));
        ckpt::convert_to_f32(d.dtype, whole.data(), values.size(), values.data());
      }
      converted.resize(item.bytes);
      if (item.dtype == ckpt::DType::F32) return values.data();
      ckpt::convert_from_f32(item.dtype, values.data(), values.size(), converted.data());
      return converted.data();
    };
    ckpt::write_safetensors((staging.path() / file).string(), tensors, {{"format", "pt"}}, fetch);
  }
  if (shards.size() > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    ckpt::write_file_durably((staging.path() / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  if (!o.config.empty()) ckpt::write_file_durably((staging.path() / "config.json").string(), config_text);
  staging.commit();

  HfExportSummary summary;
  summary.tensors = static_cast<int64_t>(items.size());
  summary.shards = static_cast<int64_t>(shards.size());
  summary.bytes = total;
  summary.dtype = ckpt::dtype_name(dtype);
  return summary;
}

}  // namespace zero::interop
