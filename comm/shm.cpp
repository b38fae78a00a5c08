// Host collectives through one shared-memory segment, for a group whose
// ranks all run on this host (Note [Shared-memory collectives]).
// One concept over 400 lines: one shared-memory segment's protocol (layout,
// futex waits, the collectives over it), which only makes sense together.
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "comm/internal.h"
#include "core/env.h"
#include "core/fault.h"
#include "zero/error.h"
#include "zero/log.h"

namespace zero::comm {
namespace {

// Note [Shared-memory collectives]: gloo's TCP transport moves every byte
// of a loopback collective through the kernel's socket buffers (a copy in,
// a copy out) in small pieces, and on CPU ranks that work runs on the cores
// the ranks compute on: 0.8 GB/s bus bandwidth for a 64 MiB all-reduce on
// 2 ranks where memcpy does 5-10 GB/s (bench/README.md). When every rank of
// a group runs on this host, the group maps one segment instead:
//   all-reduce      each rank copies a chunk of its tensor into its slot;
//                   barrier; rank r sums slice r of every slot and writes
//                   the sum back into slice r of its own slot; barrier;
//                   each rank copies every slice out.
//   reduce-scatter  each rank copies the pieces of its input that go to
//                   every rank into its slot; barrier; rank r sums its
//                   piece of every slot into its output.
//   all-gather      copy in; barrier; copy every slot out.
//   broadcast       the root copies in; barrier; the others copy out.
// Sums run in rank order, so every rank gets the same bits. Chunks
// alternate between two sets of slots: a rank writes set b again only
// after the barrier of the chunk in between, which no rank enters before
// it has read everything it needed from set b. Each barrier also compares
// what every rank said it is doing (collective, bytes, dtype, root), so
// ranks that issue different collectives or sizes fail at once with a
// CommError naming both, and a wait checks every 100 ms whether the ranks
// it waits for are still alive, so that a dead peer is named within a
// fraction of a second rather than after ZERO_COMM_TIMEOUT.
//
// The segment is created by rank 0 under a random name, opened by the
// others, and unlinked as soon as every rank has mapped it: nothing is
// left in /dev/shm after a crash. Groups spanning hosts (Note [One node]),
// a /dev/shm too small for the segment (Docker's default is 64 MiB), or
// ZERO_HOST_TRANSPORT=gloo use gloo.

constexpr size_t kLine = 64;

enum class Kind : uint32_t { Barrier = 1, AllReduce, ReduceScatter, AllGather, Broadcast, AllToAll };

const char* name_of(Kind kind) {
  switch (kind) {
    case Kind::Barrier: return "barrier";
    case Kind::AllReduce: return "all_reduce";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllGather: return "all_gather";
    case Kind::Broadcast: return "broadcast";
    case Kind::AllToAll: return "all_to_all";
  }
  return "?";
}

// What a rank says it is doing at a barrier.
struct Header {
  uint64_t number = 0;  // this group's collective count
  uint64_t bytes = 0;
  uint32_t kind = 0;
  int32_t root = -1;
  int32_t dtype = -1;
  int32_t op = -1;
  bool operator==(const Header& o) const {
    return number == o.number && bytes == o.bytes && kind == o.kind && root == o.root && dtype == o.dtype && op == o.op;
  }
};

struct alignas(kLine) Doorbell {
  std::atomic<uint32_t> rings;     // the futex word: bumped by every arrival
  std::atomic<uint32_t> sleepers;  // waiters in futex_wait
};

struct alignas(kLine) RankSlot {
  std::atomic<uint64_t> arrived;  // barriers this rank has entered
  int32_t pid;
  Header headers[2];  // by barrier parity
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory collectives need address-free atomics");

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string as_string(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::vector<uint8_t> as_bytes(const std::string& s) { return {s.begin(), s.end()}; }

class ShmBackend : public HostBackend {
 public:
  ShmBackend(const GroupInfo& group, void* base, size_t segment_bytes, size_t slot_bytes)
      : group_(group), base_(static_cast<uint8_t*>(base)), segment_bytes_(segment_bytes), slot_bytes_(slot_bytes) {
    rank_slot(group_.rank).pid = static_cast<int32_t>(::getpid());
  }
  ~ShmBackend() override { ::munmap(base_, segment_bytes_); }

  static size_t control_bytes(int size) { return round_up(sizeof(Doorbell) + size * sizeof(RankSlot), 4096); }
  static size_t segment_size(int size, size_t slot_bytes) { return control_bytes(size) + 2 * size * slot_bytes; }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    run(Kind::AllReduce, t, -1, op, [&](const Header& h) {
      const size_t elem = t.element_size(), n = size_t(t.numel()), per_chunk = slot_bytes_ / elem;
      auto* data = static_cast<uint8_t*>(t.data_ptr());
      size_t offset = 0;
      do {
        const size_t len = std::min(per_chunk, n - offset);
        const int set = next_set();
        std::memcpy(slot(set, group_.rank), data + offset * elem, len * elem);
        arrive_and_wait(h);
        const auto [lo, hi] = slice(len, group_.rank);
        if (hi > lo) {
          at::Tensor mine = t.view({-1}).narrow(0, int64_t(offset + lo), int64_t(hi - lo));
          reduce_chunks(mine, peers_view(set, lo * elem, hi - lo, t.scalar_type()), op);
          std::memcpy(slot(set, group_.rank) + lo * elem, mine.data_ptr(), (hi - lo) * elem);
        }
        arrive_and_wait(h);
        for (int p = 0; p < group_.size; ++p) {
          if (p == group_.rank) continue;
          const auto [plo, phi] = slice(len, p);
          std::memcpy(data + (offset + plo) * elem, slot(set, p) + plo * elem, (phi - plo) * elem);
        }
        offset += len;
      } while (offset < n);
    });
  }

  void reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    run(Kind::ReduceScatter, input, -1, op, [&](const Header& h) {
      const size_t elem = input.element_size(), m = size_t(output.numel());
      const size_t per_chunk = slot_bytes_ / elem / group_.size;
      const auto* in = static_cast<const uint8_t*>(input.data_ptr());
      at::Tensor out = output.view({-1});
      size_t offset = 0;
      do {
        const size_t len = std::min(per_chunk, m - offset);
        const int set = next_set();
        for (int q = 0; q < group_.size; ++q) {
          std::memcpy(slot(set, group_.rank) + q * len * elem, in + (q * m + offset) * elem, len * elem);
        }
        arrive_and_wait(h);
        if (len > 0) {
          at::Tensor mine = out.narrow(0, int64_t(offset), int64_t(len));
          reduce_chunks(mine, peers_view(set, group_.rank * len * elem, len, input.scalar_type()), op);
        }
        offset += len;
      } while (offset < m);
    });
  }

