#include "core/env.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace zero::env {

std::string get(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : fallback;
}

bool is_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

std::optional<long long> parse_whole_number(const std::string& text, long long min, long long max) {
  // strtoll alone would take leading spaces and stop quietly at "10s".
  const size_t digits = (!text.empty() && (text[0] == '-' || text[0] == '+')) ? 1 : 0;
  if (text.size() == digits || text.find_first_not_of("0123456789", digits) != std::string::npos) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0' || v < min || v > max) return std::nullopt;
  return v;
}

Number number(const char* name, std::optional<long long> fallback, long long min, long long max,
              const std::string& meaning) {
  Number n;
  const std::string text = get(name);
  if (text.empty() && fallback) {
    n.value = *fallback;
    return n;
  }
  if (auto v = parse_whole_number(text, min, max)) {
    n.value = *v;
    return n;
  }
  // At most 40 characters of the value: it is shown, not echoed whole.
  n.error = std::string(name) + "=" + (text.size() > 40 ? text.substr(0, 40) + "..." : text) + ": " + meaning +
            ", a whole number from " + std::to_string(min) + " to " + std::to_string(max) +
            (fallback ? " (unset: " + std::to_string(*fallback) + ")" : "");
  return n;
}

Flag flag(const char* name, bool fallback, const std::string& meaning) {
  Flag f;
  std::string text = get(name);
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (text.empty()) {
    f.value = fallback;
  } else if (text == "1" || text == "true" || text == "yes" || text == "on") {
    f.value = true;
  } else if (text == "0" || text == "false" || text == "no" || text == "off") {
    f.value = false;
  } else {
    const std::string shown = get(name);
    f.error = std::string(name) + "=" + (shown.size() > 40 ? shown.substr(0, 40) + "..." : shown) + ": " + meaning +
              ", 1, true, yes or on, or 0, false, no or off (unset: " + (fallback ? "on" : "off") + ")";
  }
  return f;
}

}  // namespace zero::env
