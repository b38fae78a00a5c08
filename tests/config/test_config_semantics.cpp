// Meaning: DeepSpeed's documented defaults, deprecated spellings, keys zero
// does not implement, optimizer and scheduler parameters, precision rules.
// Expected values are DeepSpeed's (docs/_pages/config-json.md and the
// defaults in deepspeed/runtime/*), written here as literals.
#include "config_test_util.h"

namespace {

using zero::Config;
using zero_test::as_json;
using zero_test::config_error;
using zero_test::count_containing;
using zero_test::parse;

nlohmann::json at(const nlohmann::json& j, const std::string& dotted) {
  const nlohmann::json* node = &j;
  size_t start = 0;
  while (true) {
    size_t dot = dotted.find('.', start);
    std::string key = dotted.substr(start, dot - start);
    if (!node->contains(key)) return "<missing " + dotted + ">";
    node = &(*node)[key];
    if (dot == std::string::npos) return *node;
    start = dot + 1;
  }
}

void expect_values(const nlohmann::json& j, const std::vector<std::pair<std::string, nlohmann::json>>& table) {
  for (const auto& [path, value] : table) EXPECT_EQ(at(j, path), value) << path;
}

// ---- defaults -------------------------------------------------------------

TEST(ConfigDefaults, TopLevelAndPrecisionAreDeepSpeeds) {
  Config c = parse("{}");
  EXPECT_TRUE(c.warnings().empty());
  expect_values(as_json(c), {
      {"gradient_clipping", 0.0}, {"prescale_gradients", false}, {"gradient_predivide_factor", 1.0},
      {"communication_data_type", nullptr}, {"sparse_gradients", false}, {"steps_per_print", 10},
      {"wall_clock_breakdown", false}, {"dump_state", false},
      {"fp16.enabled", false}, {"fp16.auto_cast", false}, {"fp16.loss_scale", 0.0},
      {"fp16.initial_scale_power", 16}, {"fp16.loss_scale_window", 1000}, {"fp16.hysteresis", 2},
      {"fp16.consecutive_hysteresis", false}, {"fp16.min_loss_scale", 1.0},
      {"bf16.enabled", false}, {"bf16.immediate_grad_update", false},
      {"aio.block_size", 1048576}, {"aio.queue_depth", 8}, {"aio.intra_op_parallelism", 1},
      {"aio.single_submit", false}, {"aio.overlap_events", true}, {"aio.use_gds", false},
      {"activation_checkpointing.partition_activations", false},
      {"activation_checkpointing.cpu_checkpointing", false},
      {"activation_checkpointing.contiguous_memory_optimization", false},
      {"activation_checkpointing.number_checkpoints", nullptr},
      {"activation_checkpointing.checkpoint_every", nullptr},
      {"activation_checkpointing.synchronize_checkpoint_boundary", false},
      {"activation_checkpointing.profile", false},
      {"checkpoint.tag_validation", "Warn"}, {"checkpoint.load_universal", false},
      {"checkpoint.use_node_local_storage", false}, {"checkpoint.parallel_write.pipeline_stage", false},
      {"checkpoint.in_memory.interval", 0},
      {"tensor_parallel.autotp_size", 0}, {"tensor_parallel.tp.tp_size", 1}, {"pipeline.stages", 1},
      {"zero.comm_timeout_s", 300}, {"zero.cuda_comm_backend", "nccl"},
  });
}

TEST(ConfigDefaults, ZeroOptimizationIsDeepSpeeds) {
  expect_values(as_json(parse("{}")), {
      {"zero_optimization.stage", 0}, {"zero_optimization.contiguous_gradients", true},
      {"zero_optimization.reduce_scatter", true}, {"zero_optimization.reduce_bucket_size", 500000000},
      {"zero_optimization.allgather_partitions", true}, {"zero_optimization.allgather_bucket_size", 500000000},
      {"zero_optimization.overlap_comm", false}, {"zero_optimization.load_from_fp32_weights", true},
      {"zero_optimization.elastic_checkpoint", false}, {"zero_optimization.round_robin_gradients", false},
      {"zero_optimization.sub_group_size", 1000000000},
      {"zero_optimization.stage3_prefetch_bucket_size", 50000000},
      {"zero_optimization.stage3_param_persistence_threshold", 100000},
      {"zero_optimization.stage3_model_persistence_threshold", INT64_MAX},
      {"zero_optimization.stage3_max_live_parameters", 1000000000},
      {"zero_optimization.stage3_max_reuse_distance", 1000000000},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", false},
      {"zero_optimization.ignore_unused_parameters", true}, {"zero_optimization.mics_shard_size", -1},
      {"zero_optimization.zero_hpz_partition_size", 1}, {"zero_optimization.zero_quantized_weights", false},
      {"zero_optimization.zero_quantization_block_size", 4096}, {"zero_optimization.zero_quantized_gradients", false},
      {"zero_optimization.offload_optimizer.device", "none"}, {"zero_optimization.offload_optimizer.nvme_path", nullptr},
      {"zero_optimization.offload_optimizer.pin_memory", false},
      {"zero_optimization.offload_optimizer.buffer_count", 4},
      {"zero_optimization.offload_optimizer.fast_init", false}, {"zero_optimization.offload_optimizer.ratio", 1.0},
      {"zero_optimization.offload_param.device", "none"}, {"zero_optimization.offload_param.pin_memory", false},
      {"zero_optimization.offload_param.buffer_count", 5}, {"zero_optimization.offload_param.buffer_size", 100000000},
      {"zero_optimization.offload_param.max_in_cpu", 1000000000},
  });
}

// ZeRO++ acts on stage 3's collectives only: elsewhere it is refused, not ignored.
TEST(ConfigZeroPlusPlus, EachPartNeedsStage3AndBlocksAreOfEights) {
  EXPECT_TRUE(parse(R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true}})").warnings().empty());
  for (int stage : {0, 1, 2}) {
    const std::string message = zero_test::config_error([&] {
      parse(R"({"zero_optimization": {"stage": )" + std::to_string(stage) + R"(, "zero_quantized_weights": true}})");
    });
    EXPECT_NE(message.find("zero_quantized_weights quantizes stage 3's all-gather of weights, but "
                           "zero_optimization.stage is " + std::to_string(stage)),
              std::string::npos)
        << message;
  }
  for (const char* key : {R"("zero_hpz_partition_size": 2)", R"("zero_quantized_gradients": true)"}) {
    EXPECT_TRUE(parse(std::string(R"({"zero_optimization": {"stage": 3, )") + key + "}}").warnings().empty()) << key;
    const std::string message = zero_test::config_error(
        [&] { parse(std::string(R"({"zero_optimization": {"stage": 2, )") + key + "}}"); });
    EXPECT_NE(message.find("but zero_optimization.stage is 2; set stage 3 or remove it"), std::string::npos) << message;
  }
  const std::string message = zero_test::config_error(
      [] { parse(R"({"zero_optimization": {"stage": 3, "zero_quantization_block_size": 100}})"); });
  EXPECT_NE(message.find("zero_quantization_block_size is 100; it must be a multiple of 8"), std::string::npos) << message;
}

