#pragma once
// How deeply a JSON text nests, found before it is parsed. nlohmann/json
// parses without recursion, but dumping, copying and comparing a value
// recurse once per level, so a file of 100,000 nested arrays (a config, a
// manifest, a safetensors header) would overflow the stack later. Every
// reader of untrusted JSON refuses texts deeper than kMaxJsonDepth first.
// Header-only and torch-free: ckpt/ and the tools use it too.
#include <string_view>

namespace zero::core {

// Far deeper than any ds_config (4 levels), manifest (4) or safetensors header (3).
constexpr int kMaxJsonDepth = 64;

// True when `text` nests arrays and objects more than `limit` levels deep.
// Brackets inside strings do not count, nor (for configs, which may hold
// them) inside // and /* */ comments.
inline bool json_nests_deeper_than(std::string_view text, int limit = kMaxJsonDepth) {
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {  // skip the string, escapes included
      for (++i; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\') ++i;
      }
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') {
      const size_t end = text.find("*/", i + 2);
      i = end == std::string_view::npos ? text.size() : end + 1;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace zero::core
