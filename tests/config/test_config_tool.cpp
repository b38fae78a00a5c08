// The zero-config tool, run as a user would: exit status, stdout, stderr.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "config_test_util.h"

namespace {

using zero_test::source_path;

struct ToolRun {
  int status;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs the tool through the shell with `env` prefixed (e.g. "WORLD_SIZE=4").
ToolRun tool(const std::string& args, const std::string& env = "env -u WORLD_SIZE") {
  const std::string dir = ::testing::TempDir();
  // ctest runs tests in parallel, each in its own process: names of its own.
  const std::string id = std::to_string(getpid());
  const std::string out = dir + "/zero_config_out." + id, err = dir + "/zero_config_err." + id;
  const std::string command = env + " '" + ZERO_CONFIG_TOOL + "' " + args + " >'" + out + "' 2>'" + err + "'";
  int raw = std::system(command.c_str());
  ToolRun run{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, slurp(out), slurp(err)};
  std::remove(out.c_str());
  std::remove(err.c_str());
  return run;
}

std::string file_arg(const std::string& relative) { return "'" + source_path(relative) + "'"; }

TEST(ConfigTool, PrintsTheResolvedConfig) {
  ToolRun r = tool(file_arg("configs/zero2.json") + " --world-size 4");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["train_batch_size"], 8 * 1 * 4);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 8);
  EXPECT_EQ(j["gradient_accumulation_steps"], 1);
  EXPECT_EQ(j["zero_optimization"]["stage"], 2);
  EXPECT_EQ(j["zero_optimization"]["stage3_max_live_parameters"], 1000000000);   // defaults filled in
  EXPECT_EQ(j["fp16"]["initial_scale_power"], 16);
  EXPECT_NE(r.err.find("valid for world size 4"), std::string::npos) << r.err;
}

TEST(ConfigTool, WorldSizeComesFromTheEnvironment) {
  ToolRun r = tool(file_arg("configs/zero1.json"), "WORLD_SIZE=3");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["train_batch_size"], 8 * 3);
  r = tool(file_arg("configs/zero1.json"));   // no WORLD_SIZE: one rank
  EXPECT_EQ(nlohmann::json::parse(r.out)["train_batch_size"], 8);
  r = tool(file_arg("configs/zero1.json") + " --world-size=2", "WORLD_SIZE=3");   // the option wins
  EXPECT_EQ(nlohmann::json::parse(r.out)["train_batch_size"], 16);
}

TEST(ConfigTool, WarningsGoToStderr) {
  ToolRun r = tool(file_arg("tests/config/good/zero2_cpu_offload_legacy_keys.json"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("zero-config: warning: zero_optimization.cpu_offload is deprecated"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("warning"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(r.out)["zero_optimization"]["offload_optimizer"]["device"], "cpu");
}

TEST(ConfigTool, JsonDocumentCarriesTheWarnings) {
  ToolRun r = tool(file_arg("tests/config/good/zero2_cpu_offload_legacy_keys.json") + " --json --world-size 2");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["config"]["train_batch_size"], 48);   // as written
  EXPECT_EQ(j["config"]["gradient_accumulation_steps"], 2);
  EXPECT_EQ(j["config"]["train_micro_batch_size_per_gpu"], 48 / (2 * 2));
  ASSERT_EQ(j["warnings"].size(), 1u);   // cpu_offload (its activation_checkpointing keys are all implemented)
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(ConfigTool, BadConfigExitsOneWithTheMessage) {
  ToolRun r = tool(file_arg("tests/config/bad/typo_reduce_bucket_size.json"));
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.out.empty());
  EXPECT_EQ(r.err.rfind("zero-config: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("typo_reduce_bucket_size.json: zero_optimization.reduce_bucket_sise"), std::string::npos);
  EXPECT_NE(r.err.find("did you mean \"reduce_bucket_size\""), std::string::npos);

  r = tool(file_arg("tests/config/bad/batch_inconsistent.json") + " --world-size 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("world_size 2"), std::string::npos) << r.err;

  r = tool("/nonexistent/ds.json");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("zero-config: error: cannot read config file: No such file or directory opening /nonexistent/ds.json"), std::string::npos);
}

TEST(ConfigTool, UsageErrorsExitTwo) {
  for (const std::string& args : {std::string(""), std::string("--world-size 0 x.json"), std::string("x.json --world-size"),
                                  std::string("x.json --bogus"), std::string("a.json b.json"),
                                  std::string("x.json --world-size two")}) {
    ToolRun r = tool(args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(r.err.rfind("zero-config: error: ", 0), 0u) << args << ": " << r.err;
  }
  ToolRun r = tool(file_arg("configs/zero1.json"), "WORLD_SIZE=abc");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("WORLD_SIZE"), std::string::npos);
}

// DeepSpeed's and torchrun's underscores mean the same; a near miss is named.
TEST(ConfigTool, UnderscoresAndNearMisses) {
  ToolRun dashed = tool(file_arg("configs/zero1.json") + " --world-size 2 --json");
  ToolRun underscored = tool(file_arg("configs/zero1.json") + " --world_size 2 --json");
  ASSERT_EQ(dashed.status, 0) << dashed.err;
  EXPECT_EQ(underscored.status, 0) << underscored.err;
  EXPECT_EQ(underscored.out, dashed.out);
  ToolRun equals = tool(file_arg("configs/zero1.json") + " --world_size=2 --json");
  EXPECT_EQ(equals.out, dashed.out) << equals.err;
  ToolRun typo = tool(file_arg("configs/zero1.json") + " --wrold-size 2");
  EXPECT_EQ(typo.status, 2);
  EXPECT_NE(typo.err.find("unknown option '--wrold-size'; did you mean --world-size?"), std::string::npos) << typo.err;
}

TEST(ConfigTool, HelpListsTheOptions) {
  ToolRun r = tool("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* option : {"--world-size", "--json", "--help"}) EXPECT_NE(r.out.find(option), std::string::npos);
}

}  // namespace
