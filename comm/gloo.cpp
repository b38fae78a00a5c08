// Host collectives over the gloo library's TCP transport.
//
// c10d's Gloo in LibTorch 1.13 lacks reduce-scatter, so zero drives gloo
// directly. Reduce-scatter is an all-to-all of the input chunks followed by
// a local reduction: each rank sends (N-1)/N of its input, as a ring
// reduce-scatter would, and the layout is explicit (chunk r to rank r).
// One concept over 400 lines: one transport's collectives, which share its
// context, its tags and its timeout handling.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <exception>
#include <mutex>
#include <sstream>

#include "comm/internal.h"
#include "core/env.h"
#include "core/fault.h"
#include "zero/log.h"
#include "zero/error.h"

namespace zero::comm {
namespace {

// gloo's rendezvous speaks to c10d's store through this adapter.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(StorePtr store, std::chrono::milliseconds timeout) : store_(std::move(store)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store_->wait({key}, timeout_);
    auto value = store_->get(key);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  StorePtr store_;
  std::chrono::milliseconds timeout_;
};

// Element-wise reductions handed to gloo's all-reduce. Half types add in
// float, as NCCL does internally.
template <typename T>
using Acc = std::conditional_t<std::is_same<T, c10::Half>::value || std::is_same<T, c10::BFloat16>::value, float, T>;

template <typename T>
void sum_fn(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<Acc<T>>(x[i]) + static_cast<Acc<T>>(y[i]));
}

template <typename T>
void max_fn(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    const Acc<T> xa = static_cast<Acc<T>>(x[i]);
    const Acc<T> ya = static_cast<Acc<T>>(y[i]);
    // NaN wins, so that an overflow seen by one rank is seen by all.
    out[i] = (xa != xa || xa > ya) ? x[i] : y[i];
  }
}

template <typename T>
void run_all_reduce(gloo::AllreduceOptions& opts, at::Tensor& t, ReduceOp op) {
  opts.setOutput<T>(t.data_ptr<T>(), static_cast<size_t>(t.numel()));
  opts.setReduceFunction(op == ReduceOp::Max ? &max_fn<T> : &sum_fn<T>);
  gloo::allreduce(opts);
}

std::shared_ptr<gloo::transport::Device> make_device() {
  gloo::transport::tcp::attr attr;
  const std::string iface = env::get("GLOO_SOCKET_IFNAME");
  if (!iface.empty()) {
    attr.iface = iface;
  } else {
    // Bind where MASTER_ADDR points for loopback jobs; else this host's name.
    const std::string master = env::get("MASTER_ADDR", "127.0.0.1");
    std::string host = env::gloo_hostname();
    if (host.empty()) {
      if (master == "localhost" || master.rfind("127.", 0) == 0) {
        host = "127.0.0.1";
      } else {
        char name[256] = {0};
        ::gethostname(name, sizeof(name) - 1);
        host = name;
      }
    }
    attr.hostname = host;
  }
  return gloo::transport::tcp::CreateDevice(attr);
}

// Note [Failures inside gloo's threads]: gloo checks what a peer sends on
// its own I/O thread, and a failed check there (e.g. a peer that passed a
// bigger tensor: "op.preamble.length <= op.nbytes") is an exception no
// caller can catch, so the process terminates. Before it does, this
// terminate handler names the collective in flight and asks the heartbeats
// which rank passed what (HealthMonitor::diagnose), so that the launcher's
// output says "the ranks passed tensors of different sizes" and the sizes.
std::atomic<const GroupInfo*> g_in_flight{nullptr};
std::atomic<const char*> g_in_flight_op{nullptr};
std::terminate_handler g_previous_terminate = nullptr;

void report_gloo_failure(const char* what) {
  const GroupInfo* group = g_in_flight.load();
  const char* op = g_in_flight_op.load();
  if (!group || !op) return;
  std::string diagnosis = group->health ? group->health->diagnose(group->global_ranks) : "";
  std::fprintf(stderr, "zero: %s: %s failed inside gloo: %s\n  diagnosis: %s\n", where(*group).c_str(), op, what,
               diagnosis.c_str());
  std::fflush(stderr);
}

// Marks a collective as in flight for on_terminate while it runs.
struct InFlight {
  InFlight(const GroupInfo& group, const char* op) {
    g_in_flight_op.store(op);
    g_in_flight.store(&group);
  }
  ~InFlight() { g_in_flight.store(nullptr); }
};

