// Checkpoints made hostile on purpose: files that are not regular files,
// manifests claiming more than the rank files hold, and tool outputs that
// would overwrite their own inputs. Each case once crashed, hung, allocated
// what a file claimed or destroyed a checkpoint.
#include <sys/stat.h>
#include <unistd.h>

#include <deque>

#include "ckpt/checkpoint.h"
#include "ckpt/file_io.h"
#include "tests/ckpt/ckpt_test_support.h"

using namespace ckpt_test;

namespace {

// Outputs that cannot be redirected: each write stages under a name drawn
// anew (staging_name_for), so a symlink planted where a staging file might
// be (the old fixed <file>.tmp, or a name of the pattern) is never written
// through; a device node or FIFO given as the output is refused and left
// as it is.
TEST_F(CkptTest, AStagingSymlinkOrASpecialFileCannotRedirectAWrite) {
  const std::string outside = dir_ + "/outside.txt";
  spit(outside, "keep me");
  const std::string target = dir_ + "/latest";
  ASSERT_EQ(::symlink(outside.c_str(), (target + ".tmp").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (target + ".0000000000000000.tmp").c_str()), 0);
  write_file_durably(target, "global_step7");
  EXPECT_EQ(slurp(target), "global_step7");
  EXPECT_EQ(slurp(outside), "keep me");
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(target + ".tmp"))) << "a file that is not its own is left alone";

  const std::string fifo = dir_ + "/out.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_CONTAINS(error_of([&] { write_file_durably(fifo, "x"); }), fifo + " exists and is not a regular file (a FIFO)");
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_CONTAINS(error_of([&] { write_file_durably("/dev/null", "x"); }),
                  "/dev/null exists and is not a regular file (a character device)");
}

// Two processes replacing one file (two saves' `latest`), their writes
// interleaved: each stages under a name of its own, so neither writes into
// or renames the other's; both succeed, the last rename wins whole, and no
// staging file is left. (With one shared <file>.tmp the second writer
// removed the first's, whose rename then failed.)
TEST_F(CkptTest, TwoWritersOfOneFileDoNotTouchEachOthersStaging) {
  const std::string target = dir_ + "/latest";
  zero::ckpt::AtomicWriter first(target, 12), second(target, 12);
  first.write("global_step1", 12, nullptr);
  second.write("global_step2", 12, nullptr);
  first.commit();
  EXPECT_EQ(slurp(target), "global_step1");
  second.commit();
  EXPECT_EQ(slurp(target), "global_step2");
  EXPECT_FALSE(staging_left(target));
  EXPECT_NE(zero::ckpt::staging_name_for(target), zero::ckpt::staging_name_for(target));
  EXPECT_TRUE(zero::ckpt::is_staging_name_for("latest.0123456789abcdef.tmp", "latest"));
  for (const std::string other : {"latest.tmp", "latest.0123456789abcdeg.tmp", "latest2.0123456789abcdef.tmp",
                                  "latest.0123456789abcdef.tmpx", "latest.0123456789abcde.tmp"}) {
    EXPECT_FALSE(zero::ckpt::is_staging_name_for(other, "latest")) << other;
  }
}

// A FIFO where `latest`, a manifest or a rank file belongs: refused at
// once, naming it (a plain open() would wait for a writer forever).
TEST_F(CkptTest, NonRegularFilesAreRefusedWithoutWaiting) {
  Model model;
  model.write(dir_, "global_step1", kTwoRanks);
  ::alarm(30);  // a regression fails here instead of hanging the suite

  fs::rename(dir_ + "/latest", dir_ + "/latest.saved");
  ASSERT_EQ(::mkfifo((dir_ + "/latest").c_str(), 0600), 0);
  EXPECT_CONTAINS(error_of([&] { read_latest(dir_); }), dir_ + "/latest is a FIFO, not a regular file");
  ToolRun r = tool(dir_, "inspect '" + dir_ + "'");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "is a FIFO, not a regular file");
  fs::remove(dir_ + "/latest");
  fs::create_directory(dir_ + "/latest");
  EXPECT_CONTAINS(error_of([&] { read_latest(dir_); }), dir_ + "/latest is a directory, not a regular file");
  fs::remove(dir_ + "/latest");
  fs::rename(dir_ + "/latest.saved", dir_ + "/latest");

  const std::string manifest = manifest_path(dir_, "global_step1");
  fs::remove(manifest);
  fs::create_symlink("/dev/zero", manifest);
  EXPECT_CONTAINS(error_of([&] { read_manifest(dir_, "global_step1"); }), "is a character device, not a regular file");

  Model other;
  const Manifest m = other.write(dir_, "global_step2", kTwoRanks);
  const std::string rank1 = tag_dir(dir_, "global_step2") + "/" + rank_file_name(1);
  fs::remove(rank1);
  ASSERT_EQ(::mkfifo(rank1.c_str(), 0600), 0);
  EXPECT_CONTAINS(error_of([&] { SafetensorsFile f(rank1); }), rank1 + " is a FIFO, not a regular file");
  EXPECT_CONTAINS(error_of([&] { hash_file(rank1); }), rank1 + " is a FIFO, not a regular file");
  EXPECT_CONTAINS(error_of([&] { consolidate(dir_, "global_step2", dir_ + "/out.safetensors"); }),
                  "checkpoint file " + rank1 + " is a FIFO, not a regular file");
  ::alarm(0);
}

