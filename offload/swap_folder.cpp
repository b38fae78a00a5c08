// The NVMe swapper's folder and files (swap_folder.h).
#include "offload/swap_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "offload/aligned_buffer.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::offload {
namespace {

constexpr const char* kLogSubsystem = "offload";

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

[[noreturn]] void fail(const std::string& message) { throw OffloadError("NVMe swapper: " + message); }

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// A key's file name (SwapFolder::file_for).
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

}  // namespace

SwapFolder::SwapFolder(std::string nvme_path, int rank) : nvme_path_(std::move(nvme_path)) {
  create(rank);
  try {
    probe_direct_io();
  } catch (...) {
    remove();
    throw;
  }
}

SwapFolder::~SwapFolder() {
  stop_discarding();
  remove();
}

void SwapFolder::discard(const std::string& file) {
  const std::string moved = path_ + "/discarded" + std::to_string(next_discarded_++) + ".del";
  if (::rename(file.c_str(), moved.c_str()) != 0) {
    if (errno != ENOENT) (void)::unlink(file.c_str());  // cannot move it aside: unlinked in line
    return;  // ENOENT: gone already, nothing to give back
  }
  std::lock_guard<std::mutex> lock(discard_mutex_);
  discarded_.push_back(moved);
  if (!discarder_.joinable()) {
    discarder_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(discard_mutex_);
      while (true) {
        discard_ready_.wait(lock, [this] { return stopping_ || !discarded_.empty(); });
        if (discarded_.empty()) return;  // stopping, with nothing left
        const std::string next = std::move(discarded_.front());
        discarded_.pop_front();
        lock.unlock();
        (void)::unlink(next.c_str());  // a failure leaves it to the folder's removal
        lock.lock();
      }
    });
  }
  discard_ready_.notify_one();
}

void SwapFolder::stop_discarding() noexcept {
  {
    std::lock_guard<std::mutex> lock(discard_mutex_);
    stopping_ = true;
  }
  discard_ready_.notify_one();
  if (discarder_.joinable()) discarder_.join();
}

