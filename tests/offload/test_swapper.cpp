// The NVMe swapper (offload/swapper.h): bytes written come back unchanged
// (every size around the 4 KiB and block boundaries, aligned and unaligned
// memory, many tickets in flight, rewrites), errors name the path or file
// and say how to fix it, the folder goes away with the swapper, and a
// filesystem without O_DIRECT gets buffered I/O with one warning.
//
// Some cases need root to mount a small filesystem (ENOSPC, a read-only
// nvme_path when chmod cannot stop root, a filesystem without O_DIRECT);
// they skip with the reason when that is impossible.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "offload/swapper.h"
#include "zero/error.h"

namespace fs = std::filesystem;
using zero::OffloadError;
using zero::offload::AlignedBuffer;
using zero::offload::kIoAlignment;
using zero::offload::NvmeSwapper;
using zero::offload::SwapOptions;
using zero::offload::SwapTicket;

namespace {

constexpr size_t kMiB = 1 << 20;

std::string temp_root() {
  const char* t = std::getenv("TMPDIR");
  return (t && *t) ? t : "/tmp";
}

// A fresh directory under $TMPDIR (or `parent`), removed at the end.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& parent = temp_root()) {
    std::string templ = parent + "/zero_swapper_test_XXXXXX";
    char* p = ::mkdtemp(templ.data());
    if (p == nullptr) throw std::runtime_error("mkdtemp under " + parent + ": " + std::strerror(errno));
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A filesystem mounted on a fresh directory (needs root); `error` says why not.
struct Mount {
  TempDir dir;
  bool ok = false;
  std::string error;
  Mount(const char* type, const char* options, unsigned long flags = 0) {
    if (::geteuid() != 0) {
      error = "not running as root, cannot mount a " + std::string(type);
      return;
    }
    ok = ::mount(type, dir.path.c_str(), type, flags, options) == 0;
    if (!ok) error = "mount -t " + std::string(type) + " failed: " + std::strerror(errno);
  }
  ~Mount() {
    if (ok) ::umount2(dir.path.c_str(), MNT_DETACH);
  }
};

SwapOptions options(const std::string& path, int64_t block = 1 << 20, int64_t depth = 8) {
  SwapOptions o;
  o.nvme_path = path;
  o.block_size = block;
  o.queue_depth = depth;
  return o;
}

void fill(void* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  auto* b = static_cast<unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(b + i, &v, 8);
  }
  const uint64_t v = rng();
  std::memcpy(b + i, &v, n - i);
}

