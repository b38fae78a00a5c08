// The checkpoint format layer (ckpt/), torch-free: safetensors writer and
// reader, manifest and `latest`, fragments read across world sizes,
// consolidation, and the zero-ckpt tool. Checkpoints are written by hand
// here (write_safetensors + write_manifest), so these tests need no engine.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include <gtest/gtest.h>
#include <xxhash.h>

#include "ckpt/checkpoint.h"
#include "tests/ckpt/ckpt_test_support.h"
#include "zero/error.h"

using namespace ckpt_test;

namespace {

// ---- dtypes --------------------------------------------------------------------

TEST(Dtypes, NamesAndSizes) {
  const std::vector<std::pair<DType, size_t>> all{{DType::F32, 4},     {DType::F16, 2},    {DType::BF16, 2},
                                                  {DType::F64, 8},     {DType::I64, 8},    {DType::I32, 4},
                                                  {DType::U8, 1},      {DType::BOOL, 1},   {DType::F8_E4M3, 1},
                                                  {DType::F8_E5M2, 1}};
  for (auto [d, size] : all) {
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
    EXPECT_EQ(dtype_size(d), size) << dtype_name(d);
  }
  EXPECT_STREQ(dtype_name(DType::BF16), "BF16");
  EXPECT_STREQ(dtype_name(DType::F8_E4M3), "F8_E4M3");
  EXPECT_CONTAINS(error_of([] { dtype_from_name("C64"); }), "C64");
  EXPECT_TRUE(dtype_is_floating(DType::BF16));
  EXPECT_TRUE(dtype_is_floating(DType::F8_E5M2));
  EXPECT_FALSE(dtype_is_floating(DType::I64));
  float f;
  int32_t i = 1;
  EXPECT_CONTAINS(error_of([&] { convert_to_f32(DType::I32, &i, 1, &f); }), "I32");
}

// Every float8 code against the formula of its format (sign, exponent,
// mantissa, bias; e4m3fn: bias 7, no infinities, S.1111.111 NaN; e5m2:
// bias 15, IEEE infinities and NaNs), and a few values named by the formats.
TEST(Dtypes, Float8ConvertsExactly) {
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[i] = static_cast<uint8_t>(i);
  std::vector<float> e4m3(256), e5m2(256);
  convert_to_f32(DType::F8_E4M3, all.data(), all.size(), e4m3.data());
  convert_to_f32(DType::F8_E5M2, all.data(), all.size(), e5m2.data());
  for (int i = 0; i < 256; ++i) {
    const double sign = (i & 0x80) ? -1.0 : 1.0;
    {
      const int e = (i >> 3) & 0xf, m = i & 7;
      const double want = e == 15 && m == 7 ? NAN : sign * (e == 0 ? std::pow(2.0, -6) * m / 8.0 : std::pow(2.0, e - 7) * (1.0 + m / 8.0));
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(e4m3[i])) << "e4m3 code " << i;
      else EXPECT_EQ(e4m3[i], want) << "e4m3 code " << i;
      EXPECT_EQ(std::signbit(e4m3[i]), (i & 0x80) != 0) << "e4m3 code " << i;
    }
    {
      const int e = (i >> 2) & 0x1f, m = i & 3;
      const double want = e == 31 ? (m == 0 ? sign * INFINITY : NAN)
                                  : sign * (e == 0 ? std::pow(2.0, -14) * m / 4.0 : std::pow(2.0, e - 15) * (1.0 + m / 4.0));
      if (std::isnan(want)) EXPECT_TRUE(std::isnan(e5m2[i])) << "e5m2 code " << i;
      else EXPECT_EQ(e5m2[i], want) << "e5m2 code " << i;
    }
  }
  EXPECT_EQ(e4m3[0x7e], 448.0f);  // e4m3fn's largest finite value
  EXPECT_EQ(e4m3[0x01], std::ldexp(1.0f, -9));
  EXPECT_EQ(e5m2[0x7b], 57344.0f);  // e5m2's largest finite value
  EXPECT_TRUE(std::isinf(e5m2[0x7c]));
}

TEST(Dtypes, HalfAndBfloat16ConvertExactly) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> f16(all.size()), bf16(all.size());
  convert_to_f32(DType::F16, all.data(), all.size(), f16.data());
  convert_to_f32(DType::BF16, all.data(), all.size(), bf16.data());
  int bad = 0;
  for (size_t i = 0; i < all.size() && bad < 10; ++i) {
    const double a = f16_reference(all[i]), b = bf16_reference(all[i]);
    if (std::isnan(a) ? !std::isnan(f16[i]) : (f16[i] != a || std::signbit(f16[i]) != std::signbit(a))) {
      ++bad;
      ADD_FAILURE() << "F16 0x" << std::hex << i << ": " << f16[i] << " != " << a;
    }
    if (std::isnan(b) ? !std::isnan(bf16[i]) : (bf16[i] != b || std::signbit(bf16[i]) != std::signbit(b))) {
      ++bad;
      ADD_FAILURE() << "BF16 0x" << std::hex << i << ": " << bf16[i] << " != " << b;
    }
  }
  const double d[3] = {0.1, -2.5, 1e300};
  float out[3];
  convert_to_f32(DType::F64, d, 3, out);
  EXPECT_EQ(out[0], 0.1f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_TRUE(std::isinf(out[2]));
}

// ---- safetensors ---------------------------------------------------------------

