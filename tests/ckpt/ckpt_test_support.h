#pragma once
// What the checkpoint format tests share: file helpers, a fixture with a
// fresh directory, a synthetic model whose checkpoint is written by hand,
// the layouts of its ranks, and a runner for the zero-ckpt tool.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "ckpt/checkpoint.h"
#include "zero/error.h"

namespace ckpt_test {

namespace fs = std::filesystem;
using namespace zero::ckpt;
using zero::CheckpointError;

// ---- helpers -----------------------------------------------------------------

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

inline void flip_byte(const std::string& path, uint64_t offset) {
  std::string b = slurp(path);
  ASSERT_LT(offset, b.size());
  b[offset] = static_cast<char>(b[offset] ^ 0x40);
  spit(path, b);
}

// Whether a durable write of `path` left a staging file beside it
// (zero::ckpt::is_staging_name_for).
inline bool staging_left(const std::string& path) {
  const fs::path p(path);
  for (const auto& entry : fs::directory_iterator(p.parent_path())) {
    if (zero::ckpt::is_staging_name_for(entry.path().filename().string(), p.filename().string())) return true;
  }
  return false;
}

// The message of the CheckpointError `f` throws ("" when it throws nothing).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "missing \"" << (needle) << "\" in: " << (haystack)

// A fresh directory per test, removed afterwards.
class CkptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "zero_ckpt_" + info->test_suite_name() + "_" + info->name() + "_" +
           std::to_string(::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (std::getenv("ZERO_CKPT_KEEP_TEST_DIRS")) return;  // to look at what a test wrote
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

// Half and bfloat16 from their fields (an independent reference for convert_to_f32).
inline double f16_reference(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0x1f) v = man ? NAN : INFINITY;
  else if (exp == 0) v = std::ldexp(man, -24);
  else v = std::ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}
inline double bf16_reference(uint16_t h) {
  int sign = h >> 15, exp = (h >> 7) & 0xff, man = h & 0x7f;
  double v;
  if (exp == 0xff) v = man ? NAN : INFINITY;
  else if (exp == 0) v = std::ldexp(man, -133);
  else v = std::ldexp(128 + man, exp - 134);
  return sign ? -v : v;
}

// ---- a synthetic model and its checkpoint written by hand --------------------
//
// Trainable: fc1.weight [5, 7] (flat elements [0, 35)), fc1.bias [10] ([35, 45)).
// Frozen: emb.weight [3, 4] stored as BF16. Buffers: bn.running_mean F32 [4],
// scale16 F16 [3], bn.num_batches_tracked I64 []. Fragment kinds fp32,
// exp_avg, exp_avg_sq. A "layout" is the ranks' boundaries in the flat
// concatenation of the trainable parameters, cutting parameters anywhere.
struct Model {
  struct P {
    std::string name;
    std::vector<int64_t> shape;
    int64_t numel, flat_start;
  };
  std::vector<P> trainable{{"fc1.weight", {5, 7}, 35, 0}, {"fc1.bias", {10}, 10, 35}};
  std::vector<std::string> kinds{"fp32", "exp_avg", "exp_avg_sq"};
  std::map<std::pair<std::string, std::string>, std::vector<float>> ref;  // (kind, param)
  std::vector<uint16_t> emb_bf16{0x3f80, 0xc000, 0x4049, 0x0000, 0x8000, 0x3e80, 0x42f6, 0xbf00, 0x0001, 0x7f7f, 0x4000, 0xc2c8};
  std::vector<float> running_mean{0.5f, -1.25f, 3.0f, 1e-3f};
  std::vector<uint16_t> scale16{0x3c00, 0x3555, 0x0001};  // 1, 0.333..., 2^-24
  int64_t num_batches = 1234567890123;
  std::vector<uint8_t> rng{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

  Model() {
    for (size_t k = 0; k < kinds.size(); ++k)
      for (size_t p = 0; p < trainable.size(); ++p) {
        auto& v = ref[{kinds[k], trainable[p].name}];
        for (int64_t i = 0; i < trainable[p].numel; ++i)
          v.push_back(static_cast<float>(k * 4096 + p * 512 + i) * 0.25f - 300.0f);  // exact
      }
  }

  using Skip = std::function<bool(const std::string& kind, const std::string& param, int64_t offset)>;

  // Writes <dir>/<tag> for the ranks `bounds` describes ({0, .., 45}) and
  // points latest at it. `skip` drops fragments (to make gaps).
  Manifest write(const std::string& dir, const std::string& tag, const std::vector<int64_t>& bounds,
                 const Skip& skip = nullptr, bool latest = true) const {
    fs::create_directories(tag_dir(dir, tag));
    Manifest m;
    m.tag = tag;
    m.world_size = static_cast<int>(bounds.size()) - 1;
    m.stage = 2;
    m.dtype = "BF16";
    m.optimizer = "adam";
    m.states = {"exp_avg", "exp_avg_sq"};
    for (const P& p : trainable) m.params.push_back({p.name, p.shape, true});
    m.params.push_back({"emb.weight", {3, 4}, false});
    m.buffers = {"bn.running_mean", "scale16", "bn.num_batches_tracked"};
    m.engine = {{"global_steps", 7}};
    m.client_state = {{"epoch", 3}};
    for (int r = 0; r < m.world_size; ++r) {
      const int64_t lo = bounds[r], hi = bounds[r + 1];
      std::vector<TensorData> ts;
      for (const std::string& kind : kinds)
        for (const P& p : trainable) {
          const int64_t a = std::max(lo, p.flat_start), b = std::min(hi, p.flat_start + p.numel);
          if (a >= b) continue;
          const int64_t offset = a - p.flat_start;
          if (skip && skip(kind, p.name, offset)) continue;
          TensorData t;
          t.name = kind + "/" + p.name + "/" + std::to_string(offset);
          t.dtype = DType::F32;
          t.shape = {b - a};
          t.data = ref.at({kind, p.name}).data() + offset;
          t.bytes = static_cast<size_t>(b - a) * 4;
          ts.push_back(t);
        }
      if (r == 0) {
        ts.push_back({"module/emb.weight", DType::BF16, {3, 4}, emb_bf16.data(), emb_bf16.size() * 2});
        ts.push_back({"module/bn.running_mean", DType::F32, {4}, running_mean.data(), running_mean.size() * 4});
        ts.push_back({"module/scale16", DType::F16, {3}, scale16.data(), scale16.size() * 2});
        ts.push_back({"module/bn.num_batches_tracked", DType::I64, {}, &num_batches, 8});
      }
      ts.push_back({"rng/cpu", DType::U8, {16}, rng.data(), rng.size()});
      FileInfo f = write_safetensors(tag_dir(dir, tag) + "/" + rank_file_name(r), ts, {{"rank", std::to_string(r)}});
      f.rank = r;
      m.files.push_back(f);
    }
    write_manifest(dir, m);
    if (latest) write_latest(dir, tag);
    return m;
  }

  // The consolidated state dict: name -> (dtype, shape, values as double).
  struct Expected {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<double> values;
  };
  std::map<std::string, Expected> consolidated() const {
    std::map<std::string, Expected> out;
    for (const P& p : trainable) {
      const auto& v = ref.at({"fp32", p.name});
      out[p.name] = {DType::F32, p.shape, std::vector<double>(v.begin(), v.end())};
    }
    Expected emb{DType::F32, {3, 4}, {}};
    for (uint16_t h : emb_bf16) emb.values.push_back(bf16_reference(h));
    out["emb.weight"] = emb;
    out["bn.running_mean"] = {DType::F32, {4}, std::vector<double>(running_mean.begin(), running_mean.end())};
    Expected s{DType::F32, {3}, {}};
    for (uint16_t h : scale16) s.values.push_back(f16_reference(h));
    out["scale16"] = s;
    out["bn.num_batches_tracked"] = {DType::I64, {}, {static_cast<double>(num_batches)}};
    return out;
  }
};

inline const std::vector<int64_t> kTwoRanks{0, 23, 45};        // cuts fc1.weight at 23
inline const std::vector<int64_t> kThreeRanks{0, 16, 40, 45};  // cuts fc1.weight at 16, fc1.bias at 5
inline const std::vector<int64_t> kOneRank{0, 45};
inline const std::vector<int64_t> kFourRanks{0, 10, 10, 30, 45};  // rank 1 owns nothing

// Compares a consolidated file with the reference, value by value.
inline void expect_consolidated(const std::string& path, const Model& model) {
  SafetensorsFile f(path);
  const auto expected = model.consolidated();
  ASSERT_EQ(f.entries().size(), expected.size());
  for (const auto& [name, e] : expected) {
    SCOPED_TRACE(name);
    auto it = f.entries().find(name);
    ASSERT_NE(it, f.entries().end());
    EXPECT_EQ(it->second.dtype, e.dtype);
    EXPECT_EQ(it->second.shape, e.shape);
    const uint64_t bytes = it->second.end - it->second.begin;
    ASSERT_EQ(bytes, e.values.size() * dtype_size(e.dtype));
    if (e.dtype == DType::F32) {
      std::vector<float> v(e.values.size());
      f.read(name, 0, bytes, v.data());
      for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(static_cast<double>(v[i]), e.values[i]) << "element " << i;
    } else {
      int64_t v = 0;
      f.read(name, 0, 8, &v);
      EXPECT_EQ(static_cast<double>(v), e.values[0]);
    }
  }
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

// RLIMIT_FSIZE lowered for this scope, with SIGXFSZ ignored so that a write
// past the limit fails with EFBIG instead of killing the process. Nothing may
// be written to a regular file (gtest output included) while it is active.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    ok_ = ::getrlimit(RLIMIT_FSIZE, &old_) == 0;
    rlimit r = old_;
    r.rlim_cur = bytes;
    ok_ = ok_ && ::setrlimit(RLIMIT_FSIZE, &r) == 0;
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, old_handler_);
  }
  bool ok() const { return ok_; }

