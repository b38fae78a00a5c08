// See staging.h.
#include "interop/staging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ckpt/checkpoint.h"
#include "zero/error.h"

namespace zero::interop {

using ckpt::fail;

namespace fs = std::filesystem;

namespace {


void fsync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    fail("cannot sync folder " + dir.string() + ": " + std::strerror(e));
  }
  ::close(fd);
}

}  // namespace

void check_destination(const fs::path& from, const fs::path& out, const std::string& input) {
  auto clean = [](const fs::path& p) {
    fs::path c = fs::weakly_canonical(p);
    return c.filename().empty() ? c.parent_path() : c;  // "/a/b/" -> "/a/b"
  };
  const fs::path a = clean(from), b = clean(out);
  if (std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first == a.end())
    fail("the output folder " + out.string() + " is " + (a == b ? "the input folder" : "inside the input folder " + from.string()) +
         "; choose a folder outside " + input);
  std::error_code ec;
  const auto status = fs::symlink_status(out, ec);
  if (ec || status.type() == fs::file_type::not_found) return;
  if (status.type() != fs::file_type::directory || !fs::is_empty(out, ec))
    fail("the output folder " + out.string() + " already exists and is not empty; zero-ckpt writes a new folder "
         "(choose another, or remove it)");
}

Staging::Staging(const fs::path& out) : out_(out) {
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) fail("cannot create " + parent.string() + ": " + ec.message());
  path_ = parent / ("." + out.filename().string() + ".staging-" + std::to_string(::getpid()));
  if (::mkdir(path_.c_str(), 0755) != 0)  // never an existing path (or a planted link)
    fail("cannot create the staging folder " + path_.string() + ": " + std::strerror(errno));
}

Staging::~Staging() {
  if (!released_) {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
}

void Staging::commit() {
  std::error_code ec;
  if (fs::is_directory(fs::symlink_status(out_, ec)) && ::rmdir(out_.c_str()) != 0)
    fail("cannot replace the empty folder " + out_.string() + ": " + std::strerror(errno));
  if (::rename(path_.c_str(), out_.c_str()) != 0)
    fail("cannot rename " + path_.string() + " to " + out_.string() + ": " + std::strerror(errno));
  released_ = true;
  fsync_directory(out_.has_parent_path() ? out_.parent_path() : fs::path("."));
}

}  // namespace zero::interop
