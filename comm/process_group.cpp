// ProcessGroup: routes each collective to the host backend (CPU tensors,
// and CUDA tensors staged through host memory) or the NCCL backend.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "comm/exit_on_error.h"
#include "comm/internal.h"
#include "core/env.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::comm {
namespace {
std::atomic<bool> g_exiting_on_error{false};
}  // namespace

void exiting_on_error() { g_exiting_on_error.store(true); }
bool is_exiting_on_error() { return g_exiting_on_error.load(); }

namespace {

// What the whole job shares: the store and the heartbeats. Its destructor
// is the clean goodbye of Note [Missing rank].
struct World {
  LaunchInfo launch;
  StorePtr store;
  std::shared_ptr<HealthMonitor> health;
  std::chrono::milliseconds timeout;
  std::vector<int> node_of;  // by world rank (Group::find_nodes)
  ~World() {
    if (health) health->shutdown(is_exiting_on_error() ? std::chrono::milliseconds(0) : timeout);
  }
};

class HostWork : public Work {
 public:
  HostWork(std::future<void> done, std::function<void()> finish)
      : done_(done.share()), finish_(std::move(finish)) {}
  void wait() override {
    if (waited_) return;
    done_.get();  // rethrows the collective's CommError
    if (finish_) finish_();
    waited_ = true;
  }
  bool is_completed() override {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }

 private:
  std::shared_future<void> done_;
  std::function<void()> finish_;
  bool waited_ = false;
};

// Host copy of a CUDA tensor for the gloo path; pinned when CUDA is usable.
at::Tensor host_buffer(const at::Tensor& t, bool copy) {
  auto options = t.options().device(at::kCPU);
  if (t.is_cuda()) options = options.pinned_memory(true);
  at::Tensor host = at::empty(t.sizes(), options);
  if (copy) host.copy_(t);
  return host;
}

class Group : public ProcessGroup {
 public:
  Group(GroupInfo info, std::shared_ptr<World> world, CudaBackend cuda)
      : world_(std::move(world)), info_(std::move(info)), cuda_(cuda) {
    if (info_.size == 1) {
      host_ = make_local_backend();
    } else {
      host_ = make_shm_backend(info_);
      if (!host_) host_ = make_gloo_backend(info_);
    }
    log::debug("comm", where(info_) + ": host collectives of " + info_.name + " over " + host_->transport());
  }

  int rank() const override { return info_.rank; }
  int size() const override { return info_.size; }
  int global_rank(int group_rank) const override { return info_.global_ranks.at(group_rank); }
  int node(int group_rank) const override { return world_->node_of.at(info_.global_ranks.at(group_rank)); }
  int nodes() const override {
    std::vector<int> seen;
    for (int r : info_.global_ranks) seen.push_back(world_->node_of.at(r));
    std::sort(seen.begin(), seen.end());
    return static_cast<int>(std::unique(seen.begin(), seen.end()) - seen.begin());
  }

  // The world's node of each rank (Note [One node] in shm.cpp): a hash of
  // every rank's node identity, gathered once as the world is joined.
  // Neither counted in stats() nor logged: it is part of joining, not the
  // job's traffic.
  void find_nodes() {
    std::vector<int>& node_of = world_->node_of;
    node_of.assign(static_cast<size_t>(info_.size), 0);
    if (info_.size == 1) return;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a
    for (unsigned char c : node_identity()) hash = (hash ^ c) * 1099511628211ull;
    at::Tensor mine = at::full({1}, static_cast<int64_t>(hash), at::kLong);
    at::Tensor all = at::empty({info_.size}, at::kLong);
    thread_.submit([&] { host_->all_gather(all, mine); }).get();
    std::vector<int64_t> ids;
    for (int r = 0; r < info_.size; ++r) {
      const int64_t id = all[r].item<int64_t>();
      const auto it = std::find(ids.begin(), ids.end(), id);
      node_of[static_cast<size_t>(r)] = static_cast<int>(it - ids.begin());
      if (it == ids.end()) ids.push_back(id);
    }
    log::debug("comm", where(info_) + ": " + std::to_string(info_.size) + " ranks on " + std::to_string(ids.size()) +
                           " node(s); this one is node " + std::to_string(node_of[static_cast<size_t>(info_.rank)]));
  }
  std::string host_transport() const override { return host_->transport(); }