[[noreturn]] void on_terminate() {
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const gloo::EnforceNotMet& g) {
      report_gloo_failure(g.what());
    } catch (const gloo::Exception& g) {
      report_gloo_failure(g.what());
    } catch (...) {
    }
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

// Note [Checked collectives]: over gloo, ranks that pass tensors of
// different sizes to one collective end in gloo's own check on its I/O
// thread, which terminates the process (Note [Failures inside gloo's
// threads]); a smaller size can instead leave a peer waiting for bytes that
// never come. zero's own collectives agree on their sizes by construction:
// every size derives from the flat layout, which initialize builds from a
// config and a model that every rank has been checked to share
// (comm::disagreement). Exchanging each collective's signature costs every
// collective one more gloo collective (what the shared-memory transport
// gets for free from its slots): measured on 2 ranks of a loaded 2-core VM,
// a 4-byte all_reduce took 0.34-0.37 ms alone and 2.4-5.7 ms checked, a
// 1 MiB one 0.5-0.9 ms and 7.0-8.0 ms. So it is done only in debug runs:
// with ZERO_CHECK_COLLECTIVES=1 (rank 0's setting holds for
// the group), every gloo collective first all-gathers a fixed-size record
// (kind, bytes, dtype, reduce op or root) and a record that differs is a
// CommError on every rank naming the collective, its number and what each
// rank passed, before gloo sees any of it.
enum class Kind : int64_t { AllReduce = 1, ReduceScatter, AllGather, Broadcast, Barrier, AllToAll };

struct Signature {
  Kind kind;
  int64_t bytes = 0;
  int64_t dtype = -1;  // at::ScalarType, -1 for a barrier
  int64_t extra = -1;  // the reduce op, or the broadcast's root
};

const char* kind_name(int64_t k) {
  switch (static_cast<Kind>(k)) {
    case Kind::AllReduce: return "all_reduce";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllGather: return "all_gather";
    case Kind::Broadcast: return "broadcast";
    case Kind::Barrier: return "barrier";
    case Kind::AllToAll: return "all_to_all";
  }
  return "an unknown collective";
}

// What a rank passed, as a record reads back: "all_reduce (sum) of 4194304 bytes of Float".
std::string describe(const int64_t* r) {
  std::ostringstream out;
  out << kind_name(r[0]);
  const auto kind = static_cast<Kind>(r[0]);
  if (kind == Kind::Barrier) return out.str();
  if (kind == Kind::AllReduce || kind == Kind::ReduceScatter) out << " (" << to_string(static_cast<ReduceOp>(r[3])) << ")";
  out << " of " << r[1] << " bytes";
  if (r[2] >= 0 && r[2] < static_cast<int64_t>(at::ScalarType::NumOptions))
    out << " of " << c10::toString(static_cast<at::ScalarType>(r[2]));
  if (kind == Kind::Broadcast) out << " from rank " << r[3];
  return out.str();
}