 private:
  rlimit old_{};
  sighandler_t old_handler_;
  bool ok_ = false;
};

// Whether a write past a lowered RLIMIT_FSIZE fails with EFBIG here.
inline bool file_size_limit_works(const std::string& dir) {
  const std::string probe = dir + "/probe";
  bool efbig = false;
  {
    FileSizeLimit limit(100);
    if (!limit.ok()) return false;
    int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return false;
    std::vector<char> b(4096, 'x');
    efbig = ::write(fd, b.data(), b.size()) < 4096 && (::write(fd, b.data(), b.size()) < 0 && errno == EFBIG);
    ::close(fd);
  }
  ::unlink(probe.c_str());
  return efbig;
}

// Rewrites tensor `name` of the safetensors file at `path` as F16 (rounded),
// the rest as it was, and returns the file's new size and checksum: what a
// hostile edit that also fixes the manifest leaves, so that only a dtype
// check can find it.
inline FileInfo rewrite_as_f16(const std::string& path, const std::string& name) {
  std::deque<std::vector<uint8_t>> keep;  // stable addresses for the borrowed data
  std::vector<TensorData> tensors;
  std::map<std::string, std::string> metadata;
  {
    SafetensorsFile f(path);
    metadata = f.metadata();
    for (const auto& [n, e] : f.entries()) {
      keep.emplace_back(e.end - e.begin);
      f.read(n, 0, e.end - e.begin, keep.back().data());
      TensorData t{n, e.dtype, e.shape, keep.back().data(), keep.back().size()};
      if (n == name) {
        EXPECT_EQ(e.dtype, DType::F32) << n;
        const size_t count = keep.back().size() / 4;
        keep.emplace_back(count * 2);
        convert_from_f32(DType::F16, reinterpret_cast<const float*>(t.data), count, keep.back().data());
        t = {n, DType::F16, e.shape, keep.back().data(), keep.back().size()};
      }
      tensors.push_back(t);
    }
  }
  write_safetensors(path, tensors, metadata);
  return hash_file(path);
}

#ifdef ZERO_CKPT_TOOL  // test_ckpt_format runs the tool; the engine tests do not

struct ToolRun {
  int status;
  std::string out, err;
};

inline ToolRun tool(const std::string& dir, const std::string& args) {
  const std::string out = dir + "/tool_out.txt", err = dir + "/tool_err.txt";
  const std::string command = std::string("'") + ZERO_CKPT_TOOL + "' " + args + " >'" + out + "' 2>'" + err + "'";
  int raw = std::system(command.c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(out), slurp(err)};
}

#endif

}  // namespace ckpt_test
