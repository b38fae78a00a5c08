// WeightFiles: Hugging Face's weight files (one safetensors file, or an
// index and its shards) and zero's consolidated file, read by element range
// (checkpoint.h).
#include <algorithm>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "core/json_depth.h"
#include "core/json_duplicates.h"
#include "core/regular_file.h"
#include "zero/error.h"

namespace zero::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIndex = "model.safetensors.index.json";
constexpr uint64_t kMaxIndexBytes = uint64_t(64) << 20;  // an index lists names: megabytes at most

// The index's shard names: plain file names in the index's own folder.
std::map<std::string, std::string> read_index(const std::string& path) {
  std::string text, error;
  if (!core::read_regular_file(path, kMaxIndexBytes, text, error)) fail("weights: " + error);
  if (core::json_nests_deeper_than(text)) fail("weights: " + path + " nests deeper than any weight index does; it is damaged");
  nlohmann::json j;
  std::optional<std::string> duplicate;
  try {
    j = core::parse_json_noting_duplicates<nlohmann::json>(text, duplicate);
  } catch (const nlohmann::json::exception& e) {
    fail("weights: " + path + " is not valid JSON (" + e.what() + ")");
  }
  if (duplicate) fail("weights: " + path + " holds the key " + *duplicate + " twice; which shard holds that tensor is ambiguous");
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    fail("weights: " + path + " has no \"weight_map\" object (tensor name -> shard file), which a Hugging Face index holds");
  }
  std::map<std::string, std::string> map;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail("weights: " + path + ": the shard of \"" + it.key() + "\" is not a file name");
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
      fail("weights: " + path + ": the shard of \"" + it.key() + "\" is \"" + file +
           "\", not a file in the index's folder; shards must lie beside their index");
    }
    map[it.key()] = file;
  }
  if (map.empty()) fail("weights: " + path + " maps no tensor to a shard");
  return map;
}

}  // namespace

WeightFiles::WeightFiles(const std::string& path) : path_(path) {
  std::error_code ec;
  std::string single, index;
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / kIndex, ec)) {
      index = (fs::path(path) / kIndex).string();
    } else if (fs::exists(fs::path(path) / "model.safetensors", ec)) {
      single = (fs::path(path) / "model.safetensors").string();
    } else {
      fail("weights: the folder " + path + " holds neither " + kIndex + " nor model.safetensors");
    }
  } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    index = path;
  } else {
    single = path;
  }
  if (!single.empty()) {
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& [name, entry] : files_.back()->entries()) {
      tensors_[name] = {entry.dtype, entry.shape, single};
      holder_[name] = files_.back().get();
    }
    return;
  }
  const std::map<std::string, std::string> map = read_index(index);
  const fs::path folder = fs::path(index).parent_path();
  std::map<std::string, const SafetensorsFile*> opened;
  for (const auto& [name, file] : map) {
    if (!opened.count(file)) {
      files_.push_back(std::make_unique<SafetensorsFile>((folder / file).string()));
      opened[file] = files_.back().get();
    }
    const SafetensorsFile* f = opened[file];
    auto entry = f->entries().find(name);
    if (entry == f->entries().end()) {
      fail("weights: " + index + " places \"" + name + "\" in " + file + ", which has no tensor of that name");
    }
    tensors_[name] = {entry->second.dtype, entry->second.shape, f->path()};
    holder_[name] = f;
  }
  for (const auto& f : files_) {  // a shard's tensor the index does not list, or lists elsewhere
    for (const auto& [name, entry] : f->entries()) {
      if (!map.count(name)) {
        fail("weights: " + f->path() + " holds \"" + name + "\", which " + index + " does not list; the index and its shards differ");
      }
      if (holder_.at(name) != f.get()) {
        fail("weights: \"" + name + "\" is in " + f->path() + " and in " + holder_.at(name)->path() + "; a tensor lies in one shard");
      }
    }
  }
}

WeightFiles::~WeightFiles() = default;

void WeightFiles::read(const std::string& name, uint64_t byte_offset, uint64_t bytes, void* dst) const {
  auto it = holder_.find(name);
  if (it == holder_.end()) fail("weights: no tensor \"" + name + "\" in " + path_);
  it->second->read(name, byte_offset, bytes, dst);
}

void WeightFiles::read_f32(const std::string& name, int64_t start, int64_t length, float* dst) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("weights: no tensor \"" + name + "\" in " + path_);
  const DType dtype = it->second.dtype;
  const size_t size = dtype_size(dtype);
  if (dtype == DType::F32) {
    read(name, uint64_t(start) * size, uint64_t(length) * size, dst);
    return;
  }
  if (!dtype_is_floating(dtype)) fail("weights: \"" + name + "\" in " + it->second.file + " is " + dtype_name(dtype) + ", not a floating dtype");
  constexpr int64_t kPiece = int64_t(1) << 20;  // elements converted at a time
  std::vector<uint8_t> raw(static_cast<size_t>(std::min(length, kPiece)) * size);
  for (int64_t done = 0; done < length; done += kPiece) {
    const int64_t n = std::min(kPiece, length - done);
    read(name, uint64_t(start + done) * size, uint64_t(n) * size, raw.data());
    convert_to_f32(dtype, raw.data(), static_cast<size_t>(n), dst + done);
  }
}

}  // namespace zero::ckpt
