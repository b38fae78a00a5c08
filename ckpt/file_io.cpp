// Checkpoint files on disk (file_io.h): the durable atomic writer and
// write_file_durably, whole reads and hash_file, and the XXH3 hash
// (checkpoint.h).
#include "ckpt/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <xxhash.h>

#include "core/regular_file.h"
#include "zero/error.h"

namespace zero::ckpt {

namespace {


std::string errno_text(int e) {
  std::string s = std::strerror(e);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string hint_for(int e) {
  switch (e) {
    case ENOSPC: return "; free space or save elsewhere";
    case EDQUOT: return "; the disk quota is used up: free space or save elsewhere";
    case EFBIG: return "; the file size limit (ulimit -f) or the file system's maximum file size is too small";
    case EROFS: return "; the file system is read-only: save elsewhere";
    case EACCES:
    case EPERM: return "; check the directory's permissions or save elsewhere";
    case ENOENT: return "; the directory does not exist: create it first";
    default: return "";
  }
}

}  // namespace

// ---- AtomicWriter --------------------------------------------------------------

std::string staging_name_for(const std::string& path) {
  static thread_local std::mt19937_64 draw{std::random_device{}() ^ (uint64_t(::getpid()) << 32)};
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(draw()));
  return path + "." + hex + ".tmp";
}

bool is_staging_name_for(const std::string& file_name, const std::string& target_name) {
  const size_t digits = 16, size = target_name.size() + 1 + digits + 4;
  if (file_name.size() != size || file_name.compare(0, target_name.size() + 1, target_name + ".") != 0 ||
      file_name.compare(size - 4, 4, ".tmp") != 0)
    return false;
  return std::all_of(file_name.begin() + static_cast<std::ptrdiff_t>(target_name.size() + 1),
                     file_name.end() - 4, [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

// The staging file has a name of its own (staging_name_for) and is made
// anew (O_EXCL, O_NOFOLLOW): two writers of one file (two saves' `latest`)
// never write into or rename each other's, and nothing planted in the
// folder can carry the write into a file outside it. The destination must
// be a regular file or absent: the rename would replace a device node or a
// FIFO given as an output path (as root, /dev/null itself).
AtomicWriter::AtomicWriter(std::string path, uint64_t total, const std::string& recycle)
    : path_(std::move(path)), tmp_(staging_name_for(path_)), total_(total) {
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
    fail(path_ + " exists and is not a regular file (" +
         (S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device"
                                                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                       : S_ISDIR(st.st_mode) ? "a directory"
                                                                              : "a special file") +
         "); write to a file path instead; nothing was changed");
  }
  if (!recycle.empty() && ::rename(recycle.c_str(), tmp_.c_str()) == 0) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);  // its pages are written over
    if (fd_ < 0) ::unlink(tmp_.c_str());
  }
  if (fd_ < 0) fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    int e = errno;
    fail(errno_text(e) + " creating " + tmp_ + " to write " + path_ + hint_for(e) + "; an existing " + path_ +
         " is untouched");
  }
}

AtomicWriter::~AtomicWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicWriter::write(const void* data, size_t n, Xxh3* hasher) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    size_t chunk = std::min(n, kChunk);
    if (hasher) hasher->update(p, chunk);
    size_t done = 0;
    while (done < chunk) {
      ssize_t w = ::write(fd_, p + done, chunk - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        error(errno, "writing");
      }
      if (w == 0) error(EIO, "writing (short write)");
      done += static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
    }
    p += chunk;
    n -= chunk;
  }
}

void AtomicWriter::commit() {
  if (written_ != total_) error(EIO, "writing (size changed while writing)");
  if (::ftruncate(fd_, static_cast<off_t>(total_)) != 0) error(errno, "cutting to size");  // a recycled file was longer
  if (::fsync(fd_) != 0) error(errno, "syncing");
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) error(errno, "closing");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) error(errno, "renaming " + tmp_ + " to");
  committed_ = true;
  const std::string dir = parent_dir(path_);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    int e = errno;
    fail(errno_text(e) + " opening directory " + dir + " to make the rename of " + path_ + " durable");
  }
  if (::fsync(dfd) != 0 && errno != EINVAL) {
    int e = errno;
    ::close(dfd);
    fail(errno_text(e) + " syncing directory " + dir + " after writing " + path_ +
         "; the file is in place but may not survive a crash");
  }
  ::close(dfd);
}

void AtomicWriter::error(int e, const std::string& what) {
  fail(errno_text(e) + " " + what + " " + path_ + " (wrote " + std::to_string(written_) + " of " +
       std::to_string(total_) + " bytes)" + hint_for(e) + "; an existing " + path_ +
       " is untouched (the previous checkpoint is intact)");
}

void write_file_durably(const std::string& path, const std::string& content) {
  AtomicWriter w(path, content.size());
  w.write(content.data(), content.size(), nullptr);
  w.commit();
}

// ---- reading -------------------------------------------------------------------

void pread_all(int fd, void* dst, uint64_t bytes, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(bytes, kChunk));
    ssize_t r = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      fail(errno_text(e) + " reading " + path + " at byte " + std::to_string(offset));
    }
    if (r == 0)
      fail("truncated: " + path + " ended at byte " + std::to_string(offset) + " while " + std::to_string(bytes) +
           " more bytes were expected (the file changed after it was opened?)");
    p += r;
    bytes -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

FileInfo hash_file(const std::string& path) {
  core::OpenedFile opened = core::open_regular_file(path, std::numeric_limits<uint64_t>::max());
  if (opened.fd < 0) fail(opened.error);
  const int fd = opened.fd;
  FileInfo info;
  info.name = path;
  info.bytes = opened.bytes;
  try {
    Xxh3 h;
    std::vector<char> buf(std::min<uint64_t>(info.bytes, kChunk));
    for (uint64_t off = 0; off < info.bytes;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(info.bytes - off, kChunk));
      pread_all(fd, buf.data(), n, off, path);
      h.update(buf.data(), n);
      off += n;
    }
    info.xxh3 = xxh3_hex(h.digest());
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return info;
}

// ---- XXH3 --------------------------------------------------------------------

Xxh3::Xxh3() : state_(XXH3_createState()) {
  if (!state_ || XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)) == XXH_ERROR)
    fail("cannot initialise the XXH3 hash state");
}

Xxh3::~Xxh3() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3::update(const void* p, size_t n) {
  if (n) XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), p, n);
}

uint64_t Xxh3::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

std::string xxh3_hex(uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

}  // namespace zero::ckpt