// Stage 3's keys in a config of another stage have no effect: one warning
// names them all; at stage 3, or left null, nothing is said.
TEST(ConfigWarnings, Stage3KeysAtAnotherStageAreNamed) {
  const Config two = parse(R"({"zero_optimization": {"stage": 2, "stage3_max_live_parameters": 1e8,
      "stage3_prefetch_bucket_size": 5e7, "sub_group_size": 1e9, "reduce_bucket_size": 5e8}})");
  EXPECT_EQ(zero_test::count_containing(two.warnings(),
                                        "zero_optimization.stage3_max_live_parameters, zero_optimization.stage3_prefetch_bucket_size, "
                                        "zero_optimization.sub_group_size are stage 3 keys: at zero_optimization.stage 2 "
                                        "they have no effect"),
            1u);
  const Config none = parse(R"({"zero_optimization": {"stage3_gather_16bit_weights_on_model_save": true}})");
  EXPECT_EQ(zero_test::count_containing(none.warnings(),
                                        "zero_optimization.stage3_gather_16bit_weights_on_model_save is a stage 3 key: "
                                        "at zero_optimization.stage 0 it has no effect"),
            1u);
  EXPECT_TRUE(parse(R"({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 1e8}})").warnings().empty());
  EXPECT_TRUE(parse(R"({"zero_optimization": {"stage": 1, "stage3_max_live_parameters": null}})").warnings().empty());
}

