// The manifest (JSON), paths and the `latest` pointer.
// See Note [Checkpoint layout] in checkpoint.h.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "core/json_depth.h"
#include "core/json_duplicates.h"
#include "core/regular_file.h"
#include "zero/error.h"

namespace zero::ckpt {

namespace fs = std::filesystem;

namespace {


using json = nlohmann::json;

const json& require(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) fail(where + ": required key \"" + key + "\" is missing");
  return *it;
}

std::string get_string(const json& j, const char* key, const std::string& where) {
  const json& v = require(j, key, where);
  if (!v.is_string()) fail(where + ": \"" + key + "\" must be a string, found " + v.dump());
  return v.get<std::string>();
}

int64_t get_int(const json& j, const char* key, const std::string& where) {
  const json& v = require(j, key, where);
  if (!v.is_number_integer()) fail(where + ": \"" + key + "\" must be an integer, found " + v.dump());
  return v.get<int64_t>();
}

std::vector<std::string> get_strings(const json& j, const char* key, const std::string& where) {
  std::vector<std::string> out;
  auto it = j.find(key);
  if (it == j.end()) return out;
  if (!it->is_array()) fail(where + ": \"" + key + "\" must be an array of strings");
  for (const auto& s : *it) {
    if (!s.is_string()) fail(where + ": \"" + key + "\" holds " + s.dump() + ", not a string");
    out.push_back(s.get<std::string>());
  }
  return out;
}

bool is_hex16(const std::string& s) {
  return s.size() == 16 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// A tag is one path component.
// "global_step9" before "global_step10": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      std::string x = a.substr(i, i2 - i), y = b.substr(j, j2 - j);
      x.erase(0, std::min(x.find_first_not_of('0'), x.size()));
      y.erase(0, std::min(y.find_first_not_of('0'), y.size()));
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  if ((a.size() - i) != (b.size() - j)) return a.size() - i < b.size() - j;
  return a < b;
}

std::string tag_list(const std::string& dir) {
  std::vector<std::string> tags;
  try {
    tags = list_tags(dir);
  } catch (const CheckpointError&) {
  }
  if (tags.empty()) return "none (no <tag>/manifest.json in " + dir + ")";
  std::string s;
  for (const auto& t : tags) s += (s.empty() ? "" : ", ") + t;
  return s;
}

// A manifest lists every parameter by name and shape: 1 GiB is far beyond
// any model's; `latest` holds one tag.
// 2^50 elements (4 PiB of fp32) in one parameter: beyond any model.
constexpr int64_t kMaxParamElements = int64_t{1} << 50;

constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

std::string read_text(const std::string& path, uint64_t max_bytes = kMaxManifestBytes) {
  std::string text, error;
  if (!core::read_regular_file(path, max_bytes, text, error)) fail("cannot read " + error);
  return text;
}

// DeepSpeed's checkpoint folders are converted (zero-ckpt import), not loaded.
void refuse_deepspeed_folder(const std::string& dir, const std::string& tag) {
  std::error_code ec;
  for (const char* deepspeed : {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"})
    if (fs::exists(fs::path(tag_dir(dir, tag)) / deepspeed, ec))
      fail(tag_dir(dir, tag) + " is a DeepSpeed checkpoint (it holds " + deepspeed + "), not a zero one; convert it "
           "first with: zero-ckpt import --from deepspeed " + dir + " NEW_DIR [--tag " + tag + "], then load NEW_DIR");
}

}  // namespace

// ---- Manifest ------------------------------------------------------------------

std::string fragment_name(const std::string& kind, const std::string& param, int64_t offset) {
  return kind + "/" + param + "/" + std::to_string(offset);
}

nlohmann::json Manifest::to_json() const {
  json params_json = json::array();
  for (const ParamInfo& p : params) params_json.push_back({{"name", p.name}, {"shape", p.shape}, {"trainable", p.trainable}});
  json files_json = json::array();
  for (const FileInfo& f : files)
    files_json.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"xxh3", f.xxh3}});
  json j = json::object();
  j["format"] = format;
  j["version"] = version;
  j["tag"] = tag;
  j["world_size"] = world_size;
  j["mesh"] = {{"tp", tensor_parallel}, {"pp", pipeline_parallel}};
  j["stage"] = stage;
  j["dtype"] = dtype;
  j["optimizer"] = optimizer;
  j["states"] = states;
  j["params"] = std::move(params_json);
  j["buffers"] = buffers;
  j["files"] = std::move(files_json);
  j["engine"] = engine.is_null() ? json::object() : engine;
  j["client_state"] = client_state.is_null() ? json::object() : client_state;
  if (!save_id.empty()) j["save"] = save_id;
  return j;
}

