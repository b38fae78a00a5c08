#pragma once
// The structure of a YAML launch config, checked before yaml-cpp makes
// nodes of it (Note [Launch config structure] in yaml_structure.cpp).
// Internal to accelerate/; only built with yaml-cpp (ZERO_HAVE_YAML).
#include <functional>
#include <string>

namespace zero::launch_yaml {

// Raises the caller's error for `path` (a key path, "" for the whole file)
// and `problem`; it must not return.
using StructureFail = std::function<void(const std::string& path, const std::string& problem)>;

// Walks `text`'s events once: a key written twice in any mapping, a second
// document, or nesting deeper than `max_depth` calls `fail` with the first
// found. yaml-cpp's own parse errors pass through as YAML::Exception.
void check_structure(const std::string& text, int max_depth, const StructureFail& fail);

}  // namespace zero::launch_yaml