// DeepSpeed: overlap_comm defaults to true at stage 3 only; an explicit value wins.
TEST(ConfigDefaults, OverlapCommFollowsTheStage) {
  for (int stage = 0; stage <= 3; ++stage)
    EXPECT_EQ(parse(R"({"zero_optimization": {"stage": )" + std::to_string(stage) + "}}").zero_optimization.overlap_comm,
              stage == 3);
  EXPECT_FALSE(parse(R"({"zero_optimization": {"stage": 3, "overlap_comm": false}})").zero_optimization.overlap_comm);
}

TEST(ConfigDefaults, OptimizerParamsAreThoseOfTheImplementation) {
  auto params = [](const std::string& type) {
    return as_json(parse(R"({"optimizer": {"type": ")" + type + R"("}})"))["optimizer"]["params"];
  };
  // FusedAdam (deepspeed/ops/adam/fused_adam.py)
  EXPECT_EQ(params("Adam"), nlohmann::json::parse(R"({"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8,
      "weight_decay": 0.0, "adam_w_mode": true, "torch_adam": false, "amsgrad": false, "bias_correction": true})"));
  // torch.optim.SGD
  EXPECT_EQ(params("SGD"), nlohmann::json::parse(
      R"({"lr": 0.001, "weight_decay": 0.0, "momentum": 0.0, "dampening": 0.0, "nesterov": false})"));
  // torch.optim.Adagrad
  EXPECT_EQ(params("Adagrad"), nlohmann::json::parse(
      R"({"lr": 0.01, "eps": 1e-10, "weight_decay": 0.0, "lr_decay": 0.0, "initial_accumulator_value": 0.0})"));
  // FusedLamb (deepspeed/ops/lamb/fused_lamb.py)
  EXPECT_EQ(params("Lamb"), nlohmann::json::parse(R"({"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8,
      "weight_decay": 0.0, "bias_correction": true, "max_coeff": 10.0, "min_coeff": 0.01, "eps_inside_sqrt": false})"));
}

TEST(ConfigDefaults, SchedulerParamsAreLrSchedulesPy) {
  auto params = [](const std::string& type, const std::string& given) {
    return as_json(parse(R"({"scheduler": {"type": ")" + type + R"(", "params": )" + given + "}}"))["scheduler"]["params"];
  };
  EXPECT_EQ(params("WarmupLR", "{}"), nlohmann::json::parse(R"({"warmup_min_lr": 0.0, "warmup_max_lr": 0.001,
      "warmup_num_steps": 1000, "warmup_type": "log", "last_batch_iteration": -1})"));
  EXPECT_EQ(params("WarmupCosineLR", R"({"total_num_steps": 10})"), nlohmann::json::parse(R"({"warmup_min_ratio": 0.0,
      "warmup_num_steps": 1000, "warmup_type": "log", "total_num_steps": 10, "cos_min_ratio": 0.0001,
      "last_batch_iteration": -1})"));
  EXPECT_EQ(params("OneCycle", R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_first_step_size": 300,
                                   "cycle_first_stair_count": 3})"),
            nlohmann::json::parse(R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "decay_lr_rate": 0.0,
      "cycle_first_step_size": 300, "cycle_second_step_size": 300, "cycle_first_stair_count": 3,
      "cycle_second_stair_count": 3, "decay_step_size": 0, "cycle_momentum": true, "cycle_min_mom": 0.8,
      "cycle_max_mom": 0.9, "decay_mom_rate": 0.0, "last_batch_iteration": -1})"));
  EXPECT_EQ(params("LRRangeTest", "{}"), nlohmann::json::parse(R"({"lr_range_test_min_lr": 0.001,
      "lr_range_test_step_size": 2000, "lr_range_test_step_rate": 1.0, "lr_range_test_staircase": false,
      "last_batch_iteration": -1})"));
}

