// The two Fields implementations: Reader (JSON -> structs, with every check
// on a single value) and Writer (structs -> JSON, for Config::to_json).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "config/config_detail.h"
#include "zero/error.h"

namespace zero::config_detail {

// ---- Opt ---------------------------------------------------------------

bool Opt::contains(double v) const {
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  if (hi_open ? !(v < hi) : !(v <= hi)) return false;
  return true;
}

static std::string bound(double v, bool integral) {
  if (integral && std::fabs(v) < 1e18) return std::to_string(static_cast<int64_t>(v));
  return show_number(v);
}

std::string Opt::describe(bool integral) const {
  std::string what = integral ? "an integer" : "a number";
  bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  if (has_lo && has_hi)
    return what + " in " + (lo_open ? "(" : "[") + bound(lo, integral) + ", " + bound(hi, integral) +
           (hi_open ? ")" : "]");
  if (has_lo) return what + (lo_open ? " > " : " >= ") + bound(lo, integral);
  if (has_hi) return what + (hi_open ? " < " : " <= ") + bound(hi, integral);
  return what;
}

Got Fields::integer(const char* key, int& v, const Opt& o) {
  int64_t wide = v;
  Got got = integer(key, wide, o);
  v = static_cast<int>(wide);   // callers bound the range to int
  return got;
}

namespace {

bool is_auto(const Json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

// JSON integers, and numbers such as 5e8 that hold an integer exactly.
bool to_int(const Json& v, int64_t& out) {
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) >= 9.2e18) return false;
    out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

// Why a value of the right meaning was refused, for the common slips.
std::string hint(const Json& found) {
  if (!found.is_string()) return "";
  const std::string& s = found.get_ref<const std::string&>();
  if (s == "true" || s == "false" || s == "True" || s == "False") return " (write true or false without quotes)";
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  if (!s.empty() && end != nullptr && *end == '\0') return " (write numbers without quotes)";
  return "";
}

// true/false-like "switched on" test for keys zero ignores.
bool is_set(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_object()) {
    auto enabled = v.find("enabled");
    if (enabled != v.end() && enabled->is_boolean()) return enabled->get<bool>();
    return !v.empty();
  }
  return !v.empty();
}

const std::vector<std::string>& all_paths();

// "a.b must be ..." reads as a sentence; other messages follow "a.b: ".
std::string attach(const std::string& path, const std::string& message) {
  for (const char* verb : {"is ", "must ", "needs "})
    if (message.rfind(verb, 0) == 0) return path + " " + message;
  return path + ": " + message;
}

class Reader final : public Fields {
 public:
  Reader(const Json& obj, std::string prefix, std::vector<std::string>& warnings)
      : obj_(obj), prefix_(std::move(prefix)), warnings_(warnings) {}
  using Fields::integer;

  bool reading() const override { return true; }

  Got flag(const char* key, bool& v, const Opt& o) override {
    const Json* j = lookup(key);
    if (j == nullptr) return Got::Absent;
    if (is_auto(*j)) return on_auto(key, o, v ? "true" : "false");
    if (!j->is_boolean()) expected(key, "true or false", *j);
    v = j->get<bool>();
    return Got::Value;
  }

  Got integer(const char* key, int64_t& v, const Opt& o) override {
    const Json* j = lookup(key);
    if (j == nullptr) return Got::Absent;
    if (is_auto(*j)) return on_auto(key, o, std::to_string(v));
    int64_t x = 0;
    if (!to_int(*j, x) || !o.contains(static_cast<double>(x))) expected(key, o.describe(true), *j);
    v = x;
    return Got::Value;
  }

  Got integer(const char* key, std::optional<int64_t>& v, const Opt& o) override {
    const Json* j = lookup(key);
    if (j == nullptr) return Got::Absent;
    if (is_auto(*j)) return on_auto(key, o, "(none)");
    int64_t x = 0;
    if (!to_int(*j, x) || !o.contains(static_cast<double>(x))) expected(key, o.describe(true), *j);
    v = x;
    return Got::Value;
  }

  Got number(const char* key, double& v, const Opt& o) override {
    const Json* j = lookup(key);
    if (j == nullptr) return Got::Absent;
    if (is_auto(*j)) return on_auto(key, o, show_number(v));
    if (!j->is_number() || !std::isfinite(j->get<double>()) || !o.contains(j->get<double>()))
      expected(key, o.describe(false), *j);
    v = j->get<double>();
    return Got::Value;
  }

