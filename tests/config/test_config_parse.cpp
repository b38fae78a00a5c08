// Reading rules: value types, unknown keys and their suggestions, "auto",
// JSON syntax, and that nothing but zero::ConfigError ever escapes.
#include "config_test_util.h"
#include "config/config_detail.h"
#include "core/json_depth.h"

#include <sys/stat.h>
#include <unistd.h>

namespace {

using zero::Config;
using zero_test::as_json;
using zero_test::config_error;
using zero_test::count_containing;
using zero_test::parse;

void expect_error(const std::string& json, const std::vector<std::string>& parts) {
  std::string message = config_error([&] { parse(json); });
  for (const auto& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message << "\nmissing: " << part;
}

// ---- nesting ---------------------------------------------------------------

// 100,000 nested arrays would overflow the stack when the value is dumped
// or copied: refused before parsing, with a ConfigError.
TEST(ConfigJson, NestingDeeperThanAnyConfigIsRefused) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  expect_error("{\"train_batch_size\": " + deep + "}", {"invalid JSON", "deeper than 64 levels"});
}

TEST(ConfigJson, BracketsInStringsAndCommentsDoNotNest) {
  using zero::core::json_nests_deeper_than;
  const std::string many(200, '[');
  EXPECT_FALSE(json_nests_deeper_than("{\"a\": \"" + many + "\", \"b\": \"\\\"" + many + "\"}"));
  EXPECT_FALSE(json_nests_deeper_than("{// " + many + "\n /* " + many + " */ \"a\": 1}"));
  EXPECT_FALSE(json_nests_deeper_than(std::string(64, '[') + std::string(64, ']')));
  EXPECT_TRUE(json_nests_deeper_than(std::string(65, '[') + std::string(65, ']')));
  EXPECT_TRUE(json_nests_deeper_than(std::string(40, '{') + "\"a\": " + std::string(30, '[')));
  // Depth, not count: many arrays side by side are shallow.
  std::string wide = "[";
  for (int i = 0; i < 1000; ++i) wide += "[[1]],";
  EXPECT_FALSE(json_nests_deeper_than(wide + "0]"));
}

// ---- value types ---------------------------------------------------------

TEST(ConfigTypes, IntegralNumbersAreIntegers) {
  Config c = parse(R"({"zero_optimization": {"stage": 3, "reduce_bucket_size": 5e8, "sub_group_size": 1e14,
                       "stage3_max_live_parameters": 3.0e9}})");
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 100000000000000);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 3000000000);
}

TEST(ConfigTypes, FractionsAndHugeNumbersAreNotIntegers) {
  expect_error(R"({"zero_optimization": {"reduce_bucket_size": 1.5}})",
               {"zero_optimization.reduce_bucket_size must be an integer", "found 1.5"});
  expect_error(R"({"zero_optimization": {"reduce_bucket_size": 1e30}})", {"zero_optimization.reduce_bucket_size"});
  expect_error(R"({"steps_per_print": 18446744073709551615})", {"steps_per_print"});
}

TEST(ConfigTypes, NumbersAndBooleansMustNotBeQuoted) {
  expect_error(R"({"zero_optimization": {"reduce_bucket_size": "5e8"}})",
               {"zero_optimization.reduce_bucket_size", "found string \"5e8\"", "without quotes"});
  expect_error(R"({"gradient_clipping": "1.0"})", {"gradient_clipping", "without quotes"});
  expect_error(R"({"fp16": {"enabled": "true"}})", {"fp16.enabled must be true or false", "without quotes"});
  expect_error(R"({"zero_optimization": {"overlap_comm": 1}})", {"zero_optimization.overlap_comm", "found 1"});
}

TEST(ConfigTypes, WrongTypesNameExpectedAndFound) {
  expect_error(R"({"zero_optimization": {"stage": [2]}})", {"zero_optimization.stage", "an integer", "found array [2]"});
  expect_error(R"({"zero_optimization": {"offload_optimizer": "cpu"}})",
               {"zero_optimization.offload_optimizer must be an object", "found string \"cpu\""});
  expect_error(R"({"zero_optimization": {"offload_optimizer": {"nvme_path": 3}}})",
               {"zero_optimization.offload_optimizer.nvme_path must be a string", "found 3"});
  expect_error(R"({"optimizer": {"type": 1}})", {"optimizer.type must be a string"});
}

TEST(ConfigTypes, IntegersAreFineForNumbers) {
  Config c = parse(R"({"gradient_clipping": 1, "optimizer": {"type": "SGD", "params": {"lr": 1, "momentum": 0}}})");
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.optimizer.params.lr, 1.0);
}