class GlooBackend : public HostBackend {
 public:
  explicit GlooBackend(const GroupInfo& group) : group_(group) {
    static std::once_flag installed;
    std::call_once(installed, [] { g_previous_terminate = std::set_terminate(on_terminate); });
    for (int attempt = 1;; ++attempt) {
      auto store = c10::make_intrusive<c10d::PrefixStore>("connect" + std::to_string(attempt), group.store);
      std::string error;
      try {
        auto device = make_device();
        auto context = std::make_shared<gloo::rendezvous::Context>(group.rank, group.size);
        context->setTimeout(group.timeout);
        GlooStore gloo_store(store, group.timeout);
        context->connectFullMesh(gloo_store, device);
        if (fault::fires("comm.connected", group.global_ranks[group.rank])) {
          // not a zero::Error: the injected fault is what gloo itself throws
          throw std::runtime_error("Connection closed by peer (injected by ZERO_FAULT)");
        }
        context_ = context;
      } catch (const std::exception& e) {
        error = e.what();
        context_.reset();
      }
      const auto [failed_rank, failure] = connect_outcome(*store, error);
      if (failed_rank < 0) {
        check_ = agree_on_checking(*store);
        return;
      }
      if (attempt == kConnectAttempts) {
        fail("connecting", std::runtime_error("rank " + std::to_string(group.global_ranks[failed_rank]) +
                                              " could not connect after " + std::to_string(attempt) +
                                              " attempts: " + failure));
      }
      log::warn("comm", where(group_) + ": rank " + std::to_string(group.global_ranks[failed_rank]) +
                            " could not connect (" + failure + "); every rank of the group connects again (attempt " +
                            std::to_string(attempt + 1) + " of " + std::to_string(kConnectAttempts) + ")");
    }
  }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    const Signature sig{Kind::AllReduce, int64_t(t.nbytes()), int64_t(t.scalar_type()), int64_t(op)};
    guarded("all_reduce", sig, [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setTag(next_tag());
      switch (t.scalar_type()) {
        case at::kFloat: run_all_reduce<float>(opts, t, op); break;
        case at::kDouble: run_all_reduce<double>(opts, t, op); break;
        case at::kHalf: run_all_reduce<c10::Half>(opts, t, op); break;
        case at::kBFloat16: run_all_reduce<c10::BFloat16>(opts, t, op); break;
        case at::kLong: run_all_reduce<int64_t>(opts, t, op); break;
        case at::kInt: run_all_reduce<int32_t>(opts, t, op); break;
        case at::kByte: run_all_reduce<uint8_t>(opts, t, op); break;
        default: throw CommError(where(group_) + ": all_reduce does not support dtype " + std::string(c10::toString(t.scalar_type())));
      }
      if (op == ReduceOp::Avg) divide_by_size(t);
    });
  }

  void reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    const Signature sig{Kind::ReduceScatter, int64_t(input.nbytes()), int64_t(input.scalar_type()), int64_t(op)};
    guarded("reduce_scatter", sig, [&] {
      at::Tensor chunks = scratch(input);
      gloo::AlltoallOptions opts(context_);
      opts.setTag(next_tag());
      opts.setInput(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
      opts.setOutput(static_cast<uint8_t*>(chunks.data_ptr()), chunks.nbytes());
      gloo::alltoall(opts);
      reduce_chunks(output, chunks.view({group_.size, output.numel()}), op);
    });
  }

  void all_to_all(at::Tensor& output, const at::Tensor& input) override {
    const Signature sig{Kind::AllToAll, int64_t(input.nbytes()), int64_t(input.scalar_type())};
    guarded("all_to_all", sig, [&] {
      gloo::AlltoallOptions opts(context_);
      opts.setTag(next_tag());
      opts.setInput(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
      opts.setOutput(static_cast<uint8_t*>(output.data_ptr()), output.nbytes());
      gloo::alltoall(opts);
    });
  }

  void all_gather(at::Tensor& output, const at::Tensor& input) override {
    const Signature sig{Kind::AllGather, int64_t(input.nbytes()), int64_t(input.scalar_type())};
    guarded("all_gather", sig, [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setTag(next_tag());
      auto* out = static_cast<uint8_t*>(output.data_ptr());
      auto* in = static_cast<uint8_t*>(input.data_ptr());
      // An input that is this rank's slot of the output: in place (gloo
      // then leaves that slot as it is, as NCCL does).
      if (in != out + static_cast<size_t>(group_.rank) * input.nbytes()) opts.setInput(in, input.nbytes());
      opts.setOutput(out, output.nbytes());
      gloo::allgather(opts);
    });
  }

  void broadcast(at::Tensor& t, int root) override {
    const Signature sig{Kind::Broadcast, int64_t(t.nbytes()), int64_t(t.scalar_type()), root};
    guarded("broadcast", sig, [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setTag(next_tag());
      opts.setRoot(root);
      opts.setOutput(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    guarded("barrier", Signature{Kind::Barrier}, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

  const char* transport() const override { return "gloo"; }

 private:
  uint32_t next_tag() { return tag_++; }

  // Receive buffer for reduce-scatter, kept between calls: a fresh one per
  // call costs page faults on every byte.
  at::Tensor scratch(const at::Tensor& like) {
    const size_t bytes = like.nbytes();
    if (!scratch_.defined() || scratch_.nbytes() < bytes) scratch_ = at::empty({int64_t(bytes)}, at::kByte);
    return scratch_.slice(0, 0, int64_t(bytes)).view(like.scalar_type()).view(like.sizes());
  }

  void divide_by_size(at::Tensor& t) {
    if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
      t.div_(group_.size, "floor");
    } else {
      t.div_(group_.size);
    }
  }

  template <typename F>
  void guarded(const char* op, const Signature& sig, F&& body) {
    if (group_.health) group_.health->entering(op, static_cast<uint64_t>(sig.bytes));
    InFlight in_flight(group_, op);
    ++calls_;
    try {
      if (check_) check_same_collective(op, sig);
      body();
    } catch (const zero::Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(op, e);
    }
  }

  // Note [Checked collectives]: rank 0's ZERO_CHECK_COLLECTIVES holds for
  // the group (ranks that disagreed would exchange records with peers that
  // do not).
  bool agree_on_checking(c10d::Store& store) {
    const std::string key = "check_collectives";
    if (group_.rank == 0) {
      // A setting that is no yes or no travels as its error, so every rank names it.
      const env::Flag check = env::check_collectives();
      const std::string value = !check.error.empty() ? "E" + check.error : check.value ? "1" : "0";
      store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
    }
    try {
      store.wait({key}, group_.timeout);
    } catch (const std::exception& e) {
      fail("connecting", e);
    }
    const std::vector<uint8_t> value = store.get(key);
    if (!value.empty() && value[0] == 'E') throw CommError("rank 0's " + std::string(value.begin() + 1, value.end()));
    return value.size() == 1 && value[0] == '1';
  }

  // Note [Checked collectives]: every rank's record of this collective, then
  // one CommError on every rank if any differs from the others.
  void check_same_collective(const char* op, const Signature& sig) {
    constexpr size_t kFields = 4;
    std::array<int64_t, kFields> mine{static_cast<int64_t>(sig.kind), sig.bytes, sig.dtype, sig.extra};
    std::vector<int64_t> all(kFields * group_.size);
    gloo::AllgatherOptions opts(context_);
    opts.setTag(next_tag());
    opts.setInput(mine.data(), kFields);
    opts.setOutput(all.data(), all.size());
    gloo::allgather(opts);
    bool same = true, same_kind = true;
    for (int r = 1; r < group_.size; ++r) {
      same = same && std::equal(all.begin(), all.begin() + kFields, all.begin() + r * kFields);
      same_kind = same_kind && all[0] == all[r * kFields];
    }
    if (same) return;
    const bool sizes_only = same_kind && [&] {
      for (int r = 1; r < group_.size; ++r) {
        if (all[2] != all[r * kFields + 2] || all[3] != all[r * kFields + 3]) return false;
      }
      return true;
    }();
    std::ostringstream msg;
    msg << where(group_) << ": " << op << " (collective #" << calls_ << " of " << group_.name << ") checked by "
        << "ZERO_CHECK_COLLECTIVES: "
        << (sizes_only ? "the ranks passed tensors of different sizes"
                       : same_kind ? "the ranks passed different dtypes, reduce ops or roots"
                                   : "the ranks issued different collectives")
        << ":";
    for (int r = 0; r < group_.size; ++r) msg << "\n  rank " << group_.global_ranks[r] << ": " << describe(&all[r * kFields]);
    throw CommError(msg.str());
  }

  // Note [Connecting a gloo group]: gloo's TCP pair accepts the first
  // connection that reaches its listening port and checks nothing about
  // who made it, so one stray or dropped connection breaks one pair (seen
  // once on a loaded 2-core machine: "Connection closed by peer" while a
  // 2-rank subgroup connected) while the peer thinks all is well. So every
  // rank posts how its attempt went, and if any rank failed, all connect
  // again under fresh keys. Returns the first failed rank of the group and
  // its error, or -1.
  static constexpr int kConnectAttempts = 3;

  std::pair<int, std::string> connect_outcome(c10d::Store& store, const std::string& error) {
    store.set("outcome/" + std::to_string(group_.rank), std::vector<uint8_t>(error.begin(), error.end()));
    std::vector<std::string> keys;
    for (int r = 0; r < group_.size; ++r) keys.push_back("outcome/" + std::to_string(r));
    try {
      store.wait(keys, group_.timeout);
    } catch (const std::exception& e) {
      fail("connecting", e);
    }
    for (int r = 0; r < group_.size; ++r) {
      const std::vector<uint8_t> value = store.get(keys[r]);
      if (!value.empty()) return {r, std::string(value.begin(), value.end())};
    }
    return {-1, ""};
  }

  [[noreturn]] void fail(const char* op, const std::exception& e) {
    throw_collective_error(group_, where(group_) + ": " + op + " failed: " + e.what());
  }

  GroupInfo group_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 0;
  bool check_ = false;  // Note [Checked collectives]
  int64_t calls_ = 0;   // collectives issued on this group, for messages
  at::Tensor scratch_;
};

}  // namespace

std::unique_ptr<HostBackend> make_gloo_backend(const GroupInfo& group) {
  return std::make_unique<GlooBackend>(group);
}

}  // namespace zero::comm