  CommStats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

  WorkHandle all_reduce_async(at::Tensor t, ReduceOp op) override {
    check_tensor("all_reduce", t);
    const LoggedOp logged = counted("all_reduce", &CommStats::all_reduce_bytes, t.nbytes(), 2 * ring_share(t.nbytes()));
    if (auto* device = device_backend(t)) return timed_device(logged, [&] { return device->all_reduce(t, op); });
    at::Tensor h = t.is_cuda() ? host_buffer(t, true) : t;
    return host_work(logged, [this, h, op]() mutable { host_->all_reduce(h, op); }, t, h);
  }

  WorkHandle reduce_scatter_async(at::Tensor out, at::Tensor in, ReduceOp op) override {
    check_reduce_scatter(info_, out, in);
    const LoggedOp logged =
        counted("reduce_scatter", &CommStats::reduce_scatter_bytes, in.nbytes(), ring_share(in.nbytes()));
    if (auto* device = device_backend(out)) return timed_device(logged, [&] { return device->reduce_scatter(out, in, op); });
    at::Tensor hin = in.is_cuda() ? host_buffer(in, true) : in;
    at::Tensor hout = out.is_cuda() ? host_buffer(out, false) : out;
    return host_work(logged, [this, hout, hin, op]() mutable { host_->reduce_scatter(hout, hin, op); }, out, hout);
  }

  WorkHandle all_gather_async(at::Tensor out, at::Tensor in) override {
    check_all_gather(info_, out, in);
    const LoggedOp logged = counted("all_gather", &CommStats::all_gather_bytes, out.nbytes(), ring_share(out.nbytes()));
    if (auto* device = device_backend(out)) return timed_device(logged, [&] { return device->all_gather(out, in); });
    at::Tensor hin = in.is_cuda() ? host_buffer(in, true) : in;
    at::Tensor hout = out.is_cuda() ? host_buffer(out, false) : out;
    return host_work(logged, [this, hout, hin]() mutable { host_->all_gather(hout, hin); }, out, hout);
  }

  WorkHandle broadcast_async(at::Tensor t, int root) override {
    check_tensor("broadcast", t);
    if (root < 0 || root >= info_.size) {
      throw CommError(where(info_) + ": broadcast root " + std::to_string(root) + " is not a rank of a group of " +
                      std::to_string(info_.size));
    }
    const LoggedOp logged = counted("broadcast", &CommStats::broadcast_bytes, t.nbytes(),
                                    info_.rank == root && info_.size > 1 ? static_cast<int64_t>(t.nbytes()) : 0);
    if (auto* device = device_backend(t)) return timed_device(logged, [&] { return device->broadcast(t, root); });
    at::Tensor h = t.is_cuda() ? host_buffer(t, true) : t;
    return host_work(logged, [this, h, root]() mutable { host_->broadcast(h, root); }, t, h);
  }

  WorkHandle all_to_all_async(at::Tensor out, at::Tensor in) override {
    check_all_to_all(info_, out, in);
    const LoggedOp logged = counted("all_to_all", &CommStats::all_to_all_bytes, in.nbytes(), ring_share(in.nbytes()));
    if (auto* device = device_backend(out)) return timed_device(logged, [&] { return device->all_to_all(out, in); });
    at::Tensor hin = in.is_cuda() ? host_buffer(in, true) : in;
    at::Tensor hout = out.is_cuda() ? host_buffer(out, false) : out;
    return host_work(logged, [this, hout, hin]() mutable { host_->all_to_all(hout, hin); }, out, hout);
  }

