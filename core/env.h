#pragma once
// Every tunable zero reads from the environment, one line each, in one place,
// and the one parser of the whole numbers zero reads from the environment
// and from command lines.
#include <optional>
#include <string>

namespace zero::env {

std::string get(const char* name, const std::string& fallback = "");
bool is_set(const char* name);

// A whole number in [min, max] written as decimal digits with an optional
// sign and nothing else (no spaces, units, fractions or exponents); nullopt
// for anything else, a value past the range or past long long included.
std::optional<long long> parse_whole_number(const std::string& text, long long min, long long max);

// A whole number read from the environment, or why it could not be.
struct Number {
  long long value = 0;
  std::string error;  // "" when value holds the number
};

// NAME's value as a whole number in [min, max]; `fallback` when NAME is
// unset or empty. Anything else is `error`, which names the variable, its
// value, `meaning` and the range: "WORLD_SIZE=abc: the number of ranks, a
// whole number from 1 to 65536". core/ throws nothing: the caller raises
// the error class of its layer with this text.
Number number(const char* name, std::optional<long long> fallback, long long min, long long max,
              const std::string& meaning);

// A yes/no setting read from the environment, or why it could not be.
struct Flag {
  bool value = false;
  std::string error;  // "" when value holds the setting
};
// NAME as yes or no: 1, true, yes, on or 0, false, no, off (any case, as
// DeepSpeed's and torch's variables are written); `fallback` when NAME is
// unset or empty. Anything else is `error`, naming the variable, its value
// and `meaning`: a typo never quietly means "off".
Flag flag(const char* name, bool fallback, const std::string& meaning);

// Logging (core/log.cpp).
inline std::string log_level() { return get("ZERO_LOG_LEVEL", "info"); }
inline std::string log_ranks() { return get("ZERO_LOG_RANKS", "0"); }
// Seconds any collective or rendezvous may wait before naming the missing rank.
inline Number comm_timeout_s() {
  return number("ZERO_COMM_TIMEOUT", 300, 1, 7 * 24 * 3600, "the seconds a collective may wait");
}
// Backend for CUDA tensors: "nccl" (default) or "gloo" (staged through host memory).
inline std::string cuda_backend() { return get("ZERO_CUDA_BACKEND", "nccl"); }
// Transport for host collectives: "auto" (default: shared memory when every
// rank of a group runs on this host, else gloo), "shm" (required) or "gloo".
inline std::string host_transport() { return get("ZERO_HOST_TRANSPORT", "auto"); }
// Bytes per rank per chunk of a shared-memory collective, in KiB: from one
// page to 1 GiB (a segment holds two chunks per rank).
inline Number shm_slot_kib() {
  return number("ZERO_SHM_SLOT_KIB", 1024, 4, 1 << 20, "the KiB per rank of a shared-memory chunk");
}
// Network interface or host name gloo binds to (default: the host name of MASTER_ADDR's route).
inline std::string gloo_hostname() { return get("ZERO_GLOO_HOSTNAME", ""); }
// Progress reports of long operations (core/progress.h): "0" (or off, ...) silences them.
inline Flag progress_shown() { return flag("ZERO_PROGRESS", true, "whether long operations show their progress"); }
// CPU optimizers' SIMD path: "portable", "avx2" or "avx512" (default: the best the CPU has).
inline std::string cpu_optimizer_simd() { return get("ZERO_CPU_OPTIMIZER_SIMD", ""); }
// Debug runs: "1" makes every gloo collective check first that the ranks
// passed the same kind, size, dtype and root (Note [Checked collectives] in
// comm/gloo.cpp).
inline Flag check_collectives() {
  return flag("ZERO_CHECK_COLLECTIVES", false, "whether every gloo collective is checked across the ranks first");
}

// Test hook: "1" makes CPU ranks copy offloaded gradients to host buffers
// as an accelerator does (Note [Offload copies] in partition/master_store.h).
inline Flag offload_host_grad_copies() {
  return flag("ZERO_OFFLOAD_HOST_GRAD_COPIES", false, "whether CPU ranks copy offloaded gradients to host buffers");
}

// Test hook: "<point>:<rank>[:<n>]" kills that rank at a point of a save,
// a load or a step (core/fault.h).
inline std::string fault() { return get("ZERO_FAULT", ""); }

}  // namespace zero::env
