// zero-ckpt: inspects and verifies sharded zero checkpoints, consolidates
// one into a single fp32 safetensors file, and imports DeepSpeed's.
// Torch-free.
//
//   zero-ckpt inspect DIR [--tag T]
//   zero-ckpt consolidate DIR [--tag T] --out FILE.safetensors   (or DIR FILE.safetensors)
//   zero-ckpt import --from deepspeed DS_DIR OUT_DIR [--tag T] [--name-map MAP.json]
//   zero-ckpt export --to deepspeed DIR OUT_DIR --config DS_CONFIG [--world-size N] [--tag T] [--name-map MAP.json]
//   zero-ckpt export --to hf DIR OUT_DIR [--config config.json] [--dtype D] [--max-shard-size 50GB] [--tag T] [--name-map MAP.json]
//
// Exit status: 0 ok, 1 a checkpoint problem (checksum mismatch, missing file,
// unreadable manifest), 2 bad usage.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "core/did_you_mean.h"
#include "core/env.h"
#include "interop/export_deepspeed.h"
#include "interop/export_hf.h"
#include "interop/import_deepspeed.h"
#include "zero/error.h"
#include "zero/launch_info.h"

namespace {

namespace ck = zero::ckpt;

const char* const kUsage =
    "usage: zero-ckpt inspect DIR [--tag T]\n"
    "       zero-ckpt consolidate DIR [--tag T] --out FILE.safetensors   (or DIR FILE.safetensors)\n"
    "       zero-ckpt import --from deepspeed DS_DIR OUT_DIR [--tag T] [--name-map MAP.json]\n"
    "       zero-ckpt export --to deepspeed DIR OUT_DIR --config DS_CONFIG [--world-size N]\n"
    "                        [--tag T] [--name-map MAP.json]\n"
    "       zero-ckpt export --to hf DIR OUT_DIR [--config config.json] [--dtype D]\n"
    "                        [--max-shard-size 50GB] [--tag T] [--name-map MAP.json]\n"
    "\n"
    "Works on a checkpoint directory written by zero's Engine::save_checkpoint:\n"
    "DIR/latest names the newest complete tag, DIR/<tag>/manifest.json describes it\n"
    "and DIR/<tag>/rank<r>.safetensors hold each rank's fragments.\n"
    "\n"
    "  inspect      list the tags and the latest one; for the chosen tag print the\n"
    "               format version, world size, ZeRO stage, dtype, optimizer and its\n"
    "               states, parameter count and elements, and every file with its\n"
    "               size and checksum status (\"ok\", \"MISMATCH\" or \"MISSING\"); every\n"
    "               file is hashed in full\n"
    "  consolidate  write the full fp32 weights of every parameter (and the buffers;\n"
    "               floating ones as fp32) to one safetensors file, named as in the\n"
    "               model (e.g. \"fc1.weight\"); works for any world size and stage\n"
    "  import       write a zero checkpoint in the new folder OUT_DIR from DeepSpeed's\n"
    "               checkpoint folder DS_DIR (stages 1-3, fp32/bf16/fp16, any world\n"
    "               size): weights, fp32 master weights, optimizer states, step\n"
    "               counts, loss scale and the scheduler's position; it loads at any\n"
    "               world size and stage. The .pt files are read as data: nothing in\n"
    "               them is executed. OUT_DIR must not exist (or be empty) and not lie\n"
    "               inside DS_DIR; it appears only once the import is complete\n"
    "  export       write the folder DeepSpeed 0.19's load_checkpoint resumes from, for\n"
    "               the ds_config DS_CONFIG (its stage, bf16, Adam/AdamW settings and\n"
    "               scheduler) on N data-parallel ranks (default: the checkpoint's);\n"
    "               OUT_DIR as for import\n"
    "  export --to hf  write the weights as Hugging Face's model.safetensors, or\n"
    "               shards of at most --max-shard-size with model.safetensors.index.json,\n"
    "               in the dtype --dtype, config.json's torch_dtype or the checkpoint's\n"
    "               (float32, bfloat16, float16), with config.json copied beside them;\n"
    "               one tensor in memory at a time\n"
    "\n"
    "  --tag T      the tag to use (default: the one DIR/latest names)\n"
    "  --out FILE   the safetensors file consolidate writes (replaced atomically)\n"
    "  --from deepspeed   the format import reads\n"
    "  --to deepspeed|hf  the format export writes\n"
    "  --config FILE      export --to deepspeed: the ds_config DeepSpeed will resume\n"
    "               with; --to hf: the model's config.json\n"
    "  --dtype D          export --to hf: float32, bfloat16 or float16\n"
    "  --max-shard-size S export --to hf: e.g. 5GB, 500MB, 2GiB (default 50GB)\n"
    "  --world-size N     export: DeepSpeed's data-parallel world size\n"
    "  --name-map MAP.json  {\"deepspeed name\": \"zero name\", ...} for tensors whose\n"
    "               names differ between the two models (others keep theirs); export\n"
    "               also takes DeepSpeed's parameter order from it\n"
    "  -h, --help   show this help\n"
    "\n"
    "Exit status: 0 ok, 1 a checkpoint problem (checksum mismatch, missing file,\n"
    "damaged manifest), 2 bad usage.\n";

struct UsageError {
  std::string message;
};

struct Options {
  std::string command;
  std::string dir;
  std::optional<std::string> tag;
  std::optional<std::string> out;
  std::optional<std::string> from, to, name_map, config;
  std::optional<int> world_size;
  std::optional<std::string> dtype, max_shard_size;
  std::string out_dir;  // import
};

Options parse(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  const std::vector<std::string> known = {"--tag",    "--out",        "--from",       "--to",      "--dtype",
                                          "--config", "--world-size", "--name-map", "--max-shard-size", "--help"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    a = zero::text::dashed_option(a);  // --world_size as --world-size: DeepSpeed's and torchrun's spelling
    // An empty value is no value: "--dtype ''" would otherwise mean "as saved".
    auto value = [&](const std::string& flag) -> std::string {
      std::string v;
      if (a.size() > flag.size() && a.compare(0, flag.size() + 1, flag + "=") == 0) {
        v = a.substr(flag.size() + 1);
      } else {
        if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
        v = argv[++i];
      }
      if (v.empty()) throw UsageError{flag + " needs a non-empty value"};
      return v;
    };
    if (a == "--tag" || a.rfind("--tag=", 0) == 0) {
      o.tag = value("--tag");
      if (o.tag->empty()) throw UsageError{"--tag needs a non-empty value"};
    } else if (a == "--out" || a.rfind("--out=", 0) == 0) {
      o.out = value("--out");
      if (o.out->empty()) throw UsageError{"--out needs a non-empty value"};
    } else if (a == "--from" || a.rfind("--from=", 0) == 0) {
      o.from = value("--from");
      if (*o.from != "deepspeed") throw UsageError{"--from " + *o.from + ": import reads deepspeed checkpoints only"};
    } else if (a == "--to" || a.rfind("--to=", 0) == 0) {
      o.to = value("--to");
      if (*o.to != "deepspeed" && *o.to != "hf") throw UsageError{"--to " + *o.to + ": export writes deepspeed or hf"};
    } else if (a == "--dtype" || a.rfind("--dtype=", 0) == 0) {
      o.dtype = value("--dtype");
    } else if (a == "--max-shard-size" || a.rfind("--max-shard-size=", 0) == 0) {
      o.max_shard_size = value("--max-shard-size");
    } else if (a == "--config" || a.rfind("--config=", 0) == 0) {
      o.config = value("--config");
    } else if (a == "--world-size" || a.rfind("--world-size=", 0) == 0) {
      const std::string n = value("--world-size");
      const auto ranks = zero::env::parse_whole_number(n, 1, zero::comm::LaunchInfo::kMaxWorldSize);  // core/env.h
      if (!ranks)
        throw UsageError{"--world-size " + n + ": a number of ranks, a whole number from 1 to " +
                         std::to_string(zero::comm::LaunchInfo::kMaxWorldSize)};
      o.world_size = static_cast<int>(*ranks);
    } else if (a == "--name-map" || a.rfind("--name-map=", 0) == 0) {
      o.name_map = value("--name-map");
    } else if (a.size() > 1 && a[0] == '-') {
      throw UsageError{zero::text::unknown_option(argv[i], known)};
    } else {
      positional.push_back(a);
    }
  }
  if (positional.empty()) throw UsageError{"no command given (inspect, consolidate, import or export)"};
  o.command = positional[0];
  const bool convert = o.command == "import" || o.command == "export";
  if (o.command != "inspect" && o.command != "consolidate" && !convert)
    throw UsageError{"unknown command \"" + o.command + "\" (inspect, consolidate, import or export)"};
  // consolidate DIR OUT.safetensors, as DeepSpeed's zero_to_fp32.py takes
  // its output file, is consolidate DIR --out OUT.safetensors.
  if (o.command == "consolidate" && positional.size() == 3 && !o.out) o.out = positional.back(), positional.pop_back();
  const size_t wanted = convert ? 3 : 2;
  if (positional.size() < 2) throw UsageError{o.command + " needs the checkpoint folder" + (convert ? " and OUT_DIR" : "")};
  if (positional.size() < wanted) throw UsageError{o.command + " needs the new folder OUT_DIR after " + positional[1]};
  if (positional.size() > wanted) throw UsageError{"unexpected argument \"" + positional[wanted] + "\""};
  o.dir = positional[1];
  if (convert) {
    o.out_dir = positional[2];
    if (o.out) throw UsageError{"--out is for consolidate; " + o.command + " writes OUT_DIR"};
  } else if (o.name_map) {
    throw UsageError{"--name-map is for import and export, not " + o.command};
  }
  if (o.command == "import" && !o.from) throw UsageError{"import needs --from deepspeed (the format DS_DIR is in)"};
  if (o.command != "import" && o.from) throw UsageError{"--from is for import"};
  if (o.command == "export" && !o.to) throw UsageError{"export needs --to deepspeed or --to hf (the format to write)"};
  const bool to_deepspeed = o.to && *o.to == "deepspeed";
  if (o.command == "export" && to_deepspeed && !o.config)
    throw UsageError{"export --to deepspeed needs --config DS_CONFIG (the ds_config DeepSpeed resumes with)"};
  if (o.command != "export" && (o.to || o.config || o.world_size || o.dtype || o.max_shard_size))
    throw UsageError{"--to, --config, --world-size, --dtype and --max-shard-size are for export"};
  if (to_deepspeed && (o.dtype || o.max_shard_size))
    throw UsageError{"--dtype and --max-shard-size are for export --to hf (DeepSpeed's dtype is its ds_config's)"};
  if (o.to && *o.to == "hf" && o.world_size) throw UsageError{"--world-size is for export --to deepspeed"};
  if (o.command == "consolidate" && !o.out)
    throw UsageError{"consolidate needs the file to write: --out FILE.safetensors (or FILE.safetensors after DIR)"};
  if (o.command == "inspect" && o.out) throw UsageError{"--out is for consolidate, not inspect"};
  return o;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

int inspect(const Options& o) {
  std::error_code ec;
  if (!std::filesystem::is_directory(o.dir, ec)) throw zero::CheckpointError("checkpoint directory " + o.dir + " does not exist");
  const std::vector<std::string> tags = ck::list_tags(o.dir);
  std::string latest, latest_error;
  try {
    latest = ck::read_latest(o.dir);
  } catch (const zero::CheckpointError& e) {
    latest_error = e.what();
  }
  std::cout << "checkpoint directory: " << o.dir << "\n";
  std::cout << "tags: " << (tags.empty() ? "none" : join(tags)) << "\n";
  std::cout << "latest: "
            << (!latest.empty()                                         ? latest
                : !std::filesystem::exists(ck::tag_dir(o.dir, "latest"), ec) ? std::string("none")
                                                                         : "unusable: " + latest_error)
            << "\n";
  std::string tag;
  if (o.tag) {
    tag = *o.tag;
  } else if (!latest.empty()) {
    tag = latest;
  } else {
    std::cout.flush();
    throw zero::CheckpointError(latest_error);
  }

  const ck::Manifest m = ck::read_manifest(o.dir, tag);
  int64_t elements = 0, trainable_elements = 0, trainable = 0;
  for (const auto& p : m.params) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    elements += n;
    if (p.trainable) {
      ++trainable;
      trainable_elements += n;
    }
  }
  std::cout << "tag: " << tag << "\n";
  std::cout << "  format: " << m.format << " version " << m.version << "\n";
  std::cout << "  world size: " << m.world_size << "\n";
  std::cout << "  stage: " << m.stage << "\n";
  std::cout << "  dtype: " << m.dtype << "\n";
  std::cout << "  optimizer: " << (m.optimizer.empty() ? "none" : m.optimizer)
            << " (states: " << (m.states.empty() ? "none" : join(m.states)) << ")\n";
  std::cout << "  parameters: " << m.params.size() << " (" << trainable << " trainable, " << m.params.size() - trainable
            << " frozen), " << elements << " elements (" << trainable_elements << " trainable)\n";
  std::cout << "  buffers: " << m.buffers.size() << "\n";
  if (!m.engine.empty()) std::cout << "  engine: " << m.engine.dump() << "\n";
  std::cout << "  files:\n";
  int ok = 0;
  for (const auto& f : m.files) {
    const std::string path = ck::tag_dir(o.dir, tag) + "/" + f.name;
    std::cout << "    " << f.name << "  rank " << f.rank << "  " << f.bytes << " bytes  xxh3 " << f.xxh3 << "  ";
    if (!std::filesystem::exists(path, ec)) {
      std::cout << "MISSING\n";
      continue;
    }
    ck::FileInfo actual;
    try {
      actual = ck::hash_file(path);
    } catch (const zero::CheckpointError& e) {
      std::cout << "UNREADABLE (" << e.what() << ")\n";
      continue;
    }
    if (actual.bytes == f.bytes && actual.xxh3 == f.xxh3) {
      std::cout << "ok\n";
      ++ok;
    } else {
      std::cout << "MISMATCH (file has " << actual.bytes << " bytes, xxh3 " << actual.xxh3 << ")\n";
    }
  }
  const int total = static_cast<int>(m.files.size());
  std::cout << "  " << ok << " of " << total << " files ok" << (ok == total ? "" : ": the checkpoint is damaged") << "\n";
  return ok == total ? 0 : 1;
}

int consolidate(const Options& o) {
  const std::string tag = o.tag ? *o.tag : ck::read_latest(o.dir);
  const int64_t n = ck::consolidate(o.dir, tag, *o.out);
  ck::FileInfo info = ck::hash_file(*o.out);
  std::cout << "wrote " << n << " tensors of " << ck::tag_dir(o.dir, tag) << " to " << *o.out << " (" << info.bytes
            << " bytes, xxh3 " << info.xxh3 << ")\n";
  return 0;
}

int import(const Options& o) {
  zero::interop::ImportOptions options;
  options.from = o.dir;
  options.out = o.out_dir;
  options.tag = o.tag.value_or("");
  if (o.name_map)
    for (const auto& [from, to] : zero::interop::read_name_map(*o.name_map)) options.rename[from] = to;
  const auto s = zero::interop::import_deepspeed(options);
  std::cout << "imported DeepSpeed's " << o.dir << " (tag " << s.tag << ", stage " << s.stage << ", " << s.dtype << ", "
            << s.world_size << " ranks, step " << s.global_steps << ") into " << o.out_dir << ": " << s.params
            << " parameters, " << s.elements << " elements, " << s.buffers << " buffers, optimizer states "
            << (s.states.empty() ? "none" : join(s.states)) << "\n";
  for (const auto& note : s.notes) std::cout << "note: " << note << "\n";
  return 0;
}

int export_to_hf(const Options& o) {
  zero::interop::HfExportOptions options;
  options.from = o.dir;
  options.out = o.out_dir;
  options.tag = o.tag.value_or("");
  options.config = o.config.value_or("");
  options.dtype = o.dtype.value_or("");
  if (o.max_shard_size) options.max_shard_bytes = zero::interop::parse_size(*o.max_shard_size);
  if (o.name_map) options.rename = zero::interop::read_name_map(*o.name_map);
  const auto s = zero::interop::export_hf(options);
  std::cout << "exported the weights of " << o.dir << " to " << o.out_dir << " in Hugging Face's layout: " << s.tensors
            << " tensors, " << s.dtype << ", " << s.bytes << " bytes in " << s.shards << " file(s)\n";
  return 0;
}

int export_to(const Options& o) {
  if (*o.to == "hf") return export_to_hf(o);
  zero::interop::ExportOptions options;
  options.from = o.dir;
  options.out = o.out_dir;
  options.tag = o.tag.value_or("");
  options.config = *o.config;
  options.world_size = o.world_size.value_or(0);
  if (o.name_map) options.rename = zero::interop::read_name_map(*o.name_map);
  const auto s = zero::interop::export_deepspeed(options);
  std::cout << "exported " << o.dir << " (tag " << s.tag << ") as DeepSpeed's checkpoint for stage " << s.stage << ", "
            << s.dtype << ", " << s.world_size << " ranks into " << o.out_dir << ": " << s.params << " parameters, "
            << s.elements << " elements\n";
  for (const auto& note : s.notes) std::cout << "note: " << note << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help" || (i == 1 && a == "help")) {
      std::cout << kUsage;
      return 0;
    }
  }
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "zero-ckpt: " << e.message << "\n\n" << kUsage;
    return 2;
  }
  try {
    if (o.command == "import") return import(o);
    if (o.command == "export") return export_to(o);
    return o.command == "inspect" ? inspect(o) : consolidate(o);
  } catch (const zero::Error& e) {
    std::cout.flush();
    std::cerr << "zero-ckpt: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "zero-ckpt: error: " << e.what() << "\n";
    return 1;
  }
}