// ---- deprecated spellings ------------------------------------------------------

struct Deprecated {
  const char* json;
  const char* old_key;
  const char* new_key;
  std::function<bool(const Config&)> mapped;
};

TEST(ConfigDeprecated, EachOldKeyMapsWithExactlyOneWarning) {
  const Deprecated cases[] = {
      {R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})", "zero_optimization.cpu_offload",
       "offload_optimizer.device", [](const Config& c) { return c.zero_optimization.offload_optimizer.device == "cpu"; }},
      {R"({"zero_optimization": {"stage": 2, "cpu_offload": false}})", "zero_optimization.cpu_offload",
       "offload_optimizer.device", [](const Config& c) { return c.zero_optimization.offload_optimizer.device == "none"; }},
      {R"({"zero_optimization": {"stage": 3, "cpu_offload_param": true}})", "cpu_offload_param", "offload_param.device",
       [](const Config& c) { return c.zero_optimization.offload_param.device == "cpu"; }},
      {R"({"zero_optimization": {"stage": 3, "cpu_offload_params": true}})", "cpu_offload_params", "offload_param.device",
       [](const Config& c) { return c.zero_optimization.offload_param.device == "cpu"; }},
      {R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "cpu_offload_use_pin_memory": true}})",
       "cpu_offload_use_pin_memory", "offload_param.pin_memory",
       [](const Config& c) { return c.zero_optimization.offload_param.pin_memory; }},
      {R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})",
       "stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
       [](const Config& c) { return c.zero_optimization.stage3_gather_16bit_weights_on_model_save; }},
      {R"({"zero_optimization": true})", "\"zero_optimization\": true", "zero_optimization.stage",
       [](const Config& c) { return c.zero_optimization.stage == 1; }},
      {R"({"zero_optimization": false})", "\"zero_optimization\": false", "zero_optimization.stage",
       [](const Config& c) { return c.zero_optimization.stage == 0; }},
      {R"({"bfloat16": {"enabled": true}})", "bfloat16", "bf16", [](const Config& c) { return c.bf16.enabled; }},
      {R"({"aio": {"thread_count": 4}})", "aio.thread_count", "aio.intra_op_parallelism",
       [](const Config& c) { return c.aio.intra_op_parallelism == 4; }},
  };
  for (const auto& d : cases) {
    SCOPED_TRACE(d.json);
    Config c = parse(d.json);
    ASSERT_EQ(c.warnings().size(), 1u);
    EXPECT_NE(c.warnings()[0].find(d.old_key), std::string::npos) << c.warnings()[0];
    EXPECT_NE(c.warnings()[0].find(d.new_key), std::string::npos) << c.warnings()[0];
    EXPECT_NE(c.warnings()[0].find("deprecated"), std::string::npos);
    EXPECT_TRUE(d.mapped(c));
    EXPECT_EQ(c.to_json().find(d.old_key), std::string::npos);   // printed under the new name only
  }
}

