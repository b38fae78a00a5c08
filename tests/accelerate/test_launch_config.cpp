// Accelerate's YAML launch config: what is read, what is warned about, what
// is an error, and `zero-run config`'s file read back.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "zero/error.h"
#include "zero/launch_config.h"

namespace {

using zero::LaunchConfig;

std::string error_of(const std::string& yaml) {
  try {
    LaunchConfig::from_yaml(yaml, "launch.yaml");
  } catch (const zero::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchConfig, ReadsWhatAccelerateConfigWrites) {
  // As `accelerate config` writes it for DeepSpeed (keys zero has no use
  // for included), with the unquoted no YAML reads as a boolean.
  const auto c = LaunchConfig::from_yaml(R"(compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 2
  gradient_clipping: 1.0
  offload_optimizer_device: cpu
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
distributed_type: DEEPSPEED
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 0
main_training_function: main
mixed_precision: no
num_machines: 1
num_processes: 4
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
)", "launch.yaml");
  EXPECT_EQ(c.distributed_type, "DEEPSPEED");
  EXPECT_EQ(c.num_processes, 4);
  EXPECT_EQ(c.processes_per_machine(), 4);
  EXPECT_EQ(c.mixed_precision.value_or("?"), "no");
  EXPECT_TRUE(c.use_cpu);
  EXPECT_EQ(c.deepspeed.zero_stage.value_or(-1), 2);
  EXPECT_EQ(c.deepspeed.offload_optimizer_device.value_or("?"), "cpu");
  EXPECT_EQ(c.deepspeed.offload_param_device.value_or("?"), "none");
  EXPECT_DOUBLE_EQ(c.deepspeed.gradient_clipping.value_or(-1), 1.0);
  EXPECT_EQ(c.deepspeed.gradient_accumulation_steps.value_or(-1), 2);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
}

// Note [Unknown keys] in accelerate/launch_config.cpp: as in a ds_config, an
// unknown key is an error naming the file, the key and the nearest known key,
// never a warning that trains with the default left in place.
TEST(LaunchConfig, ATypoOfADeepSpeedKeyIsAnErrorNamingTheNearestKey) {
  const std::string yaml = "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stgae: 3\n";
  EXPECT_EQ(error_of(yaml), "launch config launch.yaml: deepspeed_config.zero_stgae: unknown key; did you mean "
                            "\"zero_stage\"?");
  // Nothing is read at a default stage: the file does not load at all.
  EXPECT_THROW(LaunchConfig::from_yaml(yaml, "launch.yaml"), zero::ConfigError);
}

TEST(LaunchConfig, ATypoOfATopLevelKeyIsNamedBeforeTheKeyItLeavesMissing) {
  // Not "num_processes: missing": the key the user wrote, and its fix.
  EXPECT_EQ(error_of("distributed_type: MULTI_CPU\nnum_process: 2\n"),
            "launch config launch.yaml: num_process: unknown key; did you mean \"num_processes\"?");
  EXPECT_EQ(error_of("distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precison: bf16\n"),
            "launch config launch.yaml: mixed_precison: unknown key; did you mean \"mixed_precision\"?");
}

TEST(LaunchConfig, AKeyInTheWrongMappingIsShownWhereItBelongs) {
  EXPECT_EQ(error_of("distributed_type: DEEPSPEED\nnum_processes: 2\nzero_stage: 3\n"),
            "launch config launch.yaml: zero_stage: unknown key; did you mean \"deepspeed_config.zero_stage\"?");
  EXPECT_EQ(error_of("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  mixed_precision: bf16\n"),
            "launch config launch.yaml: deepspeed_config.mixed_precision: unknown key; did you mean "
            "\"mixed_precision\" (a top-level key, outside deepspeed_config)?");
}

TEST(LaunchConfig, AnUnknownKeyWithNoNearKeyListsTheKeysRead) {
  const std::string top = error_of("distributed_type: MULTI_CPU\nnum_processes: 2\ncuda_visible_devices: 0,1\n");
  EXPECT_EQ(top.rfind("launch config launch.yaml: cuda_visible_devices: unknown key; zero reads compute_environment, "
                      "distributed_type, num_processes,", 0), 0u) << top;
  EXPECT_NE(top.find("(and accepts the other keys Accelerate writes); correct the key or remove it"),
            std::string::npos) << top;
  const std::string ds = error_of("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                                  "  stage3_prefetch_bucket_size: 5\n");
  EXPECT_EQ(ds.rfind("launch config launch.yaml: deepspeed_config.stage3_prefetch_bucket_size: unknown key; "
                     "deepspeed_config takes deepspeed_config_file, zero_stage,", 0), 0u) << ds;
}

TEST(LaunchConfig, AnUnknownKeyInAFileNamesTheFile) {
  const std::string path = ::testing::TempDir() + "typo_launch.yaml";
  std::ofstream(path) << "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stgae: 3\n";
  try {
    LaunchConfig::from_file(path);
    FAIL() << "no error";
  } catch (const zero::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "launch config " + path + ": deepspeed_config.zero_stgae: unknown key; did you "
                                     "mean \"zero_stage\"?");
  }
  std::remove(path.c_str());
}

TEST(LaunchConfig, WhatAccelerateWritesIsNoUnknownKey) {
  // Every key of Accelerate's ClusterConfig and of its deepspeed_config,
  // as `accelerate config` writes them: accepted, no warning.
  const auto c = LaunchConfig::from_yaml(R"(compute_environment: LOCAL_MACHINE
command_file: null
commands: null
debug: false
deepspeed_config:
  deepspeed_hostfile: hosts
  deepspeed_multinode_launcher: standard
  deepspeed_exclusion_filter: ''
  deepspeed_inclusion_filter: ''
  deepspeed_moe_layer_cls_names: ''
  zero3_init_flag: false
  zero3_save_16bit_model: false
  zero_stage: 2
distributed_type: DEEPSPEED
downcast_bf16: 'no'
dynamo_config: {}
enable_cpu_affinity: false
fp8_config: {}
fsdp_config: {}
gpu_ids: all
machine_rank: 0
main_training_function: main
megatron_lm_config: {}
mixed_precision: 'no'
mpirun_config: {}
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_name: null
tpu_use_cluster: false
tpu_use_sudo: false
tpu_vm: null
tpu_zone: null
use_cpu: false
)", "launch.yaml");
  EXPECT_EQ(c.deepspeed.zero_stage.value_or(-1), 2);
  EXPECT_TRUE(c.warnings.empty()) << c.warnings.front();
}

TEST(LaunchConfig, WrongTypesAndValuesAreErrorsNamingTheKey) {
  const std::string base = "distributed_type: DEEPSPEED\n";
  EXPECT_NE(error_of(base + "num_processes: two\n").find("num_processes: expected an integer, found 'two'"),
            std::string::npos);
  EXPECT_NE(error_of(base + "num_processes: [1, 2]\n").find("num_processes: expected a single value, found a list"),
            std::string::npos);
  EXPECT_NE(error_of(base + "num_processes: 2\ndeepspeed_config:\n  zero_stage: 5\n")
                .find("deepspeed_config.zero_stage: must be in [0, 3], found 5"),
            std::string::npos);
  EXPECT_NE(error_of(base + "num_processes: 2\nmixed_precision: fp8\n")
                .find("mixed_precision: expected one of no, fp16, bf16, found 'fp8'"),
            std::string::npos);
  EXPECT_NE(error_of(base + "num_processes: 2\nuse_cpu: maybe\n").find("use_cpu: expected true or false"),
            std::string::npos);
  EXPECT_NE(error_of(base + "num_processes: 2\ndeepspeed_config:\n  gradient_clipping: -1\n")
                .find("gradient_clipping: must be >= 0"),
            std::string::npos);
  EXPECT_NE(error_of("num_processes: 2\ndistributed_type: [DEEPSPEED\n").find("is not valid YAML"), std::string::npos);
}

TEST(LaunchConfig, MissingFieldsAndConflictsAreErrors) {
  EXPECT_NE(error_of("distributed_type: MULTI_CPU\n").find("num_processes: missing"), std::string::npos);
  EXPECT_NE(error_of("num_processes: 2\n").find("distributed_type: missing"), std::string::npos);
  EXPECT_NE(error_of("distributed_type: NO\nnum_processes: 4\n").find("NO runs one process, but num_processes is 4"),
            std::string::npos);
  EXPECT_NE(error_of("distributed_type: FSDP\nnum_processes: 4\n").find("DEEPSPEED with deepspeed_config.zero_stage 3"),
            std::string::npos);
  EXPECT_NE(error_of("distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nmain_process_port: 29500\n")
                .find("main_process_ip: missing"),
            std::string::npos);
  EXPECT_NE(error_of("distributed_type: MULTI_CPU\nnum_processes: 5\nnum_machines: 2\n").find("does not divide"),
            std::string::npos);
  EXPECT_NE(error_of("distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nmachine_rank: 2\n"
                     "main_process_ip: 10.0.0.1\nmain_process_port: 29500\n")
                .find("machine_rank: must be below num_machines 2"),
            std::string::npos);
  EXPECT_NE(error_of("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                     "  deepspeed_config_file: ds.json\n  zero_stage: 3\n")
                .find("gives deepspeed_config_file and also zero_stage"),
            std::string::npos);
  EXPECT_NE(error_of("distributed_type: DEEPSPEED\nnum_processes: 2\ngradient_accumulation_steps: 2\n"
                     "deepspeed_config:\n  gradient_accumulation_steps: 4\n")
                .find("2 conflicts with deepspeed_config.gradient_accumulation_steps 4"),
            std::string::npos);
  EXPECT_NE(error_of("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                     "  offload_optimizer_device: nvme\n")
                .find("offload_optimizer_nvme_path: missing"),
            std::string::npos);
  EXPECT_NE(error_of("").find("is empty"), std::string::npos);
}

// Note [Launch config structure] in accelerate/launch_config.cpp: what
// yaml-cpp would take silently (a key twice, keeping the last here; a
// second document, ignored) or recurse on (2000 levels) is refused by name,
// and so is a text longer than a launch config file may be.
TEST(LaunchConfig, AmbiguousOrOversizedTextIsRefused) {
  const std::string base = "distributed_type: MULTI_CPU\nnum_processes: 1\n";
  EXPECT_NE(error_of(base + "num_processes: 2\n").find("launch config launch.yaml: num_processes: duplicate key"),
            std::string::npos);
  EXPECT_NE(error_of(base + "deepspeed_config: {zero_stage: 1, 'zero_stage': 2}\n")
                .find("deepspeed_config.zero_stage: duplicate key"),
            std::string::npos);
  EXPECT_NE(error_of(base + "fsdp_config: [{a: 1}, {b: 1, b: 2}]\n").find("fsdp_config[1].b: duplicate key"),
            std::string::npos);
  // The same name in two mappings, or a value repeated, is not a duplicate.
  EXPECT_EQ(error_of(base + "fsdp_config: [{a: 1}, {a: 1}]\ngpu_ids: [1, 1]\n"), "");
  EXPECT_NE(error_of(base + "...\n---\nnum_processes: 4\n").find("holds more than one YAML document"),
            std::string::npos);
  EXPECT_NE(error_of(base + "gpu_ids: " + std::string(64, '[') + std::string(64, ']') + "\n")
                .find("nested deeper than 64 levels at line 3"),
            std::string::npos);
  EXPECT_EQ(error_of(base + "gpu_ids: " + std::string(63, '[') + std::string(63, ']') + "\n"), "");
  EXPECT_NE(error_of(base + std::string(1 << 20, '#')).find("has 1048621 bytes, more than the 1048576 a launch config"),
            std::string::npos);
  EXPECT_NE(error_of(base + "? {a: 1}\n: 2\n").find("a key at line 3 is a mapping; keys are plain names"),
            std::string::npos);
}

TEST(LaunchConfig, DeepSpeedConfigFileIsRelativeToTheLaunchConfig) {
  const auto c = LaunchConfig::from_yaml("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                                         "  deepspeed_config_file: ds.json\n", "/jobs/run1/launch.yaml");
  EXPECT_EQ(c.deepspeed.config_file, "/jobs/run1/ds.json");
}

TEST(LaunchConfig, AMissingFileSaysHowToWriteOne) {
  try {
    LaunchConfig::from_file("/nonexistent/launch.yaml");
    FAIL() << "no error";
  } catch (const zero::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero-run config --output /nonexistent/launch.yaml"), std::string::npos);
  }
}

TEST(LaunchConfig, TheDefaultFileReadsBackToItsAnswers) {
  zero::LaunchConfigAnswers a;
  a.cpus_found = 2;
  auto plain = LaunchConfig::from_yaml(zero::default_launch_config_yaml(a));
  EXPECT_EQ(plain.distributed_type, "MULTI_CPU");
  EXPECT_EQ(plain.num_processes, 2);
  EXPECT_EQ(plain.mixed_precision.value_or("?"), "no");
  EXPECT_EQ(plain.gradient_accumulation_steps.value_or(-1), 1);
  EXPECT_TRUE(plain.warnings.empty());

  a.gpus_found = 8;
  a.distributed_type = "DEEPSPEED";
  a.num_machines = 2;
  a.machine_rank = 1;
  a.num_processes = 16;
  a.main_process_ip = "10.0.0.1";
  a.main_process_port = 29500;
  a.mixed_precision = "bf16";
  a.gradient_accumulation_steps = 4;
  a.zero_stage = 3;
  a.offload_optimizer_device = "cpu";
  a.offload_param_device = "cpu";
  a.gradient_clipping = 1.5;
  auto ds = LaunchConfig::from_yaml(zero::default_launch_config_yaml(a));
  EXPECT_EQ(ds.distributed_type, "DEEPSPEED");
  EXPECT_EQ(ds.num_processes, 16);
  EXPECT_EQ(ds.processes_per_machine(), 8);
  EXPECT_EQ(ds.machine_rank, 1);
  EXPECT_EQ(ds.main_process_ip, "10.0.0.1");
  EXPECT_EQ(ds.main_process_port, 29500);
  EXPECT_EQ(ds.mixed_precision.value_or("?"), "bf16");
  EXPECT_EQ(ds.gradient_accumulation_steps.value_or(-1), 4);
  EXPECT_EQ(ds.deepspeed.zero_stage.value_or(-1), 3);
  EXPECT_EQ(ds.deepspeed.offload_optimizer_device.value_or("?"), "cpu");
  EXPECT_EQ(ds.deepspeed.offload_param_device.value_or("?"), "cpu");
  EXPECT_DOUBLE_EQ(ds.deepspeed.gradient_clipping.value_or(-1), 1.5);
  EXPECT_TRUE(ds.warnings.empty());
}

}  // namespace