Manifest Manifest::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail(where + ": a manifest is a JSON object, found " + std::string(j.type_name()));
  Manifest m;
  m.format = get_string(j, "format", where);
  if (m.format != kFormatName)
    fail(where + ": format is \"" + m.format + "\", not \"" + kFormatName + "\": this is not a zero checkpoint manifest");
  m.version = static_cast<int>(get_int(j, "version", where));
  if (m.version != kFormatVersion)
    fail(where + ": checkpoint format version " + std::to_string(m.version) +
         " is not supported; this build of zero reads version " + std::to_string(kFormatVersion) +
         (m.version > kFormatVersion ? " (the checkpoint was written by a newer zero: load it with that version)"
                                     : ""));
  m.tag = get_string(j, "tag", where);
  int64_t ws = get_int(j, "world_size", where);
  if (ws < 1 || ws > (1 << 24)) fail(where + ": world_size " + std::to_string(ws) + " is not a number of ranks");
  m.world_size = static_cast<int>(ws);
  if (j.contains("mesh")) {
    const json& mesh = require(j, "mesh", where);
    const int64_t tp = get_int(mesh, "tp", where + ": mesh"), pp = get_int(mesh, "pp", where + ": mesh");
    if (tp < 1 || pp < 1 || ws % (tp * pp) != 0)
      fail(where + ": mesh tp " + std::to_string(tp) + " x pp " + std::to_string(pp) + " does not divide world_size " +
           std::to_string(ws));
    m.tensor_parallel = static_cast<int>(tp);
    m.pipeline_parallel = static_cast<int>(pp);
  }
  int64_t stage = get_int(j, "stage", where);
  if (stage < 0 || stage > 3) fail(where + ": stage " + std::to_string(stage) + " is not a ZeRO stage (0-3)");
  m.stage = static_cast<int>(stage);
  m.dtype = get_string(j, "dtype", where);
  if (m.dtype != "F32" && m.dtype != "F16" && m.dtype != "BF16")
    fail(where + ": dtype \"" + m.dtype + "\" is not a training dtype (F32, F16, BF16)");
  if (j.contains("optimizer")) m.optimizer = get_string(j, "optimizer", where);
  m.states = get_strings(j, "states", where);
  m.buffers = get_strings(j, "buffers", where);

  const json& params = require(j, "params", where);
  if (!params.is_array()) fail(where + ": \"params\" must be an array");
  std::set<std::string> names;
  for (const json& p : params) {
    if (!p.is_object()) fail(where + ": a \"params\" entry is not an object: " + p.dump());
    ParamInfo info;
    info.name = get_string(p, "name", where + ": params entry");
    if (info.name.empty()) fail(where + ": a parameter has an empty name");
    const std::string pw = where + ": parameter \"" + info.name + "\"";
    if (!names.insert(info.name).second) fail(pw + " is listed twice");
    const json& shape = require(p, "shape", pw);
    if (!shape.is_array()) fail(pw + ": \"shape\" must be an array");
    // Bounded so that every product of a shape's sizes later fits int64_t.
    int64_t numel = 1;
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(pw + ": shape holds " + d.dump() + ", not a size");
      info.shape.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(numel, info.shape.back(), &numel) || numel > kMaxParamElements)
        fail(pw + ": shape " + shape.dump() + " has more than 2^50 elements, which no parameter has");
    }
    if (p.contains("trainable")) {
      if (!p["trainable"].is_boolean()) fail(pw + ": \"trainable\" must be true or false");
      info.trainable = p["trainable"].get<bool>();
    }
    m.params.push_back(std::move(info));
  }

  const json& files = require(j, "files", where);
  if (!files.is_array()) fail(where + ": \"files\" must be an array");
  std::set<int> ranks;
  for (const json& f : files) {
    if (!f.is_object()) fail(where + ": a \"files\" entry is not an object: " + f.dump());
    FileInfo info;
    info.name = get_string(f, "name", where + ": files entry");
    const std::string fw = where + ": file \"" + info.name + "\"";
    if (info.name.empty() || info.name == "." || info.name == ".." || info.name.find('/') != std::string::npos)
      fail(fw + ": a file name must be one name inside the tag directory");
    int64_t rank = get_int(f, "rank", fw);
    if (rank < 0 || rank >= m.world_size)
      fail(fw + ": rank " + std::to_string(rank) + " is outside world size " + std::to_string(m.world_size));
    info.rank = static_cast<int>(rank);
    if (!ranks.insert(info.rank).second) fail(fw + ": rank " + std::to_string(rank) + " has two files");
    const json& bytes = require(f, "bytes", fw);
    if (!bytes.is_number_unsigned() && !(bytes.is_number_integer() && bytes.get<int64_t>() >= 0))
      fail(fw + ": \"bytes\" must be a size, found " + bytes.dump());
    info.bytes = bytes.get<uint64_t>();
    info.xxh3 = get_string(f, "xxh3", fw);
    if (!is_hex16(info.xxh3)) fail(fw + ": \"xxh3\" must be 16 lowercase hex digits, found \"" + info.xxh3 + "\"");
    m.files.push_back(std::move(info));
  }
  if (static_cast<int>(m.files.size()) != m.world_size)
    fail(where + ": " + std::to_string(m.files.size()) + " files listed for world size " +
         std::to_string(m.world_size) + " (one per rank expected)");

  if (j.contains("engine")) m.engine = j["engine"];
  if (j.contains("client_state")) m.client_state = j["client_state"];
  if (m.engine.is_null()) m.engine = json::object();
  if (m.client_state.is_null()) m.client_state = json::object();
  if (j.contains("save")) {
    if (!j["save"].is_string()) fail(where + ": \"save\" is not a string (it names the save that wrote the checkpoint)");
    m.save_id = j["save"].get<std::string>();
  }
  return m;
}

