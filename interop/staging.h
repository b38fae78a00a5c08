#pragma once
// How zero-ckpt import and export write a new folder: all of it under a
// staging folder beside the destination, renamed into place once complete,
// so that a failure leaves nothing at the destination.
#include <filesystem>
#include <string>

namespace zero::interop {

// Refuses (CheckpointError) an `out` that is `from` or inside it (`input`
// names what `from` is, for the message), or that exists and is not an
// empty folder.
void check_destination(const std::filesystem::path& from, const std::filesystem::path& out, const std::string& input);

// "<parent>/.<name>.staging-<pid>", made with mkdir (never an existing path
// or a planted link); removed with what it holds unless committed.
class Staging {
 public:
  explicit Staging(const std::filesystem::path& out);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // Renames the staging folder to `out` (an empty folder there is
  // replaced) and syncs the parent folder.
  void commit();

 private:
  std::filesystem::path out_, path_;
  bool released_ = false;
};

}  // namespace zero::interop