TEST_F(CkptTest, EveryDtypeRoundTripsByteForByte) {
  std::mt19937 gen(7);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorData> ts;
  const std::vector<std::pair<DType, std::vector<int64_t>>> specs{
      {DType::F32, {3, 5}}, {DType::F16, {7}},  {DType::BF16, {2, 3, 2}}, {DType::F64, {5}},
      {DType::I64, {}},     {DType::I32, {4}},  {DType::U8, {9}},         {DType::BOOL, {6}},
      {DType::F32, {0, 4}}};  // a scalar and an empty tensor among them
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : specs[i].second) n *= d;
    auto& s = storage.emplace_back(static_cast<size_t>(n) * dtype_size(specs[i].first));
    for (auto& b : s) b = static_cast<uint8_t>(specs[i].first == DType::BOOL ? gen() & 1 : gen());
    ts.push_back({"t" + std::to_string(i) + "/" + dtype_name(specs[i].first), specs[i].first, specs[i].second,
                  s.data(), s.size()});
  }
  const std::string path = dir_ + "/all.safetensors";
  FileInfo info = write_safetensors(path, ts, {{"format", "pt"}, {"note", "ünïcode"}});
  EXPECT_EQ(info.name, "all.safetensors");
  EXPECT_FALSE(staging_left(path));

  // The returned size and hash are those of the file on disk.
  const std::string bytes = slurp(path);
  EXPECT_EQ(info.bytes, bytes.size());
  EXPECT_EQ(info.xxh3, xxh3_hex(XXH3_64bits(bytes.data(), bytes.size())));
  EXPECT_EQ(hash_file(path).xxh3, info.xxh3);

  // Layout: 8-byte little-endian length, JSON padded with spaces, data at a
  // multiple of 8, tensors contiguous in the order given.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["note"], "ünïcode");
  uint64_t pos = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& e = header[ts[i].name];
    EXPECT_EQ(e["dtype"], dtype_name(ts[i].dtype));
    EXPECT_EQ(e["data_offsets"][0].get<uint64_t>(), pos);
    pos += ts[i].bytes;
    EXPECT_EQ(e["data_offsets"][1].get<uint64_t>(), pos);
    if (ts[i].bytes > 0) {  // an empty tensor's storage may be null, which memcmp must not get
      EXPECT_EQ(0, std::memcmp(bytes.data() + 8 + n + e["data_offsets"][0].get<uint64_t>(), storage[i].data(), ts[i].bytes));
    }
  }
  EXPECT_EQ(8 + n + pos, bytes.size());

  // Read back through SafetensorsFile: whole tensors and byte ranges.
  SafetensorsFile f(path);
  EXPECT_EQ(f.file_bytes(), bytes.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.entries().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    SCOPED_TRACE(ts[i].name);
    const auto& e = f.entries().at(ts[i].name);
    EXPECT_EQ(e.dtype, ts[i].dtype);
    EXPECT_EQ(e.shape, ts[i].shape);
    std::vector<uint8_t> back(ts[i].bytes);
    f.read(ts[i].name, 0, back.size(), back.data());
    EXPECT_EQ(back, storage[i]);
    if (back.size() > 3) {
      std::vector<uint8_t> part(back.size() - 3);
      f.read(ts[i].name, 2, part.size() - 1, part.data());
      EXPECT_EQ(0, std::memcmp(part.data(), storage[i].data() + 2, part.size() - 1));
    }
  }
  EXPECT_CONTAINS(error_of([&] { uint8_t b[64]; f.read("t0/F32", 50, 20, b); }), "has 60 bytes");
  EXPECT_CONTAINS(error_of([&] { uint8_t b; f.read("nope", 0, 1, &b); }), "nope");
  f.verify(info);
}

TEST_F(CkptTest, HeaderIsPaddedToEightForEveryNameLength) {
  float x = 1.5f;
  for (int len = 1; len <= 16; ++len) {
    const std::string path = dir_ + "/pad.safetensors";
    write_safetensors(path, {{std::string(static_cast<size_t>(len), 'w'), DType::F32, {1}, &x, 4}});
    const std::string bytes = slurp(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
    EXPECT_EQ((8 + n) % 8, 0u) << "name length " << len;
    EXPECT_EQ(bytes.size(), 8 + n + 4);
    float back = 0;
    SafetensorsFile(path).read(std::string(static_cast<size_t>(len), 'w'), 0, 4, &back);
    EXPECT_EQ(back, x);
  }
}

TEST_F(CkptTest, LargeTensorIsHashedAcrossWriteChunks) {
  std::vector<uint32_t> big((40u << 20) / 4 + 3);  // 40 MiB: several 16 MiB chunks
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint32_t>(i * 2654435761u);
  const std::string path = dir_ + "/big.safetensors";
  FileInfo info = write_safetensors(path, {{"big", DType::I32, {static_cast<int64_t>(big.size())}, big.data(), big.size() * 4},
                                           {"tail", DType::U8, {1}, big.data(), 1}});
  const std::string bytes = slurp(path);
  EXPECT_EQ(info.xxh3, xxh3_hex(XXH3_64bits(bytes.data(), bytes.size())));
  SafetensorsFile f(path);
  f.verify(info);
  std::vector<uint32_t> part(1000);
  f.read("big", 4 * 5'000'000, 4000, part.data());
  EXPECT_EQ(0, std::memcmp(part.data(), big.data() + 5'000'000, 4000));
}

TEST_F(CkptTest, MalformedHeadersAreRejectedNamingTheProblem) {
  auto raw = [&](const std::string& name, const std::string& header, size_t data_bytes, bool pad = true) {
    std::string h = header;
    if (pad) h.append((8 - h.size() % 8) % 8, ' ');
    std::string b(8, '\0');
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(static_cast<uint64_t>(h.size()) >> (8 * i));
    b += h + std::string(data_bytes, '\x11');
    const std::string path = dir_ + "/" + name;
    spit(path, b);
    return path;
  };
  auto open_error = [](const std::string& path) { return error_of([&] { SafetensorsFile f(path); }); };

  std::string p = dir_ + "/tiny";
  spit(p, "abc");
  EXPECT_CONTAINS(open_error(p), "truncated");
  EXPECT_CONTAINS(open_error(p), p);

  p = raw("too_long_header", "{}", 0);
  std::string b = slurp(p);
  b[0] = 100;  // header length 100, file has 8
  spit(p, b);
  EXPECT_CONTAINS(open_error(p), "truncated");

  p = raw("not_json", "{\"a\": [1, 2", 0);
  EXPECT_CONTAINS(open_error(p), "not valid JSON");
  EXPECT_CONTAINS(open_error(p), p);

  p = raw("array", "[1, 2]", 0);
  EXPECT_CONTAINS(open_error(p), "not a JSON object");

  p = raw("deep", std::string(100000, '[') + std::string(100000, ']'), 0);
  EXPECT_CONTAINS(open_error(p), "deeper than 64 levels");

  p = raw("dtype", R"({"x": {"dtype": "F8", "shape": [2], "data_offsets": [0, 2]}})", 2);
  EXPECT_CONTAINS(open_error(p), "unknown dtype \"F8\"");

  p = raw("shape", R"({"x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 20);
  EXPECT_CONTAINS(open_error(p), "needs 24 bytes");
  EXPECT_CONTAINS(open_error(p), "\"x\"");

  p = raw("overlap", R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12);
  EXPECT_CONTAINS(open_error(p), "overlap");

  p = raw("beyond", R"({"x": {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}})", 1000);
  EXPECT_CONTAINS(open_error(p), "truncated: " + p + ": header says 4096 bytes of data, file has 1000");

  p = raw("offsets", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8);
  EXPECT_CONTAINS(open_error(p), "before begin");

  // A tensor named twice: the parser would keep the second silently.
  p = raw("twice", R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                       "x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8);
  EXPECT_CONTAINS(open_error(p), "the header names x twice");

  p = raw("metadata", R"({"__metadata__": {"k": 3}})", 0);
  EXPECT_CONTAINS(open_error(p), "__metadata__");

  p = raw("good", R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "__metadata__": {"k": "v"}})", 8);
  SafetensorsFile ok(p);  // the hand-written one is fine
  EXPECT_EQ(ok.metadata().at("k"), "v");
  EXPECT_CONTAINS(open_error(dir_ + "/absent"), dir_ + "/absent");
}

TEST_F(CkptTest, TruncatedFileIsAClearError) {
  std::vector<float> v(100, 2.0f);
  const std::string path = dir_ + "/t.safetensors";
  FileInfo info = write_safetensors(path, {{"v", DType::F32, {100}, v.data(), 400}});
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(info.bytes - 10)), 0);
  const std::string e = error_of([&] { SafetensorsFile f(path); });
  EXPECT_CONTAINS(e, "truncated");
  EXPECT_CONTAINS(e, path);
  EXPECT_CONTAINS(e, "header says 400 bytes of data, file has 390");
}