  void all_gather(at::Tensor& output, const at::Tensor& input) override {
    run(Kind::AllGather, input, -1, ReduceOp::Sum, [&](const Header& h) {
      const size_t bytes = input.nbytes();
      const auto* in = static_cast<const uint8_t*>(input.data_ptr());
      auto* out = static_cast<uint8_t*>(output.data_ptr());
      size_t offset = 0;
      do {
        const size_t len = std::min(slot_bytes_, bytes - offset);
        const int set = next_set();
        std::memcpy(slot(set, group_.rank), in + offset, len);
        arrive_and_wait(h);
        for (int p = 0; p < group_.size; ++p) {
          uint8_t* target = out + p * bytes + offset;
          if (target != in + offset) std::memcpy(target, slot(set, p), len);
        }
        offset += len;
      } while (offset < bytes);
    });
  }

  void broadcast(at::Tensor& t, int root) override {
    run(Kind::Broadcast, t, root, ReduceOp::Sum, [&](const Header& h) {
      const size_t bytes = t.nbytes(), per_chunk = slot_bytes_ * group_.size;  // one rank fills the whole set
      auto* data = static_cast<uint8_t*>(t.data_ptr());
      size_t offset = 0;
      do {
        const size_t len = std::min(per_chunk, bytes - offset);
        const int set = next_set();
        if (group_.rank == root) std::memcpy(slot(set, 0), data + offset, len);
        arrive_and_wait(h);
        if (group_.rank != root) std::memcpy(data + offset, slot(set, 0), len);
        offset += len;
      } while (offset < bytes);
    });
  }

