#pragma once
// The dense peak FLOP/s of an accelerator, for the model FLOPs utilization
// (MFU) the progress line and the monitors show: achieved FLOP/s over the
// device's peak for the training dtype. Vendors' datasheet figures without
// structured sparsity; an unknown device has none (0), and the config's
// flops_profiler.peak_tflops names it instead.
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace zero::profile {

// By the device's name as CUDA reports it ("NVIDIA H200", "NVIDIA A100-SXM4-80GB").
// tf32: fp32 matrix products run on tensor cores (torch's allow_tf32).
double peak_flops_per_s(const std::string& device_name, c10::ScalarType dtype, bool tf32);

// The name of the accelerator `device` is on, "" for the CPU.
std::string accelerator_name(const c10::Device& device);

// The peak for the device the model trains on: peak_tflops from the config
// when given (> 0), else the table; 0 when unknown.
double training_peak_flops_per_s(const c10::Device& device, c10::ScalarType dtype, double peak_tflops);

}  // namespace zero::profile