void SwapFolder::create(int rank) {
  const std::string& p = nvme_path_;
  if (p.empty()) fail("nvme_path is empty; set nvme_path to a directory on a fast local disk");
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0 && errno == ENOENT) {
    // DeepSpeed makes a missing nvme_path; so does zero, saying so. Ranks
    // that race here find the folder made by another, which is fine.
    std::error_code error;
    std::filesystem::create_directories(p, error);
    if (error && !std::filesystem::is_directory(p))
      fail("nvme_path " + p + " does not exist and cannot be created (" + error.message() +
           "); create it or point nvme_path to an existing directory");
    log::info("offload", "nvme_path " + p + " did not exist: created it");
  }
  if (::stat(p.c_str(), &st) != 0) {
    fail("nvme_path " + p + " cannot be examined (" + errno_text(errno) +
         "); fix its permissions or point nvme_path elsewhere");
  }
  if (!S_ISDIR(st.st_mode)) {
    fail("nvme_path " + p + " is not a directory; point nvme_path to a directory on a fast local disk");
  }
  if (::access(p.c_str(), W_OK | X_OK) != 0) {
    fail("nvme_path " + p + " is not writable (" + errno_text(errno) +
         "); make it writable for this user or point nvme_path elsewhere");
  }
  const std::string base = (p.back() == '/' ? p : p + "/") + "zero_swap_rank" + std::to_string(rank) + "_" +
                           std::to_string(::getpid());
  // A second swapper of this process (or a folder left by an earlier
  // process with the same pid) takes the next free suffix; an existing
  // folder is never reused or removed.
  for (int n = 0; n < 1000; ++n) {
    const std::string candidate = n == 0 ? base : base + "_" + std::to_string(n);
    if (::mkdir(candidate.c_str(), 0700) == 0) {
      path_ = candidate;
      created_ = true;
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
void SwapFolder::probe_direct_io() {
  const std::string probe = path_ + "/.odirect_probe";
  int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  int e = fd < 0 ? errno : 0;
  if (fd >= 0) {
    void* buf = alloc_io_aligned(kIoAlignment);
    std::memset(buf, 0, kIoAlignment);
    const ssize_t n = ::pwrite(fd, buf, kIoAlignment, 0);
    e = n < 0 ? errno : (n == static_cast<ssize_t>(kIoAlignment) ? 0 : EIO);
    std::free(buf);
    ::close(fd);
  }
  ::unlink(probe.c_str());
  if (e == 0) return;
  if (e != EINVAL) {
    if (e == ENOSPC || e == EDQUOT) {
      fail("no space left on " + probe + "; free space under nvme_path (" + nvme_path_ +
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
  direct_ = false;
  zero::log::warn_once("swapper.buffered:" + nvme_path_, kLogSubsystem,
                       "nvme_path " + nvme_path_ +
                           " does not support O_DIRECT; the NVMe swapper falls back to buffered I/O "
                           "through the page cache (slower, uses host memory). Point nvme_path to a "
                           "filesystem with O_DIRECT (ext4, xfs) for full speed.");
}

void SwapFolder::remove() noexcept {
  if (!created_) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  if (ec) {
    zero::log::warn(kLogSubsystem, "cannot remove the swap folder " + path_ + " (" + ec.message() +
                                       "); remove it by hand");
  }
  created_ = false;
}

std::string SwapFolder::file_for(const std::string& key) {
  const std::string name = file_name_for(key);
  auto [it, inserted] = owner_.emplace(name, key);
  if (!inserted && it->second != key) {
    fail("keys '" + it->second + "' and '" + key + "' map to the same file " + path_ + "/" + name +
         "; rename one of them");
  }
  return path_ + "/" + name;
}

int SwapFolder::open_file(const std::string& file, bool write, size_t padded, std::string& error) const {
  const int flags = (write ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC | (direct_ ? O_DIRECT : 0);
  const int fd = ::open(file.c_str(), flags, 0600);
  if (fd < 0) {
    const int e = errno;
    if (!write && e == ENOENT) {
      error = "the file " + file + " is gone (removed outside the swapper); write the key again";
    } else if (e == ENOSPC || e == EDQUOT) {
      error = "no space left on " + file + "; free space under nvme_path (" + nvme_path_ +
              ") or point nvme_path elsewhere";
    } else {
      error = "cannot open " + file + " (" + errno_text(e) +
              "); check nvme_path's permissions and the open-file limit (ulimit -n)";
    }
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    error = "cannot stat " + file + " (" + errno_text(errno) + ")";
    return fd;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (write && size > padded && ::ftruncate(fd, static_cast<off_t>(padded)) != 0) {
    error = "cannot truncate " + file + " to " + std::to_string(padded) + " bytes (" + errno_text(errno) + ")";
  }
  // Note [Preallocation]: O_DIRECT writes past the end of a file are
  // extending writes, which ext4/xfs serialise on the inode and io_uring
  // cannot issue without blocking; allocating the file's length first
  // makes them plain writes into allocated blocks, as fio (fallocate=native
  // by default) does. Only a hint: when it fails (no support, no space,
  // the file-size limit) the writes themselves report the error.
  if (write && size < padded) {
    (void)::fallocate(fd, 0, 0, static_cast<off_t>(padded));
  }
  if (!write && size < padded) {
    error = "the file " + file + " holds " + std::to_string(size) + " bytes, fewer than the " +
            std::to_string(padded) + " written (padded); it was truncated outside the swapper; write the key again";
  }
  return fd;
}

std::string SwapFolder::io_error(int e, bool write, const std::string& file, size_t offset, size_t len,
                                 size_t padded) const {
  const std::string where = " at offset " + std::to_string(offset) + " (" + std::to_string(len) + " bytes)";
  switch (e) {
    case ENOSPC:
      return "no space left on " + file + "; free space under nvme_path (" + nvme_path_ +
             ") or point nvme_path elsewhere";
    case EDQUOT:
      return "disk quota exceeded on " + file + "; free space under nvme_path (" + nvme_path_ +
             ") or point nvme_path elsewhere";
    case EFBIG:
      return "file too large: " + file + " cannot grow to " + std::to_string(padded) +
             " bytes (EFBIG: the process's file-size limit, ulimit -f, or the filesystem's maximum file "
             "size); raise the limit or point nvme_path to another filesystem";
    case EIO:
      return "I/O error (EIO) on " + file + where +
             "; the device under nvme_path may be failing (check dmesg) or point nvme_path elsewhere";
    case EINVAL:
      return "invalid argument (EINVAL) on " + file + where +
             (direct_ ? "; the filesystem rejected an O_DIRECT request (needs 4096-byte aligned memory, "
                        "offsets and lengths)"
                      : "");
    default:
      return std::string(write ? "write to " : "read from ") + file + where + " failed (" + errno_text(e) + ")";
  }
}

}  // namespace zero::offload