TEST(ConfigTypes, NullMeansNotGiven) {
  Config c = parse(R"({"zero_optimization": {"stage": null, "offload_param": null},
                       "activation_checkpointing": {"number_checkpoints": null},
                       "communication_data_type": null, "fp16": null})");
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_FALSE(c.activation_checkpointing.number_checkpoints.has_value());
  EXPECT_FALSE(c.communication_data_type.has_value());
}

TEST(ConfigTypes, ChoicesAreCaseInsensitiveAndCanonical) {
  Config c = parse(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "CPU"}},
                       "checkpoint": {"tag_validation": "FAIL"}, "communication_data_type": "BF16",
                       "optimizer": {"type": "adamw"}, "scheduler": {"type": "warmuplr"}})");
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "cpu");
  EXPECT_EQ(c.checkpoint.tag_validation, "Fail");
  EXPECT_EQ(c.communication_data_type.value_or(""), "bf16");
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
}

TEST(ConfigTypes, RangesAreChecked) {
  expect_error(R"({"zero_optimization": {"stage": 4}})", {"zero_optimization.stage", "[0, 3]", "found 4"});
  expect_error(R"({"zero_optimization": {"stage": -1}})", {"zero_optimization.stage", "[0, 3]"});
  expect_error(R"({"zero_optimization": {"allgather_bucket_size": -5}})", {"allgather_bucket_size", ">= 0"});
  expect_error(R"({"fp16": {"hysteresis": 0}})", {"fp16.hysteresis", ">= 1", "found 0"});
  expect_error(R"({"fp16": {"loss_scale_window": 0}})", {"fp16.loss_scale_window", ">= 1"});
  expect_error(R"({"fp16": {"loss_scale": -1}})", {"fp16.loss_scale", ">= 0"});
  expect_error(R"({"fp16": {"min_loss_scale": 0}})", {"fp16.min_loss_scale", "> 0"});
  expect_error(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9, -0.1]}}})", {"optimizer.params.betas", "[0, 1)"});
  expect_error(R"({"optimizer": {"type": "Adam", "params": {"lr": -0.1}}})", {"optimizer.params.lr", ">= 0"});
  expect_error(R"({"aio": {"queue_depth": 0}})", {"aio.queue_depth", ">= 1"});
  expect_error(R"({"gradient_predivide_factor": 0})", {"gradient_predivide_factor", "> 0"});
  expect_error(R"({"zero_optimization": {"offload_optimizer": {"ratio": 1.5}}})", {"offload_optimizer.ratio", "[0, 1]"});
}

// ---- unknown keys ----------------------------------------------------------

TEST(ConfigUnknownKeys, NearestKeyIsSuggested) {
  expect_error(R"({"zero_optimization": {"reduce_bucket_sise": 1}})",
               {"zero_optimization.reduce_bucket_sise: unknown key", "did you mean \"reduce_bucket_size\"?"});
  expect_error(R"({"train_micro_batch_size_per_gp": 4})", {"did you mean \"train_micro_batch_size_per_gpu\"?"});
  expect_error(R"({"optimizer": {"type": "Adam", "params": {"lrr": 1e-3}}})",
               {"optimizer.params.lrr: unknown key for optimizer Adam", "did you mean \"lr\"?"});
  expect_error(R"({"bf16": {"enable": true}})", {"bf16.enable", "did you mean \"enabled\"?"});
  expect_error(R"({"zero_optimization": {"Stage": 2}})", {"zero_optimization.Stage", "did you mean \"stage\"?"});
  expect_error(R"({"zero_optimization": {"offload_param": {"devise": "cpu"}}})",
               {"zero_optimization.offload_param.devise", "did you mean \"device\"?"});
  expect_error(R"({"zero": {"comm_timeout": 10}})", {"zero.comm_timeout", "did you mean \"comm_timeout_s\"?"});
  expect_error(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max": 1}}})",
               {"scheduler.params.warmup_max: unknown key for scheduler WarmupLR", "did you mean \"warmup_max_lr\"?"});
}

TEST(ConfigUnknownKeys, MisplacedKeyPointsToItsSection) {
  expect_error(R"({"stage": 2})", {"stage: unknown key", "did you mean \"zero_optimization.stage\"?"});
  expect_error(R"({"zero_optimization": {"loss_scale": 0}})", {"did you mean \"fp16.loss_scale\"?"});
  expect_error(R"({"optimizer": {"type": "Adam", "lr": 0.1}})", {"optimizer.lr", "did you mean \"optimizer.params.lr\"?"});
}