  Got choice(const char* key, std::string& v, const std::vector<std::string>& choices,
             const Opt& o) override {
    const Json* j = lookup(key);
    if (j == nullptr) return Got::Absent;
    if (is_auto(*j) && o.on_auto != Auto::Reject) return on_auto(key, o, "\"" + v + "\"");
    v = pick(key, *j, choices);
    return Got::Value;
  }

  Got choice(const char* key, std::optional<std::string>& v,
             const std::vector<std::string>& choices) override {
    const Json* j = lookup(key);
    if (j == nullptr) return Got::Absent;
    v = pick(key, *j, choices);
    return Got::Value;
  }

  Got text(const char* key, std::string& v) override {
    const Json* j = lookup(key);
    if (j == nullptr) return Got::Absent;
    if (!j->is_string()) expected(key, "a string", *j);
    v = j->get<std::string>();
    return Got::Value;
  }

  Got names(const char* key, std::vector<std::string>& v, const std::vector<std::string>& choices,
            const std::vector<std::pair<std::string, std::string>>& aliases) override {
    const Json* j = lookup(key);
    if (j == nullptr) return Got::Absent;
    if (!j->is_array()) expected(key, "a list of names", *j);
    std::vector<std::string> known = choices;
    for (const auto& [alias, name] : aliases) known.push_back(alias);
    v.clear();
    for (const Json& e : *j) {
      std::string name = pick(key, e, known);
      for (const auto& [alias, canonical] : aliases)
        if (name == alias) name = canonical;
      if (std::find(v.begin(), v.end(), name) == v.end()) v.push_back(name);
    }
    return Got::Value;
  }

  Got pair(const char* key, std::array<double, 2>& v, const Opt& o) override {
    const Json* j = lookup(key);
    if (j == nullptr) return Got::Absent;
    if (is_auto(*j)) return on_auto(key, o, "[" + show_number(v[0]) + ", " + show_number(v[1]) + "]");
    std::string what = "a list of two numbers";
    if (o.describe(false) != "a number") what += ", each " + o.describe(false).substr(9);
    if (!j->is_array() || j->size() != 2) expected(key, what, *j);
    for (size_t i = 0; i < 2; ++i) {
      const Json& e = (*j)[i];
      if (!e.is_number() || !o.contains(e.get<double>())) expected(key, what, *j);
    }
    v = {(*j)[0].get<double>(), (*j)[1].get<double>()};
    return Got::Value;
  }

  void object(const char* key, const std::function<void(Fields&)>& body) override {
    static const Json empty = Json::object();
    const Json* j = lookup(key);
    if (j != nullptr && !j->is_object()) expected(key, "an object", *j);
    Reader child(j != nullptr ? *j : empty, path(key), warnings_);
    body(child);
    child.finish();
  }

  void unimplemented(const char* key) override {
    const Json* j = lookup(key);
    if (j != nullptr && is_set(*j)) warn(unimplemented_warning(path(key)));
  }

  void ignored(const char* key) override { lookup(key); }

  void forbidden(const char* key, const std::string& why) override {
    if (obj_.contains(key)) throw ConfigError(attach(path(key), why));
  }

  void owner(const std::string& what) override { owner_ = what; }

  void warn(const std::string& message) override {
    for (const auto& w : warnings_)
      if (w == message) return;
    warnings_.push_back(message);
  }

  [[noreturn]] void fail(const char* key, const std::string& message) override {
    throw ConfigError(attach(path(key), message));
  }

  std::string path(const char* key) const override { return prefix_.empty() ? key : prefix_ + "." + key; }

