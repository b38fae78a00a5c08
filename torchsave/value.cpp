// Value's and TensorRef's accessors, and the shape check every pickle
// passes once it is read (no value inside itself, bounded nesting).
#include <unordered_map>

#include "torchsave/pickle.h"
#include "zero/error.h"

namespace zero::torchsave {

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;  // checked against int64 when the tensor was read
  return n;
}

bool TensorRef::contiguous() const {
  int64_t expected = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && stride[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

const char* Value::kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "tuple";
    case Kind::List: return "list";
    case Kind::Set: return "set";
    case Kind::Dict: return "dict";
    case Kind::Global: return "global";
    case Kind::Object: return "object";
    case Kind::Tensor: return "tensor";
    case Kind::Storage: return "storage";
  }
  return "?";
}

const Value* Value::find(std::string_view key) const {
  if (kind != Kind::Dict) return nullptr;
  for (const auto& [k, v] : entries)
    if (k->kind == Kind::String && k->text == key) return v;
  return nullptr;
}

const Value& Value::at(std::string_view key, const std::string& what) const {
  if (kind != Kind::Dict)
    throw CheckpointError(what + ": expected a dict holding \"" + std::string(key) + "\", found a " +
                          kind_name(kind));
  const Value* v = find(key);
  if (v == nullptr) throw CheckpointError(what + ": the key \"" + std::string(key) + "\" is missing");
  return *v;
}

int64_t Value::as_int(const std::string& what) const {
  if (kind == Kind::Int) return integer;
  if (kind == Kind::Bool) return boolean ? 1 : 0;
  throw CheckpointError(what + ": expected an int, found a " + kind_name(kind));
}

double Value::as_float(const std::string& what) const {
  if (kind == Kind::Float) return real;
  if (kind == Kind::Int) return static_cast<double>(integer);
  throw CheckpointError(what + ": expected a number, found a " + kind_name(kind));
}

const std::string& Value::as_string(const std::string& what) const {
  if (kind != Kind::String) throw CheckpointError(what + ": expected a str, found a " + kind_name(kind));
  return text;
}

const TensorRef& Value::as_tensor(const std::string& what) const {
  if (kind != Kind::Tensor) throw CheckpointError(what + ": expected a tensor, found a " + kind_name(kind));
  return *tensor;
}

// Refuses a value that contains itself or nests deeper than kMaxPickleDepth:
// an iterative depth-first walk, each node finished once (shared nodes are
// fine: memo references make a DAG, and the walk stays linear).
void check_shape(const Value* root, const std::string& what) {
  enum Color : uint8_t { White, Grey, Black };
  std::unordered_map<const Value*, Color> color;
  struct Frame {
    const Value* v;
    size_t next;
  };
  auto children = [](const Value* v) {
    std::vector<const Value*> c(v->items.begin(), v->items.end());
    for (const auto& [k, x] : v->entries) {
      c.push_back(k);
      c.push_back(x);
    }
    if (v->state) c.push_back(v->state);
    return c;
  };
  std::vector<std::pair<Frame, std::vector<const Value*>>> stack;
  stack.push_back({{root, 0}, children(root)});
  color[root] = Grey;
  while (!stack.empty()) {
    auto& [frame, kids] = stack.back();
    if (frame.next == kids.size()) {
      color[frame.v] = Black;
      stack.pop_back();
      continue;
    }
    const Value* child = kids[frame.next++];
    const Color c = color.count(child) ? color[child] : White;
    if (c == Grey)
      throw CheckpointError(what + ": a value contains itself (a recursive pickle); checkpoints hold no cycles");
    if (c == Black) continue;
    if (stack.size() >= static_cast<size_t>(kMaxPickleDepth))
      throw CheckpointError(what + ": values nest deeper than " + std::to_string(kMaxPickleDepth) +
                            " levels; checkpoints nest a few");
    color[child] = Grey;
    stack.push_back({{child, 0}, children(child)});
  }
}

}  // namespace zero::torchsave
