// The YAML launch config's structure check (yaml_structure.h).
#include "accelerate/yaml_structure.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace zero::launch_yaml {
namespace {

// Note [Launch config structure]
// yaml-cpp keeps both entries of a key written twice in a mapping (a lookup
// finds the first, a walk sees both, so the last silently wins here), takes
// the first of several documents without a word, and recurses up to 2000
// levels while parsing. Before the text becomes nodes, its events are
// walked once through yaml-cpp's own parser: a key written twice in any
// mapping (an alias to a scalar counts as that scalar), a second document,
// or nesting past the depth allowed goes to the caller's `fail` (a
// ConfigError naming it, in launch_config.cpp), the first found. As with the JSON readers (core/json_duplicates.h), one hash
// set per open mapping keeps this linear in the keys. Aliases are not
// followed, so an alias bomb costs one event per alias.
class StructureCheck : public YAML::EventHandler {
 public:
  StructureCheck(int max_depth, const StructureFail& fail) : max_depth_(max_depth), fail_(fail) {}

  void OnDocumentStart(const YAML::Mark&) override {
    if (++documents_ > 1) fail_("", "holds more than one YAML document ('---' starts another); keep one");
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override { leaf("null", true); }
  void OnAlias(const YAML::Mark&, YAML::anchor_t anchor) override {
    auto it = scalars_.find(anchor);
    if (it != scalars_.end()) leaf(it->second, true);
    else leaf("", false);
  }
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t anchor, const std::string& value) override {
    if (anchor != YAML::NullAnchor) scalars_[anchor] = value;
    leaf(value, true);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(false, m);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    open(true, m);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    bool map = false;
    bool at_key = true;  // a mapping's next node is a key
    std::string key;     // the current key ("" while it is a list or a mapping)
    size_t index = 0;    // a list's next item
    std::unordered_set<std::string> keys;
  };

  std::string path() const {
    std::string p;
    for (const Frame& f : stack_) {
      if (f.map) p += (p.empty() ? "" : ".") + (f.key.empty() ? std::string("?") : f.key);
      else p += "[" + std::to_string(f.index) + "]";
    }
    return p;
  }
  // A scalar, null or alias; `text` is its value when `named` (a possible key).
  void leaf(const std::string& text, bool named) {
    if (!stack_.empty() && stack_.back().map && stack_.back().at_key) {
      Frame& top = stack_.back();
      top.key = named ? text : "";
      if (named && !top.keys.insert(text).second) {
        fail_(path(), "duplicate key (a key may appear once per mapping; which one was meant?)");
      }
    }
    done();
  }
  void open(bool map, const YAML::Mark& m) {
    if (!stack_.empty() && stack_.back().map && stack_.back().at_key) stack_.back().key.clear();
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      fail_("", "nested deeper than " + std::to_string(max_depth_) + " levels at line " +
                      std::to_string(m.line + 1) + " (a launch config nests 2)");
    }
    stack_.emplace_back();
    stack_.back().map = map;
  }
  void close() {
    if (!stack_.empty()) stack_.pop_back();
    done();
  }
  // A node of the innermost open list or mapping is complete.
  void done() {
    if (stack_.empty()) return;
    Frame& top = stack_.back();
    if (top.map) top.at_key = !top.at_key;
    else ++top.index;
  }

  int max_depth_;
  const StructureFail& fail_;
  int documents_ = 0;
  std::vector<Frame> stack_;
  std::unordered_map<YAML::anchor_t, std::string> scalars_;
};

}  // namespace

void check_structure(const std::string& text, int max_depth, const StructureFail& fail) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  StructureCheck check(max_depth, fail);
  while (parser.HandleNextDocument(check)) {
  }
}

}  // namespace zero::launch_yaml
