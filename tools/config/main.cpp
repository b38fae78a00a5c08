// zero-config: checks a ds_config and prints it resolved for N ranks.
//
//   zero-config FILE [--world-size N] [--json]
//
// Exit status: 0 valid, 1 invalid config, 2 bad usage.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "zero/config.h"
#include "zero/error.h"

namespace {

const char* const kUsage =
    "usage: zero-config FILE [--world-size N] [--json]\n"
    "\n"
    "Checks the DeepSpeed-style config FILE, resolves it for N data-parallel ranks\n"
    "and prints it with every default filled in.\n"
    "\n"
    "  --world-size N  ranks to resolve the batch sizes for (default: $WORLD_SIZE, else 1)\n"
    "  --json          print one JSON document {file, world_size, warnings, config}\n"
    "                  instead of the config alone (warnings then stay off stderr)\n"
    "  -h, --help      show this help\n"
    "\n"
    "Without --json: the resolved config as JSON on stdout; warnings and a summary\n"
    "on stderr. Exit status: 0 valid, 1 invalid config, 2 bad usage.\n";

struct UsageError {
  std::string message;
};

struct Options {
  std::string file;
  int world_size = 1;
  bool json = false;
  bool help = false;
};

int parse_world_size(const std::string& text, const std::string& origin) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < 1 || v > 1000000)
    throw UsageError{origin + " must be a positive integer; got '" + text + "'"};
  return static_cast<int>(v);
}

Options parse_args(int argc, char** argv) {
  Options o;
  std::optional<std::string> world_size;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg == "--world-size" || arg.rfind("--world-size=", 0) == 0) {
      if (arg == "--world-size" && i + 1 >= argc) throw UsageError{"--world-size needs a value"};
      world_size = arg == "--world-size" ? argv[++i] : arg.substr(std::string("--world-size=").size());
    } else if (!arg.empty() && arg[0] == '-') {
      throw UsageError{"unknown option '" + arg + "'"};
    } else if (o.file.empty()) {
      o.file = arg;
    } else {
      throw UsageError{"more than one config file given ('" + o.file + "', '" + arg + "')"};
    }
  }
  if (o.help) return o;
  if (o.file.empty()) throw UsageError{"no config file given"};
  if (world_size) {
    o.world_size = parse_world_size(*world_size, "--world-size");
  } else if (zero::env::is_set("WORLD_SIZE")) {
    o.world_size = parse_world_size(zero::env::get("WORLD_SIZE"), "WORLD_SIZE");
  }
  return o;
}

std::string summary(const zero::Config& c) {
  const auto& b = c.batch;
  std::string precision = c.fp16.enabled ? "fp16" : c.bf16.enabled ? "bf16" : "fp32";
  std::string s = "stage " + std::to_string(c.zero_optimization.stage) + ", " + precision +
                  ", train_batch_size " + std::to_string(*b.train_batch_size) + " = micro batch " +
                  std::to_string(*b.train_micro_batch_size_per_gpu) + " x accumulation " +
                  std::to_string(*b.gradient_accumulation_steps) + " x " + std::to_string(c.world_size()) +
                  " rank(s)";
  if (!c.optimizer.type.empty()) s += ", optimizer " + c.optimizer.type;
  if (!c.scheduler.type.empty()) s += ", scheduler " + c.scheduler.type;
  return s;
}

int run(const Options& o) {
  zero::Config config = zero::Config::from_file(o.file);
  // Warnings first: they often explain an error resolve() is about to raise.
  if (!o.json)
    for (const auto& w : config.warnings()) std::cerr << "zero-config: warning: " << w << "\n";
  config.resolve(o.world_size);
  if (o.json) {
    nlohmann::ordered_json doc;
    doc["file"] = o.file;
    doc["world_size"] = o.world_size;
    doc["warnings"] = config.warnings();
    doc["config"] = nlohmann::ordered_json::parse(config.to_json());
    std::cout << doc.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return 0;
  }
  std::cout << config.to_json(2) << "\n";
  std::cerr << "zero-config: " << o.file << " is valid for world size " << o.world_size << ": " << summary(config)
            << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o = parse_args(argc, argv);
    if (o.help) {
      std::cout << kUsage;
      return 0;
    }
    return run(o);
  } catch (const UsageError& e) {
    std::cerr << "zero-config: error: " << e.message << "\n" << kUsage;
    return 2;
  } catch (const zero::Error& e) {
    std::cerr << "zero-config: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "zero-config: error: " << e.what() << "\n";
    return 1;
  }
}
