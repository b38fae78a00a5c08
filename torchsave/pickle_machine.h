#pragma once
// The restricted pickle machine's state and helpers (Note [Restricted
// pickle] in pickle.h), internal to torchsave/: the opcodes over its stack
// and memo are in pickle.cpp, what the allowed globals build (calls,
// tensors, storages) in pickle_globals.cpp.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "torchsave/pickle.h"
#include "zero/error.h"

namespace zero::torchsave {

// The stack machine. One instance reads one pickle.
class Machine {
 public:
  Machine(const uint8_t* data, size_t size, size_t stored_size, const std::string& what, Pickle& out)
      : p_(data), end_(data + size), begin_(data), what_(what), out_(out),
        budget_(kMaxHeldPerInputByte * stored_size + kHeldFloorBytes), stored_size_(stored_size) {}

  Value* run();

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw CheckpointError(what_ + ": " + why + " (at byte " + std::to_string(op_at_) +
                          "); the file is damaged or not a pickle that torch.save or DeepSpeed wrote");
  }
  [[noreturn]] void refuse(const std::string& name) const;

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

  // ---- the memory budget (Note [Restricted pickle]) ----
  // Each allocation is charged before it is made, at its worst case (a
  // vector that doubles holds up to twice its items).
  void charge(size_t bytes) {
    out_.held_bytes_ += bytes;
    if (out_.held_bytes_ > budget_)
      fail("the pickle builds more than " + std::to_string(budget_) + " bytes of values from " +
           std::to_string(stored_size_) + " stored bytes (zero allows " + std::to_string(kMaxHeldPerInputByte) +
           " a byte, plus " + std::to_string(kHeldFloorBytes) + "), which no pickle torch.save or DeepSpeed "
           "wrote does: the file is built to exhaust memory");
  }
  // What malloc takes for n bytes: its header, rounded to 16.
  static constexpr size_t heap(size_t n) { return (n + 8 + 15) / 16 * 16; }
  static constexpr size_t kItemBytes = 2 * sizeof(Value*);
  static constexpr size_t kEntryBytes = 2 * sizeof(std::pair<Value*, Value*>);
  // A hash-map node and its bucket, for the memo and the dict index.
  static constexpr size_t kNodeBytes = 64;
  void charge_string(size_t n) { charge(n > 15 ? heap(n + 1) : 0); }  // beyond the small-string buffer

  // ---- values ----
  Value* make(Value::Kind k) {
    charge(heap(sizeof(Value)) + kItemBytes);  // the node and its slot in nodes_
    out_.nodes_.push_back(std::make_unique<Value>());
    out_.nodes_.back()->kind = k;
    return out_.nodes_.back().get();
  }
  // None, True and False are one object each, as in Python.
  Value* shared(Value::Kind k, bool b = false) {
    Value*& v = k == Value::Kind::None ? none_ : b ? true_ : false_;
    if (v == nullptr) {
      v = make(k);
      v->boolean = b;
    }
    return v;
  }
  Value* make_string(Value::Kind k, const uint8_t* b, size_t n) {
    Value* v = make(k);
    charge_string(n);
    v->text.assign(reinterpret_cast<const char*>(b), n);
    return v;
  }
  void append(Value* list, const std::vector<Value*>& items) {
    charge(items.size() * kItemBytes);
    list->items.insert(list->items.end(), items.begin(), items.end());
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
  // The items above the last MARK, charged: they become a container's.
  std::vector<Value*> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    const size_t from = marks_.back();
    marks_.pop_back();
    charge((stack_.size() - from) * sizeof(Value*));
    std::vector<Value*> items(stack_.begin() + from, stack_.end());
    stack_.resize(from);
    return items;
  }
  void memo_put(uint64_t index) {
    if (stack_.empty()) fail("memo store with an empty stack");
    charge(kNodeBytes);
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
    charge(n * sizeof(Value*));
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
    charge(kNodeBytes + key.size() + kEntryBytes);
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
    charge(n * kItemBytes);
    copied_ += n;
    if (copied_ > 4 * static_cast<size_t>(end_ - begin_) + 4096)
      fail("calls that copy more elements than the pickle could hold");
  }

  Value* global(std::string module, const std::string& name);

  // REDUCE and NEWOBJ: what calling an allowed global would have built.
  Value* call(Value* callable, Value* args);

  // Protocol 2 pickles bytes as _codecs.encode(<str of code points < 256>, "latin1").
  Value* latin1(const std::string& utf8);

  // _rebuild_tensor(storage, offset, size, stride) and _rebuild_tensor_v2(...,
  // requires_grad, backward_hooks[, metadata]): a view checked to lie inside
  // its storage.
  Value* tensor(const std::vector<Value*>& x, bool v2);
  static std::string shape_text(const std::vector<int64_t>& s);

  // torch._utils._rebuild_parameter and friends: the tensor, as a Parameter.
  Value* parameter(const Value* tensor);

  // BINPERSID: torch.save's ('storage', <StorageType>, key, location, numel).
  Value* persistent(Value* pid);

  void build(Value* target, Value* state);

  void step(uint8_t op);

  int64_t parse_int(const std::string& s);
  uint64_t parse_index(const std::string& s);

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
  std::unordered_map<std::string, size_t> storage_index_;  // key -> out_.storages_ slot
  size_t copied_ = 0;
  Value* none_ = nullptr;
  Value* true_ = nullptr;
  Value* false_ = nullptr;
  const size_t budget_;
  const size_t stored_size_;
};

}  // namespace zero::torchsave
