// The restricted torch.save reader (torchsave/) against torch itself: every
// tensor of the DeepSpeed fixtures (tests/fixtures/deepspeed, written by
// tools/fixtures/make_deepspeed_fixtures.py with deepspeed 0.19 and torch)
// must equal, byte for byte, what torch.load found in the same file (the
// fixtures' reference/ safetensors files); values written by formula must
// read back as the formula says; hostile pickles and archives must fail
// with an error that names what is wrong, and nothing is ever run; and the
// heap a pickle can take is bounded by its stored size, measured by malloc.
#include <malloc.h>
#include <sys/stat.h>
#include <zip.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "torchsave/torch_save.h"
#include "zero/error.h"

namespace {

namespace fs = std::filesystem;
using zero::CheckpointError;
using zero::ckpt::DType;
using zero::ckpt::SafetensorsFile;
using zero::torchsave::Pickle;
using zero::torchsave::TensorRef;
using zero::torchsave::TorchSaveFile;
using zero::torchsave::Value;

const fs::path kFixtures = ZERO_FIXTURES "/deepspeed";

// Every tensor under dicts, lists and tuples by its path ("a/0/b"), as the
// fixture script's walk names them.
void walk(const Value& v, const std::string& path, std::map<std::string, TensorRef>& out) {
  auto join = [&](const std::string& k) { return path.empty() ? k : path + "/" + k; };
  switch (v.kind) {
    case Value::Kind::Tensor: out[path] = *v.tensor; break;
    case Value::Kind::Dict:
      for (const auto& [k, x] : v.entries) {
        std::string key = k->kind == Value::Kind::Int ? std::to_string(k->integer) : k->text;
        walk(*x, join(key), out);
      }
      break;
    case Value::Kind::Tuple:
    case Value::Kind::List:
      for (size_t i = 0; i < v.items.size(); ++i) walk(*v.items[i], join(std::to_string(i)), out);
      break;
    default: break;
  }
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<uint8_t> bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::unique_ptr<Pickle> read_pickle(const std::string& bytes) {
  return Pickle::read(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test pickle");
}

TEST(TorchSave, EveryDeepSpeedFixtureTensorEqualsWhatTorchLoadRead) {
  int files = 0, tensors = 0;
  for (const auto& e : fs::recursive_directory_iterator(kFixtures)) {
    if (e.path().extension() != ".pt" || e.path().parent_path().filename() == "torch_save") continue;
    const fs::path fixture = e.path().parent_path().parent_path().parent_path();  // <fixture>/ckpt/<tag>/x.pt
    const fs::path reference = fixture / "reference" / (e.path().stem().string() + ".safetensors");
    ASSERT_TRUE(fs::exists(reference)) << reference;
    TorchSaveFile file(e.path());
    std::map<std::string, TensorRef> found;
    walk(file.root(), "", found);
    SafetensorsFile expected(reference);
    std::set<std::string> names;
    for (const auto& [name, entry] : expected.entries()) names.insert(name);
    std::set<std::string> ours;
    for (const auto& [name, t] : found) ours.insert(name);
    EXPECT_EQ(ours, names) << e.path();
    for (const auto& [name, entry] : expected.entries()) {
      auto it = found.find(name);
      if (it == found.end()) continue;
      const TensorRef& t = it->second;
      EXPECT_EQ(t.storage.dtype, entry.dtype) << e.path() << " " << name;
      EXPECT_EQ(t.shape, entry.shape) << e.path() << " " << name;
      std::vector<uint8_t> want(entry.end - entry.begin);
      expected.read(name, 0, want.size(), want.data());
      EXPECT_EQ(file.read(t), want) << e.path() << " " << name;
      ++tensors;
    }
    ++files;
  }
  EXPECT_GE(files, 40);  // 14 fixtures, 3 to 9 files each
  EXPECT_GE(tensors, 200);
}

TEST(TorchSave, DeepSpeedRecordsReadAsData) {
  // A bf16 stage 2 optimizer file: the loss scaler (a class instance) and
  // the ZeRO stage (an enum member) arrive as records, never constructed.
  const fs::path path = kFixtures / "stage2_bf16_2ranks/ckpt/global_step3/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt";
  TorchSaveFile file(path);
  const Value& osd = file.root().at("optimizer_state_dict", "test");
  const Value& stage = osd.at("zero_stage", "test");
  ASSERT_EQ(stage.kind, Value::Kind::Object);
  EXPECT_EQ(stage.text, "deepspeed.runtime.zero.config.ZeroStageEnum");
  EXPECT_EQ(stage.member, "gradients");  // stage 2
  EXPECT_EQ(osd.at("partition_count", "test").kind == Value::Kind::Int ||
                osd.at("partition_count", "test").is_sequence(), true);
  // The model file: DeepSpeed's counters, read as plain ints.
  TorchSaveFile model(kFixtures / "stage2_bf16_2ranks/ckpt/global_step3/mp_rank_00_model_states.pt");
  EXPECT_EQ(model.root().at("global_steps", "test").as_int("test"), 3);
  EXPECT_EQ(model.root().at("dp_world_size", "test").as_int("test"), 2);
}

TEST(TorchSave, ValuesWrittenByFormula) {
  // torch_save/zip.pt: {"weight": arange(12).reshape(3, 4) float32,
  // "half": arange(6) bfloat16, "step": 7, "name": "fixture",
  // "view": weight[1:, 2:]} (a view into weight's storage).
  TorchSaveFile file(kFixtures / "torch_save/zip.pt");
  const Value& root = file.root();
  EXPECT_EQ(root.at("step", "t").as_int("t"), 7);
  EXPECT_EQ(root.at("name", "t").as_string("t"), "fixture");
  const TensorRef& w = root.at("weight", "t").as_tensor("t");
  EXPECT_EQ(w.shape, (std::vector<int64_t>{3, 4}));
  std::vector<float> wv(12);
  file.read(w, wv.data());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(wv[i], static_cast<float>(i));
  const TensorRef& view = root.at("view", "t").as_tensor("t");
  EXPECT_EQ(view.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_FALSE(view.contiguous());
  EXPECT_EQ(view.storage.key, w.storage.key);  // shared, as torch saved it
  std::vector<float> vv(4);
  file.read(view, vv.data());
  EXPECT_EQ(vv, (std::vector<float>{6, 7, 10, 11}));
  const TensorRef& half = root.at("half", "t").as_tensor("t");
  EXPECT_EQ(half.storage.dtype, DType::BF16);
  std::vector<uint16_t> hv(6);
  file.read(half, hv.data());
  for (int i = 0; i < 6; ++i) {
    const uint32_t bits = static_cast<uint32_t>(hv[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    EXPECT_EQ(f, static_cast<float>(i));
  }
  std::vector<float> part(3);
  file.read_range(w, 5, 3, part.data());
  EXPECT_EQ(part, (std::vector<float>{5, 6, 7}));
  EXPECT_NE(message_of([&] { file.read_range(w, 10, 3, part.data()); }).find("elements [10, 13) of a tensor of 12"),
            std::string::npos);
}

TEST(TorchSave, RefusesEveryOtherGlobalByName) {
  const std::string m = message_of([] { TorchSaveFile f(kFixtures / "torch_save/refused_global.pt"); });
  EXPECT_NE(m.find("'posix.system'"), std::string::npos) << m;
  EXPECT_NE(m.find("never runs"), std::string::npos) << m;
  // The same pickle outside a zip: not a torch.save file; read as a pickle, refused.
  const std::vector<uint8_t> plain = bytes_of(kFixtures / "torch_save/plain_pickle.pkl");
  EXPECT_NE(message_of([] { TorchSaveFile f(kFixtures / "torch_save/plain_pickle.pkl"); }).find("not a torch.save file"),
            std::string::npos);
  EXPECT_NE(message_of([&] { Pickle::read(plain.data(), plain.size(), "p"); }).find("'posix.system'"),
            std::string::npos);
  // getattr is allowed only on an allowed enum class.
  const std::string getattr = "\x80\x02" "c__builtin__\ngetattr\n" "c__builtin__\nopen\n";
  EXPECT_NE(message_of([&] { read_pickle(getattr); }).find("'builtins.open'"), std::string::npos);
}

TEST(TorchSave, RefusesTheLegacyFormatByName) {
  const std::string m = message_of([] { TorchSaveFile f(kFixtures / "torch_save/legacy.pt"); });
  EXPECT_NE(m.find("legacy format"), std::string::npos) << m;
  EXPECT_NE(m.find("weights_only=True"), std::string::npos) << m;
}

TEST(TorchSave, HostilePicklesFailWithTheirReason) {
  // A list that contains itself: EMPTY_LIST, BINPUT 0, BINGET 0, APPEND, STOP.
  EXPECT_NE(message_of([] { read_pickle(std::string("\x80\x02]q\x00h\x00" "a.", 9)); }).find("contains itself"),
            std::string::npos);
  // Lists nested 500 deep.
  std::string deep = "\x80\x02";
  for (int i = 0; i < 500; ++i) deep += "]";
  for (int i = 0; i < 499; ++i) deep += "a";
  deep += ".";
  EXPECT_NE(message_of([&] { read_pickle(deep); }).find("nest deeper than"), std::string::npos);
  // A string claiming 4 GB.
  EXPECT_NE(message_of([] { read_pickle(std::string("\x80\x02X\xff\xff\xff\xff" "ab.", 10)); })
                .find("runs past the end"),
            std::string::npos);
  // A memo reference never stored, an unknown opcode, no STOP.
  EXPECT_NE(message_of([] { read_pickle(std::string("\x80\x02h\x07.", 5)); }).find("never stored"), std::string::npos);
  EXPECT_NE(message_of([] { read_pickle("\x80\x02\xff."); }).find("unknown opcode 0xff"), std::string::npos);
  EXPECT_NE(message_of([] { read_pickle("\x80\x02N"); }).find("ends before STOP"), std::string::npos);
  // An integer wider than 64 bits.
  EXPECT_NE(message_of([] { read_pickle(std::string("\x80\x02\x8a\x09" "123456789.", 14)); }).find("64 bits"),
            std::string::npos);
  // A tensor of 10 elements over a storage of 4:
  // _rebuild_tensor_v2(('storage', FloatStorage, '0', 'cpu', 4), 0, (10,), (1,), False, OrderedDict()).
  static const char kView[] =
      "\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\n" "(" "(X\x07\x00\x00\x00storage" "ctorch\nFloatStorage\n"
      "X\x01\x00\x00\x00" "0" "X\x03\x00\x00\x00" "cpu" "K\x04" "tQ" "K\x00" "K\x0a\x85" "K\x01\x85" "\x89"
      "ccollections\nOrderedDict\n)R" "tR.";
  const std::string view(kView, sizeof kView - 1);
  const std::string m = message_of([&] { read_pickle(view); });
  EXPECT_NE(m.find("storage shorter than its view"), std::string::npos) << m;
  // The same with a storage of 10 reads.
  std::string fits = view;
  fits[fits.find("K\x04")+1] = '\x0a';
  const auto ok = read_pickle(fits);
  EXPECT_EQ(ok->root().tensor->shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(ok->storages().size(), 1u);
}

TEST(TorchSave, DamagedArchivesFailWithTheirReason) {
  const fs::path dir = fs::temp_directory_path() / ("zero_torchsave_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::vector<uint8_t> whole = bytes_of(kFixtures / "torch_save/zip.pt");
  auto write = [&](const std::string& name, const std::vector<uint8_t>& b) {
    std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
    return (dir / name).string();
  };
  // Truncated: the central directory is gone.
  const std::string cut = write("cut.pt", std::vector<uint8_t>(whole.begin(), whole.begin() + whole.size() / 2));
  EXPECT_NE(message_of([&] { TorchSaveFile f(cut); }).find("not a readable zip archive"), std::string::npos);
  EXPECT_NE(message_of([&] { TorchSaveFile f(write("empty.pt", {})); }).find("not a torch.save file"), std::string::npos);
  // A FIFO, or a link to one, would block the read until a writer came: refused at once, named.
  const std::string fifo = (dir / "fifo.pt").string(), link = (dir / "link.pt").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink(fifo, link);
  EXPECT_NE(message_of([&] { TorchSaveFile f(fifo); }).find("is a FIFO, not a regular file"), std::string::npos);
  EXPECT_NE(message_of([&] { TorchSaveFile f(link); }).find("is a FIFO, not a regular file"), std::string::npos);
  // A whole, valid archive still opens.
  EXPECT_NO_THROW(TorchSaveFile f(write("whole.pt", whole)));
  fs::remove_all(dir);
}

// The heap in use by glibc's count (small blocks and mmapped ones); a
// sanitizer's allocator keeps no such count (heap_is_counted says).
int64_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

bool heap_is_counted() {
  const int64_t before = heap_in_use();
  std::vector<char> probe(1 << 20, 1);
  const int64_t grew = heap_in_use() - before;
  return probe[7] == 1 && grew >= (1 << 20);
}

// A pickle of `n` copies of `unit` between `head` and `tail`.
std::string repeated(const std::string& head, const std::string& unit, size_t n, const std::string& tail) {
  std::string p = "\x80\x02" + head;
  for (size_t i = 0; i < n; ++i) p += unit;
  return p + tail;
}

// Distinct keys: SHORT_BINUNICODE of 8 hex digits, then BININT1 0.
std::string dict_items(size_t n) {
  std::string p;
  char key[16];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(key, sizeof key, "%08x", static_cast<unsigned>(i));
    p += std::string("\x8c\x08") + key + std::string("K\x00", 2);
  }
  return p;
}

TEST(TorchSave, PickleHeapIsBoundedByItsStoredSize) {
  // The opcodes that create or grow the most per input byte, each as a
  // whole pickle: what the machine charges a byte is the amplification
  // ratio, held under the budget's kMaxHeldPerInputByte, and the heap the
  // read keeps (malloc's own count) is no more than what it charged.
  struct Case {
    const char* name;
    std::function<std::string(size_t)> pickle;
  };
  const std::vector<Case> cases = {
      {"EMPTY_LIST POP", [](size_t n) { return repeated("", "]0", n, "N."); }},
      {"EMPTY_DICT POP", [](size_t n) { return repeated("", "}0", n, "N."); }},
      {"ints into a LIST", [](size_t n) { return repeated("(", std::string("K\x00", 2), n, "l."); }},
      {"APPEND", [](size_t n) { return repeated("]", std::string("K\x01" "a", 3), n, "."); }},
      {"a dict of distinct keys", [](size_t n) { return "\x80\x02}(" + dict_items(n) + "u."; }},
      {"memo slots", [](size_t n) {
         std::string p = "\x80\x02N";
         for (uint32_t i = 0; i < n; ++i) p += std::string("r") + std::string(reinterpret_cast<const char*>(&i), 4);
         return p + ".";
       }},
      {"long strings", [](size_t n) { return repeated("", std::string("\x8c\x10") + "0123456789abcdef" + "0", n, "N."); }},
      {"DUP into a LIST", [](size_t n) { return repeated("(N", "2", n, "l."); }},
  };
  const bool counted = heap_is_counted();
  double worst = 0;
  for (const Case& c : cases) {
    const std::string small = c.pickle(2000);
    const int64_t before = heap_in_use();
    auto kept = read_pickle(small);
    const int64_t held_heap = heap_in_use() - before;
    const double ratio = static_cast<double>(kept->held_bytes()) / small.size();
    worst = std::max(worst, ratio);
    std::printf("%-24s %8zu bytes: charged %9zu (%.0f a byte), heap %9lld\n", c.name, small.size(),
                kept->held_bytes(), ratio, static_cast<long long>(held_heap));
    EXPECT_LE(ratio, static_cast<double>(zero::torchsave::kMaxHeldPerInputByte)) << c.name;
    if (counted) {
      EXPECT_LE(held_heap, static_cast<int64_t>(kept->held_bytes()) + (16 << 10)) << c.name;
    }
  }
  EXPECT_LT(worst, zero::torchsave::kMaxHeldPerInputByte / 4.0) << "the budget leaves room for real pickles";
  if (!counted) std::printf("malloc keeps no count of bytes in use here (a sanitizer's allocator): heap not compared\n");
  std::printf("the most charged per input byte: %.0f (budget %zu)\n", worst, zero::torchsave::kMaxHeldPerInputByte);
}

TEST(TorchSave, PickleBudgetRefusesAnAmplifyingPickleByName) {
  // 600 000 empty lists, each popped: 1.2 MB of pickle that would keep 600 000
  // values. Read as it is stored, it fits (the budget is 512 a byte); held
  // to a 2.5 KB stored size (what deflate makes of it), it is refused.
  const std::string bomb = repeated("", "]0", 600'000, "N.");
  EXPECT_EQ(message_of([&] { read_pickle(bomb); }), "(no error)");
  const int64_t before = heap_in_use();
  const std::string m = message_of([&] {
    Pickle::read(reinterpret_cast<const uint8_t*>(bomb.data()), bomb.size(), "test pickle", 2500);
  });
  EXPECT_NE(m.find("built to exhaust memory"), std::string::npos) << m;
  EXPECT_NE(m.find("from 2500 stored bytes"), std::string::npos) << m;
  if (heap_is_counted()) {
    EXPECT_LT(heap_in_use() - before, 1 << 20);
  }
  // None is shared, as in Python: a million NONE POP pairs charge one value.
  const std::string nones = repeated("", "N0", 1'000'000, "N.");
  auto p = Pickle::read(reinterpret_cast<const uint8_t*>(nones.data()), nones.size(), "test pickle", 2500);
  EXPECT_LT(p->held_bytes(), 4096u);
  EXPECT_TRUE(p->root().is_none());
}

TEST(TorchSave, DeflatedPickleBombIsRefusedByItsCompressedSize) {
  // The hostile .pt of the report: a deflated data.pkl of repeated opcodes,
  // a few kilobytes in the file, megabytes inflated.
  const fs::path dir = fs::temp_directory_path() / ("zero_torchsave_bomb_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "bomb.pt").string();
  const std::string pickle = repeated("", "]0", 1'250'000, "N.");
  int error = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  ASSERT_NE(z, nullptr);
  zip_source_t* src = zip_source_buffer(z, pickle.data(), pickle.size(), 0);
  const zip_int64_t index = zip_file_add(z, "bomb/data.pkl", src, ZIP_FL_ENC_UTF_8);
  ASSERT_GE(index, 0);
  ASSERT_EQ(zip_set_file_compression(z, index, ZIP_CM_DEFLATE, 9), 0);
  ASSERT_EQ(zip_close(z), 0);
  const auto stored = fs::file_size(path);
  EXPECT_LT(stored, 16u << 10) << "deflate should shrink " << pickle.size() << " bytes of one pattern";
  const int64_t before = heap_in_use();
  const std::string m = message_of([&] { TorchSaveFile f(path); });
  EXPECT_NE(m.find("built to exhaust memory"), std::string::npos) << m;
  EXPECT_NE(m.find("bomb/data.pkl"), std::string::npos) << m;
  if (heap_is_counted()) {
    EXPECT_LT(heap_in_use() - before, 1 << 20);
  }
  // 16 MB of NONE POP, which the machine would read charging nothing
  // (None is shared), deflated to kilobytes: refused before it is inflated.
  const std::string nones = repeated("", "N0", 8'000'000, "N.");
  z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  ASSERT_NE(z, nullptr);
  const zip_int64_t again = zip_file_add(z, "bomb/data.pkl", zip_source_buffer(z, nones.data(), nones.size(), 0),
                                         ZIP_FL_ENC_UTF_8);
  ASSERT_GE(again, 0);
  ASSERT_EQ(zip_set_file_compression(z, again, ZIP_CM_DEFLATE, 9), 0);
  ASSERT_EQ(zip_close(z), 0);
  const std::string inflated = message_of([&] { TorchSaveFile f(path); });
  EXPECT_NE(inflated.find("inflates from"), std::string::npos) << inflated;
  EXPECT_NE(inflated.find("built to exhaust memory"), std::string::npos) << inflated;
  fs::remove_all(dir);
}

TEST(TorchSave, RealPicklesChargeFarLessThanTheBudget) {
  // Every DeepSpeed fixture: what its pickle charges per stored byte, against
  // the budget's 512 (the margin that lets a re-zipped, deflated file read).
  size_t files = 0;
  double worst = 0;
  for (const auto& e : fs::recursive_directory_iterator(kFixtures)) {
    if (e.path().extension() != ".pt") continue;
    if (message_of([&] { TorchSaveFile f(e.path().string()); }) != "(no error)") continue;  // the hostile ones
    ++files;
    zip_t* z = zip_open(e.path().c_str(), ZIP_RDONLY, nullptr);
    ASSERT_NE(z, nullptr) << e.path();
    for (zip_int64_t i = 0; i < zip_get_num_entries(z, 0); ++i) {
      const std::string name = zip_get_name(z, i, 0);
      if (name.size() < 9 || name.compare(name.size() - 9, 9, "/data.pkl") != 0) continue;
      zip_stat_t st;
      zip_stat_index(z, i, 0, &st);
      std::vector<uint8_t> bytes(st.size);
      zip_file_t* zf = zip_fopen_index(z, i, 0);
      ASSERT_EQ(zip_fread(zf, bytes.data(), bytes.size()), static_cast<zip_int64_t>(bytes.size()));
      zip_fclose(zf);
      const auto p = Pickle::read(bytes.data(), bytes.size(), name);
      worst = std::max(worst, static_cast<double>(p->held_bytes()) / bytes.size());
    }
    zip_discard(z);
  }
  ASSERT_GT(files, 0u);
  std::printf("%zu fixture files, the most a real pickle charged: %.1f bytes a byte\n", files, worst);
  EXPECT_LT(worst, zero::torchsave::kMaxHeldPerInputByte / 8.0);
}

}  // namespace
