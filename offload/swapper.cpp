// The NVMe swapper (swapper.h) on liburing.
//
// Note [Swapper requests]
// A ticket (one write or read of one key) is cut into chunks of at most
// block_size bytes. A chunk goes out as one io_uring request occupying one
// of queue_depth slots, so at most queue_depth requests are in flight across
// all tickets. A chunk uses the caller's memory in place when O_DIRECT allows
// it (address and length multiples of kIoAlignment; any address when the
// swapper runs buffered); otherwise (unaligned memory, the last partial
// 4 KiB of a transfer) it goes through one of buffer_count bounce buffers of
// block_size, padded with zeros to a multiple of kIoAlignment on the way
// out. Each completion is checked against the length it asked for: an error
// fails the ticket, -EAGAIN/-EINTR resubmit the request, a short transfer
// resubmits the remainder, and a read returning 0 early is an error naming
// the file. A failed ticket issues no further chunks, waits for the ones in
// flight (the kernel may still write into their memory) and then reports.
//
// Tickets on the same key start in order when one of them writes (a write
// after a read waits for the read; a read after a write waits for the
// write); tickets on different keys and reads of one key run concurrently.
#include "offload/swapper.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zero/error.h"
#include "zero/log.h"

namespace zero::offload {
namespace {

constexpr size_t kAlign = kIoAlignment;
constexpr int kMaxRetries = 100;  // -EAGAIN / -EINTR resubmissions of one request
constexpr const char* kLogSubsystem = "offload";

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
size_t round_down(size_t n) { return n / kAlign * kAlign; }

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

[[noreturn]] void fail(const std::string& message) { throw OffloadError("NVMe swapper: " + message); }

void* alloc_aligned(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kAlign, bytes) != 0) {
    fail("cannot allocate " + std::to_string(bytes) + " bytes of " + std::to_string(kAlign) +
         "-byte aligned host memory; lower block_size/buffer_count or free host memory");
  }
  return p;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// A key's file name: the key with characters outside [A-Za-z0-9._-]
// replaced by '_'; a key that changed, is empty or is long also gets a hash
// of the original so that different keys never share a file.
std::string file_name_for(const std::string& key) {
  constexpr size_t kMaxStem = 160;
  std::string stem;
  bool changed = false;
  for (char c : key) {
    const unsigned char u = static_cast<unsigned char>(c);
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || u == '.' || u == '_' ||
        u == '-') {
      stem += c;
    } else {
      stem += '_';
      changed = true;
    }
  }
  if (changed || stem.empty() || stem.size() > kMaxStem) {
    if (stem.size() > kMaxStem) stem.resize(kMaxStem);
    char hash[24];
    std::snprintf(hash, sizeof(hash), "-%016llx", static_cast<unsigned long long>(fnv1a(key)));
    stem += hash;
  }
  return stem + ".swp";
}

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

}  // namespace

// ---- AlignedBuffer ----

