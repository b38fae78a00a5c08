// The NVMe swapper (swapper.h): its tickets, one write or read of one key
// each. A ticket is checked when it is made (a read needs a write of its key,
// of the same size, that has not failed), starts when no earlier unfinished
// ticket on its key conflicts with it, goes out in chunks through io_uring
// (swapper_ring.cpp, Note [Swapper requests]) and is collected by wait() or
// wait_all().
//
// Tickets on the same key start in order when one of them writes (a write
// after a read waits for the read; a read after a write waits for the
// write); tickets on different keys and reads of one key run concurrently.
//
// Note [Swapper progress]
// Only queue_depth chunks are in flight at a time (block_size each: 8 MiB
// by default), a few milliseconds of a disk's work, while a sub-group's
// read is hundreds of megabytes. Were the rest issued only inside the
// caller's calls, the disk would idle while the caller computes between
// them, and reads and writes would run beside compute only a queue's worth
// at a time. So each swapper has a progress thread: the kernel signals an
// eventfd at each completion (io_uring_register_eventfd), and the thread
// then reaps, issues the next chunks and submits them, under the same mutex
// as the caller's calls. The caller still pumps and reaps inside its own
// calls (wait() blocks in the ring while holding the mutex, so the two never
// reap at once), and the thread only ever adds progress: a failure it meets
// stays in its ticket for the caller's wait() to report. Without eventfd
// registration (an old kernel) the swapper works as before, from the
// caller's calls alone.
#include "offload/swapper_impl.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <set>
#include <utility>

#include "zero/log.h"

