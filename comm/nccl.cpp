// Collectives on CUDA tensors through NCCL, on a communication stream that
// is ordered after the caller's compute stream with events. Compiled
// whenever the CUDA toolkit and NCCL are found (so CI links it); torch's own
// CUDA APIs (current stream, caching allocator) only when Torch has CUDA.
#include "comm/internal.h"

#if ZERO_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#if ZERO_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <list>
#include <sstream>

#include "zero/error.h"
#include "zero/log.h"
#endif

namespace zero::comm {

#if ZERO_WITH_NCCL
namespace {

void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw CommError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
}

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kByte: return ncclUint8;
    default: throw CommError(std::string("NCCL backend does not support dtype ") + c10::toString(t.scalar_type()));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

cudaStream_t current_stream(int device) {
#if ZERO_TORCH_CUDA
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
#else
  (void)device;
  return nullptr;  // the legacy default stream
#endif
}

// Keeps the caching allocator from reusing a tensor's memory while the
// communication stream may still read or write it.
void record_on_stream(const at::Tensor& t, cudaStream_t stream, int device) {
#if ZERO_TORCH_CUDA
  c10::cuda::CUDACachingAllocator::recordStream(
      t.storage().data_ptr(), c10::cuda::getStreamFromExternal(stream, static_cast<c10::DeviceIndex>(device)));
#else
  (void)t, (void)stream, (void)device;
#endif
}

struct DeviceGuard {
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous);
    cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(previous); }
  int previous = 0;
};

class NcclWork : public Work {
 public:
  NcclWork(cudaEvent_t done, int device, std::vector<at::Tensor> keep, std::shared_ptr<std::atomic<bool>> failed)
      : done_(done), device_(device), keep_(std::move(keep)), failed_(std::move(failed)) {}
  ~NcclWork() override { cudaEventDestroy(done_); }
  void wait() override {
    if (failed_->load()) throw CommError("NCCL communicator was aborted after a collective timed out (see the log)");
    DeviceGuard guard(device_);
    cuda_check(cudaStreamWaitEvent(current_stream(device_), done_, 0), "cudaStreamWaitEvent");
  }
  bool is_completed() override { return cudaEventQuery(done_) == cudaSuccess; }
  cudaEvent_t event() const { return done_; }

 private:
  cudaEvent_t done_;
  int device_;
  std::vector<at::Tensor> keep_;
  std::shared_ptr<std::atomic<bool>> failed_;
};