// Buffers of 2 MiB and more are 2 MiB aligned and asked for transparent huge
// pages: fewer page faults when filled, and O_DIRECT pins one huge page per
// request instead of up to block_size / 4 KiB small ones.
AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes), capacity_(round_up(bytes)) {
  if (capacity_ == 0) return;
  constexpr size_t kHuge = size_t(2) << 20;
  if (capacity_ >= kHuge) {
    void* p = nullptr;
    if (posix_memalign(&p, kHuge, capacity_) != 0) {
      fail("cannot allocate " + std::to_string(capacity_) + " bytes of aligned host memory; free host memory");
    }
    (void)::madvise(p, capacity_ / kHuge * kHuge, MADV_HUGEPAGE);  // a hint; fine when refused
    data_ = p;
  } else {
    data_ = alloc_aligned(capacity_);
  }
  std::memset(data_, 0, capacity_);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      capacity_(std::exchange(o.capacity_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}

// ---- NvmeSwapper ----

struct NvmeSwapper::Impl {
  SwapOptions opt;
  size_t block = 0;
  std::string folder;
  bool folder_created = false;
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
  std::unordered_map<std::string, std::string> file_owner;  // file name -> key
  SwapTicket next_id = 1;
  uint64_t written_bytes = 0, read_bytes = 0;  // logical bytes of finished tickets

  explicit Impl(SwapOptions o) : opt(std::move(o)) {
    try {
      validate_options();
      create_folder();
      probe_direct_io();
      init_ring();
    } catch (...) {
      shutdown();
      throw;
    }
  }

  ~Impl() { shutdown(); }

  // ---- construction ----

  void validate_options() {
    if (opt.block_size <= 0 || opt.block_size % static_cast<int64_t>(kAlign) != 0 || opt.block_size > (1 << 30)) {
      fail("block_size " + std::to_string(opt.block_size) + " must be a positive multiple of " +
           std::to_string(kAlign) + " up to 1 GiB (aio.block_size)");
    }
    if (opt.queue_depth < 1 || opt.queue_depth > 4096) {
      fail("queue_depth " + std::to_string(opt.queue_depth) + " must be between 1 and 4096 (aio.queue_depth)");
    }
    if (opt.buffer_count < 1 || opt.buffer_count > 4096) {
      fail("buffer_count " + std::to_string(opt.buffer_count) + " must be between 1 and 4096");
    }
    if (opt.timeout_s < 1) fail("timeout_s " + std::to_string(opt.timeout_s) + " must be at least 1 second");
    block = static_cast<size_t>(opt.block_size);
  }

  void create_folder() {
    const std::string& p = opt.nvme_path;
    if (p.empty()) fail("nvme_path is empty; set nvme_path to a directory on a fast local disk");
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      const int e = errno;
      if (e == ENOENT) fail("nvme_path " + p + " does not exist; create it or point nvme_path to an existing directory");
      fail("nvme_path " + p + " cannot be examined (" + errno_text(e) +
           "); fix its permissions or point nvme_path elsewhere");
    }
    if (!S_ISDIR(st.st_mode)) {
      fail("nvme_path " + p + " is not a directory; point nvme_path to a directory on a fast local disk");
    }
    if (::access(p.c_str(), W_OK | X_OK) != 0) {
      fail("nvme_path " + p + " is not writable (" + errno_text(errno) +
           "); make it writable for this user or point nvme_path elsewhere");
    }
    const std::string base = (p.back() == '/' ? p : p + "/") + "zero_swap_rank" + std::to_string(opt.rank) + "_" +
                             std::to_string(::getpid());
    // A second swapper of this process (or a folder left by an earlier
    // process with the same pid) takes the next free suffix; an existing
    // folder is never reused or removed.
    for (int n = 0; n < 1000; ++n) {
      const std::string candidate = n == 0 ? base : base + "_" + std::to_string(n);
      if (::mkdir(candidate.c_str(), 0700) == 0) {
        folder = candidate;
        folder_created = true;
        return;
      }
      const int e = errno;
      if (e == EEXIST) continue;
      fail("cannot create the swap folder " + candidate + " under nvme_path (" + errno_text(e) +
           "); make nvme_path writable for this user or point nvme_path elsewhere");
    }
    fail("cannot create a swap folder " + base + "_<n> under nvme_path: 1000 such folders already exist; "
         "remove stale zero_swap_* folders under nvme_path");
  }

  // Opens a probe file with O_DIRECT and writes one aligned block: a
  // filesystem that rejects either with EINVAL gets buffered I/O.
  void probe_direct_io() {
    const std::string probe = folder + "/.odirect_probe";
    int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    int e = fd < 0 ? errno : 0;
    if (fd >= 0) {
      void* buf = alloc_aligned(kAlign);
      std::memset(buf, 0, kAlign);
      const ssize_t n = ::pwrite(fd, buf, kAlign, 0);
      e = n < 0 ? errno : (n == static_cast<ssize_t>(kAlign) ? 0 : EIO);
      std::free(buf);
      ::close(fd);
    }
    ::unlink(probe.c_str());
    if (e == 0) return;
    if (e != EINVAL) {
      if (e == ENOSPC || e == EDQUOT) {
        fail("no space left on " + probe + "; free space under nvme_path (" + opt.nvme_path +
             ") or point nvme_path elsewhere");
      }
      fail("cannot write the probe file " + probe + " (" + errno_text(e) +
           "); make nvme_path writable for this user or point nvme_path elsewhere");
    }
    fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      fail("cannot create the probe file " + probe + " (" + errno_text(errno) +
           "); make nvme_path writable for this user or point nvme_path elsewhere");
    }
    ::close(fd);
    ::unlink(probe.c_str());
    direct = false;
    zero::log::warn_once("swapper.buffered:" + opt.nvme_path, kLogSubsystem,
                         "nvme_path " + opt.nvme_path +
                             " does not support O_DIRECT; the NVMe swapper falls back to buffered I/O "
                             "through the page cache (slower, uses host memory). Point nvme_path to a "
                             "filesystem with O_DIRECT (ext4, xfs) for full speed.");
  }

  void init_ring() {
    const unsigned depth = static_cast<unsigned>(opt.queue_depth);
    const int r = io_uring_queue_init(depth, &ring, 0);
    if (r < 0) {
      fail("io_uring_queue_init(" + std::to_string(depth) + ") failed (" + errno_text(-r) +
           "); io_uring may be disabled (sysctl kernel.io_uring_disabled), blocked by a seccomp profile, "
           "or limited by RLIMIT_MEMLOCK; lower queue_depth or enable io_uring");
    }
    ring_ok = true;
    slots.resize(depth);
    for (int i = static_cast<int>(depth) - 1; i >= 0; --i) free_slots.push_back(i);
    for (int64_t i = 0; i < opt.buffer_count; ++i) {
      bounce.push_back(static_cast<char*>(alloc_aligned(block)));
      free_bounce.push_back(static_cast<int>(i));
    }
  }

  // ---- destruction (also after a failed construction) ----

  void shutdown() noexcept {
    if (ring_ok) {
      // Requests not yet issued are dropped; the ones in flight are waited
      // for, since the kernel writes into their memory.
      for (auto& [id, t] : tickets) {
        if (!t->finished) set_error(*t, "cancelled: the swapper was destroyed");
      }
      try {
        wait_until([&] { return inflight == 0; });
      } catch (const std::exception& e) {
        leak_memory = true;
        zero::log::error(kLogSubsystem, std::string("NVMe swapper shutting down with requests in flight: ") +
                                            e.what());
      }
      for (auto& [id, t] : tickets) {
        if (t->fd >= 0) ::close(t->fd);
        t->fd = -1;
      }
      tickets.clear();
      io_uring_queue_exit(&ring);
      ring_ok = false;
    }
    if (!leak_memory) {
      for (char* b : bounce) std::free(b);
    }
    bounce.clear();
    if (folder_created) {
      std::error_code ec;
      std::filesystem::remove_all(folder, ec);
      if (ec) {
        zero::log::warn(kLogSubsystem, "cannot remove the swap folder " + folder + " (" + ec.message() +
                                           "); remove it by hand");
      }
      folder_created = false;
    }
  }

  // ---- requests ----

  std::string path_for(const std::string& key) {
    const std::string name = file_name_for(key);
    auto [it, inserted] = file_owner.emplace(name, key);
    if (!inserted && it->second != key) {
      fail("keys '" + it->second + "' and '" + key + "' map to the same file " + folder + "/" + name +
           "; rename one of them");
    }
    return folder + "/" + name;
  }

  Ticket& add_ticket(Op op, const std::string& key, std::string path, char* data, size_t bytes) {
    auto t = std::make_unique<Ticket>();
    t->id = next_id++;
    t->op = op;
    t->key = key;
    t->path = std::move(path);
    t->data = data;
    t->bytes = bytes;
    Ticket& ref = *t;
    tickets.emplace(ref.id, std::move(t));
    return ref;
  }

  SwapTicket write(const std::string& key, const void* data, size_t bytes) {
    if (data == nullptr && bytes > 0) fail("writing key '" + key + "' from a null pointer");
    Ticket& t = add_ticket(Op::Write, key, path_for(key), static_cast<char*>(const_cast<void*>(data)), bytes);
    KeyState& k = keys[key];
    k.bytes = bytes;
    k.last_write = t.id;
    k.failure.clear();
    const SwapTicket id = t.id;
    progress();
    return id;
  }

  SwapTicket read(const std::string& key, void* data, size_t bytes) {
    const std::string path = path_for(key);
    auto it = keys.find(key);
    if (it == keys.end()) {
      fail("reading key '" + key + "' that was never written (its file would be " + path +
           "); write the key before reading it");
    }
    if (!it->second.failure.empty()) {
      fail("reading key '" + key + "' whose last write failed (" + it->second.failure +
           "); write it again before reading it");
    }
    if (it->second.bytes != bytes) {
      fail("reading key '" + key + "' with " + std::to_string(bytes) + " bytes, but " +
           std::to_string(it->second.bytes) + " bytes were written to " + path +
           "; read it with the size it was written with");
    }
    if (data == nullptr && bytes > 0) fail("reading key '" + key + "' into a null pointer");
    const SwapTicket id = add_ticket(Op::Read, key, path, static_cast<char*>(data), bytes).id;
    progress();
    return id;
  }

  // A ticket waits while an earlier unfinished ticket on its key conflicts
  // with it (either of them writes). See Note [Swapper requests].
  bool blocked(const Ticket& t) const {
    for (const auto& [id, u] : tickets) {
      if (id >= t.id) break;
      if (!u->finished && u->key == t.key && (t.op == Op::Write || u->op == Op::Write)) return true;
    }
    return false;
  }

  std::string describe(const Ticket& t) const {
    return std::string(t.op == Op::Write ? "writing" : "reading") + " key '" + t.key + "' (" +
           std::to_string(t.bytes) + " bytes): ";
  }

  void set_error(Ticket& t, const std::string& message) {
    if (!t.error.empty()) return;
    t.error = "NVMe swapper: " + describe(t) + message;
    t.cause = message;
  }

  void start(Ticket& t) {
    t.started = true;
    const size_t padded = round_up(t.bytes);
    const int flags = (t.op == Op::Write ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC | (direct ? O_DIRECT : 0);
    t.fd = ::open(t.path.c_str(), flags, 0600);
    if (t.fd < 0) {
      const int e = errno;
      if (t.op == Op::Read && e == ENOENT) {
        set_error(t, "the file " + t.path + " is gone (removed outside the swapper); write the key again");
      } else if (e == ENOSPC || e == EDQUOT) {
        set_error(t, "no space left on " + t.path + "; free space under nvme_path (" + opt.nvme_path +
                         ") or point nvme_path elsewhere");
      } else {
        set_error(t, "cannot open " + t.path + " (" + errno_text(e) +
                         "); check nvme_path's permissions and the open-file limit (ulimit -n)");
      }
      return;
    }
    struct stat st {};
    if (::fstat(t.fd, &st) != 0) {
      set_error(t, "cannot stat " + t.path + " (" + errno_text(errno) + ")");
      return;
    }
    const size_t size = static_cast<size_t>(st.st_size);
    if (t.op == Op::Write && size > padded && ::ftruncate(t.fd, static_cast<off_t>(padded)) != 0) {
      set_error(t, "cannot truncate " + t.path + " to " + std::to_string(padded) + " bytes (" +
                       errno_text(errno) + ")");
    }
    // Note [Preallocation]: O_DIRECT writes past the end of a file are
    // extending writes, which ext4/xfs serialise on the inode and io_uring
    // cannot issue without blocking; allocating the file's length first
    // makes them plain writes into allocated blocks, as fio (fallocate=native
    // by default) does. Only a hint: when it fails (no support, no space,
    // the file-size limit) the writes themselves report the error.
    if (t.op == Op::Write && size < padded) {
      (void)::fallocate(t.fd, 0, 0, static_cast<off_t>(padded));
    }
    if (t.op == Op::Read && size < padded) {
      set_error(t, "the file " + t.path + " holds " + std::to_string(size) + " bytes, fewer than the " +
                       std::to_string(padded) +
                       " written (padded); it was truncated outside the swapper; write the key again");
    }
  }

  // Issues the next chunk of `t` into a free slot; false when it needs a
  // bounce buffer and none is free.
  bool issue_chunk(Ticket& t) {
    const size_t offset = t.next;
    size_t len = std::min(block, t.bytes - offset);
    char* user = t.data + offset;
    const bool aligned_address = !direct || reinterpret_cast<uintptr_t>(user) % kAlign == 0;
    const bool in_place = aligned_address && len >= kAlign;
    int b = -1;
    if (in_place) {
      len = round_down(len);  // the partial tail goes through a bounce buffer as its own chunk
    } else {
      if (free_bounce.empty()) return false;
      b = free_bounce.back();
      free_bounce.pop_back();
    }
    const int index = free_slots.back();
    free_slots.pop_back();
    Slot& s = slots[index];
    s.ticket = &t;
    s.file_offset = offset;
    s.user = user;
    s.user_len = len;
    s.done = 0;
    s.retries = 0;
    s.bounce = b;
    if (in_place) {
      s.buf = user;
      s.len = len;
    } else {
      s.buf = bounce[b];
      s.len = round_up(len);
      if (t.op == Op::Write) {
        std::memcpy(s.buf, user, len);
        std::memset(s.buf + len, 0, s.len - len);
      }
    }
    t.next += len;
    ++t.inflight;
    ++inflight;
    prepare(index);
    return true;
  }

  void prepare(int index) {
    Slot& s = slots[index];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) {
      submit();
      sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) fail("internal error: no free io_uring submission entry");
    }
    const unsigned n = static_cast<unsigned>(s.len - s.done);
    const uint64_t off = s.file_offset + s.done;
    if (s.ticket->op == Op::Write) {
      io_uring_prep_write(sqe, s.ticket->fd, s.buf + s.done, n, off);
    } else {
      io_uring_prep_read(sqe, s.ticket->fd, s.buf + s.done, n, off);
    }
    io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(index));
  }

  void submit() {
    int busy = 0;
    while (io_uring_sq_ready(&ring) > 0) {
      const int r = io_uring_submit(&ring);
      if (r > 0) continue;
      if (r == 0) break;
      if (r == -EINTR) continue;
      if ((r == -EAGAIN || r == -EBUSY) && ++busy < kMaxRetries) {
        reap(false);
        continue;
      }
      fail("io_uring_submit failed (" + errno_text(-r) + ") with " + std::to_string(inflight) +
           " requests in flight under " + folder);
    }
  }

  // Starts tickets and issues chunks while slots (and bounce buffers) last.
  void pump() {
    for (auto& [id, tp] : tickets) {
      if (free_slots.empty()) break;
      Ticket& t = *tp;
      if (t.finished) continue;
      if (!t.started && t.error.empty()) {
        if (blocked(t)) continue;
        start(t);
      }
      while (t.started && t.error.empty() && t.next < t.bytes && !free_slots.empty()) {
        if (!issue_chunk(t)) break;
      }
      maybe_finish(t);
    }
  }

  void maybe_finish(Ticket& t) {
    if (t.finished || t.inflight > 0) return;
    if (t.error.empty() && !(t.started && t.next == t.bytes)) return;
    t.finished = true;
    // A failed write leaves no partial file taking space (a full disk may
    // recover once the caller frees or rewrites something).
    if (t.fd >= 0 && t.op == Op::Write && !t.error.empty()) (void)::ftruncate(t.fd, 0);
    if (t.fd >= 0) ::close(t.fd);
    t.fd = -1;
    if (t.error.empty()) {
      (t.op == Op::Write ? written_bytes : read_bytes) += t.bytes;
    } else if (t.op == Op::Write) {
      auto it = keys.find(t.key);
      if (it != keys.end() && it->second.last_write == t.id) it->second.failure = t.cause;
    }
  }

  std::string errno_message(int e, const Ticket& t, const Slot& s) const {
    const std::string where = " at offset " + std::to_string(s.file_offset + s.done) + " (" +
                              std::to_string(s.len - s.done) + " bytes)";
    switch (e) {
      case ENOSPC:
        return "no space left on " + t.path + "; free space under nvme_path (" + opt.nvme_path +
               ") or point nvme_path elsewhere";
      case EDQUOT:
        return "disk quota exceeded on " + t.path + "; free space under nvme_path (" + opt.nvme_path +
               ") or point nvme_path elsewhere";
      case EFBIG:
        return "file too large: " + t.path + " cannot grow to " + std::to_string(round_up(t.bytes)) +
               " bytes (EFBIG: the process's file-size limit, ulimit -f, or the filesystem's maximum file "
               "size); raise the limit or point nvme_path to another filesystem";
      case EIO:
        return "I/O error (EIO) on " + t.path + where +
               "; the device under nvme_path may be failing (check dmesg) or point nvme_path elsewhere";
      case EINVAL:
        return "invalid argument (EINVAL) on " + t.path + where +
               (direct ? "; the filesystem rejected an O_DIRECT request (needs 4096-byte aligned memory, "
                         "offsets and lengths)"
                       : "");
      default:
        return std::string(t.op == Op::Write ? "write to " : "read from ") + t.path + where + " failed (" +
               errno_text(e) + ")";
    }
  }

  // One completion; see Note [Swapper requests].
  void complete(uint64_t index, int res) {
    if (index >= slots.size() || slots[index].ticket == nullptr) {
      fail("internal error: a completion for unknown request " + std::to_string(index));
    }
    Slot& s = slots[index];
    Ticket& t = *s.ticket;
    const size_t asked = s.len - s.done;
    if (res < 0) {
      const int e = -res;
      if ((e == EAGAIN || e == EINTR) && ++s.retries <= kMaxRetries) {
        prepare(static_cast<int>(index));
        return;
      }
      set_error(t, errno_message(e, t, s));
    } else if (res == 0) {
      if (t.op == Op::Read) {
        set_error(t, "unexpected end of file " + t.path + " at offset " + std::to_string(s.file_offset + s.done) +
                         " (read " + std::to_string(s.done) + " of " + std::to_string(s.len) +
                         " bytes of this request); the file was truncated outside the swapper; write the key again");
      } else {
        set_error(t, "short write to " + t.path + ": 0 of " + std::to_string(asked) + " bytes written at offset " +
                         std::to_string(s.file_offset + s.done) + "; check free space and the device under nvme_path");
      }
    } else if (static_cast<size_t>(res) > asked) {
      set_error(t, "the kernel reported " + std::to_string(res) + " bytes for a request of " + std::to_string(asked) +
                       " bytes on " + t.path);
    } else {
      s.done += static_cast<size_t>(res);
      if (s.done < s.len) {  // short read or write: resubmit the remainder
        prepare(static_cast<int>(index));
        return;
      }
      if (t.op == Op::Read && s.bounce >= 0) std::memcpy(s.user, s.buf, s.user_len);
    }
    if (s.bounce >= 0) free_bounce.push_back(s.bounce);
    s = Slot{};
    free_slots.push_back(static_cast<int>(index));
    --t.inflight;
    --inflight;
    maybe_finish(t);
  }

  // Handles the completions there are; with `block`, first submits what is
  // prepared and waits up to one second for a completion (one system call).
  // Returns whether any completion was handled.
  bool reap(bool block) {
    io_uring_cqe* cqe = nullptr;
    if (block) {
      __kernel_timespec ts{};
      ts.tv_sec = 1;
      const int r = io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, nullptr);
      if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        fail("waiting for io_uring completions failed (" + errno_text(-r) + ") under " + folder);
      }
    }
    bool any = false;
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
      const uint64_t index = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      complete(index, res);
      any = true;
    }
    return any;
  }

  void progress() {
    pump();
    submit();
    if (inflight > 0 && reap(false)) {
      pump();
      submit();
    }
  }

  template <class Pred>
  void wait_until(Pred done) {
    using clock = std::chrono::steady_clock;
    auto last = clock::now();
    while (true) {
      pump();
      if (done()) {
        submit();
        return;
      }
      if (inflight == 0) fail("internal error: nothing in flight but requests are not done under " + folder);
      if (reap(true)) {
        last = clock::now();
      } else if (clock::now() - last > std::chrono::seconds(opt.timeout_s)) {
        std::set<std::string> files;
        for (const Slot& s : slots) {
          if (s.ticket) files.insert(s.ticket->path);
        }
        std::string list;
        for (const auto& f : files) list += (list.empty() ? "" : ", ") + f;
        fail("no I/O completion for " + std::to_string(opt.timeout_s) + " s with " + std::to_string(inflight) +
             " requests in flight on " + list +
             "; the device under nvme_path may be stalled or failing (check dmesg)");
      }
    }
  }

  void wait(SwapTicket id) {
    if (id == 0 || id >= next_id) fail("waiting on ticket " + std::to_string(id) + ", which this swapper never issued");
    auto it = tickets.find(id);
    if (it == tickets.end()) return;  // already waited on
    Ticket* t = it->second.get();
    wait_until([t] { return t->finished; });
    const std::string error = t->error;
    tickets.erase(id);
    if (!error.empty()) throw OffloadError(error);
  }

  void wait_all() {
    wait_until([this] {
      for (const auto& [id, t] : tickets) {
        if (!t->finished) return false;
      }
      return true;
    });
    std::string first;
    size_t failed = 0;
    for (const auto& [id, t] : tickets) {
      if (t->error.empty()) continue;
      if (failed++ == 0) first = t->error;
    }
    tickets.clear();
    if (failed > 1) first += " (and " + std::to_string(failed - 1) + " more failed requests)";
    if (failed > 0) throw OffloadError(first);
  }
};

NvmeSwapper::NvmeSwapper(SwapOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
NvmeSwapper::~NvmeSwapper() = default;

SwapTicket NvmeSwapper::write(const std::string& key, const void* data, size_t bytes) {
  return impl_->write(key, data, bytes);
}
SwapTicket NvmeSwapper::read(const std::string& key, void* data, size_t bytes) {
  return impl_->read(key, data, bytes);
}
void NvmeSwapper::wait(SwapTicket ticket) { impl_->wait(ticket); }
void NvmeSwapper::wait_all() { impl_->wait_all(); }
bool NvmeSwapper::direct_io() const { return impl_->direct; }
const std::string& NvmeSwapper::folder() const { return impl_->folder; }
uint64_t NvmeSwapper::bytes_written() const { return impl_->written_bytes; }
uint64_t NvmeSwapper::bytes_read() const { return impl_->read_bytes; }

}  // namespace zero::offload
