// Fuzz target: the ds_config reader. Any text must parse into a Config or
// fail with zero::ConfigError; a Config that parses must resolve (or fail
// with ConfigError) at any world size, and a resolved Config must print as
// JSON that reads and resolves again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "zero/config.h"
#include "zero/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  zero::Config config;
  try {
    config = zero::Config::from_json(text);
  } catch (const zero::ConfigError&) {
    return 0;
  }
  for (int world_size : {1, 3, 64}) {
    zero::Config resolved = config;
    try {
      resolved.resolve(world_size);
    } catch (const zero::ConfigError&) {
      continue;
    }
    // What zero-config prints for a resolved config reads and resolves again.
    try {
      zero::Config::from_json(resolved.to_json()).resolve(world_size);
    } catch (const zero::ConfigError&) {
      std::abort();
    }
  }
  return 0;
}
