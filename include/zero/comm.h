#pragma once
// Process groups for zero: rank and world from the launch environment,
// rendezvous over a TCP store, and collectives on flat tensors behind one
// interface. CPU tensors go through the gloo library; CUDA tensors through
// NCCL, or through gloo staged via (pinned) host memory when NCCL cannot be
// used (several ranks sharing one GPU).
//
// Layout contract (no hidden padding): reduce_scatter's input holds
// size() * output.numel() elements and rank r receives the reduced chunk r;
// all_gather's output holds size() * input.numel() elements, chunk r being
// rank r's input. Callers pad their flat buffers to a multiple of size().
#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/launch_info.h"

namespace zero::comm {

enum class ReduceOp { Sum, Avg, Max };
const char* to_string(ReduceOp op);


// Backend used for CUDA tensors.
enum class CudaBackend { Nccl, Gloo };

struct GroupOptions {
  // Longest any rendezvous or collective may wait before failing with an
  // error that names the missing rank. Default: ZERO_COMM_TIMEOUT or 300 s.
  std::chrono::milliseconds timeout{0};
  // Default: ZERO_CUDA_BACKEND ("nccl" or "gloo"), else NCCL when built in.
  std::string cuda_backend;
};

// A pending collective. wait() blocks until it is done (CPU) or, for CUDA
// tensors on NCCL, orders the caller's current stream after it; it throws
// zero::CommError if the collective failed or timed out.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
};
using WorkHandle = std::shared_ptr<Work>;

// Bytes each rank sends per collective kind, as a bandwidth-optimal ring
// sends them (all-reduce 2(N-1)/N of the buffer, reduce-scatter and
// all-gather (N-1)/N of the full buffer, broadcast the buffer from the root,
// all-to-all (N-1)/N of its input: every chunk but its own).
struct CommStats {
  int64_t all_reduce_bytes = 0, reduce_scatter_bytes = 0, all_gather_bytes = 0, broadcast_bytes = 0;
  int64_t all_to_all_bytes = 0;
  int64_t calls = 0;
  int64_t total() const {
    return all_reduce_bytes + reduce_scatter_bytes + all_gather_bytes + broadcast_bytes + all_to_all_bytes;
  }
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rank of this process in the world group (for messages and sub-groups).
  virtual int global_rank(int group_rank) const = 0;
  // The node that group rank `group_rank` runs on: the world's nodes are
  // numbered 0, 1, ... in the order of their lowest world rank. Ranks share
  // a node when they could share memory: one kernel, PID namespace and
  // network namespace (Note [One node] in comm/shm.cpp; tools/netns-cluster.sh
  // emulates nodes as network namespaces). Learnt once, as the world is
  // joined; asking is not a collective.
  virtual int node(int group_rank) const = 0;
  // How many nodes this group's ranks run on (1: every rank on this one).
  virtual int nodes() const = 0;
  // How this group's CPU collectives travel: "local" (a group of one),
  // "shm" (every rank on this host: one shared-memory segment) or "gloo"
  // (TCP). ZERO_HOST_TRANSPORT chooses; see README "Launching".
  virtual std::string host_transport() const = 0;

  // All collectives are issued in the same order on every rank of the group.
  // The *_async forms run on the group's communication thread (CPU) or
  // stream (CUDA) and return at once.
  virtual WorkHandle all_reduce_async(at::Tensor tensor, ReduceOp op = ReduceOp::Sum) = 0;
  virtual WorkHandle reduce_scatter_async(at::Tensor output, at::Tensor input, ReduceOp op = ReduceOp::Sum) = 0;
  virtual WorkHandle all_gather_async(at::Tensor output, at::Tensor input) = 0;
  virtual WorkHandle broadcast_async(at::Tensor tensor, int root) = 0;
  // Equal chunks both ways: input and output hold `size()` chunks of one
  // length; chunk q of the input goes to rank q, and chunk p of the output
  // comes from rank p (torch.distributed's all_to_all_single without splits).
  virtual WorkHandle all_to_all_async(at::Tensor output, at::Tensor input) = 0;

