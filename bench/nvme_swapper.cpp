// NVMe swapper throughput: write and read GB/s of zero::offload::NvmeSwapper
// moving --total-mib in keys of --key-mib from/to aligned host buffers
// (used in place with O_DIRECT). bench/run_nvme_swapper.sh runs it beside
// fio (io_uring, O_DIRECT, same block size and queue depth, same directory)
// and prints the ratios.
//
// Each repeat uses a fresh swapper (new folder, new files), so writes
// allocate their blocks as fio's writes to a fresh file do; the reads read
// what that repeat wrote. The first repeat's reads are checked against the
// written bytes. Prints one line per repeat and, last, one JSON line.
//
// --pages huge (default): AlignedBuffer, which asks for transparent huge
// pages; --pages small: 4 KiB-aligned memory on 4 KiB pages (MADV_NOHUGEPAGE),
// like fio's own buffers. O_DIRECT pins the pages of every request, so the
// page size shows in the figures when the disk is fast.
//
// Usage: bench_nvme_swapper [--dir D] [--total-mib 1024] [--key-mib 256]
//                           [--block-size 1048576] [--queue-depth 8] [--repeat 3]
//                           [--pages huge|small]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "offload/swapper.h"
#include "zero/error.h"
#include "median.h"

using zero::offload::AlignedBuffer;
using zero::offload::NvmeSwapper;
using zero::offload::SwapOptions;

namespace {

struct Args {
  std::string dir;
  int64_t total_mib = 1024;
  int64_t key_mib = 256;
  int64_t block_size = 1 << 20;
  int64_t queue_depth = 8;
  int repeat = 3;
  std::string pages = "huge";
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_nvme_swapper: %s\nusage: bench_nvme_swapper [--dir D] [--total-mib N] [--key-mib N] "
               "[--block-size BYTES] [--queue-depth N] [--repeat N] [--pages huge|small]\n",
               why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  const char* tmp = std::getenv("TMPDIR");
  a.dir = (tmp && *tmp) ? tmp : "/tmp";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "-h" || k == "--help") {
      std::printf("usage: bench_nvme_swapper [--dir D] [--total-mib N] [--key-mib N] [--block-size BYTES] "
                  "[--queue-depth N] [--repeat N] [--pages huge|small]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) usage(("missing value after " + k).c_str());
    const char* v = argv[++i];
    if (k == "--dir") a.dir = v;
    else if (k == "--total-mib") a.total_mib = std::atoll(v);
    else if (k == "--key-mib") a.key_mib = std::atoll(v);
    else if (k == "--block-size") a.block_size = std::atoll(v);
    else if (k == "--queue-depth") a.queue_depth = std::atoll(v);
    else if (k == "--repeat") a.repeat = std::atoi(v);
    else if (k == "--pages") a.pages = v;
    else usage(("unknown option " + k).c_str());
  }
  if (a.total_mib <= 0 || a.key_mib <= 0 || a.repeat <= 0) usage("sizes and --repeat must be positive");
  if (a.pages != "huge" && a.pages != "small") usage("--pages is huge or small");
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string list(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    char b[32];
    std::snprintf(b, sizeof(b), "%s%.4f", i ? "," : "", v[i]);
    s += b;
  }
  return s + "]";
}

// Host memory for one key: an AlignedBuffer, or 4 KiB pages only.
struct KeyBuffer {
  AlignedBuffer aligned;
  void* small = nullptr;
  KeyBuffer(size_t bytes, bool huge) {
    if (huge) {
      aligned = AlignedBuffer(bytes);
      return;
    }
    small = std::aligned_alloc(zero::offload::kIoAlignment, bytes);
    if (small == nullptr) throw std::bad_alloc();
    (void)::madvise(small, bytes, MADV_NOHUGEPAGE);
    std::memset(small, 0, bytes);
  }
  ~KeyBuffer() { std::free(small); }
  KeyBuffer(KeyBuffer&& o) noexcept : aligned(std::move(o.aligned)), small(o.small) { o.small = nullptr; }
  void* data() const { return small ? small : aligned.data(); }
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const size_t key_bytes = static_cast<size_t>(a.key_mib) << 20;
  const size_t keys = static_cast<size_t>((a.total_mib + a.key_mib - 1) / a.key_mib);
  const double total = static_cast<double>(keys * key_bytes);
  try {
    std::vector<KeyBuffer> src, dst;
    const bool huge = a.pages == "huge";
    for (size_t k = 0; k < keys; ++k) {
      src.emplace_back(key_bytes, huge);
      dst.emplace_back(key_bytes, huge);
      auto* p = static_cast<uint64_t*>(src.back().data());
      for (size_t i = 0; i < key_bytes / 8; ++i) p[i] = (k + 1) * 0x9E3779B97F4A7C15ull ^ i;
      std::memset(dst.back().data(), 0xFF, key_bytes);  // touch the pages before timing
    }
    std::vector<double> write_gbps, read_gbps;
    bool direct = true;
    for (int r = 0; r < a.repeat; ++r) {
      SwapOptions o;
      o.nvme_path = a.dir;
      o.block_size = a.block_size;
      o.queue_depth = a.queue_depth;
      NvmeSwapper s(o);
      direct = s.direct_io();
      auto t0 = std::chrono::steady_clock::now();
      for (size_t k = 0; k < keys; ++k) s.write("key" + std::to_string(k), src[k].data(), key_bytes);
      s.wait_all();
      const double tw = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      for (size_t k = 0; k < keys; ++k) s.read("key" + std::to_string(k), dst[k].data(), key_bytes);
      s.wait_all();
      const double tr = seconds_since(t0);
      if (r == 0) {
        for (size_t k = 0; k < keys; ++k) {
          if (std::memcmp(src[k].data(), dst[k].data(), key_bytes) != 0) {
            std::fprintf(stderr, "bench_nvme_swapper: key%zu read back differs from what was written\n", k);
            return 1;
          }
        }
      }
      write_gbps.push_back(total / tw / 1e9);
      read_gbps.push_back(total / tr / 1e9);
      std::printf("repeat %d: write %.3f GB/s (%.3f s), read %.3f GB/s (%.3f s), %zu keys x %lld MiB, %s\n", r,
                  write_gbps.back(), tw, read_gbps.back(), tr, keys, static_cast<long long>(a.key_mib),
                  s.folder().c_str());
    }
    std::printf(
        "{\"bench\":\"nvme_swapper\",\"dir\":\"%s\",\"pages\":\"%s\",\"direct_io\":%s,\"block_size\":%lld,\"queue_depth\":%lld,"
        "\"keys\":%zu,\"key_bytes\":%zu,\"total_bytes\":%.0f,\"write_gbps\":%s,\"read_gbps\":%s,"
        "\"write_gbps_median\":%.4f,\"read_gbps_median\":%.4f}\n",
        a.dir.c_str(), a.pages.c_str(), direct ? "true" : "false", static_cast<long long>(a.block_size),
        static_cast<long long>(a.queue_depth), keys, key_bytes, total, list(write_gbps).c_str(),
        list(read_gbps).c_str(), zero_bench::median(write_gbps), zero_bench::median(read_gbps));
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "bench_nvme_swapper: %s\n", e.what());
    return 1;
  }
  return 0;
}
