// The batch triad: train_batch_size = train_micro_batch_size_per_gpu *
// gradient_accumulation_steps * world_size. DeepSpeed's rules
// (runtime/config.py, _set_batch_related_parameters): any two given determine
// the third; train_batch_size alone means no accumulation; the micro batch
// alone means no accumulation; gradient_accumulation_steps alone or nothing
// is an error. Unlike DeepSpeed, a division that leaves a remainder is an
// error here instead of being rounded down.
#include "config/config_detail.h"
#include "zero/error.h"

namespace zero::config_detail {
namespace {

const char* const kTbs = "train_batch_size";
const char* const kMicro = "train_micro_batch_size_per_gpu";
const char* const kGas = "gradient_accumulation_steps";

std::string n(int64_t v) { return std::to_string(v); }

int64_t product(int64_t a, int64_t b, int64_t c) {
  int64_t ab = 0, abc = 0;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc))
    throw ConfigError("batch size overflows: " + n(a) + " * " + n(b) + " * " + n(c));
  return abc;
}

// total / (a * b), which must leave no remainder.
int64_t divide(int64_t total, const char* total_key, int64_t a, const std::string& a_text, int64_t b,
               const std::string& b_text, const char* result_key) {
  int64_t divisor = product(a, b, 1);
  if (total % divisor != 0)
    throw ConfigError(std::string(total_key) + " " + n(total) + " is not divisible by " + a_text + " * " +
                      b_text + " = " + n(divisor) + ", so " + result_key +
                      " would not be a whole number; change one of them");
  return total / divisor;
}

}  // namespace

void resolve_batch(BatchConfig& b, int world_size) {
  auto& tbs = b.train_batch_size;
  auto& micro = b.train_micro_batch_size_per_gpu;
  auto& gas = b.gradient_accumulation_steps;
  for (const auto& [key, value] : {std::make_pair(kTbs, tbs), std::make_pair(kMicro, micro), std::make_pair(kGas, gas)})
    if (value && *value < 1) throw ConfigError(std::string(key) + " must be >= 1; found " + n(*value));
  // Far beyond any run (a billion samples a step): a value this large is a
  // typo, and its products would overflow the counts derived from it.
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  for (const auto& [key, value] : {std::make_pair(kTbs, tbs), std::make_pair(kMicro, micro), std::make_pair(kGas, gas)})
    if (value && *value > kMax)
      throw ConfigError(std::string(key) + " is " + n(*value) + ", above " + n(kMax) + "; is it a typo?");
  const int64_t ws = world_size;
  const std::string ws_text = "world_size " + n(ws);

  if (tbs && micro && gas) {
    if (*tbs != product(*micro, *gas, ws))
      throw ConfigError("batch sizes do not fit: train_batch_size " + n(*tbs) +
                        " != train_micro_batch_size_per_gpu " + n(*micro) + " * gradient_accumulation_steps " +
                        n(*gas) + " * " + ws_text + " = " + n(product(*micro, *gas, ws)) +
                        "; give two of the three and zero computes the third");
  } else if (tbs && micro) {
    gas = divide(*tbs, kTbs, *micro, std::string(kMicro) + " " + n(*micro), ws, ws_text, kGas);
  } else if (tbs && gas) {
    micro = divide(*tbs, kTbs, *gas, std::string(kGas) + " " + n(*gas), ws, ws_text, kMicro);
  } else if (micro && gas) {
    tbs = product(*micro, *gas, ws);
  } else if (tbs) {
    gas = 1;
    micro = divide(*tbs, kTbs, 1, "gradient_accumulation_steps 1", ws, ws_text, kMicro);
  } else if (micro) {
    gas = 1;
    tbs = product(*micro, 1, ws);
  } else if (gas) {
    throw ConfigError("gradient_accumulation_steps alone does not determine the batch: also give "
                      "train_micro_batch_size_per_gpu (or train_batch_size)");
  } else {
    throw ConfigError("no batch size given (train_batch_size, train_micro_batch_size_per_gpu and "
                      "gradient_accumulation_steps are missing or \"auto\"): give "
                      "train_micro_batch_size_per_gpu, or train_batch_size");
  }
}

}  // namespace zero::config_detail