// Where the first difference is, or -1.
int64_t first_difference(const void* a, const void* b, size_t n) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  for (size_t i = 0; i < n; ++i) {
    if (x[i] != y[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// Runs `f`, expects OffloadError, returns its message.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const OffloadError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("WRONG EXCEPTION TYPE: ") + e.what();
  }
  return "NO ERROR";
}

std::string swap_file(const NvmeSwapper& s, const std::string& key) { return s.folder() + "/" + key + ".swp"; }

// Whether a file under `dir` opens with O_DIRECT and takes an aligned write.
bool accepts_o_direct(const std::string& dir) {
  const std::string probe = dir + "/.test_probe";
  const int fd = ::open(probe.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0600);
  if (fd < 0) return false;
  AlignedBuffer b(kIoAlignment);
  const bool ok = ::pwrite(fd, b.data(), kIoAlignment, 0) == static_cast<ssize_t>(kIoAlignment);
  ::close(fd);
  ::unlink(probe.c_str());
  return ok;
}

// ---- round trips over block sizes and queue depths ----

// Every size around the 4 KiB and block boundaries, aligned memory (used in
// place by O_DIRECT, the partial tail bounced) and unaligned memory on both
// sides (bounced), each read back and compared.
void round_trips(int64_t block, int64_t depth) {
  TempDir dir;
  NvmeSwapper s(options(dir.path, block, depth));
  const size_t bs = static_cast<size_t>(block);
  const std::vector<size_t> sizes = {1, 4095, 4096, 4097, bs - 1, 3 * bs + 5, 10 * kMiB + 3};
  uint64_t written = 0, read = 0;
  int seed = 0;
  for (size_t n : sizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    AlignedBuffer src(n), dst(n);
    fill(src.data(), n, ++seed);
    const std::string key = "aligned_" + std::to_string(n);
    s.wait(s.write(key, src.data(), n));
    written += n;
    EXPECT_EQ(fs::file_size(swap_file(s, key)), (n + kIoAlignment - 1) / kIoAlignment * kIoAlignment)
        << "the file holds the data padded to 4 KiB";
    s.wait(s.read(key, dst.data(), n));
    read += n;
    ASSERT_EQ(first_difference(src.data(), dst.data(), n), -1);

    const size_t in_off = 1 + static_cast<size_t>(seed) % 7, out_off = 7 - static_cast<size_t>(seed) % 7;
    std::vector<unsigned char> usrc(n + 8), udst(n + 8, 0xAB);
    fill(usrc.data() + in_off, n, ++seed);
    const std::string ukey = "unaligned_" + std::to_string(n);
    s.wait(s.write(ukey, usrc.data() + in_off, n));
    written += n;
    s.wait(s.read(ukey, udst.data() + out_off, n));
    read += n;
    ASSERT_EQ(first_difference(usrc.data() + in_off, udst.data() + out_off, n), -1);
    // Nothing around the destination was touched.
    for (size_t i = 0; i < out_off; ++i) ASSERT_EQ(udst[i], 0xAB);
    for (size_t i = out_off + n; i < udst.size(); ++i) ASSERT_EQ(udst[i], 0xAB);
  }
  EXPECT_EQ(s.bytes_written(), written);
  EXPECT_EQ(s.bytes_read(), read);
}

TEST(SwapRoundTrip, Block4KiBDepth1) { round_trips(4096, 1); }
TEST(SwapRoundTrip, Block4KiBDepth16) { round_trips(4096, 16); }
TEST(SwapRoundTrip, Block1MiBDepth1) { round_trips(1 << 20, 1); }
TEST(SwapRoundTrip, Block1MiBDepth16) { round_trips(1 << 20, 16); }

TEST(Swapper, ManyTicketsInFlight) {
  TempDir dir;
  SwapOptions o = options(dir.path, 64 * 1024, 4);
  o.buffer_count = 2;
  NvmeSwapper s(o);
  std::mt19937 rng(7);
  constexpr int kKeys = 40;
  std::vector<std::vector<unsigned char>> src(kKeys), dst(kKeys);
  std::vector<size_t> size(kKeys), offset(kKeys);
  std::vector<SwapTicket> tickets;
  for (int k = 0; k < kKeys; ++k) {
    size[k] = 1 + rng() % (700 * 1024);
    offset[k] = k % 3 == 0 ? 0 : 1 + rng() % 7;  // some unaligned
    src[k].resize(size[k] + 4096 + 8);
    // Start in-place candidates on a 4 KiB boundary inside the vector.
    const size_t base = (4096 - reinterpret_cast<uintptr_t>(src[k].data()) % 4096) % 4096;
    offset[k] += base;
    fill(src[k].data() + offset[k], size[k], 100 + k);
    tickets.push_back(s.write("k" + std::to_string(k), src[k].data() + offset[k], size[k]));
  }
  // All queued at once: more than queue_depth chunks wait their turn.
  s.wait_all();
  tickets.clear();
  for (int k = 0; k < kKeys; ++k) {
    dst[k].assign(size[k] + 8, 0);
    tickets.push_back(s.read("k" + std::to_string(k), dst[k].data() + (k % 8), size[k]));
  }
  for (int k = kKeys - 1; k >= 0; --k) {  // waited in reverse order
    s.wait(tickets[k]);
    ASSERT_EQ(first_difference(src[k].data() + offset[k], dst[k].data() + (k % 8), size[k]), -1) << "key " << k;
  }
  s.wait(tickets[0]);  // waiting again on a collected ticket returns at once
  uint64_t total = 0;
  for (size_t n : size) total += n;
  EXPECT_EQ(s.bytes_written(), total);
  EXPECT_EQ(s.bytes_read(), total);
}

// Note [Swapper progress]: a transfer many queues long finishes while the
// caller makes no call into the swapper (it would stop after the first
// queue_depth chunks if only the caller's calls issued the rest), and a
// read after it, also left alone, returns the bytes written.
TEST(Swapper, TransfersGoOnWhileTheCallerComputes) {
  TempDir dir;
  NvmeSwapper s(options(dir.path, 64 * 1024, 2));
  const size_t bytes = 16 * kMiB;  // 256 chunks, 2 in flight at a time
  AlignedBuffer src(bytes), dst(bytes);
  fill(src.data(), bytes, 11);
  std::memset(dst.data(), 0, bytes);
  auto finished = [&](auto counter) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (counter() < bytes && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the caller's "compute"
    }
    return counter() == bytes;
  };
  const SwapTicket w = s.write("long", src.data(), bytes);
  EXPECT_TRUE(finished([&] { return s.bytes_written(); })) << "the write stalled without the caller's calls";
  s.wait(w);
  const SwapTicket r = s.read("long", dst.data(), bytes);
  EXPECT_TRUE(finished([&] { return s.bytes_read(); })) << "the read stalled without the caller's calls";
  s.wait(r);
  EXPECT_EQ(first_difference(src.data(), dst.data(), bytes), -1);
}

