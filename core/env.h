#pragma once
// Every tunable zero reads from the environment, one line each, in one place.
#include <string>

namespace zero::env {

std::string get(const char* name, const std::string& fallback = "");
long get_int(const char* name, long fallback);
bool is_set(const char* name);

// Logging (core/log.cpp).
inline std::string log_level() { return get("ZERO_LOG_LEVEL", "info"); }
inline std::string log_ranks() { return get("ZERO_LOG_RANKS", "0"); }
// Seconds any collective or rendezvous may wait before naming the missing rank.
inline long comm_timeout_s() { return get_int("ZERO_COMM_TIMEOUT", 300); }
// Backend for CUDA tensors: "nccl" (default) or "gloo" (staged through host memory).
inline std::string cuda_backend() { return get("ZERO_CUDA_BACKEND", "nccl"); }
// Transport for host collectives: "auto" (default: shared memory when every
// rank of a group runs on this host, else gloo), "shm" (required) or "gloo".
inline std::string host_transport() { return get("ZERO_HOST_TRANSPORT", "auto"); }
// Bytes per rank per chunk of a shared-memory collective, in KiB.
inline long shm_slot_kib() { return get_int("ZERO_SHM_SLOT_KIB", 1024); }
// Network interface or host name gloo binds to (default: the host name of MASTER_ADDR's route).
inline std::string gloo_hostname() { return get("ZERO_GLOO_HOSTNAME", ""); }
// Progress reports of long operations (core/progress.h): "0" silences them.
inline bool progress_shown() { return get("ZERO_PROGRESS") != "0"; }
// CPU optimizers' SIMD path: "portable", "avx2" or "avx512" (default: the best the CPU has).
inline std::string cpu_optimizer_simd() { return get("ZERO_CPU_OPTIMIZER_SIMD", ""); }

// Test hook: "1" makes CPU ranks copy offloaded gradients to host buffers
// as an accelerator does (Note [Offload copies] in partition/master_store.h).
inline bool offload_host_grad_copies() { return get("ZERO_OFFLOAD_HOST_GRAD_COPIES") == "1"; }

// Test hook: "<point>:<rank>[:<n>]" kills that rank at a point of a save,
// a load or a step (core/fault.h).
inline std::string fault() { return get("ZERO_FAULT", ""); }

}  // namespace zero::env