TEST_F(CkptTest, FlippedByteIsAChecksumErrorNamingTheFile) {
  std::vector<float> v(100, 2.0f);
  const std::string path = dir_ + "/c.safetensors";
  FileInfo info = write_safetensors(path, {{"v", DType::F32, {100}, v.data(), 400}});
  flip_byte(path, info.bytes - 5);
  SafetensorsFile f(path);  // the header is intact
  const std::string e = error_of([&] { f.verify(info); });
  EXPECT_CONTAINS(e, "checksum mismatch");
  EXPECT_CONTAINS(e, path);
  EXPECT_CONTAINS(e, info.xxh3);
  FileInfo wrong_size = info;
  wrong_size.bytes += 1;
  EXPECT_CONTAINS(error_of([&] { f.verify(wrong_size); }), "size mismatch");
}

TEST_F(CkptTest, InvalidTensorsAreRejectedBeforeWriting) {
  float x[4] = {};
  const std::string path = dir_ + "/bad.safetensors";
  EXPECT_CONTAINS(error_of([&] { write_safetensors(path, {{"a", DType::F32, {3}, x, 16}}); }), "12 bytes");
  EXPECT_CONTAINS(error_of([&] { write_safetensors(path, {{"a", DType::F32, {1}, x, 4}, {"a", DType::F32, {1}, x, 4}}); }),
                  "twice");
  EXPECT_CONTAINS(error_of([&] { write_safetensors(path, {{"a", DType::F32, {-1}, x, 4}}); }), "negative");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(staging_left(path));
  EXPECT_CONTAINS(error_of([&] { write_safetensors(dir_ + "/no/such/dir/x.safetensors", {{"a", DType::F32, {1}, x, 4}}); }),
                  dir_ + "/no/such/dir/x.safetensors");
}

TEST_F(CkptTest, FailedWriteLeavesThePreviousFileIntactAndNoTmp) {
  // Root ignores directory permissions, so the failure is forced with
  // RLIMIT_FSIZE: writing past it fails with EFBIG once SIGXFSZ is ignored.
  if (!file_size_limit_works(dir_)) GTEST_SKIP() << "cannot force EFBIG with RLIMIT_FSIZE here";
  const std::string path = dir_ + "/rank00000.safetensors";
  std::vector<float> small(16, 1.0f), large(64 * 1024, 2.0f);
  FileInfo before = write_safetensors(path, {{"w", DType::F32, {16}, small.data(), 64}});
  const std::string old_bytes = slurp(path);
  std::string error;
  {
    FileSizeLimit limit(64 * 1024);  // the new file needs 256 KiB
    error = error_of([&] { write_safetensors(path, {{"w", DType::F32, {64 * 1024}, large.data(), large.size() * 4}}); });
  }
  EXPECT_CONTAINS(error, path);
  EXPECT_CONTAINS(error, std::string(std::strerror(EFBIG)).substr(1));  // errno's text
  EXPECT_CONTAINS(error, "wrote 65536 of");
  EXPECT_CONTAINS(error, "intact");
  EXPECT_EQ(slurp(path), old_bytes);
  EXPECT_FALSE(staging_left(path));
  SafetensorsFile(path).verify(before);

  // write_file_durably (manifest, latest) behaves the same.
  spit(dir_ + "/m.json", "old");
  {
    FileSizeLimit limit(0);
    error = error_of([&] { write_file_durably(dir_ + "/m.json", "new content"); });
  }
  EXPECT_CONTAINS(error, dir_ + "/m.json");
  EXPECT_EQ(slurp(dir_ + "/m.json"), "old");
  EXPECT_FALSE(staging_left(dir_ + "/m.json"));
}

