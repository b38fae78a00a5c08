#pragma once
// Peak resident memory of this process, read from the kernel, for tests
// that bound what an operation holds: reset the peak, run it, read VmHWM.
#include <dlfcn.h>
#include <malloc.h>

#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "zero/unit.h"

namespace peak_rss {

// A field of /proc/self/status in bytes (VmRSS: now; VmHWM: the peak since
// the last reset), -1 when absent.
inline int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

// Hands the allocator's free memory back to the kernel (tcmalloc, which
// zero-run preloads, keeps it, and so does glibc), so that what the next
// operation allocates shows in RSS rather than reusing memory freed before
// it; then sets VmHWM to VmRSS ("5", Linux 4.0 and later). False where the
// kernel refuses.
inline bool reset_peak() {
  using Release = void (*)();
  if (auto release = reinterpret_cast<Release>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"))) release();
  malloc_trim(0);
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// A model of `units` zero::Units, each two Linear(1024, 1024): 8.4 MB a unit.
constexpr int64_t kWidth = 1024;
constexpr int64_t kUnitBytes = 2 * (kWidth * kWidth + kWidth) * 4;

struct LayerImpl : torch::nn::Module {
  LayerImpl() {
    a = register_module("a", torch::nn::Linear(kWidth, kWidth));
    b = register_module("b", torch::nn::Linear(kWidth, kWidth));
  }
  at::Tensor forward(const at::Tensor& x) { return b(torch::relu(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Layer);

struct TowerImpl : torch::nn::Module {
  explicit TowerImpl(int64_t units) {
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < units; ++i) {
      units_.emplace_back(Layer());
      layers->push_back(units_.back());
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& unit : units_) x = unit(x);
    return x;
  }
  torch::nn::ModuleList layers{nullptr};

 private:
  std::vector<zero::Unit<Layer>> units_;
};
TORCH_MODULE(Tower);

}  // namespace peak_rss