TEST(Swapper, RewriteAndOrderingOnOneKey) {
  TempDir dir;
  NvmeSwapper s(options(dir.path, 4096 * 16, 8));
  const size_t big = 5 * kMiB + 17;
  AlignedBuffer v1(big), v2(3), v3(big), v4(big), out(big);
  fill(v1.data(), big, 1);
  fill(v2.data(), 3, 2);
  fill(v3.data(), big, 3);
  fill(v4.data(), big, 4);
  s.wait(s.write("w", v1.data(), big));
  // A smaller rewrite replaces the content and the size.
  s.wait(s.write("w", v2.data(), 3));
  EXPECT_EQ(fs::file_size(swap_file(s, "w")), kIoAlignment);
  s.wait(s.read("w", out.data(), 3));
  EXPECT_EQ(first_difference(v2.data(), out.data(), 3), -1);
  const std::string msg = error_of([&] { s.read("w", out.data(), big); });
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(big)), std::string::npos) << msg;
  EXPECT_NE(msg.find(" 3 bytes"), std::string::npos) << msg;

  // A read issued right after a write (not waited) sees that write; a write
  // issued right after a read (not waited) does not disturb the read.
  const SwapTicket w3 = s.write("w", v3.data(), big);
  const SwapTicket r3 = s.read("w", out.data(), big);
  const SwapTicket w4 = s.write("w", v4.data(), big);
  s.wait(r3);
  s.wait(w3);
  EXPECT_EQ(first_difference(v3.data(), out.data(), big), -1);
  s.wait(w4);
  s.wait(s.read("w", out.data(), big));
  EXPECT_EQ(first_difference(v4.data(), out.data(), big), -1);
}

TEST(Swapper, ZeroBytesAndOddKeys) {
  TempDir dir;
  NvmeSwapper s(options(dir.path));
  s.wait(s.write("empty", nullptr, 0));
  s.wait(s.read("empty", nullptr, 0));
  // Keys with characters outside [A-Za-z0-9._-] stay distinct files.
  const char a[] = "first", b[] = "other";
  s.wait(s.write("layer/0:w", a, sizeof(a)));
  s.wait(s.write("layer_0_w", b, sizeof(b)));
  s.wait(s.write("", b, sizeof(b)));
  char out[8] = {};
  s.wait(s.read("layer/0:w", out, sizeof(a)));
  EXPECT_STREQ(out, "first");
  s.wait(s.read("layer_0_w", out, sizeof(b)));
  EXPECT_STREQ(out, "other");
  for (const auto& e : fs::directory_iterator(s.folder())) {
    EXPECT_EQ(e.path().extension(), ".swp") << e.path();
    EXPECT_EQ(e.path().string().find(':'), std::string::npos) << e.path();
  }
}

// ---- the folder ----

