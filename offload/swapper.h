#pragma once
// The NVMe swapper: tensors' bytes moved between host memory and files
// under nvme_path through io_uring (ZeRO-Infinity's storage tier).
// Torch-free.
//
// Each swapper owns one folder, <nvme_path>/zero_swap_rank<r>_<pid>/,
// created at construction and removed with its files at destruction. One
// key is one file. Requests go out as block_size chunks with up to
// queue_depth in flight; O_DIRECT needs 4 KiB-aligned memory and lengths,
// so aligned caller memory (AlignedBuffer) is used in place and anything
// else goes through the swapper's own aligned buffers. A filesystem without
// O_DIRECT (ramfs, tmpfs before Linux 6.6) falls back to buffered I/O with
// one warning.
//
// Threading: a swapper is used from one thread (the engine's). Requests make
// progress while the caller computes: the swapper's own thread issues the
// chunks that did not fit in the queue as the earlier ones complete (Note
// [Swapper progress] in swapper.cpp).
//
// Ordering: requests on the same key take effect in the order they were
// made (a read after a write of the same key returns what that write wrote,
// a write after a read waits until the read is done); requests on different
// keys run concurrently.
//
// File layout: <folder>/<sanitized key>.swp holds the bytes padded with
// zeros to a multiple of kIoAlignment; the swapper remembers each key's
// logical size. The folder and its files: swap_folder.h; the requests:
// Note [Swapper requests] in swapper.cpp.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "offload/aligned_buffer.h"

namespace zero::offload {

struct SwapOptions {
  std::string nvme_path;            // must exist, be a directory and be writable
  int rank = 0;
  int64_t block_size = 1048576;     // bytes per request (aio.block_size), a multiple of 4096
  int64_t queue_depth = 8;          // requests in flight (aio.queue_depth)
  int64_t buffer_count = 4;         // bounce buffers of block_size for unaligned memory
                                    // and the last partial 4 KiB of a transfer
  int64_t timeout_s = 300;          // wait() gives up (OffloadError naming the files in
                                    // flight) after this long without any completion
};

// A request in flight; wait() on it (or wait_all()).
using SwapTicket = uint64_t;

class NvmeSwapper {
 public:
  // Throws OffloadError naming nvme_path when it is missing, not a
  // directory or not writable.
  explicit NvmeSwapper(SwapOptions options);
  ~NvmeSwapper();  // waits for requests in flight, removes the folder
  NvmeSwapper(const NvmeSwapper&) = delete;
  NvmeSwapper& operator=(const NvmeSwapper&) = delete;

  // Starts writing `bytes` from `data` to the file of `key` (replacing it).
  // `data` must stay valid until the ticket is waited on.
  SwapTicket write(const std::string& key, const void* data, size_t bytes);
  // Starts reading the `bytes` last written under `key` into `data`.
  // Throws OffloadError at once for a key never written, a key whose last
  // write failed, or `bytes` different from the size written.
  SwapTicket read(const std::string& key, void* data, size_t bytes);
  // Blocks until done; throws OffloadError naming the file on any failure
  // (ENOSPC, EFBIG, EIO, a short read or write, a file gone missing). A
  // ticket already waited on (or collected by wait_all) returns at once.
  void wait(SwapTicket ticket);
  // Waits for every request; when some failed, throws the first failure
  // (after all are done) and mentions how many others failed.
  void wait_all();
  // Waits for the requests on `key`, then deletes its file and forgets the
  // key (a later read fails as for a key never written): disk space given
  // back as soon as a file is done with. An unknown key: nothing.
  void remove(const std::string& key);

  bool direct_io() const;           // false after the buffered fallback
  const std::string& folder() const;
  uint64_t bytes_written() const;
  uint64_t bytes_read() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero::offload
