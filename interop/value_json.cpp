#include "interop/value_json.h"

#include <cmath>

#include "zero/error.h"

namespace zero::interop {

using torchsave::Value;

namespace {

// Empty `where` on success; else the path to the first value JSON cannot hold.
std::string convert(const Value& v, nlohmann::json& out, const std::string& path) {
  switch (v.kind) {
    case Value::Kind::None: out = nullptr; return "";
    case Value::Kind::Bool: out = v.boolean; return "";
    case Value::Kind::Int: out = v.integer; return "";
    case Value::Kind::Float:
      if (!std::isfinite(v.real)) return path + " (a non-finite float)";
      out = v.real;
      return "";
    case Value::Kind::String: out = v.text; return "";
    case Value::Kind::Tuple:
    case Value::Kind::List: {
      out = nlohmann::json::array();
      for (size_t i = 0; i < v.items.size(); ++i) {
        nlohmann::json item;
        if (auto bad = convert(*v.items[i], item, path + "[" + std::to_string(i) + "]"); !bad.empty()) return bad;
        out.push_back(std::move(item));
      }
      return "";
    }
    case Value::Kind::Dict: {
      out = nlohmann::json::object();
      for (const auto& [k, x] : v.entries) {
        std::string key;
        if (k->kind == Value::Kind::String) {
          key = k->text;
        } else if (k->kind == Value::Kind::Int) {
          key = std::to_string(k->integer);
        } else {
          return path + " (a key of type " + Value::kind_name(k->kind) + ")";
        }
        nlohmann::json item;
        if (auto bad = convert(*x, item, path + "." + key); !bad.empty()) return bad;
        out[key] = std::move(item);
      }
      return "";
    }
    default:
      return path + " (a " + std::string(Value::kind_name(v.kind)) + (v.text.empty() ? "" : " " + v.text) + ")";
  }
}

}  // namespace

nlohmann::json to_json(const Value& v, const std::string& what) {
  nlohmann::json out;
  if (auto bad = convert(v, out, what); !bad.empty()) throw CheckpointError(bad + " is not plain data");
  return out;
}

bool try_to_json(const Value& v, nlohmann::json& out) { return convert(v, out, "value").empty(); }

}  // namespace zero::interop
