// Small text helpers for config messages: typo suggestions, value display.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "config/config_detail.h"
#include "core/did_you_mean.h"

namespace zero::config_detail {

std::string lower(const std::string& s) { return text::lower(s); }
size_t edit_distance(const std::string& a, const std::string& b) { return text::edit_distance(a, b); }
std::optional<std::string> nearest(const std::string& key, const std::vector<std::string>& candidates) {
  return text::nearest(key, candidates);
}

std::string show(const Json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  if (v.is_string()) return "string " + text;
  if (v.is_array()) return "array " + text;
  if (v.is_object()) return "object " + text;
  return text;
}

std::string show_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string unimplemented_warning(const std::string& path) {
  return "known DeepSpeed key " + path + " is accepted but not implemented by zero; it has no effect";
}

}  // namespace zero::config_detail
