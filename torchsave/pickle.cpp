// The restricted pickle machine (Note [Restricted pickle] in pickle.h).
// Opcodes follow CPython's Lib/pickletools.py; the globals' meanings follow
// torch/_utils.py (tensor rebuilds) and torch/serialization.py (storages).
// One concept over 400 lines: one opcode machine, an opcode's case beside
// the next, over one stack and memo.
#include "torchsave/pickle.h"

#include "torchsave/allowed_globals.h"

#include <cmath>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "zero/error.h"

namespace zero::torchsave {

namespace {

using ckpt::DType;

// Opcodes (pickletools' names).
enum Op : uint8_t {
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2', FLOAT = 'F', INT = 'I', BININT = 'J',
  BININT1 = 'K', LONG = 'L', BININT2 = 'M', NONE = 'N', PERSID = 'P', BINPERSID = 'Q', REDUCE = 'R',
  STRING = 'S', BINSTRING = 'T', SHORT_BINSTRING = 'U', UNICODE = 'V', BINUNICODE = 'X', APPEND = 'a',
  BUILD = 'b', GLOBAL = 'c', DICT = 'd', EMPTY_DICT = '}', APPENDS = 'e', GET = 'g', BINGET = 'h',
  INST = 'i', LONG_BINGET = 'j', LIST = 'l', EMPTY_LIST = ']', OBJ = 'o', PUT = 'p', BINPUT = 'q',
  LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't', EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G',
  PROTO = 0x80, NEWOBJ = 0x81, EXT1 = 0x82, EXT2 = 0x83, EXT4 = 0x84, TUPLE1 = 0x85, TUPLE2 = 0x86,
  TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b, BINBYTES = 'B',
  SHORT_BINBYTES = 'C', SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e, EMPTY_SET = 0x8f,
  ADDITEMS = 0x90, FROZENSET = 0x91, NEWOBJ_EX = 0x92, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95,
  BYTEARRAY8 = 0x96, NEXT_BUFFER = 0x97, READONLY_BUFFER = 0x98
};

// a * b + c for non-negative operands, or -1 when it leaves int64.
int64_t mul_add(int64_t a, int64_t b, int64_t c) {
  __int128 r = static_cast<__int128>(a) * b + c;
  return r > INT64_MAX ? -1 : static_cast<int64_t>(r);
}

}  // namespace


// The stack machine. One instance reads one pickle.
class Machine {
 public:
  Machine(const uint8_t* data, size_t size, const std::string& what, Pickle& out)
      : p_(data), end_(data + size), begin_(data), what_(what), out_(out) {}