// write_safetensors with `fetch`: each tensor's bytes are asked for once, in
// order, just before they are written (the caller may reuse the memory after
// the next call); the file equals the one written from borrowed data; a fetch
// that throws leaves the previous file intact.
TEST_F(CkptTest, FetchedTensorsAreAskedForInOrderAndWrittenAsBorrowedOnes) {
  std::vector<std::vector<float>> values;
  std::vector<TensorData> borrowed, fetched;
  for (int i = 0; i < 5; ++i) {
    values.emplace_back(static_cast<size_t>(3 + 1000 * i));
    for (size_t e = 0; e < values.back().size(); ++e) values.back()[e] = static_cast<float>(i * 100000 + e);
  }
  for (int i = 0; i < 5; ++i) {
    const std::string name = "fp32/p" + std::to_string(i) + "/0";
    borrowed.push_back({name, DType::F32, {static_cast<int64_t>(values[i].size())}, values[i].data(), values[i].size() * 4});
    fetched.push_back({name, DType::F32, {static_cast<int64_t>(values[i].size())}, nullptr, values[i].size() * 4});
  }
  const FileInfo reference = write_safetensors(dir_ + "/borrowed.safetensors", borrowed);
  std::vector<size_t> asked;
  std::vector<float> window;  // one tensor's bytes at a time, overwritten by the next fetch
  const std::string path = dir_ + "/fetched.safetensors";
  const FileInfo info = write_safetensors(path, fetched, {}, [&](size_t i) -> const void* {
    asked.push_back(i);
    window = values[i];
    return window.data();
  });
  EXPECT_EQ(asked, (std::vector<size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(info.xxh3, reference.xxh3);
  EXPECT_EQ(slurp(path), slurp(dir_ + "/borrowed.safetensors"));
  const std::string before = slurp(path);
  const std::string e = error_of([&] {
    write_safetensors(path, fetched, {}, [&](size_t i) -> const void* {
      if (i == 3) throw CheckpointError("NVMe read failed for p3");
      return values[i].data();
    });
  });
  EXPECT_CONTAINS(e, "NVMe read failed for p3");
  EXPECT_EQ(slurp(path), before);
  EXPECT_FALSE(staging_left(path));
  EXPECT_CONTAINS(error_of([&] { write_safetensors(path, fetched); }), "no data pointer");
}

// ---- manifest, latest, tags ------------------------------------------------------

TEST_F(CkptTest, ManifestRoundTripsThroughJson) {
  Model model;
  Manifest m = model.write(dir_, "global_step7", kThreeRanks);
  Manifest back = read_manifest(dir_, "global_step7");
  EXPECT_EQ(back.to_json(), m.to_json());
  EXPECT_EQ(back.format, "zero-checkpoint");
  EXPECT_EQ(back.version, kFormatVersion);
  EXPECT_EQ(back.world_size, 3);
  EXPECT_EQ(back.stage, 2);
  EXPECT_EQ(back.dtype, "BF16");
  EXPECT_EQ(back.states, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  ASSERT_EQ(back.params.size(), 3u);
  EXPECT_EQ(back.params[0].shape, (std::vector<int64_t>{5, 7}));
  EXPECT_FALSE(back.params[2].trainable);
  ASSERT_EQ(back.files.size(), 3u);
  EXPECT_EQ(back.files[2].name, "rank00002.safetensors");
  EXPECT_EQ(back.files[2].rank, 2);
  EXPECT_EQ(back.files[2].bytes, fs::file_size(tag_dir(dir_, "global_step7") + "/rank00002.safetensors"));
  EXPECT_EQ(back.engine["global_steps"], 7);
  EXPECT_EQ(back.client_state["epoch"], 3);
  EXPECT_EQ(rank_file_name(3), "rank00003.safetensors");
  EXPECT_EQ(tag_dir("/a/b/", "t"), "/a/b/t");
  EXPECT_EQ(manifest_path("/a/b", "t"), "/a/b/t/manifest.json");
  EXPECT_FALSE(staging_left(manifest_path(dir_, "global_step7")));
}

TEST(Manifest, UnknownVersionNamesTheFileAndTheVersions) {
  Manifest m;
  m.tag = "t";
  m.dtype = "F32";
  m.files = {{"rank00000.safetensors", 0, 8, "0123456789abcdef"}};
  auto j = m.to_json();
  EXPECT_NO_THROW(Manifest::from_json(j, "x/manifest.json"));
  j["version"] = 99;
  const std::string e = error_of([&] { Manifest::from_json(j, "/ck/t/manifest.json"); });
  EXPECT_CONTAINS(e, "/ck/t/manifest.json");
  EXPECT_CONTAINS(e, "version 99");
  EXPECT_CONTAINS(e, "reads version 1");
}

TEST(Manifest, InvalidManifestsAreRejected) {
  Manifest m;
  m.tag = "t";
  m.world_size = 2;
  m.dtype = "F16";
  m.params = {{"w", {2, 3}, true}};
  m.files = {{"rank00000.safetensors", 0, 8, "0123456789abcdef"}, {"rank00001.safetensors", 1, 8, "fedcba9876543210"}};
  const auto good = m.to_json();
  auto bad = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto j = good;
    edit(j);
    return error_of([&] { Manifest::from_json(j, "M.json"); });
  };
  EXPECT_CONTAINS(bad([](auto& j) { j["format"] = "deepspeed"; }), "not a zero checkpoint");
  EXPECT_CONTAINS(bad([](auto& j) { j.erase("world_size"); }), "\"world_size\" is missing");
  EXPECT_CONTAINS(bad([](auto& j) { j["stage"] = "two"; }), "\"stage\" must be an integer");
  EXPECT_CONTAINS(bad([](auto& j) { j["stage"] = 4; }), "stage 4");
  EXPECT_CONTAINS(bad([](auto& j) { j["dtype"] = "fp16"; }), "fp16");
  EXPECT_CONTAINS(bad([](auto& j) { j["files"].erase(1); }), "1 files listed for world size 2");
  EXPECT_CONTAINS(bad([](auto& j) { j["files"][1]["rank"] = 0; }), "two files");
  EXPECT_CONTAINS(bad([](auto& j) { j["files"][1]["rank"] = 5; }), "outside world size");
  EXPECT_CONTAINS(bad([](auto& j) { j["files"][0]["xxh3"] = "XYZ"; }), "16 lowercase hex");
  EXPECT_CONTAINS(bad([](auto& j) { j["files"][0]["name"] = "../etc/passwd"; }), "one name inside the tag directory");
  EXPECT_CONTAINS(bad([](auto& j) { j["params"].push_back(j["params"][0]); }), "listed twice");
  EXPECT_CONTAINS(bad([](auto& j) { j["params"][0]["shape"] = {2, -3}; }), "-3");
  EXPECT_CONTAINS(bad([](auto& j) { j = nlohmann::json::array(); }), "JSON object");
  EXPECT_CONTAINS(bad([](auto& j) { j.erase("files"); }), "M.json: required key \"files\" is missing");
  // A key written twice in the file's text (stage 2, then 0): refused, not the last kept.
  std::string text = good.dump();
  text.insert(text.size() - 1, R"(, "stage": 0)");
  EXPECT_CONTAINS(error_of([&] { zero::ckpt::parse_manifest(text, "M.json"); }), "M.json holds the key stage twice");
}

TEST_F(CkptTest, LatestAndTagErrorsSayWhatToDo) {
  const std::string ck = dir_ + "/ck";
  EXPECT_CONTAINS(error_of([&] { read_latest(ck); }), ck + " does not exist");
  Model model;
  model.write(ck, "global_step10", kOneRank, nullptr, false);
  model.write(ck, "global_step9", kOneRank, nullptr, false);
  model.write(ck, "global_step100", kTwoRanks, nullptr, false);
  fs::create_directories(tag_dir(ck, "global_step200"));  // an interrupted save: no manifest
  model.write(ck + "/.saving", "global_step300", kOneRank, nullptr, false);  // a staging folder is no tag
  EXPECT_EQ(list_tags(ck), (std::vector<std::string>{"global_step9", "global_step10", "global_step100"}));

  // No latest: the error lists the complete tags and says to pass one.
  std::string e = error_of([&] { read_latest(ck); });
  EXPECT_CONTAINS(e, ck + "/latest");
  EXPECT_CONTAINS(e, "global_step9, global_step10, global_step100");
  EXPECT_CONTAINS(e, "pass the tag");
  EXPECT_EQ(e.find("global_step200"), std::string::npos) << e;

  // latest may only name a complete tag.
  EXPECT_CONTAINS(error_of([&] { write_latest(ck, "global_step200"); }), "manifest.json does not exist");
  EXPECT_CONTAINS(error_of([&] { write_latest(ck, "../x"); }), "invalid checkpoint tag");
  write_latest(ck, "global_step100");
  EXPECT_EQ(read_latest(ck), "global_step100");
  EXPECT_EQ(slurp(ck + "/latest"), "global_step100\n");

  // A latest written by hand naming a tag whose save never finished.
  spit(ck + "/latest", "global_step200\n");
  e = error_of([&] { read_latest(ck); });
  EXPECT_CONTAINS(e, "names tag \"global_step200\"");
  EXPECT_CONTAINS(e, "interrupted");
  EXPECT_CONTAINS(e, "global_step100");

  // A missing manifest: interrupted save or wrong tag, with the complete tags.
  e = error_of([&] { read_manifest(ck, "global_step200"); });
  EXPECT_CONTAINS(e, manifest_path(ck, "global_step200"));
  EXPECT_CONTAINS(e, "interrupted");
  EXPECT_CONTAINS(e, "global_step9, global_step10, global_step100");
  e = error_of([&] { read_manifest(ck, "global_step5"); });
  EXPECT_CONTAINS(e, "the tag is wrong");

  // A damaged manifest names its path.
  spit(manifest_path(ck, "global_step9"), "{\"format\": ");
  EXPECT_CONTAINS(error_of([&] { read_manifest(ck, "global_step9"); }), manifest_path(ck, "global_step9"));
  // One nested past any manifest is refused before it is parsed.
  spit(manifest_path(ck, "global_step9"), "{\"format\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  EXPECT_CONTAINS(error_of([&] { read_manifest(ck, "global_step9"); }), "deeper than 64 levels");
}

// Note [Tag rule]: one rule for every tag, saved, loaded or read from
// `latest`. Against the three rules it replaced, ckpt/ (latest, manifests)
// now also refuses "latest" and names starting with '.', the engine's save
// also a newline or NUL, DeepSpeed's folders (interop) all three; nothing
// refused before is accepted now.
TEST_F(CkptTest, OneTagRuleEverywhere) {
  using zero::ckpt::check_tag;
  using zero::ckpt::tag_problem;
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"", "empty"},           {"latest", "newest tag"},   {".", "starts with '.'"},
      {"..", "starts with '.'"}, {".saving", "starts with '.'"}, {"a/b", "'/'"},
      {"../x", "starts with '.'"}, {"step\n1", "newline"},  {std::string("st\0ep", 6), "NUL"},
      {"latest.tmp", "ends in .tmp"}, {"global_step3.tmp", "ends in .tmp"}};
  for (const auto& [tag, why] : refused) {
    SCOPED_TRACE(tag);
    EXPECT_CONTAINS(tag_problem(tag), why);
    const std::string e = error_of([&] { check_tag(tag, "here"); });
    EXPECT_CONTAINS(e, "here: invalid checkpoint tag");
    EXPECT_CONTAINS(e, "global_step100");
  }
  for (const std::string tag : {"global_step100", "best", "step.5", "latest2", "my latest", "a..b", "x.", "tmp", "x.tmp2"}) {
    EXPECT_EQ(tag_problem(tag), "") << tag;
  }
  // read_latest applies it to what the file says.
  const std::string ck = dir_ + "/ck";
  fs::create_directories(ck);
  spit(ck + "/latest", ".saving\n");
  EXPECT_CONTAINS(error_of([&] { read_latest(ck); }), "starts with '.'");
  EXPECT_CONTAINS(error_of([&] { write_latest(ck, "latest"); }), "invalid checkpoint tag");
}

TEST_F(CkptTest, WriteLatestKeepsTheOldTagUntilTheRename) {
  Model model;
  model.write(dir_, "global_step1", kOneRank);
  model.write(dir_, "global_step2", kOneRank, nullptr, false);
  EXPECT_EQ(read_latest(dir_), "global_step1");
  if (!file_size_limit_works(dir_)) GTEST_SKIP() << "cannot force EFBIG with RLIMIT_FSIZE here";
  std::string error;
  {
    FileSizeLimit limit(0);  // the temporary cannot get its content
    error = error_of([&] { write_latest(dir_, "global_step2"); });
  }
  EXPECT_CONTAINS(error, dir_ + "/latest");
  EXPECT_EQ(read_latest(dir_), "global_step1");
  EXPECT_FALSE(staging_left(dir_ + "/latest"));
  write_latest(dir_, "global_step2");
  EXPECT_EQ(read_latest(dir_), "global_step2");
  EXPECT_FALSE(staging_left(dir_ + "/latest"));
}

// The folder a manifest is in is the checkpoint, whatever its "tag" says.
TEST_F(CkptTest, ARenamedTagFolderReadsItsOwnFiles) {
  Model model;
  model.write(dir_, "saved", kTwoRanks);
  fs::rename(dir_ + "/saved", dir_ + "/renamed");
  const Manifest m = read_manifest(dir_, "renamed");
  EXPECT_EQ(m.tag, "renamed");
  EXPECT_EQ(m.tag_in_file, "saved");
  FragmentReader reader(dir_, m);
  const auto& p = model.trainable.front();
  std::vector<float> out(static_cast<size_t>(p.numel));
  reader.read_f32(model.kinds.front(), p.name, 0, p.numel, out.data());
  EXPECT_EQ(out, model.ref.at({model.kinds.front(), p.name}));
}

// ---- fragments -----------------------------------------------------------------

TEST_F(CkptTest, AnyRangeReadsTheSameFromEveryWorldSize) {
  Model model;
  int layout = 0;
  for (const auto& bounds : {kOneRank, kTwoRanks, kThreeRanks, kFourRanks}) {
    const std::string tag = "layout" + std::to_string(layout++);
    Manifest m = model.write(dir_, tag, bounds);
    FragmentReader reader(dir_, read_manifest(dir_, tag));
    for (const auto& kind : model.kinds)
      for (const auto& p : model.trainable) {
        const auto& ref = model.ref.at({kind, p.name});
        std::vector<float> out(static_cast<size_t>(p.numel));
        for (int64_t s = 0; s <= p.numel; ++s)
          for (int64_t l = 0; s + l <= p.numel; ++l) {
            std::fill(out.begin(), out.end(), -1e9f);
            reader.read_f32(kind, p.name, s, l, out.data());
            for (int64_t i = 0; i < l; ++i) {
              ASSERT_EQ(out[i], ref[s + i]) << tag << " " << kind << " " << p.name << " [" << s << ", " << s + l
                                            << ") element " << i;
            }
            if (l < p.numel) {
              ASSERT_EQ(out[l], -1e9f) << "wrote past the range";
            }
          }
      }
    EXPECT_CONTAINS(error_of([&] { float f[40]; reader.read_f32("fp32", "fc1.bias", 5, 6, f); }),
                    "outside the parameter's 10 elements");
  }
}

TEST_F(CkptTest, GapIsReportedWithItsRange) {
  Model model;
  // Rank 1's exp_avg fragment of fc1.weight (elements [23, 35)) is lost.
  model.write(dir_, "t", kTwoRanks, [](const std::string& kind, const std::string& param, int64_t offset) {
    return kind == "exp_avg" && param == "fc1.weight" && offset == 23;
  });
  FragmentReader reader(dir_, read_manifest(dir_, "t"));
  std::vector<float> out(35);
  reader.read_f32("exp_avg", "fc1.weight", 0, 23, out.data());  // rank 0's part is fine
  std::string e = error_of([&] { reader.read_f32("exp_avg", "fc1.weight", 0, 35, out.data()); });
  EXPECT_CONTAINS(e, "\"exp_avg\" of parameter \"fc1.weight\"");
  EXPECT_CONTAINS(e, "no fragment covers elements [23, 35)");
  EXPECT_CONTAINS(e, "[0, 23) in rank00000.safetensors");
  e = error_of([&] { reader.read_f32("exp_avg", "fc1.weight", 20, 5, out.data()); });
  EXPECT_CONTAINS(e, "[23, 25)");
  reader.read_f32("exp_avg_sq", "fc1.weight", 0, 35, out.data());  // other kinds complete

  // A gap in the middle: the 3-rank layout without rank 1's fp32 fragment of fc1.weight ([16, 35)).
  model.write(dir_, "t3", kThreeRanks, [](const std::string& kind, const std::string& param, int64_t offset) {
    return kind == "fp32" && param == "fc1.weight" && offset == 16;
  });
  FragmentReader r3(dir_, read_manifest(dir_, "t3"));
  EXPECT_CONTAINS(error_of([&] { r3.read_f32("fp32", "fc1.weight", 10, 20, out.data()); }), "[16, 30)");
  // A gap between two fragments: 4 ranks, rank 2's [10, 30) of fc1.weight lost, [30, 35) present.
  model.write(dir_, "t4", kFourRanks, [](const std::string& kind, const std::string& param, int64_t offset) {
    return kind == "exp_avg_sq" && param == "fc1.weight" && offset == 10;
  });
  FragmentReader r4(dir_, read_manifest(dir_, "t4"));
  e = error_of([&] { r4.read_f32("exp_avg_sq", "fc1.weight", 5, 30, out.data()); });
  EXPECT_CONTAINS(e, "no fragment covers elements [10, 30) (reading [5, 35)");
  EXPECT_CONTAINS(e, "[30, 35) in rank00003.safetensors");
  r4.read_f32("exp_avg_sq", "fc1.weight", 30, 5, out.data());
  EXPECT_EQ(out[4], model.ref.at({"exp_avg_sq", "fc1.weight"})[34]);
  // A kind never stored (another optimizer's state).
  e = error_of([&] { r3.read_f32("momentum_buffer", "fc1.weight", 0, 1, out.data()); });
  EXPECT_CONTAINS(e, "no fragments");
  EXPECT_CONTAINS(e, "exp_avg, exp_avg_sq, fp32");
}

TEST_F(CkptTest, MissingRankFileIsNamed) {
  Model model;
  Manifest m = model.write(dir_, "t", kThreeRanks);
  fs::remove(tag_dir(dir_, "t") + "/rank00001.safetensors");
  FragmentReader reader(dir_, m);
  std::vector<float> out(35);
  const std::string e = error_of([&] { reader.read_f32("fp32", "fc1.weight", 0, 35, out.data()); });
  EXPECT_CONTAINS(e, "missing checkpoint file " + tag_dir(dir_, "t") + "/rank00001.safetensors");
  EXPECT_CONTAINS(e, "rank 1 of world size 3");
}

TEST_F(CkptTest, CorruptRankFileFailsOnlyWhenItsDataIsRead) {
  Model model;
  Manifest m = model.write(dir_, "t", kTwoRanks);
  const std::string rank1 = tag_dir(dir_, "t") + "/rank00001.safetensors";
  flip_byte(rank1, fs::file_size(rank1) - 20);
  std::vector<float> out(35);
  FragmentReader reader(dir_, m);
  reader.read_f32("fp32", "fc1.weight", 0, 23, out.data());  // rank 0 only: not hashed rank 1
  std::string e = error_of([&] { reader.read_f32("fp32", "fc1.weight", 20, 10, out.data()); });
  EXPECT_CONTAINS(e, "checksum mismatch");
  EXPECT_CONTAINS(e, rank1);
  // verify = false reads without hashing.
  FragmentReader unverified(dir_, m, false);
  unverified.read_f32("fp32", "fc1.weight", 20, 10, out.data());

  // Truncated: the size check names the file; unverified, the header check does.
  ASSERT_EQ(::truncate(rank1.c_str(), static_cast<off_t>(m.files[1].bytes - 8)), 0);
  FragmentReader r2(dir_, m);
  e = error_of([&] { r2.read_f32("fp32", "fc1.weight", 0, 1, out.data()); });
  EXPECT_CONTAINS(e, "truncated");
  EXPECT_CONTAINS(e, rank1);
  FragmentReader r3(dir_, m, false);
  e = error_of([&] { r3.read_f32("fp32", "fc1.weight", 0, 1, out.data()); });
  EXPECT_CONTAINS(e, "truncated");
  EXPECT_CONTAINS(e, rank1);
}

// Note [Hashing while reading]: whatever order the fragments are read in
// (the file's, backwards, some skipped, ranges cut anywhere), the files this
// reader verifies hash to the manifest's checksum, and a flipped byte is
// found whether the reads went over it or not.
TEST_F(CkptTest, HashingWhileReadingMatchesTheManifestInAnyReadOrder) {
  Model model;
  using Read = std::tuple<std::string, std::string, int64_t, int64_t>;  // kind, param, start, length
  std::vector<Read> file_order, backwards, partial;
  for (const auto& kind : model.kinds)
    for (const auto& p : model.trainable) {
      for (int64_t s = 0; s < p.numel; s += 6) file_order.emplace_back(kind, p.name, s, std::min<int64_t>(6, p.numel - s));
    }
  backwards.assign(file_order.rbegin(), file_order.rend());
  for (size_t i = 0; i < file_order.size(); i += 3) partial.push_back(file_order[i]);
  int layout = 0;
  for (const auto& bounds : {kOneRank, kThreeRanks}) {
    const std::string tag = "h" + std::to_string(layout++);
    const Manifest m = model.write(dir_, tag, bounds);
    std::vector<int> all_ranks;
    for (int r = 0; r < m.world_size; ++r) all_ranks.push_back(r);
    auto run = [&](const std::vector<Read>& reads, std::vector<std::vector<float>>& outs) {
      FragmentReader reader(dir_, m);
      reader.verify_only(all_ranks);
      outs.clear();
      for (const auto& [kind, param, start, length] : reads) {
        outs.emplace_back(static_cast<size_t>(length));  // kept until the hashes are done
        reader.read_f32(kind, param, start, length, outs.back().data());
      }
      std::vector<uint8_t> storage;
      reader.read_whole(0, "module/scale16", storage);
      reader.finish_verification();
    };
    for (const auto* reads : {&file_order, &backwards, &partial}) {
      std::vector<std::vector<float>> outs;
      ASSERT_NO_THROW(run(*reads, outs)) << tag;
      for (size_t i = 0; i < reads->size(); ++i) {
        const auto& [kind, param, start, length] = (*reads)[i];
        for (int64_t e = 0; e < length; ++e) ASSERT_EQ(outs[i][e], model.ref.at({kind, param})[start + e]);
      }
    }
    // A byte flipped in fragment data that every order reads, and one in the rng tensor that none reads.
    const std::string last = tag_dir(dir_, tag) + "/" + rank_file_name(0);
    uint64_t read_at = 0, unread_at = 0;
    {
      SafetensorsFile f(last);
      read_at = f.data_start() + f.entries().at("fp32/fc1.weight/0").begin + 5;
      unread_at = f.data_start() + f.entries().at("rng/cpu").begin + 7;
    }
    for (uint64_t at : {read_at, unread_at}) {
      const std::string good = slurp(last);
      flip_byte(last, at);
      for (const auto* reads : {&file_order, &partial}) {
        std::vector<std::vector<float>> outs;
        const std::string e = error_of([&] { run(*reads, outs); });
        EXPECT_CONTAINS(e, "checksum mismatch");
        EXPECT_CONTAINS(e, last);
      }
      spit(last, good);
    }
  }
}

TEST_F(CkptTest, WholeTensorsByRank) {
  Model model;
  Manifest m = model.write(dir_, "t", kTwoRanks);
  FragmentReader reader(dir_, m);
  EXPECT_TRUE(reader.has(0, "module/emb.weight"));
  EXPECT_FALSE(reader.has(1, "module/emb.weight"));
  EXPECT_TRUE(reader.has(1, "rng/cpu"));
  EXPECT_FALSE(reader.has(7, "rng/cpu"));
  std::vector<uint8_t> storage;
  TensorData t = reader.read_whole(0, "module/emb.weight", storage);
  EXPECT_EQ(t.dtype, DType::BF16);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 4}));
  ASSERT_EQ(t.bytes, 24u);
  EXPECT_EQ(0, std::memcmp(t.data, model.emb_bf16.data(), 24));
  t = reader.read_whole(1, "rng/cpu", storage);
  EXPECT_EQ(std::vector<uint8_t>(storage.begin(), storage.end()), model.rng);
  EXPECT_CONTAINS(error_of([&] { reader.read_whole(1, "module/emb.weight", storage); }), "rank00001.safetensors");
}

