#pragma once
// Internal to the NVMe swapper (swapper.h): the folder one swapper owns,
// <nvme_path>/zero_swap_rank<r>_<pid>[_<n>]/, and its files, one per key.
// Made at construction, after nvme_path is checked, with O_DIRECT probed
// (a filesystem that refuses it gets buffered I/O and one warning); removed
// with its files at destruction. Torch-free.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace zero::offload {

class SwapFolder {
 public:
  // Throws OffloadError naming nvme_path when it is missing, not a
  // directory or not writable, or the folder cannot be made in it.
  SwapFolder(std::string nvme_path, int rank);
  ~SwapFolder();  // removes the folder and its files (a warning when it cannot)
  SwapFolder(const SwapFolder&) = delete;
  SwapFolder& operator=(const SwapFolder&) = delete;

  const std::string& path() const { return path_; }
  bool direct_io() const { return direct_; }  // false: buffered I/O

  // The file of `key`: the key with characters outside [A-Za-z0-9._-]
  // replaced by '_' and ".swp" added; a key that changed, is empty or is
  // long also gets a hash of the original. Throws OffloadError when two
  // keys would share a file.
  std::string file_for(const std::string& key);

  // Opens `file` for writing `padded` bytes (created; cut or allocated to
  // that length) or for reading them (checked to hold that many). Returns
  // the descriptor, or -1; `error` is set when anything failed, saying what
  // to do (with a descriptor too, which the caller closes).
  int open_file(const std::string& file, bool write, size_t padded, std::string& error) const;

  // Deletes `file` (a file of this folder, with no request on it) without
  // waiting: it is renamed out of the way at once, so a later file of that
  // name is a new one, and unlinked on a thread of the folder's own. Ext4
  // gives a large file's blocks back inside unlink, milliseconds each: the
  // parts that initialize reads once and lets go cost it a second a
  // gigabyte when unlinked in line.
  void discard(const std::string& file);

  // What errno `e` from a request on `file` means and what to do: `len`
  // bytes at `offset` of a file of `padded` bytes.
  std::string io_error(int e, bool write, const std::string& file, size_t offset, size_t len, size_t padded) const;

 private:
  void create(int rank);
  void probe_direct_io();
  void remove() noexcept;
  void stop_discarding() noexcept;  // unlinks what is queued, then joins the thread

  std::string nvme_path_;
  std::string path_;
  bool created_ = false;
  bool direct_ = true;
  std::unordered_map<std::string, std::string> owner_;  // file name -> key
  // discard(): renamed files waiting for their unlink, and the thread that unlinks them.
  std::mutex discard_mutex_;
  std::condition_variable discard_ready_;
  std::deque<std::string> discarded_;
  bool stopping_ = false;
  size_t next_discarded_ = 0;
  std::thread discarder_;
};

}  // namespace zero::offload