  void barrier() override { thread_.submit([this] { host_->barrier(); }).get(); }

  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    std::vector<int> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
        sorted.back() >= info_.size) {
      throw CommError(where(info_) + ": new_group needs distinct ranks in [0, " + std::to_string(info_.size) + ")");
    }
    // Named after the parent and a per-parent counter, identical on every rank.
    const std::string name = info_.name + "." + std::to_string(++subgroups_);
    auto it = std::find(ranks.begin(), ranks.end(), info_.rank);
    if (it == ranks.end()) return nullptr;
    GroupInfo sub;
    sub.name = name;
    sub.rank = static_cast<int>(it - ranks.begin());
    sub.size = static_cast<int>(ranks.size());
    for (int r : ranks) sub.global_ranks.push_back(info_.global_ranks[r]);
    sub.timeout = info_.timeout;
    sub.health = info_.health;
    if (world_->store) {
      sub.store = c10::make_intrusive<c10d::PrefixStore>("zero/" + name, world_->store);
      wait_for_ranks(*sub.store, "arrive/", sub.rank, sub.size, sub.global_ranks, sub.timeout);
    }
    return std::make_shared<Group>(std::move(sub), world_, cuda_);
  }

 private:
  int64_t ring_share(size_t bytes) const {
    return static_cast<int64_t>(bytes) * (info_.size - 1) / info_.size;
  }
  // Counts the bytes in CommStats; asks the comms logger whether it logs this one.
  LoggedOp counted(const char* op, int64_t CommStats::*field, size_t message_bytes, int64_t sent_bytes) {
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.*field += sent_bytes;
      ++stats_.calls;
    }
    return log_op(op, static_cast<int64_t>(message_bytes), sent_bytes, info_.size, info_.global_ranks.at(info_.rank));
  }

  // A logged NCCL collective, timed as DeepSpeed's comms logger times one:
  // the device synchronized before (earlier work does not count) and after.
  static WorkHandle timed_device(const LoggedOp& logged, const std::function<WorkHandle()>& issue) {
    if (!logged) return issue();
    torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    WorkHandle work = issue();
    work->wait();
    torch::cuda::synchronize();
    logged.record(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return work;
  }

  // The NCCL backend for CUDA tensors, created on first use; null means
  // "use the host path".
  DeviceBackend* device_backend(const at::Tensor& t) {
    if (!t.is_cuda() || cuda_ != CudaBackend::Nccl) return nullptr;
    std::lock_guard<std::mutex> lock(device_mu_);
    if (!device_) {
      device_ = make_nccl_backend(info_, t.device().index());
      if (!device_) throw CommError("this build of zero has no NCCL backend; set ZERO_CUDA_BACKEND=gloo");
    }
    return device_.get();
  }

  // Runs `op` on the comm thread; for staged CUDA tensors copies the host
  // result back into `target` on the waiting thread (its current stream).
  // A logged one is timed there, from the start of the collective to its end.
  WorkHandle host_work(const LoggedOp& logged, std::function<void()> op, const at::Tensor& target,
                       const at::Tensor& host) {
    if (logged) {
      op = [logged, op = std::move(op)] {
        const auto start = std::chrono::steady_clock::now();
        op();
        logged.record(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      };
    }
    std::function<void()> finish;
    if (target.is_cuda()) {
      finish = [target, host]() mutable { target.copy_(host); };
    }
    return std::make_shared<HostWork>(thread_.submit(std::move(op)), std::move(finish));
  }

  // Declared first so that they are destroyed last: the comm thread stops
  // before the backends it uses, and the world says goodbye at the very end.
  std::shared_ptr<World> world_;
  GroupInfo info_;
  CudaBackend cuda_;
  std::unique_ptr<HostBackend> host_;
  std::mutex device_mu_;
  std::unique_ptr<DeviceBackend> device_;
  int subgroups_ = 0;
  mutable std::mutex stats_mu_;
  CommStats stats_;
  CommThread thread_;
};

CudaBackend choose_cuda_backend(const GroupOptions& options) {
  std::string name = options.cuda_backend.empty() ? env::cuda_backend() : options.cuda_backend;
  if (name == "gloo") return CudaBackend::Gloo;
  if (name != "nccl") {
    throw CommError("unknown CUDA communication backend '" + name + "' (from " +
                    (options.cuda_backend.empty() ? "ZERO_CUDA_BACKEND" : "GroupOptions::cuda_backend") +
                    "); use \"nccl\" or \"gloo\"");
  }
  if (!nccl_available()) {
    log::debug("comm", "built without NCCL: CUDA tensors go through gloo via host memory");
    return CudaBackend::Gloo;
  }
  return CudaBackend::Nccl;
}

// A write to a peer that has gone away must become a CommError that names
// the rank (the health monitor's diagnosis), not kill this process: gloo's
// TCP pairs and the store write to sockets without MSG_NOSIGNAL. A handler
// the program installed itself is left alone.
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

}  // namespace

