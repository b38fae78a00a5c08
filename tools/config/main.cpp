// zero-config: checks a ds_config and prints it resolved for N ranks, or
// estimates the memory per rank at each ZeRO stage (estimate_report.cpp).
//
//   zero-config FILE [--world-size N] [--json]
//   zero-config FILE --estimate --params N [--world-size N] [--json]
//   zero-config FILE --estimate --micro B --context S --width H --depth L [...]
//
// Exit status: 0 valid, 1 invalid config, 2 bad usage.
#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/did_you_mean.h"
#include "core/env.h"
#include "zero/config.h"
#include "zero/error.h"
#include "tools/config/options.h"

namespace {

using zero_config_tool::Options;
using zero_config_tool::UsageError;

const char* const kUsage =
    "usage: zero-config FILE [--world-size N] [--json]\n"
    "       zero-config FILE --estimate --params N [--world-size N] [--json]\n"
    "       zero-config FILE --estimate --micro B --context S --width H --depth L\n"
    "                   [--heads A] [--vocab V] [--params N] [--world-size N] [--cpu-ranks] [--json]\n"
    "\n"
    "Checks the DeepSpeed-style config FILE, resolves it for N data-parallel ranks\n"
    "and prints it with every default filled in.\n"
    "\n"
    "With --estimate: prints the model-state memory one rank holds (parameters,\n"
    "gradients, fp32 master, optimizer states) at each ZeRO stage 0-3 for a model of\n"
    "--params trainable parameters, on the device, in host memory and on NVMe. The\n"
    "training dtype, optimizer, bucket sizes and offload choices come from FILE\n"
    "(offload applied at the stages that allow it); the config's stage is marked\n"
    "'*'. Activations, buffers and temporaries are not counted; the batch sizes are\n"
    "not resolved.\n"
    "\n"
    "  --world-size N  data-parallel ranks (default: $WORLD_SIZE, else 1)\n"
    "  --estimate      estimate memory per rank instead of printing the config\n"
    "  --params N      trainable parameters for --estimate, e.g. 7e9 or 7000000000\n"
    "  --micro, --context, --width, --depth  a GPT-style model's shape: with them,\n"
    "                  --estimate adds its activations per rank with and without\n"
    "                  activation checkpointing (and as the config's\n"
    "                  activation_checkpointing chooses); --params defaults to the\n"
    "                  example GPT's count for that shape\n"
    "                  and the stage-3 gathered bound from its block's size\n"
    "  --heads A       attention heads (default width / 64), --vocab V (default 50257)\n"
    "  --cpu-ranks     the ranks are CPU processes: the parameters' device is host\n"
    "                  memory, so the device's bytes are counted as host memory\n"
    "  --json          print one JSON document {file, world_size, warnings, config}\n"
    "                  instead of the config alone (warnings then stay off stderr);\n"
    "                  with --estimate, the estimate in bytes as JSON\n"
    "  -h, --help      show this help\n"
    "\n"
    "Without --json: the resolved config as JSON (or the estimate table) on stdout;\n"
    "warnings and a summary on stderr. Exit status: 0 valid, 1 invalid config,\n"
    "2 bad usage.\n";

// A positive whole number for a shape flag.
int64_t parse_size(const std::string& flag, const std::string& text) {
  const auto v = zero::env::parse_whole_number(text, 1, 100000000LL);  // the one parser of numbers (core/env.h)
  if (!v) throw UsageError{flag + " must be a whole number from 1 to 100000000; got '" + text + "'"};
  return *v;
}

int parse_world_size(const std::string& text, const std::string& origin) {
  const auto v = zero::env::parse_whole_number(text, 1, 1000000);
  if (!v) throw UsageError{origin + " must be a whole number of ranks from 1 to 1000000; got '" + text + "'"};
  return static_cast<int>(*v);
}

// A whole number of parameters, written 1500000000 or 1.5e9.
int64_t parse_params(const std::string& text) {
  const std::string expected =
      "--params must be a whole number of parameters from 1 to 1e15, e.g. 7e9 or 7000000000; got '" + text + "'";
  if (text.empty() || !(std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.'))
    throw UsageError{expected};
  if (text.find_first_not_of("0123456789") == std::string::npos) {   // digits only: a whole number
    const auto whole = zero::env::parse_whole_number(text, 1, 1000000000000000LL);
    if (!whole) throw UsageError{expected};
    return *whole;
  }
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (*end != '\0' || errno != 0 || !std::isfinite(v) || v < 1 || v > 1e15 || v != std::floor(v))
    throw UsageError{expected};
  return static_cast<int64_t>(v);
}

Options parse_args(int argc, char** argv) {
  Options o;
  std::optional<std::string> world_size, params;
  std::map<std::string, std::string> shape;  // --micro ... --vocab
  const std::set<std::string> shape_flags = {"--micro", "--context", "--width", "--depth", "--heads", "--vocab"};
  const std::vector<std::string> known = {"--world-size", "--json", "--estimate", "--params", "--cpu-ranks",
                                          "--micro", "--context", "--width", "--depth", "--heads", "--vocab", "--help"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    arg = zero::text::dashed_option(arg);  // --world_size as --world-size: DeepSpeed's and torchrun's spelling
    if (shape_flags.count(arg)) {
      if (i + 1 >= argc) throw UsageError{arg + " needs a value"};
      shape[arg] = argv[++i];
    } else if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg == "--estimate") {
      o.estimate = true;
    } else if (arg == "--cpu-ranks") {
      o.cpu_ranks = true;
    } else if (arg == "--params" || arg.rfind("--params=", 0) == 0) {
      if (arg == "--params" && i + 1 >= argc) throw UsageError{"--params needs a value"};
      params = arg == "--params" ? argv[++i] : arg.substr(std::string("--params=").size());
    } else if (arg == "--world-size" || arg.rfind("--world-size=", 0) == 0) {
      if (arg == "--world-size" && i + 1 >= argc) throw UsageError{"--world-size needs a value"};
      world_size = arg == "--world-size" ? argv[++i] : arg.substr(std::string("--world-size=").size());
    } else if (!arg.empty() && arg[0] == '-') {
      throw UsageError{zero::text::unknown_option(argv[i], known)};
    } else if (o.file.empty()) {
      o.file = arg;
    } else {
      throw UsageError{"more than one config file given ('" + o.file + "', '" + arg + "')"};
    }
  }
  if (o.help) return o;
  if (o.file.empty()) throw UsageError{"no config file given"};
  if (params && !o.estimate) throw UsageError{"--params is for --estimate"};
  if (o.cpu_ranks && !o.estimate) throw UsageError{"--cpu-ranks is for --estimate"};
  if (!shape.empty()) {
    if (!o.estimate) throw UsageError{"--micro, --context, --width, --depth, --heads and --vocab are for --estimate"};
    for (const char* needed : {"--micro", "--context", "--width", "--depth"}) {
      if (!shape.count(needed)) throw UsageError{std::string("the activation estimate needs ") + needed + " too (--micro, --context, --width, --depth)"};
    }
    zero::ActivationShape& a = o.activations;
    a.micro_batch = parse_size("--micro", shape["--micro"]);
    a.context = parse_size("--context", shape["--context"]);
    a.width = parse_size("--width", shape["--width"]);
    a.depth = parse_size("--depth", shape["--depth"]);
    a.heads = shape.count("--heads") ? parse_size("--heads", shape["--heads"]) : std::max<int64_t>(1, a.width / 64);
    a.vocab = shape.count("--vocab") ? parse_size("--vocab", shape["--vocab"]) : 50257;
    if (a.width % a.heads != 0) throw UsageError{"--width must be a multiple of --heads"};
    o.shape = true;
  }
  if (o.estimate && !params && !o.shape)
    throw UsageError{"--estimate needs --params N, the model's trainable parameters (or a model shape: --micro, --context, --width, --depth)"};
  if (params) o.params = parse_params(*params);
  if (!params && o.shape) o.params = zero::gpt_params(o.activations);
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
                  std::to_string(*b.gradient_accumulation_steps) + " x " + std::to_string(c.data_parallel_size()) +
                  " data-parallel rank(s)";  // world / (tp x pp x sp): the others share a batch
  if (!c.optimizer.type.empty()) s += ", optimizer " + c.optimizer.type;
  if (!c.scheduler.type.empty()) s += ", scheduler " + c.scheduler.type;
  return s;
}

// ---- the resolved config ------------------------------------------------------

int run(const Options& o) {
  if (o.estimate) return zero_config_tool::run_estimate(o);
  zero::Config config = zero::Config::from_file(o.file);
  // Warnings first: they often explain an error resolve() is about to raise.
  if (!o.json)
    for (const auto& w : config.warnings()) std::cerr << "zero-config: warning: " << w << "\n";
  config.resolve(o.world_size);
  config.check_trainable();  // Note [One validator]
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
