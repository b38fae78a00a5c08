#pragma once
// Typo suggestions for keys a reader does not know ("did you mean ...?"),
// shared by the ds_config reader (config/) and the launch config reader
// (accelerate/launch_config.cpp, also linked into zero-run), so both suggest
// alike. Header-only: zero-run links no library of the project.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

namespace zero::text {

inline std::string lower(const std::string& s) {
  std::string out = s;
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return out;
}

// Levenshtein distance, one row at a time.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({above + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The candidate closest to `key` (ignoring case) when close enough to be a
// typo: within a third of its length, and at least 2 edits.
inline std::optional<std::string> nearest(const std::string& key, const std::vector<std::string>& candidates) {
  const std::string k = lower(key);
  std::optional<std::string> best;
  size_t best_distance = std::max<size_t>(2, k.size() / 3) + 1;  // farther is no typo
  for (const auto& c : candidates) {
    const size_t d = edit_distance(k, lower(c));
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

// A command-line option's name as the tools spell it: "--world_size" is
// "--world-size" (DeepSpeed's launcher and torchrun write underscores), and
// "--name=value" gives "--name". Anything else is returned as it is.
inline std::string option_name(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return arg;
  std::string name = arg.substr(0, arg.find('='));
  std::replace(name.begin() + 2, name.end(), '_', '-');
  return name;
}

// `arg` with its name spelled as the tools spell it ("--world_size=2" is
// "--world-size=2"); anything not starting with "--" as it is.
inline std::string dashed_option(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return arg;
  const size_t eq = arg.find('=');
  return option_name(arg) + (eq == std::string::npos ? "" : arg.substr(eq));
}

// "unknown option '--wrold-size'; did you mean --world-size?" (the hint
// only when one of `known` is near).
inline std::string unknown_option(const std::string& arg, const std::vector<std::string>& known) {
  std::string message = "unknown option '" + arg + "'";
  if (auto near = nearest(option_name(arg), known)) message += "; did you mean " + *near + "?";
  return message;
}

}  // namespace zero::text