  // As reduce_scatter moves its chunks, copied rather than reduced: each rank
  // writes all its chunks' next pieces to its slot, then reads its own piece
  // from every peer's.
  void all_to_all(at::Tensor& output, const at::Tensor& input) override {
    run(Kind::AllToAll, input, -1, ReduceOp::Sum, [&](const Header& h) {
      const size_t elem = input.element_size(), m = size_t(input.numel()) / size_t(group_.size);
      const size_t per_chunk = slot_bytes_ / elem / group_.size;
      const auto* in = static_cast<const uint8_t*>(input.data_ptr());
      auto* out = static_cast<uint8_t*>(output.data_ptr());
      size_t offset = 0;
      do {
        const size_t len = std::min(per_chunk, m - offset);
        const int set = next_set();
        for (int q = 0; q < group_.size; ++q) {
          std::memcpy(slot(set, group_.rank) + q * len * elem, in + (q * m + offset) * elem, len * elem);
        }
        arrive_and_wait(h);
        for (int p = 0; p < group_.size; ++p) {
          std::memcpy(out + (p * m + offset) * elem, slot(set, p) + group_.rank * len * elem, len * elem);
        }
        offset += len;
      } while (offset < m);
    });
  }

  void barrier() override {
    at::Tensor none;
    run(Kind::Barrier, none, -1, ReduceOp::Sum, [&](const Header& h) { arrive_and_wait(h); });
  }

  const char* transport() const override { return "shm"; }

 private:
  Doorbell& doorbell() { return *reinterpret_cast<Doorbell*>(base_); }
  RankSlot& rank_slot(int r) { return reinterpret_cast<RankSlot*>(base_ + sizeof(Doorbell))[r]; }
  uint8_t* slot(int set, int r) {
    return base_ + control_bytes(group_.size) + (size_t(set) * group_.size + r) * slot_bytes_;
  }
  int next_set() { return int(chunks_++ % 2); }

  // Rank p's share [lo, hi) of a chunk of `len` elements.
  std::pair<size_t, size_t> slice(size_t len, int p) const {
    return {len * p / group_.size, len * (p + 1) / group_.size};
  }

  // Elements [offset, offset + len) of every rank's slot in `set`, as a
  // (size x len) tensor for reduce_chunks.
  at::Tensor peers_view(int set, size_t byte_offset, size_t len, at::ScalarType dtype) {
    const int64_t stride = int64_t(slot_bytes_ / c10::elementSize(dtype));
    return at::from_blob(slot(set, 0) + byte_offset, {group_.size, int64_t(len)}, {stride, 1},
                         at::TensorOptions().dtype(dtype));
  }

  template <typename F>
  void run(Kind kind, const at::Tensor& t, int root, ReduceOp op, F&& body) {
    if (!failure_.empty()) {
      throw CommError(where(group_) + ": " + name_of(kind) + " on a group whose earlier collective failed (" +
                      failure_ + ")");
    }
    Header h;
    h.number = ++collectives_;
    h.bytes = t.defined() ? t.nbytes() : 0;
    h.kind = uint32_t(kind);
    h.root = root;
    h.dtype = t.defined() ? int32_t(t.scalar_type()) : -1;
    h.op = kind == Kind::AllReduce || kind == Kind::ReduceScatter ? int32_t(op) : -1;
    if (group_.health) group_.health->entering(name_of(kind), h.bytes);
    try {
      body(h);
    } catch (const CommError& e) {
      failure_ = e.what();
      throw;
    } catch (const std::exception& e) {
      failure_ = e.what();
      throw CommError(where(group_) + ": " + name_of(kind) + " failed: " + e.what());
    }
  }

  void arrive_and_wait(const Header& h) {
    const uint64_t k = ++barriers_;
    RankSlot& me = rank_slot(group_.rank);
    me.headers[k % 2] = h;
    me.arrived.store(k, std::memory_order_seq_cst);
    ring();
    wait_for_all(k, h);
    for (int p = 0; p < group_.size; ++p) {
      const Header& theirs = rank_slot(p).headers[k % 2];
      if (!(theirs == h)) mismatch(p, theirs, h);
    }
  }

  void ring() {
    Doorbell& bell = doorbell();
    bell.rings.fetch_add(1, std::memory_order_seq_cst);
    if (bell.sleepers.load(std::memory_order_seq_cst) > 0) {
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell.rings), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    }
  }

