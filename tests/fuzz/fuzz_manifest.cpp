// Fuzz target: a checkpoint's manifest.json. Any text must give a Manifest
// or a zero::CheckpointError; a Manifest that reads must write JSON that
// reads back to the same parameters and files.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/checkpoint.h"
#include "zero/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zero::ckpt;
  Manifest m;
  try {
    m = parse_manifest(std::string(reinterpret_cast<const char*>(data), size), "fuzz/manifest.json");
  } catch (const zero::CheckpointError&) {
    return 0;
  }
  try {
    const Manifest again = Manifest::from_json(m.to_json(), "fuzz/manifest.json (written again)");
    if (again.params.size() != m.params.size() || again.files.size() != m.files.size()) std::abort();
    for (size_t i = 0; i < m.params.size(); ++i)
      if (again.params[i].shape != m.params[i].shape || again.params[i].name != m.params[i].name) std::abort();
  } catch (const zero::CheckpointError&) {
    std::abort();  // what was read must write and read back
  }
  return 0;
}
