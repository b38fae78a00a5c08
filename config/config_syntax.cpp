// Note [DeepSpeed's config syntax]: DeepSpeed reads a ds_config with hjson,
// so "#", "//" and "/* */" comments and a comma before a closing bracket
// work there. zero accepts the same where the meaning is the same: this pass
// turns comments and such commas into spaces (every line and column stays
// where it was, for the parser's messages) and a strict JSON parser reads
// the rest. hjson's quoteless strings are still refused: a Python spelling
// such as True is the text "True" to hjson (which DeepSpeed then refuses
// where it wants a boolean); the parse error says which JSON word to write.
#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

#include "config/config_detail.h"

namespace zero {
namespace config_detail {
namespace {

// `i` at a string's opening quote: the index of its closing one (escapes
// skipped), or text.size() when it never closes (the parser names that).
size_t end_of_string(const std::string& text, size_t i) {
  for (++i; i < text.size() && text[i] != '"'; ++i)
    if (text[i] == '\\') ++i;
  return std::min(i, text.size());
}

}  // namespace

std::string blank_comments_and_trailing_commas(const std::string& text) {
  std::string out = text;
  const size_t n = out.size();
  size_t pending_comma = std::string::npos;  // a comma that only spaces and comments follow so far
  char previous = '\0';                      // the last character outside comments and spaces
  auto blank = [&](size_t from, size_t to) {  // [from, to), newlines kept
    for (size_t k = from; k < to && k < n; ++k)
      if (out[k] != '\n' && out[k] != '\r') out[k] = ' ';
  };
  for (size_t i = 0; i < n; ++i) {
    const char c = out[i];
    if (c == '"') {  // a string, escapes included, copied as it is
      pending_comma = std::string::npos;
      previous = c;
      i = end_of_string(out, i);
      continue;
    }
    if (c == '#' || (c == '/' && i + 1 < n && out[i + 1] == '/')) {
      size_t end = out.find('\n', i);
      if (end == std::string::npos) end = n;
      blank(i, end);
      i = end - 1;
      continue;
    }
    if (c == '/' && i + 1 < n && out[i + 1] == '*') {
      const size_t end = out.find("*/", i + 2);
      if (end == std::string::npos) return out;  // unterminated: the parser names it
      blank(i, end + 2);
      i = end + 1;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    if ((c == '}' || c == ']') && pending_comma != std::string::npos) out[pending_comma] = ' ';
    // A comma after a value only: "{,}" and "[1,,]" stay errors.
    const bool after_value = previous != '\0' && previous != '{' && previous != '[' && previous != ',';
    pending_comma = c == ',' && after_value ? i : std::string::npos;
    previous = c;
  }
  return out;
}

std::string python_spelling_hint(const std::string& text) {
  static const std::pair<const char*, const char*> spellings[] = {{"True", "true"}, {"False", "false"}, {"None", "null"}};
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '"') {
      i = end_of_string(text, i);
      continue;
    }
    if (i > 0 && word_char(text[i - 1])) continue;
    for (const auto& [python, json] : spellings) {
      const size_t len = std::char_traits<char>::length(python);
      if (text.compare(i, len, python) == 0 && (i + len == text.size() || !word_char(text[i + len])))
        return std::string("; ") + python + " is Python's spelling: JSON writes " + json;
    }
  }
  return "";
}

}  // namespace config_detail
}  // namespace zero