// ---- paths -----------------------------------------------------------------------

std::string tag_dir(const std::string& dir, const std::string& tag) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  if (d.empty()) d = ".";
  return d == "/" ? "/" + tag : d + "/" + tag;
}

std::string rank_file_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank%05d.safetensors", rank);
  return buf;
}

std::string manifest_path(const std::string& dir, const std::string& tag) { return tag_dir(dir, tag) + "/manifest.json"; }

std::vector<std::string> list_tags(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> tags;
  fs::directory_iterator it(dir, ec);
  if (ec) fail("cannot list checkpoint directory " + dir + ": " + ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) fail("cannot list checkpoint directory " + dir + ": " + ec.message());
    std::error_code e2;
    if (!it->is_directory(e2)) continue;
    const std::string tag = it->path().filename().string();
    if (tag.empty() || tag[0] == '.') continue;  // e.g. a writer's staging folder
    if (fs::is_regular_file(it->path() / "manifest.json", e2)) tags.push_back(tag);
  }
  std::sort(tags.begin(), tags.end(), natural_less);
  return tags;
}

void write_latest(const std::string& dir, const std::string& tag) {
  check_tag(tag, "write_latest(" + dir + ")");
  std::error_code ec;
  if (!fs::is_regular_file(manifest_path(dir, tag), ec))
    fail("refusing to point " + tag_dir(dir, "latest") + " at tag \"" + tag + "\": " + manifest_path(dir, tag) +
         " does not exist (write the manifest, last, before `latest`)");
  write_file_durably(tag_dir(dir, "latest"), tag + "\n");
}

void fail(const std::string& message) { throw CheckpointError(message); }