// A manifest that claims a bigger parameter than its fragments hold is
// refused before a buffer of the claimed size exists (it was allocated
// first: std::bad_alloc, or 4 TB of zeros); a shape whose product would
// overflow int64 is refused when the manifest is read.
TEST_F(CkptTest, ShapesClaimedByTheManifestAreCheckedBeforeAllocating) {
  Model model;
  Manifest m = model.write(dir_, "global_step1", kTwoRanks);
  m.params[1].shape = {1000000000000};  // fc1.bias: 10 elements stored
  write_manifest(dir_, m);
  const std::string out = dir_ + "/out.safetensors";
  const std::string e = error_of([&] { consolidate(dir_, "global_step1", out); });
  EXPECT_CONTAINS(e, "parameter \"fc1.bias\" 1000000000000 elements but its fp32 fragments in the rank files cover the first 10: elements [10, 1000000000000) are missing");
  EXPECT_FALSE(fs::exists(out));

  m.params[1].shape = {int64_t{1} << 40, int64_t{1} << 40};
  write_manifest(dir_, m);
  EXPECT_CONTAINS(error_of([&] { read_manifest(dir_, "global_step1"); }),
                  "parameter \"fc1.bias\": shape [1099511627776,1099511627776] has more than 2^50 elements");
  ToolRun r = tool(dir_, "inspect '" + dir_ + "'");  // its element count once overflowed (UBSan)
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_CONTAINS(r.err, "more than 2^50 elements");
}

// consolidate --out naming one of the checkpoint's own files (directly, by
// a link, or inside its folder) is refused and the checkpoint stays whole;
// before, the output replaced the rank file being read.
TEST_F(CkptTest, ConsolidateNeverWritesOverItsInputs) {
  Model model;
  const Manifest m = model.write(dir_, "global_step1", kTwoRanks);
  const std::string folder = tag_dir(dir_, "global_step1");
  const std::string rank0 = folder + "/" + rank_file_name(0);
  const FileInfo before = hash_file(rank0);

  ToolRun r = tool(dir_, "consolidate '" + dir_ + "' --out '" + rank0 + "'");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_CONTAINS(r.err, "into the checkpoint folder " + folder);
  EXPECT_CONTAINS(error_of([&] { consolidate(dir_, "global_step1", manifest_path(dir_, "global_step1")); }),
                  "refusing to write");
  EXPECT_CONTAINS(error_of([&] { consolidate(dir_, "global_step1", folder + "/new.safetensors"); }),
                  "into the checkpoint folder");
  const std::string link = dir_ + "/rank0_link.safetensors";
  fs::create_hard_link(rank0, link);
  EXPECT_CONTAINS(error_of([&] { consolidate(dir_, "global_step1", link); }),
                  "it is " + rank0 + ", an input of the consolidation");
  EXPECT_CONTAINS(error_of([&] { consolidate(dir_, "global_step1", dir_ + "/latest"); }), "an input of the consolidation");

  EXPECT_EQ(hash_file(rank0).xxh3, before.xxh3);
  EXPECT_EQ(m.files[0].xxh3, before.xxh3);
  EXPECT_EQ(read_latest(dir_), "global_step1");
  const std::string out = dir_ + "/elsewhere.safetensors";
  EXPECT_EQ(consolidate(dir_, "global_step1", out), 6);
  expect_consolidated(out, model);
}

// A fragment rewritten as F16 in its file, the manifest's size and checksum
// fixed to match (so only a dtype check finds it): every reader refuses it,
// naming the fragment, the file and both dtypes. It loaded and consolidated,
// converted, before.
TEST_F(CkptTest, AFragmentWhoseDtypeWasChangedIsRefused) {
  Model model;
  Manifest m = model.write(dir_, "global_step1", kTwoRanks);
  const std::string rank1 = tag_dir(dir_, "global_step1") + "/" + rank_file_name(1);
  const FileInfo rewritten = rewrite_as_f16(rank1, "fp32/fc1.weight/23");
  m.files[1].bytes = rewritten.bytes;
  m.files[1].xxh3 = rewritten.xxh3;
  write_manifest(dir_, m);
  const std::string expected = "fragment \"fp32/fc1.weight/23\" in " + rank1 + " is F16, not F32";
  const std::string out = dir_ + "/out.safetensors";
  EXPECT_CONTAINS(error_of([&] { consolidate(dir_, "global_step1", out); }), expected);
  EXPECT_FALSE(fs::exists(out));
  ToolRun r = tool(dir_, "consolidate '" + dir_ + "' --out '" + out + "'");
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_CONTAINS(r.err, expected);
  EXPECT_FALSE(fs::exists(out));
  FragmentReader reader(dir_, read_manifest(dir_, "global_step1"));
  std::vector<float> values(35);
  EXPECT_CONTAINS(error_of([&] { reader.read_f32("fp32", "fc1.weight", 0, 35, values.data()); }), expected);
}