// ---- consolidate -----------------------------------------------------------------

TEST_F(CkptTest, ConsolidateEqualsTheReferenceForEveryWorldSize) {
  Model model;
  int layout = 0;
  for (const auto& bounds : {kOneRank, kTwoRanks, kThreeRanks, kFourRanks}) {
    const std::string tag = "ws" + std::to_string(bounds.size() - 1) + "_" + std::to_string(layout++);
    model.write(dir_, tag, bounds);
    const std::string out = dir_ + "/" + tag + ".safetensors";
    EXPECT_EQ(consolidate(dir_, tag, out), 6);
    SCOPED_TRACE(tag);
    expect_consolidated(out, model);
  }
  // Incomplete checkpoints fail to consolidate and leave no file behind.
  model.write(dir_, "gap", kTwoRanks, [](const std::string& kind, const std::string&, int64_t offset) {
    return kind == "fp32" && offset == 0;
  });
  EXPECT_CONTAINS(error_of([&] { consolidate(dir_, "gap", dir_ + "/gap.safetensors"); }), "[0, ");
  EXPECT_FALSE(fs::exists(dir_ + "/gap.safetensors"));
}

// Writes a consolidated file and the values it must hold, for the Python
// reader (tests/ckpt/read_safetensors.py, run by CTest after this test). With
// ZERO_CKPT_PY_DIR set, the files go there; also writes expected_wrong.json,
// which the script must reject.
TEST_F(CkptTest, ConsolidatedFileForThePythonReader) {
  const char* env = std::getenv("ZERO_CKPT_PY_DIR");
  const std::string out_dir = env && *env ? env : dir_ + "/py";
  fs::create_directories(out_dir);
  Model model;
  model.write(dir_, "global_step3", kThreeRanks);
  const std::string out = out_dir + "/consolidated.safetensors";
  ASSERT_EQ(consolidate(dir_, "global_step3", out), 6);
  expect_consolidated(out, model);

  nlohmann::json exp = {{"tensors", nlohmann::json::object()},
                        {"metadata", {{"format", "pt"}, {"checkpoint_tag", "global_step3"}}}};
  for (const auto& [name, e] : model.consolidated()) {
    nlohmann::json values = nlohmann::json::array();
    for (double v : e.values) {
      if (e.dtype == DType::I64) values.push_back(static_cast<int64_t>(v));
      else values.push_back(v);
    }
    exp["tensors"][name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"values", values}};
  }
  spit(out_dir + "/expected.json", exp.dump(1));
  exp["tensors"]["fc1.bias"]["values"][9] = exp["tensors"]["fc1.bias"]["values"][9].get<double>() + 0.25;
  spit(out_dir + "/expected_wrong.json", exp.dump(1));
}