  bool all_arrived(uint64_t k) {
    for (int p = 0; p < group_.size; ++p) {
      if (rank_slot(p).arrived.load(std::memory_order_acquire) < k) return false;
    }
    return true;
  }

  // Spins briefly (a peer is usually a few microseconds away), then sleeps on
  // the doorbell; every 100 ms checks the peers' processes and the deadline.
  void wait_for_all(uint64_t k, const Header& h) {
    Doorbell& bell = doorbell();
    for (int spin = 0; spin < 2000; ++spin) {
      if (all_arrived(k)) return;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    const auto start = std::chrono::steady_clock::now();
    auto next_check = start + std::chrono::milliseconds(100);
    for (;;) {
      const uint32_t rings = bell.rings.load(std::memory_order_seq_cst);
      if (all_arrived(k)) return;
      bell.sleepers.fetch_add(1, std::memory_order_seq_cst);
      if (!all_arrived(k)) {
        const timespec nap{0, 20 * 1000 * 1000};
        ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell.rings), FUTEX_WAIT, rings, &nap, nullptr, 0);
      }
      bell.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      const auto now = std::chrono::steady_clock::now();
      if (now < next_check) continue;
      next_check = now + std::chrono::milliseconds(100);
      check_peers(k, h, now - start);
    }
  }

  void check_peers(uint64_t k, const Header& h, std::chrono::steady_clock::duration waited) {
    std::vector<int> late, dead;
    for (int p = 0; p < group_.size; ++p) {
      if (rank_slot(p).arrived.load(std::memory_order_acquire) >= k) continue;
      late.push_back(p);
      const pid_t pid = rank_slot(p).pid;
      if (pid > 0 && !process_alive(pid)) dead.push_back(p);
    }
    const bool timed_out = waited >= group_.timeout;
    if (dead.empty() && !timed_out) return;
    std::ostringstream msg;
    msg << where(group_) << ": " << name_of(Kind(h.kind)) << " (collective #" << h.number
        << ", shared memory) failed: ";
    const std::vector<int>& named = dead.empty() ? late : dead;
    msg << (dead.empty() ? "timed out waiting for rank" : "the process of rank") << (named.size() > 1 ? "s" : "");
    for (size_t i = 0; i < named.size(); ++i) msg << (i ? ", " : " ") << group_.global_ranks[named[i]];
    msg << (dead.empty() ? "" : (named.size() > 1 ? " are gone" : " is gone"));
    throw_collective_error(group_, msg.str());
  }

  [[noreturn]] void mismatch(int p, const Header& theirs, const Header& mine) {
    auto describe = [](const Header& x) {
      std::ostringstream out;
      out << name_of(Kind(x.kind)) << " #" << x.number << " of " << x.bytes << " bytes";
      if (x.dtype >= 0) out << " (" << c10::toString(at::ScalarType(x.dtype)) << ")";
      if (x.root >= 0) out << " from root " << x.root;
      if (x.op >= 0) out << " with " << to_string(ReduceOp(x.op));
      return out.str();
    };
    std::ostringstream msg;
    msg << where(group_) << ": rank " << group_.global_ranks[p] << " issued " << describe(theirs) << " while rank "
        << group_.global_ranks[group_.rank] << " issued " << describe(mine) << ": ";
    if (theirs.kind == mine.kind && theirs.bytes != mine.bytes) {
      msg << "the ranks passed tensors of different sizes";
    } else {
      msg << "the ranks issued different collectives";
    }
    msg << ". Every rank of a group must issue the same collectives, in the same order, on tensors of the same size.";
    throw CommError(msg.str());
  }

  GroupInfo group_;
  uint8_t* base_;
  size_t segment_bytes_;
  size_t slot_bytes_;
  uint64_t barriers_ = 0;
  uint64_t chunks_ = 0;
  uint64_t collectives_ = 0;
  std::string failure_;
};

// Every rank posts its node identity; true when all are the same.
bool ranks_share_this_host(const GroupInfo& group) {
  const std::string mine = node_identity();
  group.store->set("shm/host/" + std::to_string(group.rank), as_bytes(mine));
  for (int r = 0; r < group.size; ++r) {
    const std::string key = "shm/host/" + std::to_string(r);
    group.store->wait({key}, group.timeout);
    if (as_string(group.store->get(key)) != mine) return false;
  }
  return true;
}

