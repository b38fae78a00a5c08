#pragma once
// Private to config/config*.cpp: how a ds_config is read and written.
//
// One description of each JSON object (the visit_* functions in
// config_schema.cpp and config_optim.cpp) drives both directions through the
// Fields interface: the Reader checks and copies JSON into the structs, the
// Writer prints the structs back as JSON. So the key names, the order of
// to_json's output and the set of known keys (for "did you mean") come from
// one place.
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/config.h"

namespace zero {

// Reaches Config's private members from the free functions below.
struct ConfigAccess {
  static std::vector<std::string>& warnings(Config& c) { return c.warnings_; }
  static std::string& source(Config& c) { return c.source_; }
  static int& world_size(Config& c) { return c.world_size_; }
};

namespace config_detail {

using Json = nlohmann::ordered_json;   // keeps the file's key order for messages

// What "auto" means for one key (see config.h).
enum class Auto {
  Reject,    // "auto" is an error
  Default,   // keep the default, warn naming the value used
  Caller,    // the caller decides (Got::Auto tells it)
};

// Constraints on one value; built by chaining: Opt().min(0).max(3).
struct Opt {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  Auto on_auto = Auto::Reject;
  std::string auto_note;   // replaces the generic reason in the "auto" warning

  Opt& min(double v) { lo = v; lo_open = false; return *this; }
  Opt& above(double v) { lo = v; lo_open = true; return *this; }
  Opt& max(double v) { hi = v; hi_open = false; return *this; }
  Opt& below(double v) { hi = v; hi_open = true; return *this; }
  Opt& autos(Auto a, std::string note = "") { on_auto = a; auto_note = std::move(note); return *this; }
  bool contains(double v) const;
  std::string describe(bool integral) const;   // "an integer in [0, 3]", "a number > 0"
};

enum class Got { Absent, Value, Auto };

// One JSON object seen from a visit_* function.
class Fields {
 public:
  virtual ~Fields() = default;
  virtual bool reading() const = 0;

  virtual Got flag(const char* key, bool& v, const Opt& o = {}) = 0;
  virtual Got integer(const char* key, int64_t& v, const Opt& o = {}) = 0;
  virtual Got integer(const char* key, std::optional<int64_t>& v, const Opt& o = {}) = 0;
  virtual Got number(const char* key, double& v, const Opt& o = {}) = 0;
  // One of `choices`, matched case-insensitively, stored as spelled in `choices`.
  virtual Got choice(const char* key, std::string& v, const std::vector<std::string>& choices,
                     const Opt& o = {}) = 0;
  virtual Got choice(const char* key, std::optional<std::string>& v,
                     const std::vector<std::string>& choices) = 0;
  virtual Got text(const char* key, std::string& v) = 0;
  // A list of names, each one of `choices` (case-insensitive); `aliases`
  // maps other spellings onto a choice. Stored as spelled in `choices`.
  virtual Got names(const char* key, std::vector<std::string>& v, const std::vector<std::string>& choices,
                    const std::vector<std::pair<std::string, std::string>>& aliases = {}) = 0;
  virtual Got pair(const char* key, std::array<double, 2>& v, const Opt& o = {}) = 0;
  // A nested object; absent reads as {} so that its defaults apply.
  virtual void object(const char* key, const std::function<void(Fields&)>& body) = 0;

  // Reading only; a Writer ignores these.
  // A key DeepSpeed knows that zero does not implement: one warning when it
  // is set to anything but false/0/null or an object with "enabled": false.
  virtual void unimplemented(const char* key) = 0;
  // A key read and left alone without a word (the settings of a section
  // whose own warning says it does nothing).
  virtual void ignored(const char* key) = 0;
  // A key that is an error with a reason (e.g. max_grad_norm).
  virtual void forbidden(const char* key, const std::string& why) = 0;
  // Names the object in unknown-key messages, e.g. "optimizer SGD".
  virtual void owner(const std::string& what) = 0;
  virtual void warn(const std::string& message) = 0;
  [[noreturn]] virtual void fail(const char* key, const std::string& message) = 0;
  virtual std::string path(const char* key) const = 0;

  Got integer(const char* key, int& v, const Opt& o = {});
};

// ---- config_reader.cpp -------------------------------------------------
// Reads the root object into `c`, then reports the first unknown key.
void read_config(const Json& root, Config& c);
// Writes `c` as a JSON object.
Json write_config(const Config& c);

// ---- config_schema.cpp -------------------------------------------------
// The whole ds_config, key by key.
void visit_config(Fields& f, Config& c);

// ---- config_checks.cpp -------------------------------------------------
// Checks across sections (stage vs offload, fp16 vs bf16, ...).
void check_config(const Config& c);
// One warning naming the stage 3 keys a config of another stage gives.
void warn_stage3_keys_elsewhere(const Json& root, std::vector<std::string>& warnings);

// ---- config_optim.cpp --------------------------------------------------
// Supported types in their canonical spelling.
const std::vector<std::string>& optimizer_types();
const std::vector<std::string>& scheduler_types();
void visit_optimizer(Fields& f, OptimizerConfig& o);
void visit_scheduler(Fields& f, SchedulerConfig& s, const OptimizerConfig& o);
// Values "auto" left for the program to fill in before resolve().
void check_resolvable(const Config& c);

// ---- config_legacy.cpp -------------------------------------------------
// Rewrites deprecated spellings in place, one warning each.
void map_deprecated(Json& root, std::vector<std::string>& warnings);

// ---- config_batch.cpp --------------------------------------------------
void resolve_batch(BatchConfig& b, int world_size);

// ---- config_syntax.cpp -------------------------------------------------
// Note [DeepSpeed's config syntax]: "#", "//" and "/* */" comments and
// commas before a closing bracket become spaces, lines and columns kept.
std::string blank_comments_and_trailing_commas(const std::string& text);
// For a parse error: "; True is Python's spelling: JSON writes true" when
// `text` holds True, False or None outside its strings, else "".
std::string python_spelling_hint(const std::string& text);

// ---- config_text.cpp ---------------------------------------------------
std::string lower(const std::string& s);
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `key` when close enough to be a likely typo.
std::optional<std::string> nearest(const std::string& key, const std::vector<std::string>& candidates);
// A JSON value for a message: strings quoted, long values cut.
std::string show(const Json& v);
// Shortest text that reads back as the same double.
std::string show_number(double v);
std::string join(const std::vector<std::string>& items, const std::string& sep);
// The warning for a known-but-unimplemented key.
std::string unimplemented_warning(const std::string& path);

}  // namespace config_detail
}  // namespace zero
