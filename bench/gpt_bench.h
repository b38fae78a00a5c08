// Shared by the GPT benchmarks (memory_peaks.cpp, step_time.cpp): command
// line flags, the ds_config they train with, and small helpers.
#pragma once

#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

namespace zero_bench {

// "--key value" pairs; a key given twice keeps the last value. -h or
// --help prints every option with its default and exits 0.
class Flags {
 public:
  Flags(int argc, char** argv, const std::map<std::string, std::string>& defaults) : values_(defaults) {
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "-h" || std::string(argv[i]) == "--help") {
        std::string usage = std::string("usage: ") + argv[0];
        for (const auto& kv : values_) usage += " [--" + kv.first + " " + (kv.second.empty() ? "\"\"" : kv.second) + "]";
        std::printf("%s\n", usage.c_str());
        std::exit(0);
      }
    }
    for (int i = 1; i < argc; ++i) {
      std::string key = argv[i];
      if (key.rfind("--", 0) != 0 || !values_.count(key.substr(2))) {
        throw std::invalid_argument("unknown option '" + key + "'" + known());
      }
      if (i + 1 >= argc) throw std::invalid_argument(key + " needs a value");
      values_[key.substr(2)] = argv[++i];
    }
  }
  std::string str(const std::string& key) const { return values_.at(key); }
  int64_t num(const std::string& key) const { return static_cast<int64_t>(real(key)); }
  double real(const std::string& key) const {
    const std::string& v = values_.at(key);
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') throw std::invalid_argument("--" + key + " must be a number; got '" + v + "'");
    return d;
  }

 private:
  std::string known() const {
    std::string s = "; known:";
    for (const auto& kv : values_) s += " --" + kv.first + " (" + kv.second + ")";
    return s;
  }
  std::map<std::string, std::string> values_;
};

struct TrainSetup {
  int stage = 0;
  std::string dtype = "fp32";  // fp32 | bf16 | fp16
  int64_t micro_batch = 4;
  int64_t reduce_bucket_size = 500000;  // elements
  bool overlap_comm = true;
  std::string offload_optimizer = "none";  // none | cpu
  // Stage 3: how far forward's gathered units stay gathered for backward
  // (elements); negative leaves the key out, DeepSpeed's default 1e9.
  int64_t stage3_max_reuse_distance = -1;
  // checkpoint.in_memory.interval (0: the key left out).
  int64_t in_memory_interval = 0;
};

// The ds_config both benchmarks train with: AdamW, clipping 1.0, no
// scheduler, progress logging effectively off (it would add a collective).
inline std::string ds_config(const TrainSetup& s) {
  std::ostringstream j;
  j << "{\"train_micro_batch_size_per_gpu\": " << s.micro_batch << ", \"gradient_accumulation_steps\": 1,"
    << " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"betas\": [0.9, 0.95],"
    << " \"eps\": 1e-8, \"weight_decay\": 0.01}},"
    << " \"gradient_clipping\": 1.0,"
    << " \"fp16\": {\"enabled\": " << (s.dtype == "fp16" ? "true" : "false") << "},"
    << " \"bf16\": {\"enabled\": " << (s.dtype == "bf16" ? "true" : "false") << "},"
    << " \"steps_per_print\": 1000000000,"
    << " \"zero_optimization\": {\"stage\": " << s.stage << ", \"overlap_comm\": " << (s.overlap_comm ? "true" : "false")
    << ", \"contiguous_gradients\": true, \"reduce_bucket_size\": " << s.reduce_bucket_size
    << ", \"offload_optimizer\": {\"device\": \"" << s.offload_optimizer << "\"}";
  if (s.stage3_max_reuse_distance >= 0) j << ", \"stage3_max_reuse_distance\": " << s.stage3_max_reuse_distance;
  j << "}";
  if (s.in_memory_interval > 0) j << ", \"checkpoint\": {\"in_memory\": {\"interval\": " << s.in_memory_interval << "}}";
  j << "}";
  return j.str();
}

// Highest resident set size of this process so far, in bytes (Linux reports KiB).
inline int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// --device auto|cpu|cuda as a device: "auto" is CUDA when there is one; a
// rank's GPU is its LOCAL_RANK's (modulo the GPUs there are).
inline at::Device bench_device(std::string name) {
  if (name == "auto") name = torch::cuda::is_available() ? "cuda" : "cpu";
  if (name == "cpu") return at::Device(at::kCPU);
  if (name != "cuda") throw std::invalid_argument("--device must be auto, cpu or cuda; got '" + name + "'");
  const int64_t gpus = std::max<int64_t>(1, torch::cuda::device_count());
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env_int("LOCAL_RANK", 0) % gpus));
}

}  // namespace zero_bench