// ---- the zero-ckpt tool ----------------------------------------------------------


TEST_F(CkptTest, ToolInspectListsTheCheckpoint) {
  Model model;
  const std::string ck = dir_ + "/ck";
  model.write(ck, "global_step5", kThreeRanks);
  model.write(ck, "global_step12", kTwoRanks);
  ToolRun r = tool(dir_, "inspect '" + ck + "'");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_CONTAINS(r.out, "tags: global_step5, global_step12");
  EXPECT_CONTAINS(r.out, "latest: global_step12");
  EXPECT_CONTAINS(r.out, "tag: global_step12");
  EXPECT_CONTAINS(r.out, "format: zero-checkpoint version 1");
  EXPECT_CONTAINS(r.out, "world size: 2");
  EXPECT_CONTAINS(r.out, "stage: 2");
  EXPECT_CONTAINS(r.out, "dtype: BF16");
  EXPECT_CONTAINS(r.out, "optimizer: adam (states: exp_avg, exp_avg_sq)");
  EXPECT_CONTAINS(r.out, "parameters: 3 (2 trainable, 1 frozen), 57 elements (45 trainable)");
  EXPECT_CONTAINS(r.out, "rank00001.safetensors  rank 1");
  EXPECT_CONTAINS(r.out, "ok\n");
  EXPECT_CONTAINS(r.out, "2 of 2 files ok");

  r = tool(dir_, "inspect '" + ck + "' --tag global_step5");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_CONTAINS(r.out, "world size: 3");
  EXPECT_CONTAINS(r.out, "3 of 3 files ok");
}