// Rank 0's file records the parameters it was saved with; model.write
// leaves that out, as files saved before the record did. Returns the
// manifest with the record in place.
Manifest write_with_record(const Model& model, const std::string& dir, const std::string& tag) {
  Manifest m = model.write(dir, tag, kTwoRanks);
  const std::string rank0 = tag_dir(dir, tag) + "/" + rank_file_name(0);
  std::deque<std::vector<uint8_t>> keep;
  std::vector<TensorData> tensors;
  std::map<std::string, std::string> metadata;
  {
    SafetensorsFile f(rank0);
    metadata = f.metadata();
    for (const auto& [n, e] : f.entries()) {
      keep.emplace_back(e.end - e.begin);
      f.read(n, 0, e.end - e.begin, keep.back().data());
      tensors.push_back({n, e.dtype, e.shape, keep.back().data(), keep.back().size()});
    }
  }
  metadata[kParamsRecord] = params_record(m.params);
  write_safetensors(rank0, tensors, metadata);
  const FileInfo info = hash_file(rank0);
  m.files[0].bytes = info.bytes;
  m.files[0].xxh3 = info.xxh3;
  write_manifest(dir, m);
  return m;
}

// consolidate checks the manifest against the files before it writes
// anything, as a load does: a parameter's shape changed (fewer elements,
// the same elements transposed, a frozen one's), a parameter or a buffer
// removed. It wrote what the manifest said before (the first 30 elements;
// a transposed matrix; nothing of the removed ones).
TEST_F(CkptTest, ConsolidateChecksTheManifestAgainstTheFiles) {
  Model model;
  write_with_record(model, dir_, "global_step1");
  const std::string manifest = manifest_path(dir_, "global_step1");
  const std::string folder = tag_dir(dir_, "global_step1");
  const std::string out = dir_ + "/out.safetensors";
  EXPECT_EQ(consolidate(dir_, "global_step1", out), 6);  // the record itself is no obstacle
  expect_consolidated(out, model);
  fs::remove(out);
  struct Case {
    std::string what;
    std::function<void(Manifest&)> edit;
    std::string with_record, without_record;  // the errors expected
  };
  const std::vector<Case> cases = {
      {"fewer elements", [](Manifest& m) { m.params[0].shape = {5, 6}; },
       "\"fc1.weight\" has shape [5,7] in the files, [5,6] in the manifest",
       "gives parameter \"fc1.weight\" shape [5,6] (30 elements) but fragment \"exp_avg/fc1.weight/23\" in " + folder +
           "/rank00001.safetensors holds elements [23, 35)"},
      {"transposed", [](Manifest& m) { m.params[0].shape = {7, 5}; },
       "\"fc1.weight\" has shape [5,7] in the files, [7,5] in the manifest", ""},
      {"frozen reshaped", [](Manifest& m) { m.params[2].shape = {4, 3}; },
       "\"emb.weight\" has shape [3,4] in the files, [4,3] in the manifest",
       "\"module/emb.weight\" in " + folder + "/rank00000.safetensors has shape [3,4] but " + manifest +
           " gives frozen parameter \"emb.weight\" shape [4,3]"},
      {"parameter removed", [](Manifest& m) { m.params.erase(m.params.begin() + 1); },
       "\"fc1.bias\" is in the files, not in the manifest",
       "holds fragment \"exp_avg/fc1.bias/0\" of parameter \"fc1.bias\", which " + manifest + " does not list"},
      {"buffer removed", [](Manifest& m) { m.buffers.erase(m.buffers.begin() + 1); },
       folder + "/rank00000.safetensors holds \"module/scale16\", which " + manifest +
           " lists neither as a frozen parameter nor as a buffer",
       folder + "/rank00000.safetensors holds \"module/scale16\", which " + manifest +
           " lists neither as a frozen parameter nor as a buffer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    for (bool record : {true, false}) {
      const std::string& expected = record ? c.with_record : c.without_record;
      if (expected.empty()) continue;  // a transposed shape: only the record can tell
      fs::remove_all(folder);
      Manifest m = record ? write_with_record(model, dir_, "global_step1") : model.write(dir_, "global_step1", kTwoRanks);
      c.edit(m);
      write_manifest(dir_, m);
      EXPECT_CONTAINS(error_of([&] { consolidate(dir_, "global_step1", out); }), expected);
      EXPECT_FALSE(fs::exists(out));
      ToolRun r = tool(dir_, "consolidate '" + dir_ + "' --out '" + out + "'");
      EXPECT_EQ(r.status, 1) << r.out << r.err;
      EXPECT_CONTAINS(r.err, expected);
      EXPECT_FALSE(fs::exists(out));
      EXPECT_CONTAINS(error_of([&] { ConsolidatedTensors t(dir_, "global_step1"); }), expected);
    }
  }
}

}  // namespace
