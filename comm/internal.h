#pragma once
// comm's one internal header: the pieces behind zero::comm::ProcessGroup.
//
// Note [Missing rank]: no wait in comm may hang. Rendezvous polls for every
// rank's arrival key and, on timeout, lists the ranks that never arrived.
// Each process publishes a heartbeat (and the number of the collective it
// last entered) in the store; when a collective fails or times out, the
// failing rank reads the heartbeats twice, a few periods apart, to tell
// which peer died, hangs, exited, or issued a different collective, and
// says so in the CommError.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zero/comm.h"

namespace zero::comm {

using StorePtr = c10::intrusive_ptr<c10d::Store>;

// ---- rendezvous.cpp ------------------------------------------------------
// Connects to (rank 0: starts) the TCP store named by the launch info.
// `client_only`: connect even on rank 0 (a second connection for heartbeats).
StorePtr connect_store(const LaunchInfo& launch, std::chrono::milliseconds timeout, bool client_only = false);
// Every rank announces itself under `prefix` and waits for the others;
// throws CommError naming the ranks that did not arrive in time.
void wait_for_ranks(c10d::Store& store, const std::string& prefix, int rank, int size,
                    const std::vector<int>& global_ranks, std::chrono::milliseconds timeout);
// Note [A store that never answers] (rendezvous.cpp): while it lives, a
// rendezvous blocked past `after` ends the process with an error naming
// the store.
class StoreWatchdog {
 public:
  StoreWatchdog(const LaunchInfo& launch, std::chrono::milliseconds after);
  ~StoreWatchdog();
  StoreWatchdog(const StoreWatchdog&) = delete;
  StoreWatchdog& operator=(const StoreWatchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

// ---- health.cpp (Note [Missing rank]) ------------------------------------
class HealthMonitor {
 public:
  HealthMonitor(StorePtr store, int global_rank, int world_size);
  ~HealthMonitor();
  // Called as a collective starts: the heartbeat carries its number, name
  // and the bytes this rank contributes (so that a diagnosis can name ranks
  // that passed tensors of different sizes).
  void entering(const char* op, uint64_t bytes);
  // A sentence on which of `global_ranks` is missing and why.
  std::string diagnose(const std::vector<int>& global_ranks);
  // Marks this rank as exited cleanly; rank 0 then waits (bounded) for the
  // others before its store goes away.
  void shutdown(std::chrono::milliseconds timeout);

 private:
  // What the heartbeat thread and a diagnosis's reader use, shared with
  // them so that one left blocked on an unreachable store outlives this
  // object safely (Note [An unreachable store] in health.cpp).
  struct State {
    StorePtr store;
    int rank = 0;
    std::atomic<long> seq{0};
    std::atomic<const char*> op{"none"};
    std::atomic<uint64_t> bytes{0};
    std::atomic<bool> store_stuck{false};
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
  };
  static void beat(const std::shared_ptr<State>& state);
  static std::string key(int rank) { return "zero/hb/" + std::to_string(rank); }
  void stop_beating();

  std::shared_ptr<State> state_;
  int world_;
  std::thread thread_;
};

// ---- backends ------------------------------------------------------------
struct GroupInfo {
  std::string name;                 // "world" or "group<N>", for messages and store keys
  int rank = 0;
  int size = 1;
  std::vector<int> global_ranks;    // group rank -> world rank
  StorePtr store;                   // already prefixed for this group
  std::chrono::milliseconds timeout{300000};
  std::shared_ptr<HealthMonitor> health;  // null for a single process
};

// Synchronous collectives on CPU tensors; each call blocks until done or
// throws CommError (Note [Missing rank]). Run on the group's comm thread.
class HostBackend {
 public:
  virtual ~HostBackend() = default;
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  virtual void reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) = 0;
  virtual void all_gather(at::Tensor& output, const at::Tensor& input) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void all_to_all(at::Tensor& output, const at::Tensor& input) = 0;
  virtual void barrier() = 0;
  // "local", "shm" or "gloo", for logs and tests.
  virtual const char* transport() const = 0;
};
std::unique_ptr<HostBackend> make_local_backend();                     // size 1
std::unique_ptr<HostBackend> make_gloo_backend(const GroupInfo& group);  // gloo.cpp
// Null when the group cannot use shared memory (shm.cpp, Note [Shared-memory
// collectives]); every rank of the group gets the same answer.
std::unique_ptr<HostBackend> make_shm_backend(const GroupInfo& group);
// This process's node as ranks compare it (node.cpp, Note [One node]): equal
// strings, one node.
std::string node_identity();
// Whether process `pid` of this node runs; one that exited but was not
// reaped yet (a zombie) counts as gone (node.cpp).
bool process_alive(pid_t pid);

// Collectives on CUDA tensors enqueued on a communication stream (nccl.cpp).
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual WorkHandle all_reduce(at::Tensor tensor, ReduceOp op) = 0;
  virtual WorkHandle reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op) = 0;
  virtual WorkHandle all_gather(at::Tensor output, at::Tensor input) = 0;
  virtual WorkHandle broadcast(at::Tensor tensor, int root) = 0;
  virtual WorkHandle all_to_all(at::Tensor output, at::Tensor input) = 0;
};
// Null when this build has no NCCL.
std::unique_ptr<DeviceBackend> make_nccl_backend(const GroupInfo& group, int device_index);

// Shared element-wise reduction of `chunks` (size x n) into `output` (n).
void reduce_chunks(at::Tensor& output, const at::Tensor& chunks, ReduceOp op);
// Checks shared by every backend; throw CommError with the shapes at fault.
void check_reduce_scatter(const GroupInfo& g, const at::Tensor& output, const at::Tensor& input);
void check_all_gather(const GroupInfo& g, const at::Tensor& output, const at::Tensor& input);
void check_all_to_all(const GroupInfo& g, const at::Tensor& output, const at::Tensor& input);
void check_tensor(const char* op, const at::Tensor& tensor);
// "rank 2 of world" style prefix for messages.
std::string where(const GroupInfo& g);
// A failed collective's CommError: `message`, then the heartbeats'
// diagnosis of the peers (Note [Missing rank]) and the timeout in force.
[[noreturn]] void throw_collective_error(const GroupInfo& g, const std::string& message);

// ---- comm_thread.cpp ------------------------------------------------------
// One thread per group runs its host collectives in issue order, so async
// collectives overlap the caller's compute and stay ordered across ranks.
class CommThread {
 public:
  CommThread();
  ~CommThread();
  std::future<void> submit(std::function<void()> task);

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

// The comms logger's side of one collective (comms_logger.cpp): whether it
// is logged now, and where its time goes.
struct LoggedOp {
  const char* op = nullptr;  // nullptr: not logged
  int64_t message_bytes = 0, sent_bytes = 0;
  int group_size = 1;
  bool verbose = false;
  explicit operator bool() const { return op != nullptr; }
  void record(double seconds) const;
};
// `op` as the logger sees it now (off, or not among prof_ops: not logged).
LoggedOp log_op(const char* op, int64_t message_bytes, int64_t sent_bytes, int group_size, int global_rank);

}  // namespace zero::comm