namespace zero::offload {

NvmeSwapper::Impl::Impl(SwapOptions o) : opt(std::move(o)) {
  try {
    validate_options();
    folder = std::make_unique<SwapFolder>(opt.nvme_path, opt.rank);
    direct = folder->direct_io();
    init_ring();
    start_progress_thread();
  } catch (...) {
    shutdown();
    throw;
  }
}

// Pumps and reaps until done() (or the timeout without any completion).
template <class Pred>
void NvmeSwapper::Impl::wait_until(Pred done) {
  using clock = std::chrono::steady_clock;
  auto last = clock::now();
  while (true) {
    pump();
    if (done()) {
      submit();
      return;
    }
    if (inflight == 0) fail("internal error: nothing in flight but requests are not done under " + folder->path());
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

void NvmeSwapper::Impl::validate_options() {
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

void NvmeSwapper::Impl::start_progress_thread() {
  completions_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (completions_fd < 0 || wake_fd < 0 || io_uring_register_eventfd(&ring, completions_fd) < 0) {
    zero::log::warn_once("swapper-progress", kLogSubsystem,
                         "io_uring cannot signal an eventfd here; NVMe transfers progress only while the engine "
                         "waits for them, not beside its compute");
    return;
  }
  progress_thread = std::thread([this] { run_progress(); });
}

void NvmeSwapper::Impl::run_progress() noexcept {
  pollfd fds[2] = {{completions_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
  uint64_t count = 0;
  while (true) {
    (void)::poll(fds, 2, -1);
    (void)!::read(completions_fd, &count, sizeof count);  // non-blocking: clears the signal
    (void)!::read(wake_fd, &count, sizeof count);
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return;
    try {
      if (inflight > 0) reap(false);
      pump();
      submit();
    } catch (const std::exception& e) {  // the caller's own calls meet it and report it
      zero::log::debug(kLogSubsystem, std::string("the progress thread stops: ") + e.what());
      return;
    }
  }
}

void NvmeSwapper::Impl::stop_progress_thread() noexcept {
  if (progress_thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    const uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
    progress_thread.join();
  }
}

void NvmeSwapper::Impl::shutdown() noexcept {
  stop_progress_thread();
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
  for (int* fd : {&completions_fd, &wake_fd}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  folder.reset();
}

NvmeSwapper::Impl::Ticket& NvmeSwapper::Impl::add_ticket(Op op, const std::string& key, std::string path, char* data,
                                                         size_t bytes) {
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

SwapTicket NvmeSwapper::Impl::write(const std::string& key, const void* data, size_t bytes) {
  if (data == nullptr && bytes > 0) fail("writing key '" + key + "' from a null pointer");
  Ticket& t = add_ticket(Op::Write, key, folder->file_for(key), static_cast<char*>(const_cast<void*>(data)), bytes);
  KeyState& k = keys[key];
  k.bytes = bytes;
  k.last_write = t.id;
  k.failure.clear();
  const SwapTicket id = t.id;
  progress();
  return id;
}

SwapTicket NvmeSwapper::Impl::read(const std::string& key, void* data, size_t bytes) {
  const std::string path = folder->file_for(key);
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
// with it (either of them writes).
bool NvmeSwapper::Impl::blocked(const Ticket& t) const {
  for (const auto& [id, u] : tickets) {
    if (id >= t.id) break;
    if (!u->finished && u->key == t.key && (t.op == Op::Write || u->op == Op::Write)) return true;
  }
  return false;
}

std::string NvmeSwapper::Impl::describe(const Ticket& t) const {
  return std::string(t.op == Op::Write ? "writing" : "reading") + " key '" + t.key + "' (" +
         std::to_string(t.bytes) + " bytes): ";
}

void NvmeSwapper::Impl::set_error(Ticket& t, const std::string& message) {
  if (!t.error.empty()) return;
  t.error = "NVMe swapper: " + describe(t) + message;
  t.cause = message;
}

// Opens the ticket's file; a failure fails the ticket.
void NvmeSwapper::Impl::start(Ticket& t) {
  t.started = true;
  std::string error;
  t.fd = folder->open_file(t.path, t.op == Op::Write, round_up(t.bytes), error);
  if (!error.empty()) set_error(t, error);
}

// Starts tickets and issues chunks while slots (and bounce buffers) last.
void NvmeSwapper::Impl::pump() {
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

void NvmeSwapper::Impl::maybe_finish(Ticket& t) {
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

void NvmeSwapper::Impl::progress() {
  pump();
  submit();
  if (inflight > 0 && reap(false)) {
    pump();
    submit();
  }
}

void NvmeSwapper::Impl::wait(SwapTicket id) {
  if (id == 0 || id >= next_id) fail("waiting on ticket " + std::to_string(id) + ", which this swapper never issued");
  auto it = tickets.find(id);
  if (it == tickets.end()) return;  // already waited on
  Ticket* t = it->second.get();
  wait_until([t] { return t->finished; });
  const std::string error = t->error;
  tickets.erase(id);
  if (!error.empty()) throw OffloadError(error);
}

void NvmeSwapper::Impl::wait_all() {
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

void NvmeSwapper::Impl::remove(const std::string& key) {
  if (keys.find(key) == keys.end()) return;
  wait_until([&] {
    for (const auto& [id, t] : tickets) {
      if (t->key == key && !t->finished) return false;
    }
    return true;
  });
  for (auto it = tickets.begin(); it != tickets.end();) {  // nobody waits on them now
    it = it->second->key == key ? tickets.erase(it) : std::next(it);
  }
  keys.erase(key);
  folder->discard(folder->file_for(key));  // its blocks given back beside the caller's work
}

NvmeSwapper::NvmeSwapper(SwapOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
NvmeSwapper::~NvmeSwapper() = default;

// Each call holds the mutex it shares with the progress thread.
using Lock = std::lock_guard<std::mutex>;
SwapTicket NvmeSwapper::write(const std::string& key, const void* data, size_t bytes) {
  Lock lock(impl_->mu);
  return impl_->write(key, data, bytes);
}
SwapTicket NvmeSwapper::read(const std::string& key, void* data, size_t bytes) {
  Lock lock(impl_->mu);
  return impl_->read(key, data, bytes);
}
void NvmeSwapper::wait(SwapTicket ticket) {
  Lock lock(impl_->mu);
  impl_->wait(ticket);
}
void NvmeSwapper::wait_all() {
  Lock lock(impl_->mu);
  impl_->wait_all();
}
void NvmeSwapper::remove(const std::string& key) {
  Lock lock(impl_->mu);
  impl_->remove(key);
}
bool NvmeSwapper::direct_io() const { return impl_->direct; }  // fixed at construction
const std::string& NvmeSwapper::folder() const { return impl_->folder->path(); }
uint64_t NvmeSwapper::bytes_written() const {
  Lock lock(impl_->mu);
  return impl_->written_bytes;
}
uint64_t NvmeSwapper::bytes_read() const {
  Lock lock(impl_->mu);
  return impl_->read_bytes;
}

}  // namespace zero::offload