TEST(ConfigDeprecated, OldZeroFormCarriesAllgatherSize) {
  for (const char* json : {R"({"zero_optimization": true, "allgather_size": 2e8})",
                           R"({"allgather_size": 2e8, "zero_optimization": true, "fp16": {"enabled": true}})"}) {
    Config c = parse(json);
    EXPECT_EQ(c.zero_optimization.stage, 1);
    EXPECT_EQ(c.zero_optimization.allgather_bucket_size, 200000000);
    EXPECT_TRUE(c.fp16.enabled || std::string(json).find("fp16") == std::string::npos);
    // The deprecated form, and allgather_bucket_size's own: zero reads nothing from it.
    EXPECT_EQ(c.warnings().size(), 2u);
    EXPECT_EQ(zero_test::count_containing(c.warnings(), "allgather_bucket_size is accepted but not implemented"), 1u);
  }
  EXPECT_EQ(parse(R"({"allgather_size": 2e8, "zero_optimization": false})").zero_optimization.stage, 0);
}

// zero_optimization keys zero reads nothing from warn when they ask for
// something zero does not do, and only then.
TEST(ConfigUnread, EachUnreadKeyWarnsOnlyAwayFromItsDefault) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"contiguous_gradients", "false"},        {"reduce_scatter", "false"},
      {"allgather_partitions", "false"},        {"allgather_bucket_size", "2e8"},
      {"load_from_fp32_weights", "false"},      {"round_robin_gradients", "true"},
      {"stage3_model_persistence_threshold", "1000"}};
  for (const auto& [key, value] : cases) {
    SCOPED_TRACE(key);
    // A stage 3 key away from stage 3 would warn a second time (Stage3KeysAtAnotherStageAreNamed).
    const std::string stage = key.rfind("stage3_", 0) == 0 ? R"("stage": 3, )" : "";
    Config c = parse(R"({"zero_optimization": {)" + stage + "\"" + key + "\": " + value + "}}");
    ASSERT_EQ(c.warnings().size(), 1u);
    EXPECT_NE(c.warnings()[0].find("zero_optimization." + key + " is accepted but not implemented"), std::string::npos)
        << c.warnings()[0];
  }
  // Their defaults, written out, ask for what zero does; zero's checkpoints
  // are always elastic, so asking for it is honoured.
  EXPECT_TRUE(parse(R"({"zero_optimization": {"elastic_checkpoint": true}})").warnings().empty());
  EXPECT_TRUE(parse(R"({"zero_optimization": {"contiguous_gradients": true, "reduce_scatter": true,
                       "allgather_partitions": true, "allgather_bucket_size": 5e8, "load_from_fp32_weights": true,
                       "round_robin_gradients": false, "elastic_checkpoint": false}})")
                  .warnings()
                  .empty());
}

TEST(ConfigDeprecated, OldAndNewTogetherIsAnError) {
  std::string message = config_error([] {
    parse(R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true,
                                     "stage3_gather_16bit_weights_on_model_save": false}})");
  });
  EXPECT_NE(message.find("both given"), std::string::npos) << message;
  message = config_error([] { parse(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})"); });
  EXPECT_NE(message.find("bfloat16"), std::string::npos) << message;
  message = config_error([] { parse(R"({"zero_optimization": {"stage": 3, "cpu_offload": "yes"}})"); });
  EXPECT_NE(message.find("zero_optimization.cpu_offload must be true or false"), std::string::npos) << message;
}

// DeepSpeed's field names behind its stage3_* aliases are accepted silently.
TEST(ConfigDeprecated, FieldNameAliasesNeedNoWarning) {
  Config c = parse(R"({"zero_optimization": {"stage": 3, "prefetch_bucket_size": 1000, "max_live_parameters": 2000}})");
  EXPECT_EQ(c.zero_optimization.stage3_prefetch_bucket_size, 1000);
  EXPECT_EQ(c.zero_optimization.stage3_max_live_parameters, 2000);
  EXPECT_TRUE(c.warnings().empty());
}

// ---- known but not implemented ------------------------------------------------------