TEST_F(CkptTest, ToolInspectFlagsCorruptAndMissingFiles) {
  Model model;
  const std::string ck = dir_ + "/ck";
  Manifest m = model.write(ck, "global_step5", kThreeRanks);
  const std::string rank2 = tag_dir(ck, "global_step5") + "/rank00002.safetensors";
  flip_byte(rank2, m.files[2].bytes - 3);
  ToolRun r = tool(dir_, "inspect '" + ck + "'");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_CONTAINS(r.out, "rank00002.safetensors  rank 2");
  EXPECT_CONTAINS(r.out, "MISMATCH");
  EXPECT_CONTAINS(r.out, "2 of 3 files ok");

  fs::remove(rank2);
  r = tool(dir_, "inspect '" + ck + "' --tag=global_step5");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_CONTAINS(r.out, "MISSING");

  // No latest and no --tag: the error lists the tags.
  fs::remove(ck + "/latest");
  r = tool(dir_, "inspect '" + ck + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.out, "tags: global_step5");
  EXPECT_CONTAINS(r.err, "pass the tag");
}

TEST_F(CkptTest, ToolConsolidateWritesTheReference) {
  Model model;
  const std::string ck = dir_ + "/ck";
  model.write(ck, "global_step5", kThreeRanks);
  const std::string out = dir_ + "/full.safetensors";
  ToolRun r = tool(dir_, "consolidate '" + ck + "' --out '" + out + "'");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_CONTAINS(r.out, "wrote 6 tensors");
  expect_consolidated(out, model);

  // The same checkpoint at another world size consolidates to the same tensors.
  model.write(ck, "global_step6", kTwoRanks);
  const std::string out2 = dir_ + "/full2.safetensors";
  r = tool(dir_, "consolidate '" + ck + "' --tag global_step6 --out='" + out2 + "'");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  expect_consolidated(out2, model);

  // zero_to_fp32.py's form, the output file after the folder, writes the same.
  const std::string out3 = dir_ + "/full3.safetensors";
  r = tool(dir_, "consolidate '" + ck + "' '" + out3 + "' --tag global_step6");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  expect_consolidated(out3, model);

  // A corrupt file stops it with the file's name.
  const std::string rank0 = tag_dir(ck, "global_step5") + "/rank00000.safetensors";
  flip_byte(rank0, fs::file_size(rank0) - 30);
  r = tool(dir_, "consolidate '" + ck + "' --tag global_step5 --out '" + dir_ + "/bad.safetensors'");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.err, "checksum mismatch");
  EXPECT_CONTAINS(r.err, rank0);
  EXPECT_FALSE(fs::exists(dir_ + "/bad.safetensors"));
}

TEST_F(CkptTest, ToolUsageErrorsExitTwo) {
  ToolRun r = tool(dir_, "--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_CONTAINS(r.out, "usage: zero-ckpt inspect DIR");
  for (const char* args : {"", "frobnicate x", "inspect", "consolidate x", "inspect x --bogus", "inspect x y",
                           "inspect x --tag", "inspect x --out y", "export x y --to hf --dtype ''",
                           "export x y --to hf --dtype=", "export x y --to hf --max-shard-size ''"}) {
    r = tool(dir_, args);
    EXPECT_EQ(r.status, 2) << "args: " << args;
    EXPECT_CONTAINS(r.err, "usage:");
  }
  r = tool(dir_, "inspect '" + dir_ + "/nowhere'");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.err, "does not exist");
  // A near miss names the option meant; underscores are dashes.
  r = tool(dir_, "inspect x --tga t");
  EXPECT_EQ(r.status, 2);
  EXPECT_CONTAINS(r.err, "unknown option '--tga'; did you mean --tag?");
  r = tool(dir_, "consolidate x --out a.safetensors b.safetensors");
  EXPECT_EQ(r.status, 2) << "two output files";
  EXPECT_CONTAINS(r.err, "unexpected argument");
}

}  // namespace