TEST(ConfigUnknownKeys, KeyOfAnotherOptimizerListsTheKnownOnes) {
  expect_error(R"({"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})",
               {"optimizer.params.betas: unknown key for optimizer SGD", "lr", "momentum", "nesterov"});
}

TEST(ConfigUnknownKeys, UnrelatedKeyIsNamed) {
  expect_error(R"({"my_own_setting": 1})", {"my_own_setting: unknown key"});
  expect_error(R"({"fp16": {"xyz": 1}})", {"fp16.xyz: unknown key", "known keys here:", "initial_scale_power"});
}

// ---- "auto" ----------------------------------------------------------------

TEST(ConfigAuto, HuggingFaceValuesTakeDefaultsWithOneWarningEach) {
  Config c = parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_gather_16bit_weights_on_model_save": "auto"},
    "gradient_clipping": "auto"})");
  // DeepSpeed's defaults (FusedAdam, WarmupLR, DeepSpeedZeroConfig).
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.optimizer.params.lr, 1e-3);
  EXPECT_EQ(c.optimizer.params.betas[0], 0.9);
  EXPECT_EQ(c.optimizer.params.betas[1], 0.999);
  EXPECT_EQ(c.optimizer.params.eps, 1e-8);
  EXPECT_EQ(c.optimizer.params.weight_decay, 0.0);
  EXPECT_EQ(c.scheduler.params.warmup_min_lr, 0.0);
  EXPECT_EQ(c.scheduler.params.warmup_max_lr, c.optimizer.params.lr);   // peak = optimizer lr
  EXPECT_EQ(c.scheduler.params.warmup_num_steps, 1000);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero_optimization.stage3_param_persistence_threshold, 100000);
  EXPECT_FALSE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.gradient_clipping, 0.0);
  for (const char* path : {"fp16.enabled", "bf16.enabled", "optimizer.params.lr", "optimizer.params.betas",
                           "optimizer.params.eps", "optimizer.params.weight_decay", "scheduler.params.warmup_min_lr",
                           "scheduler.params.warmup_num_steps", "zero_optimization.reduce_bucket_size",
                           "zero_optimization.stage3_prefetch_bucket_size",
                           "zero_optimization.stage3_param_persistence_threshold",
                           "zero_optimization.stage3_gather_16bit_weights_on_model_save", "gradient_clipping"})
    EXPECT_EQ(count_containing(c.warnings(), std::string(path) + " is \"auto\""), 1u) << path;
  EXPECT_EQ(count_containing(c.warnings(), "warmup_max_lr"), 0u);
  EXPECT_EQ(count_containing(c.warnings(), "hidden size"), 3u);   // the three model-derived sizes
  EXPECT_EQ(c.warnings().size(), 13u);
}

TEST(ConfigAuto, WarmupPeakFollowsTheOptimizer) {
  Config c = parse(R"({"optimizer": {"type": "Adam", "params": {"lr": 3e-5}},
                       "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto", "warmup_num_steps": 10,
                                                                         "total_num_steps": 100}}})");
  EXPECT_EQ(c.scheduler.params.warmup_max_lr, 3e-5);
  EXPECT_TRUE(c.warnings().empty());
  Config alone = parse(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}})");
  EXPECT_EQ(alone.scheduler.params.warmup_max_lr, 1e-3);
  EXPECT_EQ(count_containing(alone.warnings(), "warmup_max_lr"), 1u);
}

TEST(ConfigAuto, TotalStepsMustComeFromTheProgram) {
  Config c = parse(R"({"train_micro_batch_size_per_gpu": 1,
                       "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto"}}})");
  EXPECT_FALSE(c.scheduler.params.total_num_steps.has_value());
  std::string message = config_error([&] { Config(c).resolve(1); });
  EXPECT_NE(message.find("scheduler.params.total_num_steps"), std::string::npos) << message;
  c.scheduler.params.total_num_steps = 5000;
  c.resolve(1);
  EXPECT_EQ(as_json(c)["scheduler"]["params"]["total_num_steps"], 5000);
}

TEST(ConfigAuto, RefusedWhereHuggingFaceNeverWritesIt) {
  expect_error(R"({"zero_optimization": {"stage": "auto"}})", {"zero_optimization.stage", "\"auto\" is not accepted"});
  expect_error(R"({"fp16": {"hysteresis": "auto"}})", {"fp16.hysteresis", "\"auto\""});
  expect_error(R"({"zero_optimization": {"offload_optimizer": {"device": "auto"}}})",
               {"zero_optimization.offload_optimizer.device"});
  expect_error(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": "auto", "cycle_max_lr": 1}}})",
               {"scheduler.params.cycle_min_lr", "\"auto\""});
}