  Value* run() {
    while (true) {
      op_at_ = static_cast<size_t>(p_ - begin_);
      const uint8_t op = byte();
      if (op == STOP) {
        Value* v = pop();
        if (!stack_.empty() || !marks_.empty()) fail("values left on the stack at STOP");
        return v;
      }
      step(op);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw CheckpointError(what_ + ": " + why + " (at byte " + std::to_string(op_at_) +
                          "); the file is damaged or not a pickle that torch.save or DeepSpeed wrote");
  }
  [[noreturn]] void refuse(const std::string& name) const {
    std::string list;
    for (const std::string& a : allowed_globals()) list += (list.empty() ? "" : ", ") + a;
    throw CheckpointError(what_ + ": the pickle asks for the Python global '" + name +
                          "', which zero does not allow: it reads data and never runs what a file names. "
                          "Allowed: " + list + ". If this file is a checkpoint you trust, save its tensors "
                          "with safetensors instead");
  }

  // ---- input ----
  uint8_t byte() {
    if (p_ >= end_) fail("the pickle ends before STOP");
    return *p_++;
  }
  const uint8_t* take(uint64_t n) {
    if (n > static_cast<uint64_t>(end_ - p_))
      fail("a length of " + std::to_string(n) + " bytes runs past the end of the pickle (" +
           std::to_string(end_ - p_) + " left)");
    const uint8_t* at = p_;
    p_ += n;
    return at;
  }
  uint64_t le(int n) {
    const uint8_t* b = take(n);
    uint64_t v = 0;
    for (int i = n; i-- > 0;) v = (v << 8) | b[i];
    return v;
  }
  std::string line() {
    const uint8_t* nl = static_cast<const uint8_t*>(std::memchr(p_, '\n', end_ - p_));
    if (nl == nullptr) fail("a text argument has no end of line");
    std::string s(reinterpret_cast<const char*>(p_), nl - p_);
    p_ = nl + 1;
    return s;
  }

  // ---- values ----
  Value* make(Value::Kind k) {
    out_.nodes_.push_back(std::make_unique<Value>());
    out_.nodes_.back()->kind = k;
    return out_.nodes_.back().get();
  }
  Value* make_string(Value::Kind k, const uint8_t* b, size_t n) {
    Value* v = make(k);
    v->text.assign(reinterpret_cast<const char*>(b), n);
    return v;
  }
  Value* make_int(int64_t i) {
    Value* v = make(Value::Kind::Int);
    v->integer = i;
    return v;
  }
  void push(Value* v) { stack_.push_back(v); }
  Value* pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("the stack is empty");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("the stack is empty");
    return stack_.back();
  }
  std::vector<Value*> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    const size_t from = marks_.back();
    marks_.pop_back();
    std::vector<Value*> items(stack_.begin() + from, stack_.end());
    stack_.resize(from);
    return items;
  }
  void memo_put(uint64_t index) {
    if (stack_.empty()) fail("memo store with an empty stack");
    memo_[index] = stack_.back();
  }
  Value* memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail("a memo reference to " + std::to_string(index) + ", which was never stored");
    return it->second;
  }
  Value* tuple_of(std::vector<Value*> items) {
    Value* t = make(Value::Kind::Tuple);
    t->items = std::move(items);
    return t;
  }
  Value* pop_tuple_n(int n) {
    std::vector<Value*> items(n);
    for (int i = n; i-- > 0;) items[i] = pop();
    return tuple_of(std::move(items));
  }
  Value* list_target(const char* op) {
    Value* l = top();
    if (l->kind != Value::Kind::List && l->kind != Value::Kind::Set)
      fail(std::string(op) + " into a " + Value::kind_name(l->kind) + ", not a list");
    return l;
  }
  Value* dict_target() {
    Value* d = top();
    if (d->kind != Value::Kind::Dict) fail(std::string("SETITEM into a ") + Value::kind_name(d->kind));
    return d;
  }
  void set_item(Value* d, Value* k, Value* v) {
    // Python keeps the last value of a repeated key. Keys of the scalar
    // kinds a checkpoint uses are compared by value, through an index per
    // dict so that a large dict costs linear time; others by identity.
    std::string key;
    switch (k->kind) {
      case Value::Kind::String: key = "s" + k->text; break;
      case Value::Kind::Bytes: key = "b" + k->text; break;
      case Value::Kind::Int: key = "i" + std::to_string(k->integer); break;
      case Value::Kind::Bool: key = "i" + std::to_string(k->boolean ? 1 : 0); break;
      default: key = "p" + std::to_string(reinterpret_cast<uintptr_t>(k)); break;
    }
    auto [it, added] = dict_index_[d].emplace(std::move(key), d->entries.size());
    if (!added) {
      d->entries[it->second].second = v;
      return;
    }
    d->entries.emplace_back(k, v);
  }
  // Calls that copy a sequence (set(list), torch.Size(tuple), ...) could
  // copy one large memoized list again and again: a real pickle copies no
  // more than it holds.
  void copied(size_t n) {
    copied_ += n;
    if (copied_ > 4 * static_cast<size_t>(end_ - begin_) + 4096)
      fail("calls that copy more elements than the pickle could hold");
  }

  Value* global(std::string module, const std::string& name) {
    if (module == "__builtin__") module = "builtins";  // protocol 2's spelling
    const std::string full = module + "." + name;
    if (find_allowed(full) == nullptr) refuse(full);
    Value* g = make(Value::Kind::Global);
    g->text = full;
    return g;
  }

  // REDUCE and NEWOBJ: what calling an allowed global would have built.
  Value* call(Value* callable, Value* args) {
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
        s->text = x[0]->text + (x.size() == 2 ? ":" + std::to_string(x[1]->as_int(what_ + ": torch.device")) : "");
        return s;
      }
      case Role::RebuildTensor: arity(4, 4); return tensor(x, false);
      case Role::RebuildTensorV2: arity(6, 7); return tensor(x, true);
      case Role::RebuildParameter:
      case Role::RebuildParameterWithState: {
        arity(3, 4);
        if (x[0]->kind != Value::Kind::Tensor) fail(who + " of a " + Value::kind_name(x[0]->kind));
        Value* t = make(Value::Kind::Tensor);
        t->tensor = x[0]->tensor;
        t->tensor.parameter = true;
        return t;
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
        if (x[1]->text == "torch.nn.parameter.Parameter") t->tensor.parameter = true;
        return t;
      }
      case Role::Record: {
        copied(x.size());
        Value* o = make(Value::Kind::Object);
        o->text = who;
        o->items = x;
        return o;
      }
      case Role::Enum: {  // ZeroStageEnum(2)
        arity(1, 1);
        Value* o = make(Value::Kind::Object);
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

  // Protocol 2 pickles bytes as _codecs.encode(<str of code points < 256>, "latin1").
  Value* latin1(const std::string& utf8) {
    Value* b = make(Value::Kind::Bytes);
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

  // _rebuild_tensor(storage, offset, size, stride) and _rebuild_tensor_v2(...,
  // requires_grad, backward_hooks[, metadata]): a view checked to lie inside
  // its storage.
  Value* tensor(const std::vector<Value*>& x, bool v2) {
    const char* who = v2 ? "torch._utils._rebuild_tensor_v2" : "torch._utils._rebuild_tensor";
    if (x[0]->kind != Value::Kind::Storage) fail(std::string(who) + " of a " + Value::kind_name(x[0]->kind));
    if (x[1]->kind != Value::Kind::Int || x[1]->integer < 0) fail(std::string(who) + " with a bad storage offset");
    if (!x[2]->is_sequence() || !x[3]->is_sequence() || x[2]->items.size() != x[3]->items.size())
      fail(std::string(who) + " with sizes and strides that do not match");
    if (x[2]->items.size() > 64) fail(std::string(who) + " with more than 64 dimensions");
    Value* t = make(Value::Kind::Tensor);
    TensorRef& r = t->tensor;
    r.storage = x[0]->storage;
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
  static std::string shape_text(const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  }

  // BINPERSID: torch.save's ('storage', <StorageType>, key, location, numel).
  Value* persistent(Value* pid) {
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
    bool seen = false;
    for (const StorageRef& known : out_.storages_)
      if (known.key == s.key) {
        if (known.dtype != s.dtype || known.numel != s.numel)
          fail("the storage \"" + s.key + "\" named twice with different types or sizes");
        seen = true;
      }
    if (!seen) out_.storages_.push_back(s);
    Value* v = make(Value::Kind::Storage);
    v->storage = s;
    return v;
  }

  void build(Value* target, Value* state) {
    if (target->kind == Value::Kind::Object || target->kind == Value::Kind::Dict) {
      target->state = state;
      return;
    }
    if (target->kind == Value::Kind::Tensor) return;  // a tensor's Python attributes: nothing for zero
    fail(std::string("BUILD on a ") + Value::kind_name(target->kind));
  }

  void step(uint8_t op) {
    switch (op) {
      case PROTO: {
        const uint8_t v = byte();
        if (v > 5) fail("pickle protocol " + std::to_string(v) + " (this reader knows 2-5)");
        return;
      }
      case FRAME: le(8); return;  // framing is a hint for buffered readers
      case MARK: marks_.push_back(stack_.size()); return;
      case POP: pop(); return;
      case POP_MARK: pop_mark(); return;
      case DUP: push(top()); return;
      case NONE: push(make(Value::Kind::None)); return;
      case NEWTRUE:
      case NEWFALSE: {
        Value* b = make(Value::Kind::Bool);
        b->boolean = op == NEWTRUE;
        push(b);
        return;
      }
      case BININT: push(make_int(static_cast<int32_t>(le(4)))); return;
      case BININT1: push(make_int(le(1))); return;
      case BININT2: push(make_int(le(2))); return;
      case INT: {
        const std::string s = line();
        if (s == "00" || s == "01") {
          Value* b = make(Value::Kind::Bool);
          b->boolean = s == "01";
          push(b);
          return;
        }
        push(make_int(parse_int(s)));
        return;
      }
      case LONG1:
      case LONG4: {
        const uint64_t n = op == LONG1 ? le(1) : le(4);
        if (n > 8) fail("an integer of " + std::to_string(n) + " bytes (zero reads at most 64 bits)");
        const uint8_t* b = take(n);
        uint64_t v = 0;
        for (uint64_t i = n; i-- > 0;) v = (v << 8) | b[i];
        if (n > 0 && n < 8 && (b[n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        push(make_int(static_cast<int64_t>(v)));
        return;
      }
      case BINFLOAT: {
        const uint8_t* b = take(8);
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | b[i];  // big-endian
        Value* f = make(Value::Kind::Float);
        std::memcpy(&f->real, &bits, 8);
        push(f);
        return;
      }
      case FLOAT: {
        const std::string s = line();
        char* end = nullptr;
        Value* f = make(Value::Kind::Float);
        f->real = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end != '\0') fail("a FLOAT that is not a number");
        push(f);
        return;
      }
      case SHORT_BINUNICODE: { const uint64_t n = le(1); push(make_string(Value::Kind::String, take(n), n)); return; }
      case BINUNICODE: { const uint64_t n = le(4); push(make_string(Value::Kind::String, take(n), n)); return; }
      case BINUNICODE8: { const uint64_t n = le(8); push(make_string(Value::Kind::String, take(n), n)); return; }
      case SHORT_BINSTRING: { const uint64_t n = le(1); push(make_string(Value::Kind::String, take(n), n)); return; }
      case BINSTRING: { const uint64_t n = le(4); push(make_string(Value::Kind::String, take(n), n)); return; }
      case SHORT_BINBYTES: { const uint64_t n = le(1); push(make_string(Value::Kind::Bytes, take(n), n)); return; }
      case BINBYTES: { const uint64_t n = le(4); push(make_string(Value::Kind::Bytes, take(n), n)); return; }
      case BINBYTES8:
      case BYTEARRAY8: { const uint64_t n = le(8); push(make_string(Value::Kind::Bytes, take(n), n)); return; }
      case EMPTY_TUPLE: push(make(Value::Kind::Tuple)); return;
      case TUPLE1: push(pop_tuple_n(1)); return;
      case TUPLE2: push(pop_tuple_n(2)); return;
      case TUPLE3: push(pop_tuple_n(3)); return;
      case TUPLE: push(tuple_of(pop_mark())); return;
      case EMPTY_LIST: push(make(Value::Kind::List)); return;
      case LIST: {
        Value* l = make(Value::Kind::List);
        l->items = pop_mark();
        push(l);
        return;
      }
      case APPEND: {
        Value* v = pop();
        list_target("APPEND")->items.push_back(v);
        return;
      }
      case APPENDS: {
        std::vector<Value*> items = pop_mark();
        Value* l = list_target("APPENDS");
        l->items.insert(l->items.end(), items.begin(), items.end());
        return;
      }
      case EMPTY_SET: push(make(Value::Kind::Set)); return;
      case ADDITEMS: {
        std::vector<Value*> items = pop_mark();
        Value* s = top();
        if (s->kind != Value::Kind::Set) fail("ADDITEMS into a " + std::string(Value::kind_name(s->kind)));
        s->items.insert(s->items.end(), items.begin(), items.end());
        return;
      }
      case FROZENSET: {
        Value* s = make(Value::Kind::Set);
        s->items = pop_mark();
        push(s);
        return;
      }
      case EMPTY_DICT: push(make(Value::Kind::Dict)); return;
      case DICT: {
        std::vector<Value*> items = pop_mark();
        if (items.size() % 2) fail("DICT with an odd number of items");
        Value* d = make(Value::Kind::Dict);
        for (size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        push(d);
        return;
      }
      case SETITEM: {
        Value* v = pop();
        Value* k = pop();
        set_item(dict_target(), k, v);
        return;
      }
      case SETITEMS: {
        std::vector<Value*> items = pop_mark();
        if (items.size() % 2) fail("SETITEMS with an odd number of items");
        Value* d = dict_target();
        for (size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        return;
      }
      case GLOBAL: {
        std::string module = line();
        const std::string name = line();
        push(global(std::move(module), name));
        return;
      }
      case STACK_GLOBAL: {
        Value* name = pop();
        Value* module = pop();
        if (name->kind != Value::Kind::String || module->kind != Value::Kind::String)
          fail("STACK_GLOBAL of something other than two strings");
        push(global(module->text, name->text));
        return;
      }
      case REDUCE: {
        Value* args = pop();
        Value* callable = pop();
        push(call(callable, args));
        return;
      }
      case NEWOBJ: {
        Value* args = pop();
        Value* cls = pop();
        push(call(cls, args));
        return;
      }
      case NEWOBJ_EX: {
        Value* kwargs = pop();
        Value* args = pop();
        Value* cls = pop();
        if (kwargs->kind != Value::Kind::Dict || !kwargs->entries.empty()) fail("NEWOBJ_EX with keyword arguments");
        push(call(cls, args));
        return;
      }
      case BUILD: {
        Value* state = pop();
        build(top(), state);
        return;
      }
      case BINPERSID: push(persistent(pop())); return;
      case PERSID: fail("a text persistent id (PERSID), which torch.save does not write");
      case PUT: memo_put(parse_index(line())); return;
      case BINPUT: memo_put(le(1)); return;
      case LONG_BINPUT: memo_put(le(4)); return;
      case MEMOIZE: memo_put(memo_.size()); return;
      case GET: push(memo_get(parse_index(line()))); return;
      case BINGET: push(memo_get(le(1))); return;
      case LONG_BINGET: push(memo_get(le(4))); return;
      case INST:
      case OBJ: fail("INST/OBJ (protocol 0 and 1 object creation), which zero does not run");
      case EXT1:
      case EXT2:
      case EXT4: fail("a copyreg extension code (EXT1/2/4), which zero does not resolve");
      case NEXT_BUFFER:
      case READONLY_BUFFER: fail("an out-of-band buffer (protocol 5), which torch.save does not write");
      case STRING:
      case UNICODE:
      case LONG: fail("a protocol 0 text opcode, which torch.save (protocol 2) does not write");
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        fail(std::string("an unknown opcode ") + hex);
      }
    }
  }

  int64_t parse_int(const std::string& s) {
    if (s.empty() || s.size() > 19) fail("an INT that is not a 64-bit integer");
    size_t i = s[0] == '-' ? 1 : 0;
    if (i == s.size()) fail("an INT that is not a 64-bit integer");
    int64_t v = 0;
    for (; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') fail("an INT that is not a 64-bit integer");
      v = v * 10 + (s[i] - '0');
    }
    return s[0] == '-' ? -v : v;
  }
  uint64_t parse_index(const std::string& s) {
    const int64_t v = parse_int(s);
    if (v < 0) fail("a negative memo index");
    return static_cast<uint64_t>(v);
  }

  const uint8_t* p_;
  const uint8_t* end_;
  const uint8_t* begin_;
  size_t op_at_ = 0;
  const std::string& what_;
  Pickle& out_;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Value*> memo_;
  std::unordered_map<const Value*, std::unordered_map<std::string, size_t>> dict_index_;
  size_t copied_ = 0;
};

std::unique_ptr<Pickle> Pickle::read(const uint8_t* data, size_t size, const std::string& what) {
  auto pickle = std::make_unique<Pickle>();
  Machine machine(data, size, what, *pickle);
  pickle->root_ = machine.run();
  check_shape(pickle->root_, what);
  return pickle;
}

}  // namespace zero::torchsave
