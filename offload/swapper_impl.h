#pragma once
// Internal to the NVMe swapper (swapper.h): its state, whose methods are in
// two files: swapper.cpp (the tickets: what is asked of each key, in which
// order, and the waiting for it) and swapper_ring.cpp (their chunks through
// io_uring, Note [Swapper requests]). Torch-free.
#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "offload/aligned_buffer.h"
#include "offload/swap_folder.h"
#include "offload/swapper.h"
#include "zero/error.h"

namespace zero::offload {

struct NvmeSwapper::Impl {
  enum class Op { Write, Read };

  struct Ticket {
    SwapTicket id = 0;
    Op op = Op::Write;
    std::string key, path;
    char* data = nullptr;  // the caller's memory
    size_t bytes = 0;      // logical size
    int fd = -1;
    bool started = false;  // file opened, chunks may go out
    bool finished = false;
    size_t next = 0;       // logical offset of the next chunk to issue
    int inflight = 0;      // chunks in flight
    std::string error;     // first failure; set: no more chunks go out
    std::string cause;     // the same without the "writing key ..." prefix
  };

  struct Slot {
    Ticket* ticket = nullptr;  // null: free
    char* buf = nullptr;       // memory the kernel reads or writes (caller's or a bounce buffer)
    size_t file_offset = 0;
    size_t len = 0;            // bytes asked of the kernel (a multiple of kAlign)
    size_t done = 0;           // bytes the kernel reported so far (short transfers)
    int bounce = -1;           // bounce buffer index, -1 when in place
    char* user = nullptr;      // caller's memory of this chunk (copy target of a bounced read)
    size_t user_len = 0;
    int retries = 0;
  };

  struct KeyState {
    size_t bytes = 0;          // logical size of the last write
    SwapTicket last_write = 0;
    std::string failure;       // non-empty: the last write failed
  };

  static constexpr size_t kAlign = kIoAlignment;
  static constexpr int kMaxRetries = 100;  // -EAGAIN / -EINTR resubmissions of one request
  static constexpr const char* kLogSubsystem = "offload";

  static size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  static size_t round_down(size_t n) { return n / kAlign * kAlign; }
  static std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }
  [[noreturn]] static void fail(const std::string& message) { throw OffloadError("NVMe swapper: " + message); }

  SwapOptions opt;
  size_t block = 0;
  std::unique_ptr<SwapFolder> folder;  // reset last (shutdown): the kernel may still use its files
  bool direct = true;
  io_uring ring{};
  bool ring_ok = false;
  std::vector<Slot> slots;
  std::vector<int> free_slots;
  std::vector<char*> bounce;
  std::vector<int> free_bounce;
  bool leak_memory = false;  // requests never completed: the kernel may still use the bounce buffers
  int inflight = 0;
  std::map<SwapTicket, std::unique_ptr<Ticket>> tickets;  // not yet waited on, in issue order
  std::unordered_map<std::string, KeyState> keys;
  SwapTicket next_id = 1;
  uint64_t written_bytes = 0, read_bytes = 0;  // logical bytes of finished tickets

  // Note [Swapper progress]: the caller's calls and the progress thread
  // take `mu` around everything above.
  std::mutex mu;
  int completions_fd = -1;  // eventfd the kernel signals at each completion
  int wake_fd = -1;         // eventfd that wakes the progress thread: new work, or stop
  bool stopping = false;
  std::thread progress_thread;

  // ---- swapper.cpp -------------------------------------------------------
  explicit Impl(SwapOptions o);
  ~Impl() { shutdown(); }
  void validate_options();
  void shutdown() noexcept;  // also after a failed construction
  Ticket& add_ticket(Op op, const std::string& key, std::string path, char* data, size_t bytes);
  SwapTicket write(const std::string& key, const void* data, size_t bytes);
  SwapTicket read(const std::string& key, void* data, size_t bytes);
  bool blocked(const Ticket& t) const;
  std::string describe(const Ticket& t) const;
  void set_error(Ticket& t, const std::string& message);
  void start(Ticket& t);
  void pump();
  void maybe_finish(Ticket& t);
  void progress();
  template <class Pred>
  void wait_until(Pred done);
  void wait(SwapTicket id);
  void wait_all();
  void remove(const std::string& key);
  void start_progress_thread();
  void stop_progress_thread() noexcept;
  void run_progress() noexcept;
  void wake_progress_thread() noexcept;

  // ---- swapper_ring.cpp --------------------------------------------------
  void init_ring();
  bool issue_chunk(Ticket& t);
  void prepare(int index);
  void submit();
  void complete(uint64_t index, int res);
  bool reap(bool block);
};

}  // namespace zero::offload
