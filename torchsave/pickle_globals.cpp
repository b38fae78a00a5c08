// What the restricted pickle machine's allowed globals build (Note
// [Restricted pickle] in pickle.h): GLOBAL's lookup in the allow-list,
// REDUCE and NEWOBJ's calls, BINPERSID's storages and BUILD. The meanings
// follow torch/_utils.py (tensor rebuilds) and torch/serialization.py
// (storages); nothing named by a file is ever run.
#include <cstdint>
#include <string>
#include <vector>

#include "torchsave/allowed_globals.h"
#include "torchsave/pickle_machine.h"
#include "zero/error.h"

namespace zero::torchsave {

namespace {

using ckpt::DType;

// a * b + c for non-negative operands, or -1 when it leaves int64.
int64_t mul_add(int64_t a, int64_t b, int64_t c) {
  __int128 r = static_cast<__int128>(a) * b + c;
  return r > INT64_MAX ? -1 : static_cast<int64_t>(r);
}

}  // namespace

void Machine::refuse(const std::string& name) const {
  std::string list;
  for (const std::string& a : allowed_globals()) list += (list.empty() ? "" : ", ") + a;
  throw CheckpointError(what_ + ": the pickle asks for the Python global '" + name +
                        "', which zero does not allow: it reads data and never runs what a file names. "
                        "Allowed: " + list + ". If this file is a checkpoint you trust, save its tensors "
                        "with safetensors instead");
}

Value* Machine::global(std::string module, const std::string& name) {
  if (module == "__builtin__") module = "builtins";  // protocol 2's spelling
  const std::string full = module + "." + name;
  if (find_allowed(full) == nullptr) refuse(full);
  Value* g = make(Value::Kind::Global);
  charge_string(full.size());
  g->text = full;
  return g;
}

Value* Machine::call(Value* callable, Value* args) {
  if (callable->kind != Value::Kind::Global) fail(std::string("a call of a ") + Value::kind_name(callable->kind));
  if (args->kind != Value::Kind::Tuple) fail("a call whose arguments are not a tuple");
  const Allowed& a = *find_allowed(callable->text);
  const std::vector<Value*>& x = args->items;
  const std::string who = callable->text;
  auto arity = [&](size_t lo, size_t hi) {
    if (x.size() < lo || x.size() > hi)
      fail(who + " called with " + std::to_string(x.size()) + " arguments");
  };
  switch (a.role) {
    case Role::OrderedDict: {
      arity(0, 1);
      Value* d = make(Value::Kind::Dict);
      if (!x.empty()) {  // OrderedDict([(k, v), ...])
        if (!x[0]->is_sequence()) fail(who + " from a " + Value::kind_name(x[0]->kind));
        copied(x[0]->items.size());
        for (Value* pair : x[0]->items) {
          if (!pair->is_sequence() || pair->items.size() != 2) fail(who + " from an item that is not a pair");
          set_item(d, pair->items[0], pair->items[1]);
        }
      }
      return d;
    }
    case Role::Set: {
      arity(0, 1);
      Value* s = make(Value::Kind::Set);
      if (!x.empty()) {
        if (!x[0]->is_sequence() && x[0]->kind != Value::Kind::Set) fail(who + " of a " + Value::kind_name(x[0]->kind));
        copied(x[0]->items.size());
        s->items = x[0]->items;
      }
      return s;
    }
    case Role::GetAttr: {
      arity(2, 2);
      if (x[0]->kind != Value::Kind::Global || find_allowed(x[0]->text)->role != Role::Enum ||
          x[1]->kind != Value::Kind::String)
        fail("getattr is allowed only as getattr(<an allowed enum class>, \"<member>\")");
      Value* o = make(Value::Kind::Object);
      charge_string(x[0]->text.size());
      charge_string(x[1]->text.size());
      o->text = x[0]->text;
      o->member = x[1]->text;
      return o;
    }
    case Role::Encode: {
      arity(1, 2);
      if (x[0]->kind != Value::Kind::String) fail(who + " of a " + Value::kind_name(x[0]->kind));
      if (x.size() == 2 && (x[1]->kind != Value::Kind::String ||
                            (x[1]->text != "latin1" && x[1]->text != "latin-1")))
        fail(who + " with an encoding other than latin1");
      return latin1(x[0]->text);
    }
    case Role::Size: {
      arity(1, 1);
      if (!x[0]->is_sequence()) fail(who + " of a " + Value::kind_name(x[0]->kind));
      copied(x[0]->items.size());
      for (Value* d : x[0]->items)
        if (d->kind != Value::Kind::Int) fail(who + " with a " + Value::kind_name(d->kind) + " dimension");
      return tuple_of(x[0]->items);
    }
    case Role::Device: {
      arity(1, 2);
      if (x[0]->kind != Value::Kind::String) fail(who + " of a " + Value::kind_name(x[0]->kind));
      Value* s = make(Value::Kind::String);
      charge_string(x[0]->text.size() + 21);
      s->text = x[0]->text + (x.size() == 2 ? ":" + std::to_string(x[1]->as_int(what_ + ": torch.device")) : "");
      return s;
    }
    case Role::RebuildTensor: arity(4, 4); return tensor(x, false);
    case Role::RebuildTensorV2: arity(6, 7); return tensor(x, true);
    case Role::RebuildParameter:
    case Role::RebuildParameterWithState: {
      arity(3, 4);
      if (x[0]->kind != Value::Kind::Tensor) fail(who + " of a " + Value::kind_name(x[0]->kind));
      return parameter(x[0]);
    }
    case Role::RebuildFromType: {
      arity(4, 4);
      if (x[0]->kind != Value::Kind::Global || x[1]->kind != Value::Kind::Global ||
          find_allowed(x[1]->text)->role != Role::TensorType)
        fail(who + " of something other than a tensor rebuild and a tensor type");
      const Role inner = find_allowed(x[0]->text)->role;
      if (inner != Role::RebuildTensor && inner != Role::RebuildTensorV2 && inner != Role::RebuildParameter &&
          inner != Role::RebuildParameterWithState)
        fail(who + " of " + x[0]->text + ", which does not rebuild a tensor");
      if (x[2]->kind != Value::Kind::Tuple) fail(who + " with arguments that are not a tuple");
      Value* t = call(x[0], x[2]);
      return x[1]->text == "torch.nn.parameter.Parameter" ? parameter(t) : t;
    }
    case Role::Record: {
      copied(x.size());
      Value* o = make(Value::Kind::Object);
      charge_string(who.size());
      o->text = who;
      o->items = x;
      return o;
    }
    case Role::Enum: {  // ZeroStageEnum(2)
      arity(1, 1);
      Value* o = make(Value::Kind::Object);
      charge_string(who.size());
      charge(kItemBytes);
      o->text = who;
      o->items = x;
      return o;
    }
    case Role::StorageType:
    case Role::TensorType:
    case Role::DTypeConstant: fail(who + " is a type, not something a checkpoint calls");
  }
  fail("unreachable");
}

Value* Machine::latin1(const std::string& utf8) {
  Value* b = make(Value::Kind::Bytes);
  charge_string(utf8.size());
  for (size_t i = 0; i < utf8.size();) {
    const uint8_t c = static_cast<uint8_t>(utf8[i]);
    if (c < 0x80) {
      b->text.push_back(static_cast<char>(c));
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < utf8.size() && c <= 0xC3) {
      b->text.push_back(static_cast<char>(((c & 0x1F) << 6) | (static_cast<uint8_t>(utf8[i + 1]) & 0x3F)));
      i += 2;
    } else {
      fail("_codecs.encode of a character that latin1 cannot hold");
    }
  }
  return b;
}

Value* Machine::tensor(const std::vector<Value*>& x, bool v2) {
  const char* who = v2 ? "torch._utils._rebuild_tensor_v2" : "torch._utils._rebuild_tensor";
  if (x[0]->kind != Value::Kind::Storage) fail(std::string(who) + " of a " + Value::kind_name(x[0]->kind));
  if (x[1]->kind != Value::Kind::Int || x[1]->integer < 0) fail(std::string(who) + " with a bad storage offset");
  if (!x[2]->is_sequence() || !x[3]->is_sequence() || x[2]->items.size() != x[3]->items.size())
    fail(std::string(who) + " with sizes and strides that do not match");
  if (x[2]->items.size() > 64) fail(std::string(who) + " with more than 64 dimensions");
  Value* t = make(Value::Kind::Tensor);
  charge(heap(sizeof(TensorRef)) + heap(x[0]->storage->key.size()) + heap(x[0]->storage->location.size()) +
         2 * heap(sizeof(int64_t) * x[2]->items.size()));
  t->tensor = std::make_unique<TensorRef>();
  TensorRef& r = *t->tensor;
  r.storage = *x[0]->storage;
  r.offset = x[1]->integer;
  int64_t numel = 1, last = r.offset;  // the last element the view reaches
  for (size_t d = 0; d < x[2]->items.size(); ++d) {
    const Value* size = x[2]->items[d];
    const Value* stride = x[3]->items[d];
    if (size->kind != Value::Kind::Int || stride->kind != Value::Kind::Int || size->integer < 0 ||
        stride->integer < 0)
      fail(std::string(who) + " with a negative or non-integer size or stride");
    r.shape.push_back(size->integer);
    r.stride.push_back(stride->integer);
    numel = mul_add(numel, size->integer, 0);
    if (numel < 0) fail(std::string(who) + " with more elements than int64 holds");
    if (size->integer > 0) last = mul_add(size->integer - 1, stride->integer, last);
    if (last < 0) fail(std::string(who) + " with strides past int64");
  }
  if (numel > 0 && last >= r.storage.numel)
    fail(std::string("a tensor of shape ") + shape_text(r.shape) + " at offset " + std::to_string(r.offset) +
         " reaches element " + std::to_string(last) + " of a storage of " + std::to_string(r.storage.numel) +
         " (storage shorter than its view)");
  // Strides of 0 (an expanded tensor) let a tiny storage claim any number
  // of elements: a checkpoint's tensors are dense, so a view may not hold
  // more elements than its storage, which bounds what reading it allocates.
  if (numel > r.storage.numel)
    fail("a tensor of shape " + shape_text(r.shape) + " has more elements than its storage of " +
         std::to_string(r.storage.numel) + " (overlapping strides); zero reads dense tensors");
  if (v2 && x[4]->kind != Value::Kind::Bool) fail(std::string(who) + " with a requires_grad that is not a bool");
  return t;
}

std::string Machine::shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

Value* Machine::persistent(Value* pid) {
  if (pid->kind != Value::Kind::Tuple || pid->items.size() != 5 || pid->items[0]->kind != Value::Kind::String ||
      pid->items[0]->text != "storage")
    fail("a persistent id that is not torch.save's ('storage', type, key, location, numel)");
  const std::vector<Value*>& x = pid->items;
  if (x[1]->kind != Value::Kind::Global || find_allowed(x[1]->text)->role != Role::StorageType)
    fail("a storage whose type is not a torch storage class");
  if (x[2]->kind != Value::Kind::String || x[3]->kind != Value::Kind::String || x[4]->kind != Value::Kind::Int ||
      x[4]->integer < 0)
    fail("a storage with a bad key, location or size");
  StorageRef s;
  s.dtype = find_allowed(x[1]->text)->dtype;
  s.key = x[2]->text;
  s.location = x[3]->text;
  s.numel = x[4]->integer;
  if (mul_add(s.numel, static_cast<int64_t>(ckpt::dtype_size(s.dtype)), 0) < 0)
    fail("a storage of " + std::to_string(s.numel) + " elements, more bytes than int64 holds");
  if (s.key.empty() || s.key.find('/') != std::string::npos || s.key.find("..") != std::string::npos)
    fail("a storage key \"" + s.key + "\" that is not a plain name");
  if (auto known = storage_index_.find(s.key); known != storage_index_.end()) {
    const StorageRef& k = out_.storages_[known->second];
    if (k.dtype != s.dtype || k.numel != s.numel)
      fail("the storage \"" + s.key + "\" named twice with different types or sizes");
  } else {
    charge(kNodeBytes + 2 * sizeof(StorageRef) + 3 * (heap(s.key.size()) + heap(s.location.size())));
    storage_index_.emplace(s.key, out_.storages_.size());
    out_.storages_.push_back(s);
  }
  Value* v = make(Value::Kind::Storage);
  charge(heap(sizeof(StorageRef)) + heap(s.key.size()) + heap(s.location.size()));
  v->storage = std::make_unique<StorageRef>(std::move(s));
  return v;
}

Value* Machine::parameter(const Value* tensor) {
  Value* t = make(Value::Kind::Tensor);
  charge(heap(sizeof(TensorRef)) + heap(tensor->tensor->storage.key.size()) +
         heap(tensor->tensor->storage.location.size()) + 2 * heap(sizeof(int64_t) * tensor->tensor->shape.size()));
  t->tensor = std::make_unique<TensorRef>(*tensor->tensor);
  t->tensor->parameter = true;
  return t;
}

void Machine::build(Value* target, Value* state) {
  if (target->kind == Value::Kind::Object || target->kind == Value::Kind::Dict) {
    target->state = state;
    return;
  }
  if (target->kind == Value::Kind::Tensor) return;  // a tensor's Python attributes: nothing for zero
  fail(std::string("BUILD on a ") + Value::kind_name(target->kind));
}

}  // namespace zero::torchsave