std::string tag_problem(const std::string& tag) {
  if (tag.empty()) return "it is empty";
  if (tag == "latest") return "\"latest\" is the file naming the newest tag";
  // A file being written is staged as <name>.tmp (latest.tmp for latest):
  // a tag of that name would be taken for one, and stop every later save.
  if (tag.size() >= 4 && tag.compare(tag.size() - 4, 4, ".tmp") == 0) return "it ends in .tmp, the staging names of files being written";
  if (tag[0] == '.') return "it starts with '.'";
  if (tag.find('/') != std::string::npos) return "it holds '/'";
  if (tag.find('\n') != std::string::npos) return "it holds a newline";
  if (tag.find('\0') != std::string::npos) return "it holds a NUL byte";
  return "";
}

void check_tag(const std::string& tag, const std::string& where) {
  const std::string problem = tag_problem(tag);
  if (problem.empty()) return;
  std::string shown;  // a newline or NUL written out, so the message stays one whole line
  for (char c : tag) shown += c == '\n' ? "\\n" : c == '\0' ? "\\0" : std::string(1, c);
  fail(where + ": invalid checkpoint tag \"" + shown + "\": " + problem + " (a tag is one folder name, e.g. global_step100)");
}

std::string read_latest(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail("checkpoint directory " + dir + " does not exist");
  if (!fs::is_directory(dir, ec)) fail("checkpoint directory " + dir + " is not a directory");
  const std::string latest = tag_dir(dir, "latest");
  if (!fs::exists(latest, ec))
    fail("no " + latest + " (it names the newest complete tag, and is written last); complete tags in " + dir + ": " +
         tag_list(dir) + "; pass the tag to load explicitly");
  std::string tag = read_text(latest, 4096);
  auto b = tag.find_first_not_of(" \t\r\n");
  auto e = tag.find_last_not_of(" \t\r\n");
  tag = b == std::string::npos ? "" : tag.substr(b, e - b + 1);
  if (tag.empty()) fail(latest + " is empty; complete tags in " + dir + ": " + tag_list(dir) + "; pass a tag explicitly");
  check_tag(tag, latest);
  if (!fs::is_regular_file(manifest_path(dir, tag), ec)) refuse_deepspeed_folder(dir, tag);
  if (!fs::is_regular_file(manifest_path(dir, tag), ec))
    fail(latest + " names tag \"" + tag + "\" but " + manifest_path(dir, tag) +
         " does not exist (that save was interrupted or the tag was removed); complete tags in " + dir + ": " +
         tag_list(dir) + "; pass one of them explicitly");
  return tag;
}

void write_manifest(const std::string& dir, const Manifest& m) {
  check_tag(m.tag, "write_manifest(" + dir + ")");
  std::error_code ec;
  fs::create_directories(tag_dir(dir, m.tag), ec);
  if (ec) fail("cannot create checkpoint directory " + tag_dir(dir, m.tag) + ": " + ec.message());
  write_file_durably(manifest_path(dir, m.tag), m.to_json().dump(2) + "\n");
}

Manifest read_manifest(const std::string& dir, const std::string& tag) {
  check_tag(tag, "read_manifest(" + dir + ")");
  const std::string path = manifest_path(dir, tag);
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    refuse_deepspeed_folder(dir, tag);
    std::string why = fs::is_directory(tag_dir(dir, tag), ec)
                          ? " (the directory exists: the save of tag \"" + tag + "\" was interrupted before its manifest)"
                          : " (no directory " + tag_dir(dir, tag) + ")";
    fail("no manifest " + path + why + ": the save was interrupted or the tag is wrong; complete tags in " + dir +
         ": " + tag_list(dir));
  }
  Manifest m = parse_manifest(read_text(path), path);
  if (m.tag != tag) m.tag_in_file = m.tag;
  m.tag = tag;
  return m;
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  if (core::json_nests_deeper_than(text))
    fail(path + " nests deeper than " + std::to_string(core::kMaxJsonDepth) +
         " levels, which no manifest does; the manifest is damaged: load another tag");
  json j;
  std::optional<std::string> duplicate;
  try {
    j = core::parse_json_noting_duplicates<json>(text, duplicate);
  } catch (const json::exception& e) {
    fail(path + " is not valid JSON (" + e.what() + "); the manifest is damaged: load another tag");
  }
  if (duplicate) fail(path + " holds the key " + *duplicate + " twice; the manifest is damaged: load another tag");
  return Manifest::from_json(j, path);
}

}  // namespace zero::ckpt
