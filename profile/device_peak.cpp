// Dense peak FLOP/s by device name (profile/device_peak.h).
#include "profile/device_peak.h"

#include <ATen/Context.h>

#if ZERO_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <cctype>

namespace zero::profile {

namespace {

// TFLOP/s without sparsity: 16-bit (bf16 and fp16), tf32, fp32. The first
// entry whose every word occurs in the name wins, so the specific come first.
struct Peak {
  const char* words[2];
  double half, tf32, fp32;
};
constexpr Peak kPeaks[] = {
    {{"b200", ""}, 2250.0, 1100.0, 75.0},
    {{"h200", ""}, 989.4, 494.7, 66.9},
    {{"h100", "pcie"}, 756.0, 378.0, 51.2},
    {{"h100", "nvl"}, 835.0, 417.5, 60.0},
    {{"h100", ""}, 989.4, 494.7, 66.9},  // SXM
    {{"gh200", ""}, 989.4, 494.7, 66.9},
    {{"a100", ""}, 312.0, 156.0, 19.5},
    {{"l40s", ""}, 362.05, 183.0, 91.6},
    {{"a10g", ""}, 70.0, 35.0, 31.2},
    {{"v100", ""}, 125.0, 15.7, 15.7},  // no bf16 and no tf32: fp16 tensor cores only
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

double peak_flops_per_s(const std::string& device_name, c10::ScalarType dtype, bool tf32) {
  const std::string name = lower(device_name);
  for (const Peak& p : kPeaks) {
    if (name.find(p.words[0]) == std::string::npos) continue;
    if (*p.words[1] && name.find(p.words[1]) == std::string::npos) continue;
    if (dtype == c10::kBFloat16 && std::string(p.words[0]) == "v100") return 0;
    const double tflops = (dtype == c10::kHalf || dtype == c10::kBFloat16) ? p.half : (tf32 ? p.tf32 : p.fp32);
    return tflops * 1e12;
  }
  return 0;
}

std::string accelerator_name(const c10::Device& device) {
#if ZERO_TORCH_CUDA
  if (device.is_cuda()) return at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->name;
#endif
  (void)device;
  return "";
}

double training_peak_flops_per_s(const c10::Device& device, c10::ScalarType dtype, double peak_tflops) {
  if (peak_tflops > 0) return peak_tflops * 1e12;
  const std::string name = accelerator_name(device);
  if (name.empty()) return 0;
  return peak_flops_per_s(name, dtype, at::globalContext().allowTF32CuBLAS());
}

}  // namespace zero::profile
