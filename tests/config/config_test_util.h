#pragma once
// Helpers shared by the config tests: file corpus paths and error checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/config.h"
#include "zero/error.h"

namespace zero_test {

inline std::string source_path(const std::string& relative) { return std::string(ZERO_SOURCE_DIR) + "/" + relative; }

// The *.json files of a source folder, sorted, excluding `except`.
inline std::vector<std::string> json_files(const std::string& folder, const std::string& except = "") {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(source_path(folder))) {
    const auto name = entry.path().filename().string();
    if (entry.path().extension() == ".json" && name != except) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The message of the ConfigError `f` throws; fails the test if it throws none.
inline std::string config_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const zero::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a zero::ConfigError";
  return "";
}

inline zero::Config parse(const std::string& json) { return zero::Config::from_json(json); }

inline size_t count_containing(const std::vector<std::string>& lines, const std::string& needle) {
  return static_cast<size_t>(
      std::count_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(needle) != std::string::npos; }));
}

// The resolved config as JSON, for checks by DeepSpeed key path.
inline nlohmann::json as_json(const zero::Config& c) { return nlohmann::json::parse(c.to_json()); }

}  // namespace zero_test