class NcclBackend : public DeviceBackend {
 public:
  NcclBackend(const GroupInfo& group, int device) : group_(group), device_(device) {
    DeviceGuard guard(device_);
    ncclUniqueId id;
    const std::string key = "nccl_unique_id";
    if (group_.rank == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      const auto* p = reinterpret_cast<const uint8_t*>(&id);
      group_.store->set(key, std::vector<uint8_t>(p, p + sizeof(id)));
    } else {
      group_.store->wait({key}, group_.timeout);
      const auto bytes = group_.store->get(key);
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a missing peer times out instead of hanging
    nccl_check(ncclCommInitRankConfig(&comm_, group_.size, id, group_.rank, &config), "ncclCommInitRankConfig");
    wait_ready("ncclCommInitRank");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    DeviceGuard guard(device_);
    if (!failed_->load()) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    cudaStreamDestroy(stream_);
  }

  WorkHandle all_reduce(at::Tensor t, ReduceOp op) override {
    return launch("all_reduce", {t}, [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), comm_, s);
    });
  }
  WorkHandle reduce_scatter(at::Tensor out, at::Tensor in, ReduceOp op) override {
    return launch("reduce_scatter", {out, in}, [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(out), nccl_op(op), comm_, s);
    });
  }
  WorkHandle all_gather(at::Tensor out, at::Tensor in) override {
    return launch("all_gather", {out, in}, [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in), comm_, s);
    });
  }
  // NCCL has no all-to-all call: a send and a receive per peer, in one group.
  WorkHandle all_to_all(at::Tensor out, at::Tensor in) override {
    return launch("all_to_all", {out, in}, [&](cudaStream_t s) {
      const size_t count = size_t(in.numel()) / size_t(group_.size), bytes = count * in.element_size();
      auto* send = static_cast<char*>(in.data_ptr());
      auto* recv = static_cast<char*>(out.data_ptr());
      ncclResult_t r = ncclGroupStart();
      for (int p = 0; p < group_.size && (r == ncclSuccess || r == ncclInProgress); ++p) {
        r = ncclSend(send + p * bytes, count, nccl_type(in), p, comm_, s);
        if (r == ncclSuccess || r == ncclInProgress) r = ncclRecv(recv + p * bytes, count, nccl_type(out), p, comm_, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r == ncclSuccess || r == ncclInProgress ? end : r;
    });
  }
  WorkHandle broadcast(at::Tensor t, int root) override {
    return launch("broadcast", {t}, [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), root, comm_, s);
    });
  }

 private:
  template <typename F>
  WorkHandle launch(const char* op, std::vector<at::Tensor> tensors, F&& call) {
    if (failed_->load()) throw CommError(where(group_) + ": " + op + " on an NCCL communicator that was aborted");
    if (group_.health) group_.health->entering(op, tensors.back().nbytes());  // this rank's contribution
    DeviceGuard guard(device_);
    cudaEvent_t ready = nullptr, done = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(ready, current_stream(device_)), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);
    nccl_check(call(stream_), op);
    wait_ready(op);
    cuda_check(cudaEventRecord(done, stream_), "cudaEventRecord");
    for (const auto& t : tensors) record_on_stream(t, stream_, device_);
    auto work = std::make_shared<NcclWork>(done, device_, std::move(tensors), failed_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back({work, op, std::chrono::steady_clock::now()});
    }
    return work;
  }

  void nccl_check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    throw CommError(where(group_) + ": " + what + " failed: " + ncclGetErrorString(r));
  }

  // Non-blocking communicators report progress through the async error.
  void wait_ready(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + group_.timeout;
    ncclResult_t state = ncclInProgress;
    while (true) {
      nccl_check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state != ncclInProgress) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        failed_->store(true);
        std::string why = group_.health ? group_.health->diagnose(group_.global_ranks) : "";
        throw CommError(where(group_) + ": " + what + " timed out after " +
                        std::to_string(group_.timeout.count() / 1000.0) + " s; " + why);
      }
      std::this_thread::yield();
    }
    if (state != ncclSuccess) throw CommError(where(group_) + ": " + what + ": " + ncclGetErrorString(state));
  }

  // Watchdog: a collective that has not completed within the timeout aborts
  // the communicator, which frees the kernels that wait on a missing peer.
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      const auto now = std::chrono::steady_clock::now();
      for (auto it = pending_.begin(); it != pending_.end();) {
        auto work = it->work.lock();
        if (!work || work->is_completed()) {
          it = pending_.erase(it);
          continue;
        }
        if (now - it->started > group_.timeout && !failed_->load()) {
          failed_->store(true);
          ncclCommAbort(comm_);
          std::string why = group_.health ? group_.health->diagnose(group_.global_ranks) : "";
          log::error("comm", where(group_) + ": NCCL " + it->op + " did not complete within " +
                                 std::to_string(group_.timeout.count() / 1000.0) + " s; communicator aborted. " + why);
        }
        ++it;
      }
    }
  }

  struct Pending {
    std::weak_ptr<NcclWork> work;
    std::string op;
    std::chrono::steady_clock::time_point started;
  };

  GroupInfo group_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<std::atomic<bool>> failed_ = std::make_shared<std::atomic<bool>>(false);
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::list<Pending> pending_;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<DeviceBackend> make_nccl_backend(const GroupInfo& group, int device_index) {
  return std::make_unique<NcclBackend>(group, device_index);
}
bool nccl_available() { return true; }

#else  // !ZERO_WITH_NCCL

std::unique_ptr<DeviceBackend> make_nccl_backend(const GroupInfo&, int) { return nullptr; }
bool nccl_available() { return false; }

#endif

}  // namespace zero::comm
