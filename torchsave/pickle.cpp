// The restricted pickle machine (Note [Restricted pickle] in pickle.h):
// its opcodes, one case beside the next, over one stack and memo
// (pickle_machine.h). Opcodes follow CPython's Lib/pickletools.py; what the
// allowed globals build is in pickle_globals.cpp.
#include "torchsave/pickle.h"

#include <cstdio>
#include <cstring>

#include "torchsave/pickle_machine.h"
#include "zero/error.h"

namespace zero::torchsave {

namespace {

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

}  // namespace

Value* Machine::run() {
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

void Machine::step(uint8_t op) {
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
    case NONE: push(shared(Value::Kind::None)); return;
    case NEWTRUE:
    case NEWFALSE: push(shared(Value::Kind::Bool, op == NEWTRUE)); return;
    case BININT: push(make_int(static_cast<int32_t>(le(4)))); return;
    case BININT1: push(make_int(le(1))); return;
    case BININT2: push(make_int(le(2))); return;
    case INT: {
      const std::string s = line();
      if (s == "00" || s == "01") {
        push(shared(Value::Kind::Bool, s == "01"));
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
      append(list_target("APPEND"), {v});
      return;
    }
    case APPENDS: {
      std::vector<Value*> items = pop_mark();
      append(list_target("APPENDS"), items);
      return;
    }
    case EMPTY_SET: push(make(Value::Kind::Set)); return;
    case ADDITEMS: {
      std::vector<Value*> items = pop_mark();
      Value* s = top();
      if (s->kind != Value::Kind::Set) fail("ADDITEMS into a " + std::string(Value::kind_name(s->kind)));
      append(s, items);
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

int64_t Machine::parse_int(const std::string& s) {
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

uint64_t Machine::parse_index(const std::string& s) {
  const int64_t v = parse_int(s);
  if (v < 0) fail("a negative memo index");
  return static_cast<uint64_t>(v);
}

std::unique_ptr<Pickle> Pickle::read(const uint8_t* data, size_t size, const std::string& what,
                                     size_t stored_size) {
  auto pickle = std::make_unique<Pickle>();
  Machine machine(data, size, stored_size == 0 ? size : stored_size, what, *pickle);
  pickle->root_ = machine.run();
  check_shape(pickle->root_, what);
  return pickle;
}

}  // namespace zero::torchsave