  void all_reduce(at::Tensor tensor, ReduceOp op = ReduceOp::Sum) { all_reduce_async(tensor, op)->wait(); }
  void reduce_scatter(at::Tensor output, at::Tensor input, ReduceOp op = ReduceOp::Sum) {
    reduce_scatter_async(output, input, op)->wait();
  }
  void all_gather(at::Tensor output, at::Tensor input) { all_gather_async(output, input)->wait(); }
  void broadcast(at::Tensor tensor, int root) { broadcast_async(tensor, root)->wait(); }
  void all_to_all(at::Tensor output, at::Tensor input) { all_to_all_async(output, input)->wait(); }
  virtual void barrier() = 0;

  // Bytes sent by this rank so far on this group (see CommStats).
  virtual CommStats stats() const = 0;

  // A group of some ranks of this one (ranks as numbered in this group).
  // Every rank of this group must call it with the same list, in the same
  // order relative to other new_group calls; ranks not in the list get nullptr.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;
};

// Joins the job described by the environment (see LaunchInfo) and returns
// the world group. With no launch variables this is a group of one. While
// a world joined this way is alive, calling it again returns that world
// (options ignored), as torch.distributed's default group is reused.
std::shared_ptr<ProcessGroup> init_process_group(const GroupOptions& options = {});
std::shared_ptr<ProcessGroup> init_process_group(const LaunchInfo& launch, const GroupOptions& options = {});

// Whether this build has the NCCL backend.
bool nccl_available();

// Agreement after work each rank does on its own (a checkpoint's files):
// every rank gives its error message, empty when its part went well, and
// learns the others'. Returns, on every rank, "" when every rank succeeded;
// else one message for all ranks to raise: this rank's own when it alone
// failed, otherwise `what` followed by each failed rank's message (the
// first 2 kB of each).
std::string agreed_error(ProcessGroup& pg, const std::string& my_error, const std::string& what);

// Agreement on what must be the same on every rank (a config, a model):
// `facts` are (key, value) pairs in an order every rank shares. The ranks
// compare one 64-bit digest; only when it differs do they exchange the
// facts. Returns, on every rank, "" when all ranks hold the same facts, else
// the same message naming the first key that differs, its value on each
// rank, and how many keys differ.
using Facts = std::vector<std::pair<std::string, std::string>>;
std::string disagreement(ProcessGroup& pg, const Facts& facts);

// ---- comms logger (DeepSpeed's comms_logger) ----
// Every collective of every group of this process, by kind and message
// size: how many, the bytes this rank sent, the latency and the bandwidth.
// Off until configure_comms_logger turns it on (the engine does, from the
// ds_config's "comms_logger"). CPU collectives are timed on the
// communication thread, from the start of the collective to its end; CUDA
// collectives on NCCL are timed as DeepSpeed times them, with the device
// synchronized before and after (so the logger serializes them while on).
struct CommsLoggerOptions {
  bool enabled = false;
  bool verbose = false;               // one log line per collective (global rank 0)
  bool prof_all = true;               // every kind; else only prof_ops
  std::vector<std::string> prof_ops;  // "all_reduce", "all_gather", "reduce_scatter", "broadcast"
};
void configure_comms_logger(const CommsLoggerOptions& options);

// One kind of collective at one message size. The message is the whole
// buffer: all-reduce's tensor, all-gather's output, reduce-scatter's input,
// broadcast's tensor. Bandwidths as nccl-tests defines them, per call:
// algbw = message / latency; busbw = algbw x 2(n-1)/n (all-reduce),
// x (n-1)/n (all-gather, reduce-scatter), x 1 (broadcast).
struct CommOpSummary {
  std::string op;
  int64_t message_bytes = 0;
  int64_t count = 0;
  int64_t sent_bytes = 0;  // this rank's ring share, as CommStats counts it
  double latency_s = 0;    // summed over the calls
  double algbw_gbps_sum = 0, busbw_gbps_sum = 0;  // summed over the calls (averages: / count)
};
// Sorted by kind, then message size.
std::vector<CommOpSummary> comms_log();
void reset_comms_log();
// The log as DeepSpeed's comms summary prints it (a table per kind).
std::string comms_summary();

}  // namespace zero::comm
