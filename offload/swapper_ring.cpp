// The NVMe swapper's chunks through io_uring (swapper_impl.h).
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
#include "offload/swapper_impl.h"

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace zero::offload {

void NvmeSwapper::Impl::init_ring() {
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
    bounce.push_back(static_cast<char*>(alloc_io_aligned(block)));
    free_bounce.push_back(static_cast<int>(i));
  }
}

// Issues the next chunk of `t` into a free slot; false when it needs a
// bounce buffer and none is free.
bool NvmeSwapper::Impl::issue_chunk(Ticket& t) {
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

void NvmeSwapper::Impl::prepare(int index) {
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

void NvmeSwapper::Impl::submit() {
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
         " requests in flight under " + folder->path());
  }
}

// One completion; see Note [Swapper requests].
void NvmeSwapper::Impl::complete(uint64_t index, int res) {
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
    set_error(t, folder->io_error(e, t.op == Op::Write, t.path, s.file_offset + s.done, s.len - s.done,
                                   round_up(t.bytes)));
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
bool NvmeSwapper::Impl::reap(bool block) {
  io_uring_cqe* cqe = nullptr;
  if (block) {
    __kernel_timespec ts{};
    ts.tv_sec = 1;
    const int r = io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, nullptr);
    if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      fail("waiting for io_uring completions failed (" + errno_text(-r) + ") under " + folder->path());
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

}  // namespace zero::offload
