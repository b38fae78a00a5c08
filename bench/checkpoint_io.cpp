// Checkpoint save/load throughput per rank against plain sequential file I/O
// of the same number of bytes, in the same directory and the same run.
//
//   zero-run --nproc 2 bench_checkpoint_io [--stage 2] [--dtype fp32|bf16]
//       [--depth 6] [--width 640] [--heads 10] [--context 64] [--micro 2]
//       [--reps 7] [--warmup 1] [--chunk-mib 8] [--dir <folder>]
//       [--threads 0 = cores / ranks] [--phase all|save|load]
//
// --phase save / load repeats only the engine's save (or only its cold and
// warm loads of one checkpoint), without the reference: for profiling
// (perf record -- zero-run ...).
// bench/run_checkpoint_io.sh runs it and keeps the table.
//
// The model is examples/gpt's GPT trained one step with AdamW (so the
// optimizer states exist). Then, `reps` times, all ranks together:
//   save      engine.save_checkpoint(<dir>/ckpt, "rep<i>"): the call's wall
//             time on each rank, the slowest rank's (the ranks leave the
//             collective together). Bytes: this rank's rank file.
//   write     reference: the same number of bytes as this rank's file, from
//             a prepared buffer of that size, with write(2) of `chunk-mib`
//             pieces into a new file in the same folder, then fsync, close.
//   load cold engine.load_checkpoint(<dir>/ckpt, "rep<i>") after every file
//             of the tag was evicted from the page cache (fsync +
//             posix_fadvise(POSIX_FADV_DONTNEED); the residency is checked
//             with mincore and printed). Includes the loader's XXH3
//             verification of every file it reads.
//   read cold reference: read(2) of the reference file, evicted the same way,
//             into a buffer of its size, in `chunk-mib` pieces.
//   load warm / read warm: the same again right after, from the page cache.
// The first `warmup` repetitions are not counted (the first write after
// start-up is often several times slower).
// Before each timed phase the previous files are removed and the file
// system synced (syncfs), outside the timing; a barrier starts each phase.
// The engine and the reference alternate which goes first from one
// repetition to the next. Figures: the median over the repetitions of the
// slowest rank's time; MB/s = this rank's bytes / that time (MB = 1e6 B).
// Goal (from the issue, information only): engine >= 0.8x the reference.
// Everything created under --dir is removed at the end.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gpt/corpus.h"
#include "gpt/gpt.h"
#include "gpt_bench.h"
#include "zero/zero.h"
#include "median.h"

using namespace zero_examples;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

[[noreturn]] void sys_fail(const std::string& what, const std::string& path) {
  throw std::runtime_error(what + " " + path + ": " + std::strerror(errno));
}

// ---- plain file I/O (the reference) -------------------------------------

struct WriteTimes {
  double write_s = 0, fsync_s = 0, total_s = 0;
};

// A new file: open, write(2) `chunk` pieces of buf, fsync, close.
WriteTimes reference_write(const std::string& path, const std::vector<char>& buf, size_t chunk) {
  WriteTimes t;
  const auto start = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) sys_fail("creating", path);
  for (size_t off = 0; off < buf.size();) {
    const size_t n = std::min(chunk, buf.size() - off);
    ssize_t w = ::write(fd, buf.data() + off, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      sys_fail("writing", path);
    }
    off += static_cast<size_t>(w);
  }
  t.write_s = seconds_since(start);
  const auto sync_start = Clock::now();
  if (::fsync(fd) != 0) sys_fail("syncing", path);
  if (::close(fd) != 0) sys_fail("closing", path);
  t.fsync_s = seconds_since(sync_start);
  t.total_s = seconds_since(start);
  return t;
}

// open, read(2) `chunk` pieces into buf until end of file, close; returns the bytes read.
size_t reference_read(const std::string& path, std::vector<char>& buf, size_t chunk) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) sys_fail("opening", path);
  size_t off = 0;
  while (off < buf.size()) {
    ssize_t r = ::read(fd, buf.data() + off, std::min(chunk, buf.size() - off));
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail("reading", path);
    }
    if (r == 0) break;
    off += static_cast<size_t>(r);
  }
  ::close(fd);
  return off;
}

