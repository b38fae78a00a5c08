#pragma once
// zero-ckpt export --to hf: a zero checkpoint's weights in Hugging Face's
// layout, one tensor in memory at a time:
//   model.safetensors                      when they fit one shard, else
//   model-00001-of-0000N.safetensors ...   shards of at most max_shard_bytes
//   model.safetensors.index.json           {"metadata": {"total_size": bytes},
//                                           "weight_map": {tensor: shard}}
// as transformers' save_pretrained writes them (each file's header has
// {"format": "pt"}), and config.json when one is given. Torch-free.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"

namespace zero::interop {

struct HfExportOptions {
  std::string from;    // the zero checkpoint folder
  std::string out;     // the folder to create: absent or empty
  std::string tag;     // empty: the one from/latest names
  std::string config;  // a config.json to copy beside the weights (empty: none)
  // The weights' dtype: "F32", "BF16" or "F16"; empty: config.json's
  // "torch_dtype" (or "dtype"), else the checkpoint's training dtype.
  std::string dtype;
  uint64_t max_shard_bytes = 50'000'000'000;  // transformers 5's save_pretrained default, "50GB"
  // Hugging Face names -> zero names; names not in it are kept. The
  // tensors are written in the map's order, then the rest in the checkpoint's.
  std::vector<std::pair<std::string, std::string>> rename;
};

struct HfExportSummary {
  int64_t tensors = 0, shards = 0;
  uint64_t bytes = 0;  // of tensor data
  std::string dtype;
};

HfExportSummary export_hf(const HfExportOptions& options);

// "5GB", "500MB", "10KB", "123" (bytes): powers of 1000, as transformers'
// max_shard_size reads them, and "GiB", "MiB", "KiB" as powers of 1024;
// CheckpointError naming the text when it is not a size.
uint64_t parse_size(const std::string& text);

}  // namespace zero::interop