TEST(ConfigUnimplemented, KnownDeepSpeedKeysWarnOnce) {
  for (const char* key : {"compression_training",
                          "data_efficiency", "elasticity", "autotuning", "sparse_attention", "curriculum_learning",
                          "amp", "progressive_layer_drop"}) {
    Config c = parse(std::string(R"({")") + key + R"(": {"enabled": true, "x": 1}})");
    ASSERT_EQ(c.warnings().size(), 1u) << key;
    EXPECT_EQ(c.warnings()[0], std::string("known DeepSpeed key ") + key +
                                   " is accepted but not implemented by zero; it has no effect");
    EXPECT_TRUE(parse(std::string(R"({")") + key + R"(": {"enabled": false}})").warnings().empty()) << key;
  }
  for (const char* key : {"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "memory_breakdown",
                          "dataloader_drop_last"}) {
    EXPECT_EQ(parse(std::string(R"({")") + key + R"(": true})").warnings().size(), 1u) << key;
    EXPECT_TRUE(parse(std::string(R"({")") + key + R"(": false})").warnings().empty()) << key;
  }
}

TEST(ConfigUnimplemented, NestedKeysWarnWithTheirPath) {
  Config c = parse(R"({"fp16": {"enabled": true, "fp16_master_weights_and_grads": true},
                       "zero_optimization": {"stage": 3, "legacy_stage1": true, "zero_quantized_nontrainable_weights": true,
                                             "mics_shard_size": 8, "memory_efficient_linear": true},
                       "optimizer": {"type": "Adam", "legacy_fusion": true}})");
  for (const char* path : {"fp16.fp16_master_weights_and_grads", "zero_optimization.legacy_stage1",
                           "zero_optimization.zero_quantized_nontrainable_weights", "zero_optimization.mics_shard_size",
                           "zero_optimization.memory_efficient_linear", "optimizer.legacy_fusion"})
    EXPECT_EQ(count_containing(c.warnings(), std::string("known DeepSpeed key ") + path + " "), 1u) << path;
  EXPECT_EQ(c.warnings().size(), 6u);
  EXPECT_EQ(c.zero_optimization.mics_shard_size, 8);   // kept for whoever implements it
}

// Offload keys zero reads into the struct but nothing acts on: a value
// other than DeepSpeed's default warns, the default or no key does not.
TEST(ConfigUnimplemented, OffloadKeysZeroDoesNotActOnWarn) {
  struct Key {
    const char* section;
    const char* name;
    const char* value;          // one that asks for something
    const char* default_value;  // DeepSpeed's, spelled out
  };
  for (const Key& k : {Key{"offload_optimizer", "pipeline_read", "true", "false"},
                       Key{"offload_optimizer", "pipeline_write", "true", "false"},
                       Key{"offload_optimizer", "fast_init", "true", "false"},
                       Key{"offload_param", "max_in_cpu", "2e9", "1e9"}}) {
    const std::string path = std::string("zero_optimization.") + k.section + "." + k.name;
    const auto config = [&](const std::string& entry) {
      return parse(std::string(R"({"zero_optimization": {"stage": 3, ")") + k.section +
                   R"(": {"device": "nvme", "nvme_path": "/tmp")" + entry + "}}}");
    };
    Config set = config(std::string(", \"") + k.name + "\": " + k.value);
    ASSERT_EQ(set.warnings().size(), 1u) << path;
    EXPECT_EQ(set.warnings()[0],
              "known DeepSpeed key " + path + " is accepted but not implemented by zero; it has no effect");
    EXPECT_TRUE(config("").warnings().empty()) << path;
    EXPECT_TRUE(config(std::string(", \"") + k.name + "\": " + k.default_value).warnings().empty()) << path;
  }
}

TEST(ConfigActivationCheckpointing, EveryKeyIsReadWithoutAWarning) {
  Config c = parse(R"({"activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
                                                    "number_checkpoints": 4, "checkpoint_every": 2,
                                                    "contiguous_memory_optimization": true,
                                                    "synchronize_checkpoint_boundary": true, "profile": true}})");
  EXPECT_TRUE(c.warnings().empty());
  EXPECT_TRUE(c.activation_checkpointing.partition_activations);
  EXPECT_TRUE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints.value_or(0), 4);
  EXPECT_EQ(c.activation_checkpointing.checkpoint_every.value_or(0), 2);
  EXPECT_TRUE(c.activation_checkpointing.contiguous_memory_optimization);
  EXPECT_TRUE(c.activation_checkpointing.synchronize_checkpoint_boundary);
  EXPECT_THROW(parse(R"({"activation_checkpointing": {"checkpoint_every": 0}})"), zero::ConfigError);
}