// Drops a file's pages from the page cache (they are clean after fsync).
void evict(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) sys_fail("opening", path);
  ::fdatasync(fd);
  const int e = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (e != 0) {
    errno = e;
    sys_fail("posix_fadvise(DONTNEED)", path);
  }
}

// Resident bytes and size of a file (mincore over a read-only mapping).
std::pair<uint64_t, uint64_t> residency(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) sys_fail("opening", path);
  struct stat st {};
  ::fstat(fd, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return {0, 0};
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) sys_fail("mapping", path);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  uint64_t resident = 0;
  if (::mincore(map, size, vec.data()) == 0) {
    for (unsigned char v : vec) resident += (v & 1) ? page : 0;
  }
  ::munmap(map, size);
  return {std::min(resident, size), size};
}

void sync_fs(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) sys_fail("opening", dir);
  ::syncfs(fd);
  ::close(fd);
}

// Regular files under `dir` (recursively).
std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// This rank's data file in a tag folder: "rank<digits>.safetensors" whose number is `rank`.
std::string rank_file(const std::string& tag_dir, int rank) {
  for (const auto& e : fs::directory_iterator(tag_dir)) {
    const std::string name = e.path().filename().string();
    const std::string suffix = ".safetensors";
    if (name.rfind("rank", 0) != 0 || name.size() <= 4 + suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string digits = name.substr(4, name.size() - 4 - suffix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    if (std::stoi(digits) == rank) return e.path().string();
  }
  throw std::runtime_error("no data file of rank " + std::to_string(rank) + " in " + tag_dir);
}

// ---- collectives on doubles ----------------------------------------------

std::vector<double> reduce(zero::comm::ProcessGroup& pg, const std::vector<double>& v, zero::comm::ReduceOp op) {
  at::Tensor t = torch::tensor(v, torch::kDouble);
  pg.all_reduce(t, op);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}
double max_over_ranks(zero::comm::ProcessGroup& pg, double x) { return reduce(pg, {x}, zero::comm::ReduceOp::Max)[0]; }

// Runs `fn` on every rank at once: barrier, time, the slowest rank's seconds.
double timed(zero::comm::ProcessGroup& pg, const std::function<void()>& fn) {
  pg.barrier();
  const auto start = Clock::now();
  fn();
  return max_over_ranks(pg, seconds_since(start));
}

struct Series {
  std::vector<double> save, write, load_cold, read_cold, load_warm, read_warm, write_only, fsync_only;
};

int run(const zero_bench::Flags& flags) {
  auto world = zero::comm::init_process_group();
  zero::comm::ProcessGroup& pg = *world;
  const int rank = world->rank(), N = world->size();
  int threads = static_cast<int>(flags.num("threads"));
  if (threads <= 0) threads = std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) / N);
  at::set_num_threads(threads);
  const int reps = static_cast<int>(flags.num("reps"));
  const int warmup = static_cast<int>(flags.num("warmup"));
  const std::string phase = flags.str("phase");
  if (phase != "all" && phase != "save" && phase != "load")
    throw std::invalid_argument("--phase must be all, save or load; got '" + phase + "'");
  const bool only_save = phase == "save", only_load = phase == "load";
  const size_t chunk = static_cast<size_t>(flags.num("chunk-mib")) << 20;
  if (reps < 1 || chunk == 0) throw std::invalid_argument("--reps and --chunk-mib must be positive");

  // The folder: --dir, or beside this program (the build folder); ours is a
  // subfolder that is removed at the end.
  std::string base = flags.str("dir");
  if (base.empty()) base = (fs::read_symlink("/proc/self/exe").parent_path() / "checkpoint_io.tmp").string();
  const bool created_base = !fs::exists(base);
  const std::string root = (fs::path(base) / "zero_checkpoint_io").string();
  const std::string ckdir = root + "/ckpt";
  const std::string ref = root + "/reference_rank" + std::to_string(rank) + ".bin";
  if (rank == 0) {
    fs::remove_all(root);
    fs::create_directories(ckdir);
  }
  pg.barrier();

  // Model, one training step.
  Corpus corpus;
  Batcher train(corpus.train_tokens(), BatcherOptions{0, 1});
  GPTOptions options;
  options.vocab_size = corpus.vocab_size();
  options.depth = flags.num("depth");
  options.width = flags.num("width");
  options.heads = flags.num("heads");
  options.context = flags.num("context");
  torch::manual_seed(0);
  GPT model(options);
  zero_bench::TrainSetup setup;
  setup.stage = static_cast<int>(flags.num("stage"));
  setup.dtype = flags.str("dtype");
  setup.micro_batch = flags.num("micro");
  setup.reduce_bucket_size = 5'000'000;
  zero::InitOptions init;
  init.group = world;
  auto engine = zero::initialize(zero::Config::from_json(zero_bench::ds_config(setup)), model, init);
  {
    Batch batch = train.next_batch(setup.micro_batch, options.context, rank, N, 0, 0);
    engine.backward(model->loss(batch.inputs, batch.targets));
    engine.step();
  }
  const int64_t psi = model->num_parameters();

  // A first save gives the file size of this rank; the reference buffer is
  // made to match. With --phase load it is the checkpoint every load reads.
  engine.save_checkpoint(ckdir, "probe");
  const uint64_t bytes = fs::file_size(rank_file(ckdir + "/probe", rank));
  pg.barrier();
  if (rank == 0 && !only_load) fs::remove_all(ckdir + "/probe");
  std::vector<char> wbuf(bytes), rbuf(bytes);
  for (size_t i = 0; i < wbuf.size(); ++i) wbuf[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::memset(rbuf.data(), 1, rbuf.size());  // touched: no page faults inside the timing

  // XXH3 over this rank's bytes in memory (what the writer and the loader's verification add).
  double hash_s = 1e30;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    volatile uint64_t h = XXH3_64bits(wbuf.data(), wbuf.size());
    (void)h;
    hash_s = std::min(hash_s, seconds_since(start));
  }
  const double hash_max = max_over_ranks(pg, hash_s);

  Series s;
  double resident_ck = 0, resident_ref = 0;  // bytes resident after eviction, summed over reps and ranks
  uint64_t total_bytes = 0;
  for (int it = 0; it < warmup + reps; ++it) {
    const int rep = it - warmup;  // negative: a warm-up repetition, not counted
    const std::string tag = only_load ? "probe" : "rep" + std::to_string(it);
    const std::string tag_dir = ckdir + "/" + tag;
    const bool engine_first = it % 2 == 0;
    const std::string label = rep < 0 ? "warm-up" : "rep " + std::to_string(rep);
    const size_t keep = s.save.size(), keep_l = s.load_cold.size();
    // Quiet start: nothing of ours dirty or being discarded.
    if (!only_load) ::unlink(ref.c_str());
    sync_fs(root);

    // Save against write.
    auto do_save = [&] { s.save.push_back(timed(pg, [&] { engine.save_checkpoint(ckdir, tag); })); };
    auto do_write = [&] {
      WriteTimes w;
      s.write.push_back(timed(pg, [&] { w = reference_write(ref, wbuf, chunk); }));
      const auto parts = reduce(pg, {w.write_s, w.fsync_s}, zero::comm::ReduceOp::Max);
      s.write_only.push_back(parts[0]);
      s.fsync_only.push_back(parts[1]);
    };
    if (only_save) {
      do_save();
    } else if (only_load) {
      // the checkpoint "probe" exists; no reference
    } else if (engine_first) {
      do_save();
      sync_fs(root);
      do_write();
    } else {
      do_write();
      sync_fs(root);
      do_save();
    }
    if (only_save) {
      if (rank == 0) std::printf("%s: save %.3f s\n", label.c_str(), s.save.back());
      pg.barrier();
      if (rank == 0) fs::remove_all(tag_dir);
      if (rep < 0) s.save.resize(keep);
      continue;
    }
    const uint64_t mine = fs::file_size(rank_file(tag_dir, rank));
    if (mine != bytes) throw std::runtime_error("the rank file changed size between saves");
    if (rep == 0) {
      uint64_t all = 0;
      for (const auto& f : files_under(tag_dir)) all += fs::file_size(f);
      total_bytes = all;  // every rank sees the same folder
    }

    // Cold: evict every file of the tag and the reference, then load against read.
    pg.barrier();
    for (const auto& f : files_under(tag_dir)) evict(f);
    evict(ckdir + "/latest");
    if (!only_load) evict(ref);
    double res_ck = 0;
    for (const auto& f : files_under(tag_dir)) res_ck += static_cast<double>(residency(f).first);
    const double res_ref = only_load ? 0.0 : static_cast<double>(residency(ref).first);
    const auto res = reduce(pg, {res_ck, res_ref}, zero::comm::ReduceOp::Sum);
    resident_ck += res[0];
    resident_ref += res[1];
    auto do_load = [&](std::vector<double>& out) {
      out.push_back(timed(pg, [&] { engine.load_checkpoint(ckdir, tag); }));
    };
    auto do_read = [&](std::vector<double>& out) {
      if (only_load) return;
      size_t got = 0;
      out.push_back(timed(pg, [&] { got = reference_read(ref, rbuf, chunk); }));
      if (got != bytes) throw std::runtime_error("short read of " + ref);
    };
    if (engine_first) {
      do_load(s.load_cold);
      do_read(s.read_cold);
    } else {
      do_read(s.read_cold);
      do_load(s.load_cold);
    }
    if (!only_load && std::memcmp(rbuf.data(), wbuf.data(), std::min<size_t>(bytes, 4096)) != 0)
      throw std::runtime_error("the reference file reads back different bytes");
    // Warm: both are in the page cache now.
    if (engine_first) {
      do_load(s.load_warm);
      do_read(s.read_warm);
    } else {
      do_read(s.read_warm);
      do_load(s.load_warm);
    }
    if (rank == 0 && only_load) {
      std::printf("%s: load cold %.3f s, load warm %.3f s\n", label.c_str(), s.load_cold.back(), s.load_warm.back());
    } else if (rank == 0) {
      std::printf("%s (%s first): save %.3f s, write %.3f s (write %.3f + fsync %.3f); load cold %.3f s, "
                  "read cold %.3f s; load warm %.3f s, read warm %.3f s\n",
                  label.c_str(), engine_first ? "engine" : "reference", s.save.back(), s.write.back(), s.write_only.back(),
                  s.fsync_only.back(), s.load_cold.back(), s.read_cold.back(), s.load_warm.back(), s.read_warm.back());
    }
    std::fflush(stdout);
    pg.barrier();
    if (rank == 0 && !only_load) fs::remove_all(tag_dir);
    if (rep < 0) {  // drop the warm-up's figures
      for (auto* v : {&s.save, &s.write, &s.write_only, &s.fsync_only}) v->resize(std::min(v->size(), keep));
      for (auto* v : {&s.load_cold, &s.read_cold, &s.load_warm, &s.read_warm}) v->resize(std::min(v->size(), keep_l));
      resident_ck = resident_ref = 0;
    }
  }

  // Clean up what we created.
  pg.barrier();
  ::unlink(ref.c_str());
  pg.barrier();
  if (rank == 0) {
    fs::remove_all(root);
    if (created_base) fs::remove(base);  // only when empty
  }

  // Bytes of every rank (they differ slightly: rank 0 also holds the
  // parameters' remainder and the RNG of each rank is in its own file).
  const auto max_bytes = reduce(pg, {static_cast<double>(bytes)}, zero::comm::ReduceOp::Max)[0];
  const auto min_bytes = -reduce(pg, {-static_cast<double>(bytes)}, zero::comm::ReduceOp::Max)[0];
  if (rank == 0 && phase != "all") {
    std::printf("\n%s only, %d reps after %d warm-up, %.0f bytes per rank: median save %.3f s, load cold %.3f s, "
                "load warm %.3f s\n",
                phase.c_str(), reps, warmup, max_bytes, s.save.empty() ? 0.0 : zero_bench::median(s.save),
                s.load_cold.empty() ? 0.0 : zero_bench::median(s.load_cold), s.load_warm.empty() ? 0.0 : zero_bench::median(s.load_warm));
  } else if (rank == 0) {
    const double b = max_bytes;  // the slowest rank's time is set by the largest file, near enough
    auto mbps = [&](double sec) { return b / sec / 1e6; };
    const double save = zero_bench::median(s.save), write = zero_bench::median(s.write), lc = zero_bench::median(s.load_cold), rc = zero_bench::median(s.read_cold),
                 lw = zero_bench::median(s.load_warm), rw = zero_bench::median(s.read_warm);
    std::printf("\n## checkpoint I/O: %d ranks x %d thread(s), GPT %lld params (depth %lld, width %lld), stage %d, %s, "
                "AdamW; median of %d reps after %d warm-up, slowest rank; chunk %zu MiB\n",
                N, threads, (long long)psi, (long long)options.depth, (long long)options.width, setup.stage,
                setup.dtype.c_str(), reps, warmup, chunk >> 20);
    std::printf("bytes per rank %.0f-%.0f (%.1f MB), whole checkpoint %.1f MB (rank files + manifest), "
                "in %s\n", min_bytes, max_bytes, max_bytes / 1e6, total_bytes / 1e6, base.c_str());
    std::printf("resident after eviction: checkpoint %.2f%%, reference %.2f%% of their bytes\n",
                100.0 * resident_ck / (double(total_bytes) * reps), 100.0 * resident_ref / (double(bytes) * N * reps));
    std::printf("XXH3-64 of this rank's bytes in memory: %.3f s (%.0f MB/s); reference write %.3f s = write() %.3f s "
                "+ fsync %.3f s (medians)\n\n",
                hash_max, b / hash_max / 1e6, write, zero_bench::median(s.write_only), zero_bench::median(s.fsync_only));
    std::printf("| operation | bytes/rank | engine s | engine MB/s | reference | reference s | reference MB/s | ratio | goal 0.8 |\n");
    std::printf("|---|---:|---:|---:|---|---:|---:|---:|---|\n");
    auto row = [&](const char* op, double e, const char* ref_name, double r) {
      const double ratio = r / e;
      std::printf("| %s | %.0f | %.3f | %.1f | %s | %.3f | %.1f | %.3f | %s |\n", op, b, e, mbps(e), ref_name, r,
                  mbps(r), ratio, ratio >= 0.8 ? "pass" : "miss");
    };
    row("save", save, "write()+fsync", write);
    row("load, cold cache", lc, "read(), cold cache", rc);
    row("load, warm cache", lw, "read(), warm cache", rw);
    auto list = [](const char* name, const std::vector<double>& v) {
      std::printf("%s:", name);
      for (double x : v) std::printf(" %.3f", x);
      std::printf("\n");
    };
    std::printf("\nper repetition (s):\n");
    list("save", s.save);
    list("write+fsync", s.write);
    list("load cold", s.load_cold);
    list("read cold", s.read_cold);
    list("load warm", s.load_warm);
    list("read warm", s.read_warm);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    zero_bench::Flags flags(argc, argv,
                            {{"stage", "2"},
                             {"dtype", "fp32"},
                             {"depth", "6"},
                             {"width", "640"},
                             {"heads", "10"},
                             {"context", "64"},
                             {"micro", "2"},
                             {"reps", "7"},
                             {"warmup", "1"},
                             {"phase", "all"},
                             {"chunk-mib", "8"},
                             {"dir", ""},
                             {"threads", "0"}});
    const std::string dtype = flags.str("dtype");
    if (dtype != "fp32" && dtype != "bf16") throw std::invalid_argument("--dtype must be fp32 or bf16; got '" + dtype + "'");
    return run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint_io: %s\n", e.what());
    return 1;
  }
}
