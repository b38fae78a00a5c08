#pragma once
// A key written twice in one JSON object: nlohmann/json keeps the last value
// silently, so a manifest saying stage 2 and then 0, or a safetensors header
// naming a tensor twice, would be read as whichever came last. Every reader
// of a file zero trusts (ds_config, manifest, safetensors header, weight
// index) parses through this and refuses such a text, naming the key's path
// (DeepSpeed refuses duplicate keys in a ds_config too). Header-only and
// torch-free; one hash set per open object, so linear in the keys.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <vector>

namespace zero::core {

// Thrown while parsing when an object holds more keys than the reader
// allows: an ordered_json object inserts each key after a linear search, so
// a file of a million keys would take hours to read instead of failing.
struct TooManyKeys : std::runtime_error {
  explicit TooManyKeys(const std::string& path) : std::runtime_error(path) {}
};

// Parses `text` like Json::parse (throwing its parse_error); sets
// `duplicate` to the path of the first key an object holds twice
// ("zero_optimization.stage", "params[2].name"). Throws TooManyKeys with
// the object's path past `max_keys` keys in one object.
template <typename Json>
Json parse_json_noting_duplicates(const std::string& text, std::optional<std::string>& duplicate,
                                  bool ignore_comments = false, size_t max_keys = SIZE_MAX) {
  struct Frame {
    bool object;
    std::unordered_set<std::string> keys;
    std::string key;
    size_t index = 0;
  };
  std::vector<Frame> stack;
  auto path = [&stack] {
    std::string p;
    for (const Frame& f : stack) {
      if (f.object) p += (p.empty() ? "" : ".") + f.key;
      else p += "[" + std::to_string(f.index) + "]";
    }
    return p;
  };
  auto advance = [&stack] {
    if (!stack.empty() && !stack.back().object) ++stack.back().index;
  };
  auto callback = [&](int, typename Json::parse_event_t event, Json& parsed) {
    using E = typename Json::parse_event_t;
    switch (event) {
      case E::object_start: stack.push_back({true, {}, "", 0}); break;
      case E::array_start: stack.push_back({false, {}, "", 0}); break;
      case E::key:
        if (!stack.empty()) {
          Frame& top = stack.back();
          top.key = parsed.template get<std::string>();
          if (!top.keys.insert(top.key).second && !duplicate) duplicate = path();
          if (top.keys.size() > max_keys) {
            top.key.clear();
            std::string where = path();  // the object's own path
            if (!where.empty() && where.back() == '.') where.pop_back();
            // not a zero::Error: the reader catches it and throws its own
            throw TooManyKeys(where);
          }
        }
        break;
      case E::object_end:
      case E::array_end:
        if (!stack.empty()) stack.pop_back();
        advance();
        break;
      case E::value: advance(); break;
    }
    return true;
  };
  duplicate.reset();
  return Json::parse(text, callback, /*allow_exceptions=*/true, ignore_comments);
}

}  // namespace zero::core