  // The first key nobody asked for is an error with a suggestion.
  void finish() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      const std::string& key = it.key();
      if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
      throw ConfigError(unknown_key_message(key));
    }
  }

 private:
  // Marks `key` as known; the value, or nullptr when absent or null.
  const Json* lookup(const char* key) {
    known_.emplace_back(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  Got on_auto(const char* key, const Opt& o, const std::string& default_text) {
    if (o.on_auto == Auto::Caller) return Got::Auto;
    if (o.on_auto == Auto::Reject)
      fail(key, "\"auto\" is not accepted here (only where Hugging Face writes it); give a value");
    std::string why = o.auto_note.empty() ? "Hugging Face fills it in, zero has no value for it" : o.auto_note;
    warn(path(key) + " is \"auto\": " + why + "; using the default " + default_text);
    return Got::Auto;
  }

  std::string pick(const char* key, const Json& j, const std::vector<std::string>& choices) {
    std::vector<std::string> quoted;
    for (const auto& c : choices) quoted.push_back("\"" + c + "\"");
    std::string what = "one of " + join(quoted, ", ");
    if (!j.is_string()) expected(key, what, j);
    const std::string given = lower(j.get<std::string>());
    for (const auto& c : choices)
      if (lower(c) == given) return c;
    auto guess = nearest(given, choices);
    std::string message = path(key) + " must be " + what + "; found " + show(j);
    if (guess) message += "; did you mean \"" + *guess + "\"?";
    throw ConfigError(message);
  }

  [[noreturn]] void expected(const char* key, const std::string& what, const Json& found) const {
    throw ConfigError(path(key) + " must be " + what + "; found " + show(found) + hint(found));
  }

  std::string unknown_key_message(const std::string& key) const {
    std::string message = path(key.c_str()) + ": unknown key";
    if (!owner_.empty()) message += " for " + owner_;
    if (auto guess = nearest(key, known_)) return message + "; did you mean \"" + *guess + "\"?";
    const std::string here = path(key.c_str());
    for (const auto& p : all_paths()) {   // a key that belongs to another object
      size_t dot = p.rfind('.');
      if (p != here && p.substr(dot == std::string::npos ? 0 : dot + 1) == key)
        return message + "; did you mean \"" + p + "\"?";
    }
    if (!known_.empty() && known_.size() <= 16) message += "; known keys here: " + join(known_, ", ");
    return message;
  }

  const Json& obj_;
  std::string prefix_;
  std::vector<std::string>& warnings_;
  std::vector<std::string> known_;
  std::string owner_;
};

class Writer final : public Fields {
 public:
  using Fields::integer;
  Json out = Json::object();

  bool reading() const override { return false; }
  Got flag(const char* key, bool& v, const Opt&) override { return put(key, v); }
  Got integer(const char* key, int64_t& v, const Opt&) override { return put(key, v); }
  Got integer(const char* key, std::optional<int64_t>& v, const Opt&) override {
    return put(key, v ? Json(*v) : Json(nullptr));
  }
  Got number(const char* key, double& v, const Opt&) override { return put(key, v); }
  Got choice(const char* key, std::string& v, const std::vector<std::string>&, const Opt&) override {
    return put(key, v);
  }
  Got choice(const char* key, std::optional<std::string>& v, const std::vector<std::string>&) override {
    return put(key, v ? Json(*v) : Json(nullptr));
  }
  Got text(const char* key, std::string& v) override { return put(key, v.empty() ? Json(nullptr) : Json(v)); }
  Got names(const char* key, std::vector<std::string>& v, const std::vector<std::string>&,
            const std::vector<std::pair<std::string, std::string>>&) override {
    return put(key, Json(v));
  }
  Got pair(const char* key, std::array<double, 2>& v, const Opt&) override {
    return put(key, Json::array({v[0], v[1]}));
  }
  void object(const char* key, const std::function<void(Fields&)>& body) override {
    Writer child;
    body(child);
    out[key] = std::move(child.out);
  }
  void unimplemented(const char*) override {}
  void ignored(const char*) override {}
  void forbidden(const char*, const std::string&) override {}
  void owner(const std::string&) override {}
  void warn(const std::string&) override {}
  [[noreturn]] void fail(const char* key, const std::string& message) override {
    throw ConfigError(std::string(key) + ": " + message);
  }
  std::string path(const char* key) const override { return key; }

 private:
  Got put(const char* key, Json v) {
    out[key] = std::move(v);
    return Got::Value;
  }
};

void collect_paths(const Json& j, const std::string& prefix, std::vector<std::string>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string p = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    if (it->is_object()) collect_paths(*it, p, out);
  }
}

// Every key path zero knows, for "did you mean zero_optimization.stage?".
const std::vector<std::string>& all_paths() {
  static const std::vector<std::string> paths = [] {
    std::vector<std::string> out;
    const auto& optimizers = optimizer_types();
    const auto& schedulers = scheduler_types();
    for (size_t i = 0; i < std::max(optimizers.size(), schedulers.size()); ++i) {
      Config c;
      c.optimizer.type = optimizers[i % optimizers.size()];
      c.scheduler.type = schedulers[i % schedulers.size()];
      collect_paths(write_config(c), "", out);
    }
    return out;
  }();
  return paths;
}

}  // namespace

void read_config(const Json& root, Config& c) {
  Reader reader(root, "", ConfigAccess::warnings(c));
  visit_config(reader, c);
  reader.finish();
  check_config(c);
}

Json write_config(const Config& c) {
  Config copy = c;   // visit_* take non-const structs; a Writer only reads them
  Writer writer;
  visit_config(writer, copy);
  return std::move(writer.out);
}

}  // namespace zero::config_detail