// Maps the segment (rank 0 creates it). Returns nullptr and sets `error`
// when this rank could not.
void* map_segment(const GroupInfo& group, size_t bytes, std::string& error) {
  const std::string name_key = "shm/name";
  std::string name;
  int fd = -1;
  if (group.rank == 0) {
    std::random_device random;
    name = "/zero-" + std::to_string(::getpid()) + "-" + std::to_string(random()) + "-" + group.name;
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    // posix_fallocate reserves the pages now, so that a full /dev/shm is an
    // error here rather than a SIGBUS in the middle of a collective.
    int rc = fd < 0 ? errno : (::ftruncate(fd, off_t(bytes)) != 0 ? errno : ::posix_fallocate(fd, 0, off_t(bytes)));
    if (fault::fires("comm.shm_segment", group.global_ranks[group.rank])) rc = ENOSPC;
    if (rc != 0) {
      error = "could not create a " + std::to_string(bytes >> 20) + " MiB segment in /dev/shm: " + std::strerror(rc);
      if (fd >= 0) ::close(fd);
      ::shm_unlink(name.c_str());
      fd = -1;
      name.clear();
    }
    group.store->set(name_key, as_bytes(name));
  } else {
    group.store->wait({name_key}, group.timeout);
    name = as_string(group.store->get(name_key));
    if (name.empty()) {
      error = "rank 0 could not create the segment";
      return nullptr;
    }
    fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) error = "could not open " + name + ": " + std::strerror(errno);
  }
  if (fd < 0) return nullptr;
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    error = "could not map " + name + ": " + std::strerror(errno);
    return nullptr;
  }
  return base;
}

}  // namespace

std::unique_ptr<HostBackend> make_shm_backend(const GroupInfo& group) {
  const std::string choice = env::host_transport();
  if (choice != "auto" && choice != "shm" && choice != "gloo") {
    throw CommError("ZERO_HOST_TRANSPORT is '" + choice + "'; use \"auto\" (default), \"shm\" or \"gloo\"");
  }
  if (choice == "gloo" || group.size < 2 || !group.store) return nullptr;
  if (!ranks_share_this_host(group)) {
    if (choice == "shm") {
      throw CommError(where(group) + ": ZERO_HOST_TRANSPORT=shm, but the ranks of " + group.name +
                      " do not all run on this host (or share its PID namespace); unset it to use gloo");
    }
    return nullptr;
  }
  const env::Number slot_kib = env::shm_slot_kib();
  if (!slot_kib.error.empty()) throw CommError(slot_kib.error);
  const size_t slot_bytes = size_t(slot_kib.value) << 10;
  const size_t bytes = ShmBackend::segment_size(group.size, slot_bytes);
  std::string error;
  void* base = map_segment(group, bytes, error);
  // Every rank says how it went; one failure sends the whole group to gloo.
  group.store->set("shm/mapped/" + std::to_string(group.rank), as_bytes(error));
  std::string first_error;
  int failed_rank = -1;
  for (int r = 0; r < group.size; ++r) {
    const std::string key = "shm/mapped/" + std::to_string(r);
    group.store->wait({key}, group.timeout);
    const std::string e = as_string(group.store->get(key));
    if (!e.empty() && failed_rank < 0) {
      failed_rank = r;
      first_error = e;
    }
  }
  if (group.rank == 0 && base) {
    const std::vector<uint8_t> name = group.store->get("shm/name");
    ::shm_unlink(as_string(name).c_str());  // every rank has mapped it, or given up
  }
  if (failed_rank >= 0) {
    if (base) ::munmap(base, bytes);
    const std::string what = "rank " + std::to_string(group.global_ranks[failed_rank]) + " " + first_error;
    if (choice == "shm") throw CommError(where(group) + ": ZERO_HOST_TRANSPORT=shm, but " + what);
    log::warn("comm", where(group) + ": shared-memory collectives are off for " + group.name + " (" + what +
                          "); using gloo over TCP. Give /dev/shm more room (docker run --shm-size=1g) to use them.");
    return nullptr;
  }
  return std::make_unique<ShmBackend>(group, base, bytes, slot_bytes);
}

}  // namespace zero::comm