TEST(Swapper, FolderLivesWithTheSwapper) {
  TempDir dir;
  std::string folder, second_folder;
  {
    SwapOptions o = options(dir.path);
    o.rank = 3;
    NvmeSwapper s(o);
    folder = s.folder();
    EXPECT_EQ(folder, dir.path + "/zero_swap_rank3_" + std::to_string(::getpid()));
    EXPECT_TRUE(fs::is_directory(folder));
    NvmeSwapper other(o);  // a second swapper of the same rank in this process gets its own folder
    second_folder = other.folder();
    EXPECT_NE(second_folder, folder);
    std::vector<char> data(10000, 'x');
    s.wait(s.write("a", data.data(), data.size()));
    other.write("b", data.data(), data.size());  // destroyed with the write in flight
    EXPECT_TRUE(fs::exists(folder + "/a.swp"));
  }
  EXPECT_FALSE(fs::exists(folder)) << "the folder must go away with the swapper";
  EXPECT_FALSE(fs::exists(second_folder));
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(Swapper, RemoveGivesTheFileBackAndForgetsTheKey) {
  TempDir dir;
  NvmeSwapper s(options(dir.path));
  std::vector<char> data(3 * kMiB + 5, 'r'), back(data.size());
  s.wait(s.write("kept", data.data(), data.size()));
  s.write("gone", data.data(), data.size());  // removed with its write in flight
  s.remove("gone");
  EXPECT_FALSE(fs::exists(s.folder() + "/gone.swp"));
  EXPECT_THROW(s.read("gone", back.data(), back.size()), OffloadError) << "a removed key reads as one never written";
  s.remove("never written");  // nothing to do
  s.wait(s.read("kept", back.data(), back.size()));
  EXPECT_EQ(back, data) << "another key's file is untouched";
  const std::vector<char> again(data.size(), 'n');
  s.wait(s.write("gone", again.data(), again.size()));  // the key can be written again
  EXPECT_TRUE(fs::exists(s.folder() + "/gone.swp"));
  // The removed file is unlinked beside the caller's work (ext4 gives a
  // large file's blocks back inside unlink): it goes, and the new file of
  // that key stays.
  auto others = [&] {
    int n = 0;
    for (const auto& f : fs::directory_iterator(s.folder())) n += f.path().filename() != "kept.swp" && f.path().filename() != "gone.swp";
    return n;
  };
  for (int i = 0; i < 1000 && others() > 0; ++i) usleep(10000);
  EXPECT_EQ(others(), 0) << "the removed file's blocks are given back within 10 s";
  s.wait(s.read("gone", back.data(), back.size()));
  EXPECT_EQ(back, again) << "the file written after the remove is the new one";
}

TEST(Swapper, DirectIoMatchesTheFilesystem) {
  TempDir dir;
  NvmeSwapper s(options(dir.path));
  EXPECT_EQ(s.direct_io(), accepts_o_direct(dir.path)) << dir.path;
}

// ---- errors ----

// A missing nvme_path is made, as DeepSpeed makes it; one that cannot be
// (a plain file on the way) is refused naming it.
TEST(SwapperErrors, MissingPathIsMadeUnlessItCannotBe) {
  TempDir dir;
  const std::string missing = dir.path + "/no_such_dir/deeper";
  {
    NvmeSwapper s(options(missing));
    std::vector<unsigned char> data(4096, 0x5a), back(4096);
    s.wait(s.write("k", data.data(), data.size()));
    s.wait(s.read("k", back.data(), back.size()));
    EXPECT_EQ(back, data);
  }
  EXPECT_TRUE(fs::is_directory(missing));
  const std::string file = dir.path + "/plain_file";
  { std::FILE* f = std::fopen(file.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  const std::string msg = error_of([&] { NvmeSwapper s(options(file + "/sub")); });
  EXPECT_NE(msg.find(file + "/sub"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { NvmeSwapper s(options("")); }).find("nvme_path is empty"), std::string::npos);
}

TEST(SwapperErrors, FileInsteadOfDirectory) {
  TempDir dir;
  const std::string file = dir.path + "/plain_file";
  { std::FILE* f = std::fopen(file.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  const std::string msg = error_of([&] { NvmeSwapper s(options(file)); });
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
}

TEST(SwapperErrors, NotWritable) {
  // chmod does not stop root: as root, use a read-only mount instead.
  std::unique_ptr<TempDir> plain;
  std::unique_ptr<Mount> ro;
  std::string path;
  if (::geteuid() != 0) {
    plain = std::make_unique<TempDir>();
    ASSERT_EQ(::chmod(plain->path.c_str(), 0555), 0);
    path = plain->path;
  } else {
    ro = std::make_unique<Mount>("tmpfs", "size=1m", MS_RDONLY);
    if (!ro->ok) GTEST_SKIP() << "running as root, where chmod does not stop writing, and " << ro->error;
    path = ro->dir.path;
  }
  const std::string msg = error_of([&] { NvmeSwapper s(options(path)); });
  if (plain) ::chmod(plain->path.c_str(), 0755);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("not writable"), std::string::npos) << msg;
}

TEST(SwapperErrors, BadOptions) {
  TempDir dir;
  SwapOptions o = options(dir.path, 1000);
  EXPECT_NE(error_of([&] { NvmeSwapper s(o); }).find("block_size 1000"), std::string::npos);
  o = options(dir.path, 4096, 0);
  EXPECT_NE(error_of([&] { NvmeSwapper s(o); }).find("queue_depth 0"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir.path)) << "a failed construction leaves no folder behind";
}

TEST(SwapperErrors, UnknownKeySizeMismatchAndBadTicket) {
  TempDir dir;
  NvmeSwapper s(options(dir.path));
  char buf[100] = {};
  std::string msg = error_of([&] { s.read("never_written", buf, 10); });
  EXPECT_NE(msg.find("'never_written'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("never written"), std::string::npos) << msg;

  s.wait(s.write("sized", buf, 100));
  msg = error_of([&] { s.read("sized", buf, 99); });
  EXPECT_NE(msg.find("'sized'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("99 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("100 bytes"), std::string::npos) << msg;

  msg = error_of([&] { s.wait(12345); });
  EXPECT_NE(msg.find("12345"), std::string::npos) << msg;
}

TEST(SwapperErrors, FileChangedBehindTheSwapper) {
  TempDir dir;
  NvmeSwapper s(options(dir.path));
  AlignedBuffer data(3 * 4096);
  s.wait(s.write("cut", data.data(), data.size()));
  s.wait(s.write("gone", data.data(), data.size()));
  ASSERT_EQ(::truncate(swap_file(s, "cut").c_str(), 4096), 0);
  ASSERT_EQ(::unlink(swap_file(s, "gone").c_str()), 0);
  std::string msg = error_of([&] { s.wait(s.read("cut", data.data(), data.size())); });
  EXPECT_NE(msg.find(swap_file(s, "cut")), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  msg = error_of([&] { s.wait(s.read("gone", data.data(), data.size())); });
  EXPECT_NE(msg.find(swap_file(s, "gone")), std::string::npos) << msg;
  // wait_all reports failures too.
  s.read("cut", data.data(), data.size());
  s.read("gone", data.data(), data.size());
  msg = error_of([&] { s.wait_all(); });
  EXPECT_NE(msg.find("1 more failed"), std::string::npos) << msg;
}

TEST(SwapperErrors, NoSpaceLeft) {
  Mount small("tmpfs", "size=1m");
  if (!small.ok) GTEST_SKIP() << "needs a small filesystem to fill: " << small.error;
  std::string folder;
  {
    NvmeSwapper s(options(small.dir.path, 256 * 1024, 4));
    folder = s.folder();
    AlignedBuffer data(4 * kMiB);
    fill(data.data(), data.size(), 9);
    const std::string msg = error_of([&] { s.wait(s.write("too_big", data.data(), data.size())); });
    EXPECT_NE(msg.find("no space left on " + swap_file(s, "too_big")), std::string::npos) << msg;
    EXPECT_NE(msg.find("point nvme_path elsewhere"), std::string::npos) << msg;
    // The key whose write failed cannot be read back as if it were whole.
    const std::string read_msg = error_of([&] { s.read("too_big", data.data(), data.size()); });
    EXPECT_NE(read_msg.find("failed"), std::string::npos) << read_msg;
    // After freeing the space (a smaller rewrite), the swapper works again.
    s.wait(s.write("too_big", data.data(), 100 * 1024));
    AlignedBuffer back(100 * 1024);
    s.wait(s.read("too_big", back.data(), back.size()));
    EXPECT_EQ(first_difference(data.data(), back.data(), back.size()), -1);
  }
  EXPECT_FALSE(fs::exists(folder)) << "the folder must go away after errors too";
}

// RLIMIT_FSIZE applies to io_uring's requests (inline and in its io-wq
// workers, which share the process's limits): the write crossing the limit
// (the last chunk here) comes back short, and resubmitting the remainder
// fails with EFBIG (SIGXFSZ ignored). A swapper taking the short write as
// done would report success with the file cut at the limit.
TEST(SwapperErrors, FileTooLarge) {
  TempDir dir;
  std::string folder;
  struct rlimit old_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct sigaction ignore {}, old_action {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  std::string msg;
  size_t file_bytes = 0;
  const size_t kLimit = 3 * kMiB - 8192;
  bool direct = false;
  {
    NvmeSwapper s(options(dir.path, 256 * 1024, 4));
    folder = s.folder();
    direct = s.direct_io();
    AlignedBuffer data(3 * kMiB);
    struct rlimit limit = old_limit;
    limit.rlim_cur = kLimit;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
    msg = error_of([&] { s.wait(s.write("huge", data.data(), data.size())); });
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    file_bytes = fs::file_size(swap_file(s, "huge"));
  }
  ::sigaction(SIGXFSZ, &old_action, nullptr);
  if (msg == "NO ERROR" && file_bytes > kLimit) {
    GTEST_SKIP() << "this kernel's io_uring does not apply RLIMIT_FSIZE (the file grew to " << file_bytes
                 << " bytes past the " << kLimit << "-byte limit)";
  }
  EXPECT_LE(file_bytes, kLimit);
  EXPECT_NE(msg.find("file too large: " + folder + "/huge.swp"), std::string::npos) << msg << " direct " << direct;
  EXPECT_FALSE(fs::exists(folder));
}

// ---- buffered fallback ----

TEST(Swapper, BufferedFallbackWithoutODirect) {
  std::unique_ptr<Mount> ramfs;
  std::string where;
  if (fs::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0 && !accepts_o_direct("/dev/shm")) {
    where = "/dev/shm";
  } else {
    // /dev/shm (tmpfs) has O_DIRECT since Linux 6.6; ramfs never has.
    ramfs = std::make_unique<Mount>("ramfs", "");
    if (!ramfs->ok) {
      GTEST_SKIP() << "/dev/shm accepts O_DIRECT on this kernel and no filesystem without O_DIRECT can be "
                      "mounted here: "
                   << ramfs->error;
    }
    if (accepts_o_direct(ramfs->dir.path)) GTEST_SKIP() << "ramfs accepts O_DIRECT on this kernel";
    where = ramfs->dir.path;
  }
  TempDir dir(where);
  ::testing::internal::CaptureStderr();
  {
    NvmeSwapper s(options(dir.path, 4096 * 4, 4));
    NvmeSwapper again(options(dir.path, 4096 * 4, 4));
    EXPECT_FALSE(s.direct_io());
    EXPECT_FALSE(again.direct_io());
    for (size_t n : {size_t(1), size_t(4095), size_t(4097), size_t(100003)}) {
      std::vector<unsigned char> src(n + 3), dst(n + 5);
      fill(src.data() + 3, n, n);
      s.wait(s.write("b", src.data() + 3, n));
      s.wait(s.read("b", dst.data() + 5, n));
      ASSERT_EQ(first_difference(src.data() + 3, dst.data() + 5, n), -1) << n;
    }
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  size_t count = 0;
  for (size_t pos = 0; (pos = err.find("does not support O_DIRECT", pos)) != std::string::npos; ++pos) ++count;
  EXPECT_EQ(count, 1u) << "one warning expected, got:\n" << err;
}

}  // namespace
