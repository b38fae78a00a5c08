#pragma once
// The device the engine tests train on. ZERO_TEST_DEVICE=cuda puts the
// models and batches on this rank's GPU (LOCAL_RANK modulo the GPUs, so 2-4
// ranks over gloo can share one; bench/gpu/run_all.sh runs them so);
// unset, or "cpu", keeps them on the CPU. The references stay on the CPU.
#include <torch/torch.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace zero_test {

inline at::Device test_device() {
  const char* v = std::getenv("ZERO_TEST_DEVICE");
  const std::string name = v ? v : "";
  if (name.empty() || name == "cpu") return at::Device(at::kCPU);
  if (name != "cuda") throw std::invalid_argument("ZERO_TEST_DEVICE must be cpu or cuda; got '" + name + "'");
  if (!torch::cuda::is_available()) throw std::runtime_error("ZERO_TEST_DEVICE=cuda but LibTorch sees no CUDA device");
  const char* local = std::getenv("LOCAL_RANK");
  const int64_t gpus = torch::cuda::device_count();
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>((local ? std::atoi(local) : 0) % gpus));
}

// Relative tolerance of a parity against a CPU reference in fp32: the CPU's
// own kernels reach 1e-5 after the tests' steps; a GPU's matrix products
// sum in another order, and Adam's normalisation carries those last-bit
// differences into every element.
inline double fp32_parity_tolerance(const at::Device& device) { return device.is_cuda() ? 1e-4 : 1e-5; }

}  // namespace zero_test