TEST(ConfigAuto, PipelineStagesAutoIsOne) {
  Config c = parse(R"({"pipeline": {"stages": "auto"}, "tensor_parallel": {"autotp_size": 1, "tp": {"tp_size": 1}}})");
  EXPECT_EQ(c.parallelism.pipeline_stages, 1);
  EXPECT_TRUE(c.warnings().empty());
  EXPECT_EQ(parse(R"({"pipeline": {"stages": 2}})").parallelism.pipeline_parallel(), 2);
  EXPECT_EQ(parse(R"({"pipeline_parallel": {"pp_size": 2}})").parallelism.pipeline_parallel(), 2);
  expect_error(R"({"pipeline": {"stages": 2}, "zero_optimization": {"stage": 2}})",
               {"pipeline.stages 2", "zero_optimization.stage 0 or 1, not 2"});
  expect_error(R"({"pipeline_parallel": {"pp_size": 2}, "zero_optimization": {"stage": 3}})",
               {"pipeline.stages 2", "not 3"});
  expect_error(R"({"tensor_parallel": {"autotp_size": 4, "tp": {"tp_size": 2}}})", {"name two tensor-parallel sizes"});
}

// ---- JSON syntax ------------------------------------------------------------

TEST(ConfigSyntax, ParseErrorsGiveLineAndColumn) {
  expect_error("{\n  \"fp16\": {\n    \"enabled\": true\n    \"loss_scale\": 0\n  }\n}", {"invalid JSON", "line 4"});
  expect_error("{\"a\": }", {"invalid JSON", "line 1"});
  expect_error("", {"invalid JSON"});
  expect_error("{} {}", {"invalid JSON"});
  expect_error("\"just a string\"", {"must be a JSON object", "found string"});
}

TEST(ConfigSyntax, CommentsAreAllowedAsInHjson) {
  Config c = parse("{\n  // ZeRO stage\n  \"zero_optimization\": {\"stage\": 2 /* gradients */}\n}");
  EXPECT_EQ(c.zero_optimization.stage, 2);
}

// Note [DeepSpeed's config syntax]: what DeepSpeed's hjson reads the same
// way is read: "#" comments and a comma before a closing bracket, in
// objects and arrays, with comments between; the same config without them
// is the reference.
TEST(ConfigSyntax, HashCommentsAndTrailingCommasAsInHjson) {
  const Config plain = parse(R"({"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW",
      "params": {"lr": 1e-4, "betas": [0.9, 0.999]}}, "zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp/a#b//c/*d*/,}"}}})");
  const Config lenient = parse(R"(# DeepSpeed's hjson
{"train_micro_batch_size_per_gpu": 4,  # per rank
  "optimizer": {"type": "AdamW",
    "params": {"lr": 1e-4, "betas": [0.9, 0.999, /* two */ ], }, },
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
    "nvme_path": "/tmp/a#b//c/*d*/,}", // in a string, not a comment
  }, },
}
)");
  EXPECT_EQ(lenient.to_json(), plain.to_json());
  EXPECT_EQ(lenient.zero_optimization.offload_optimizer.nvme_path, "/tmp/a#b//c/*d*/,}");
}

// What is not a trailing comma stays an error, and Python's spellings are
// named with JSON's.
TEST(ConfigSyntax, AmbiguousSyntaxIsStillRefused) {
  expect_error(R"({,})", {"invalid JSON"});
  expect_error(R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9,, 0.99]}}})", {"invalid JSON"});
  expect_error(R"({"optimizer": {"type": "Adam", "params": {"betas": [,]}}})", {"invalid JSON"});
  expect_error(R"({"fp16": {"enabled": True}})", {"invalid JSON", "True is Python's spelling: JSON writes true"});
  expect_error(R"({"fp16": {"enabled": False}})", {"False is Python's spelling: JSON writes false"});
  expect_error(R"({"train_batch_size": None})", {"None is Python's spelling: JSON writes null"});
  // Inside a string it is text: the message does not guess.
  const std::string message = config_error([] { parse(R"({"wall_clock_breakdown": "True", "x": })"); });
  EXPECT_EQ(message.find("Python"), std::string::npos) << message;
  expect_error(R"({"a": 1 /* never closed)", {"invalid JSON"});
}