// The world joined from the environment, shared while anyone holds it: a
// second init_process_group() (zero::initialize after the program's own)
// returns it instead of starting the rendezvous store on MASTER_PORT again.
std::mutex g_env_world_mutex;
std::weak_ptr<ProcessGroup> g_env_world;

std::shared_ptr<ProcessGroup> init_process_group(const GroupOptions& options) {
  std::lock_guard<std::mutex> lock(g_env_world_mutex);
  if (auto world = g_env_world.lock()) {
    log::debug("comm", "init_process_group: the world joined earlier is still alive; it is returned (its options stay)");
    return world;
  }
  const LaunchInfo launch = LaunchInfo::from_env();
  if (launch.source == "single") {  // started without a launcher: say so once, and how to start more
    static std::once_flag said;
    std::call_once(said, [] {
      log::info("comm", "no launcher's environment (RANK and WORLD_SIZE, mpirun's or srun's): running as 1 rank; "
                        "start N ranks with zero-run --nproc N PROGRAM");
    });
  }
  auto world = init_process_group(launch, options);
  g_env_world = world;
  return world;
}

// ZERO_COMM_TIMEOUT in seconds: a whole number from 1 to a week, or unset
// (300). Anything else is an error here rather than a default taken
// silently, or a timeout c10d reaches at once (core/env.h parses it).
static std::chrono::milliseconds comm_timeout_from_env() {
  const env::Number seconds = env::comm_timeout_s();
  if (!seconds.error.empty()) throw CommError(seconds.error);
  return std::chrono::milliseconds(seconds.value * 1000);
}

std::shared_ptr<ProcessGroup> init_process_group(const LaunchInfo& launch, const GroupOptions& options) {
  auto world = std::make_shared<World>();
  world->launch = launch;
  world->timeout = options.timeout.count() > 0 ? options.timeout : comm_timeout_from_env();
  log::set_rank(launch.rank);
  const CudaBackend cuda = choose_cuda_backend(options);

  GroupInfo info;
  info.name = "world";
  info.rank = launch.rank;
  info.size = launch.world_size;
  for (int r = 0; r < launch.world_size; ++r) info.global_ranks.push_back(r);
  info.timeout = world->timeout;
  if (launch.world_size > 1) {
    ignore_sigpipe();
    // Note [A store that never answers]: the rendezvous's own errors come at
    // world->timeout; the watchdog only ends a call that never returns.
    StoreWatchdog watchdog(launch, world->timeout + std::chrono::seconds(10));
    world->store = connect_store(launch, world->timeout);
    world->health = std::make_shared<HealthMonitor>(connect_store(launch, world->timeout, /*client_only=*/true),
                                                    launch.rank, launch.world_size);
    info.health = world->health;
    info.store = c10::make_intrusive<c10d::PrefixStore>("zero/world", world->store);
    wait_for_ranks(*info.store, "arrive/", launch.rank, launch.world_size, info.global_ranks, world->timeout);
  }
  log::debug("comm", "joined: " + launch.describe());
  auto group = std::make_shared<Group>(std::move(info), std::move(world), cuda);
  group->find_nodes();
  return group;
}

}  // namespace zero::comm