// ---- optimizer, scheduler, precision ------------------------------------------------

TEST(ConfigOptimizer, AdamDecouplesWeightDecayUnlessTurnedOff) {
  EXPECT_TRUE(parse(R"({"optimizer": {"type": "Adam"}})").optimizer.decoupled_weight_decay());
  EXPECT_FALSE(parse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})")
                   .optimizer.decoupled_weight_decay());
  EXPECT_TRUE(parse(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})")
                  .optimizer.decoupled_weight_decay());
  EXPECT_FALSE(parse(R"({"optimizer": {"type": "SGD"}})").optimizer.decoupled_weight_decay());
}

TEST(ConfigOptimizer, UnsupportedAndUnknownTypes) {
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Lion", "RMSprop"}) {
    std::string message = config_error([&] { parse(std::string(R"({"optimizer": {"type": ")") + type + "\"}}"); });
    EXPECT_NE(message.find("not supported yet"), std::string::npos) << message;
    EXPECT_NE(message.find("optimizer.type"), std::string::npos) << message;
  }
  std::string message = config_error([] { parse(R"({"optimizer": {"type": "AdamWW"}})"); });
  EXPECT_NE(message.find("did you mean \"AdamW\""), std::string::npos) << message;
}

TEST(ConfigOptimizer, SchedulerWarnsWhenDecayEndsBeforeWarmup) {
  Config c = parse(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 100, "total_num_steps": 50}}})");
  EXPECT_EQ(count_containing(c.warnings(), "scheduler.params.total_num_steps"), 1u);
}

TEST(ConfigPrecision, Fp16AndBf16AreExclusive) {
  EXPECT_NE(config_error([] { parse(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})"); })
                .find("fp16.enabled and bf16.enabled"),
            std::string::npos);
  EXPECT_NO_THROW(parse(R"({"fp16": {"enabled": true}, "bf16": {"enabled": false}})"));
  // A static scale makes the dynamic scaler's bounds irrelevant.
  EXPECT_NO_THROW(parse(R"({"fp16": {"enabled": true, "loss_scale": 128, "initial_scale_power": 2, "min_loss_scale": 8}})"));
}

TEST(ConfigOffload, StageRulesFollowDeepSpeed) {
  EXPECT_NO_THROW(parse(R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}})"));
  EXPECT_NO_THROW(parse(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})"));
  EXPECT_NO_THROW(parse(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "none"}}})"));
  EXPECT_NE(config_error([] { parse(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"); })
                .find("needs stage 3"),
            std::string::npos);
  EXPECT_NE(config_error([] {
              parse(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})");
            }).find("zero_optimization.offload_optimizer.nvme_path is required"),
            std::string::npos);
}

// Partial offload (ratio below 1): taken at stages 1-3 with device "cpu"
// and at stage 3 with "nvme", without the "not implemented" warning.
TEST(ConfigOffload, PartialOffloadRatio) {
  for (int stage : {1, 2, 3}) {
    Config c = parse(R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
                     R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})");
    EXPECT_TRUE(c.warnings().empty()) << stage;
    EXPECT_DOUBLE_EQ(c.zero_optimization.offload_optimizer.ratio, 0.3);
  }
  Config nvme = parse(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "ratio": 0.5}}})");
  EXPECT_TRUE(nvme.warnings().empty());
  EXPECT_DOUBLE_EQ(nvme.zero_optimization.offload_optimizer.ratio, 0.5);
}

}  // namespace