TEST(ConfigSyntax, DuplicateKeysAreErrors) {
  expect_error(R"({"fp16": {"enabled": true}, "fp16": {"enabled": false}})", {"fp16: duplicate key"});
  expect_error(R"({"optimizer": {"type": "Adam", "params": {"lr": 1, "lr": 2}}})", {"optimizer.params.lr: duplicate key"});
  // A million keys would take hours to read into an ordered object: the
  // reader stops past 10,000 in one object, naming it.
  std::string many = R"({"train_batch_size": 8, "zero_optimization": {)";
  for (int i = 0; i <= 10000; ++i) many += (i ? ", " : "") + std::string("\"k") + std::to_string(i) + "\": 0";
  many += "}}";
  expect_error(many, {"invalid ds_config: zero_optimization holds more than 10000 keys"});
  // Same key in different objects is fine.
  EXPECT_NO_THROW(parse(R"({"fp16": {"enabled": false}, "bf16": {"enabled": false}})"));
}

// ---- robustness ------------------------------------------------------------

// Replaces every value in every corpus file by values of each JSON type:
// parsing and resolving either succeeds or throws zero::ConfigError, nothing else.
void mutate_all(const nlohmann::ordered_json& root, nlohmann::ordered_json& node, size_t& cases) {
  static const nlohmann::ordered_json kValues[] = {nullptr, true, "x", "auto", -1, 0, 1.5, 1e30, 4096,
                                                   nlohmann::ordered_json::array(), nlohmann::ordered_json::object()};
  if (!node.is_object()) return;
  for (auto it = node.begin(); it != node.end(); ++it) {
    nlohmann::ordered_json saved = it.value();
    for (const auto& v : kValues) {
      it.value() = v;
      ++cases;
      try {
        Config c = Config::from_json(root.dump());
        c.resolve(2);
        (void)c.to_json();
      } catch (const zero::ConfigError&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << "non-ConfigError " << e.what() << " for " << root.dump();
      }
    }
    it.value() = saved;
    mutate_all(root, it.value(), cases);
  }
}

// ---- the file itself ----------------------------------------------------------

// A FIFO would block the open until a writer came, /dev/zero would be read
// without end: only regular files are read, and each refusal says what the
// path is. alarm() turns a regression into a failure instead of a hang.
TEST(ConfigFile, OnlyRegularFilesAreRead) {
  const std::string fifo = ::testing::TempDir() + "zero_config_fifo_" + std::to_string(::getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ::alarm(30);
  EXPECT_NE(config_error([&] { Config::from_file(fifo); }).find(fifo + " is a FIFO, not a regular file"),
            std::string::npos);
  EXPECT_NE(config_error([&] { Config::from_file("/dev/zero"); }).find("/dev/zero is a character device"),
            std::string::npos);
  EXPECT_NE(config_error([&] { Config::from_file(::testing::TempDir()); }).find("is a directory, not a regular file"),
            std::string::npos);
  ::alarm(0);
  ::unlink(fifo.c_str());
}

TEST(ConfigRobustness, OnlyConfigErrorsEscape) {
  size_t cases = 0;
  for (const std::string folder : {"configs", "tests/config/good", "tests/config/hf"}) {
    for (const auto& name : zero_test::json_files(folder)) {
      std::ifstream in(zero_test::source_path(folder + "/" + name));
      std::stringstream text;
      text << in.rdbuf();
      // DeepSpeed's syntax (comments, trailing commas) as the reader takes it.
      nlohmann::ordered_json root =
          nlohmann::ordered_json::parse(zero::config_detail::blank_comments_and_trailing_commas(text.str()));
      mutate_all(root, root, cases);
    }
  }
  EXPECT_GT(cases, 1000u);
}

TEST(ConfigRobustness, ProgramChangesAreCheckedByResolve) {
  Config c = parse(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}})");
  c.zero_optimization.stage = 5;
  EXPECT_NE(config_error([&] { Config(c).resolve(1); }).find("zero_optimization.stage"), std::string::npos);
  c.zero_optimization.stage = 2;
  c.zero_optimization.offload_param.device = "cpu";
  EXPECT_NE(config_error([&] { Config(c).resolve(1); }).find("offload_param needs stage 3"), std::string::npos);
  c.zero_optimization.offload_param.device = "none";
  c.optimizer.type = "adamw";
  c.resolve(1);
  EXPECT_EQ(c.optimizer.type, "AdamW");
}

TEST(ConfigRobustness, DefaultConstructedConfigWorks) {
  Config c;
  EXPECT_NO_THROW(Config::from_json(c.to_json()));
  EXPECT_NE(config_error([&] { c.resolve(1); }).find("no batch size"), std::string::npos);
  c.batch.train_micro_batch_size_per_gpu = 1;
  c.resolve(1);
  EXPECT_EQ(*c.batch.train_batch_size, 1);
  EXPECT_EQ(as_json(c).count("optimizer"), 0u);   // none given, none printed
}

}  // namespace
