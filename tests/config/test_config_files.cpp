// The config corpus: configs/ (shipped), tests/config/good (configs shaped
// like the ones users write), tests/config/hf (Hugging Face style files that
// need the program to fill values) and tests/config/bad (each with the text its error must contain,
// in bad/expected.json).
#include "config_test_util.h"

namespace {

using zero::Config;
using zero_test::config_error;
using zero_test::json_files;
using zero_test::source_path;

const int kWorldSizes[] = {1, 2, 4};

// Every shipped and corpus file loads, resolves for 1, 2 and 4 ranks (those
// its tensor-parallel size divides), satisfies the batch identity over the
// data-parallel ranks, and survives a to_json round trip.
void check_good_file(const std::string& path) {
  SCOPED_TRACE(path);
  for (int ws : kWorldSizes) {
    SCOPED_TRACE("world size " + std::to_string(ws));
    Config c = Config::from_file(path);
    EXPECT_EQ(c.source(), path);
    if (ws % c.parallelism.tensor_parallel() != 0) continue;
    ASSERT_NO_THROW(c.resolve(ws));
    const auto& b = c.batch;
    ASSERT_TRUE(b.train_batch_size && b.train_micro_batch_size_per_gpu && b.gradient_accumulation_steps);
    EXPECT_EQ(*b.train_batch_size,
              *b.train_micro_batch_size_per_gpu * *b.gradient_accumulation_steps * ws / c.parallelism.tensor_parallel());
    Config again = Config::from_json(c.to_json());
    EXPECT_EQ(again.to_json(), c.to_json());
  }
}

TEST(ConfigFiles, ShippedConfigsResolve) {
  auto files = json_files("configs");
  ASSERT_GE(files.size(), 9u);
  for (const auto& name : files) check_good_file(source_path("configs/" + name));
}

TEST(ConfigFiles, CollectedGoodConfigsResolve) {
  auto files = json_files("tests/config/good");
  ASSERT_GE(files.size(), 10u);
  for (const auto& name : files) check_good_file(source_path("tests/config/good/" + name));
}

// configs/zeroN*.json really is stage N, with the precision and offload its
// name promises.
TEST(ConfigFiles, ShippedConfigsMatchTheirNames) {
  for (const auto& name : json_files("configs")) {
    if (name.rfind("zero", 0) != 0) continue;
    SCOPED_TRACE(name);
    Config c = Config::from_file(source_path("configs/" + name));
    EXPECT_EQ(c.zero_optimization.stage, name[4] - '0');
    EXPECT_EQ(c.fp16.enabled, name.find("fp16") != std::string::npos);
    EXPECT_EQ(c.zero_optimization.offload_optimizer.device != "none", name.find("offload") != std::string::npos);
    EXPECT_TRUE(c.warnings().empty()) << c.warnings().front();
  }
  Config bf16 = Config::from_file(source_path("configs/zero3_bf16.json"));
  EXPECT_TRUE(bf16.bf16.enabled);
  Config recompute = Config::from_file(source_path("configs/zero3_bf16_checkpointing.json"));
  EXPECT_EQ(recompute.activation_checkpointing.checkpoint_every.value_or(0), 1);
  Config nvme = Config::from_file(source_path("configs/zero3_offload_nvme.json"));
  EXPECT_EQ(nvme.zero_optimization.offload_optimizer.device, "nvme");
  EXPECT_EQ(nvme.zero_optimization.offload_param.device, "nvme");
  EXPECT_EQ(nvme.zero_optimization.offload_param.nvme_path, "/tmp/zero_nvme");
  EXPECT_EQ(nvme.zero_optimization.offload_optimizer.nvme_path, "/tmp/zero_nvme");
}

// The main job's config: what the example trains with.
TEST(ConfigFiles, MainJobConfig) {
  Config c = Config::from_file(source_path("configs/main.json"));
  EXPECT_TRUE(c.warnings().empty());
  EXPECT_TRUE(c.zero_optimization.stage == 2 || c.zero_optimization.stage == 3);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.scheduler.type, "WarmupLR");
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16.enabled);
  EXPECT_EQ(c.zero_optimization.offload_optimizer.device, "none");
  c.resolve(3);
  EXPECT_EQ(*c.batch.train_micro_batch_size_per_gpu, 16);
  EXPECT_EQ(*c.batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(*c.batch.train_batch_size, 16 * 1 * 3);
}

// Files with typical content give the warnings a reader would expect, and
// the values they spell (old keys and "auto" included) are read as written.
TEST(ConfigFiles, CollectedFilesWarnAboutWhatZeroIgnores) {
  Config bert = Config::from_file(source_path("tests/config/good/bert_lamb_large_batch_sparse_attention.json"));
  EXPECT_EQ(zero_test::count_containing(bert.warnings(), "sparse_attention"), 1u);
  EXPECT_EQ(bert.optimizer.type, "Lamb");
  EXPECT_FALSE(bert.optimizer.params.bias_correction);
  EXPECT_EQ(bert.optimizer.params.min_coeff, 0.08);
  EXPECT_EQ(bert.optimizer.params.max_coeff, 0.5);
  bert.resolve(4);
  EXPECT_EQ(*bert.batch.gradient_accumulation_steps, 32768 / (32 * 4));

  Config pld = Config::from_file(source_path("tests/config/good/bert_adam_progressive_layer_drop.json"));
  EXPECT_EQ(zero_test::count_containing(pld.warnings(), "progressive_layer_drop"), 1u);
  EXPECT_TRUE(pld.prescale_gradients);
  EXPECT_EQ(pld.gradient_predivide_factor, 4.0);
  pld.resolve(2);
  EXPECT_EQ(*pld.batch.gradient_accumulation_steps, 2048 / (8 * 2));

  Config legacy = Config::from_file(source_path("tests/config/good/zero3_cpu_offload_legacy_keys.json"));
  EXPECT_EQ(legacy.zero_optimization.offload_optimizer.device, "cpu");
  EXPECT_EQ(legacy.zero_optimization.offload_param.device, "cpu");
  EXPECT_TRUE(legacy.zero_optimization.offload_optimizer.pin_memory);
  EXPECT_TRUE(legacy.zero_optimization.offload_param.pin_memory);
  for (const char* old_key : {"cpu_offload ", "cpu_offload_params", "cpu_offload_use_pin_memory"})
    EXPECT_EQ(zero_test::count_containing(legacy.warnings(), old_key), 1u) << old_key;
  EXPECT_EQ(legacy.zero_optimization.stage3_param_persistence_threshold, 20000);
  legacy.resolve(4);
  EXPECT_EQ(*legacy.batch.gradient_accumulation_steps, 256 / (16 * 4));

  Config nvme = Config::from_file(source_path("tests/config/good/zero3_nvme_offload_aio_thread_count.json"));
  EXPECT_EQ(zero_test::count_containing(nvme.warnings(), "aio.thread_count is deprecated"), 1u);
  EXPECT_EQ(nvme.aio.intra_op_parallelism, 4);   // written as the old aio.thread_count
  EXPECT_EQ(nvme.aio.queue_depth, 32);
  EXPECT_EQ(nvme.aio.block_size, 262144);
  EXPECT_EQ(nvme.zero_optimization.offload_param.max_in_cpu, 3000000000);   // 3e9
  EXPECT_EQ(nvme.zero_optimization.offload_param.buffer_count, 6);
  EXPECT_EQ(nvme.zero_optimization.offload_optimizer.buffer_count, 8);
  EXPECT_EQ(nvme.zero_optimization.offload_optimizer.nvme_path, "/local_nvme/zero_swap");
  EXPECT_EQ(nvme.fp16.loss_scale, 256.0);
  nvme.resolve(4);
  EXPECT_EQ(*nvme.batch.train_batch_size, 2 * 8 * 4);

  Config gan = Config::from_file(source_path("tests/config/good/gan_adam_ttur_betas.json"));
  EXPECT_EQ(gan.optimizer.params.betas[0], 0.0);
  EXPECT_EQ(gan.optimizer.params.betas[1], 0.9);
  gan.resolve(2);
  EXPECT_EQ(*gan.batch.gradient_accumulation_steps, 1);   // train_batch_size alone: no accumulation
  EXPECT_EQ(*gan.batch.train_micro_batch_size_per_gpu, 128 / 2);

  Config trainer = Config::from_file(source_path("tests/config/good/trainer_zero3_auto_micro_batch_set.json"));
  EXPECT_EQ(trainer.optimizer.type, "AdamW");
  EXPECT_EQ(trainer.zero_optimization.sub_group_size, 500000000);
  EXPECT_TRUE(trainer.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_FALSE(trainer.zero_optimization.offload_param.pin_memory);
  trainer.resolve(4);
  EXPECT_EQ(*trainer.batch.gradient_accumulation_steps, 1);
  EXPECT_EQ(*trainer.batch.train_batch_size, 2 * 1 * 4);
}

// Hugging Face style files keep the Trainer's old spelling readable.
TEST(ConfigFiles, HuggingFaceLegacyGatherKeyIsRead) {
  Config c = Config::from_file(source_path("tests/config/hf/trainer_zero3_offload_no_batch_keys.json"));
  EXPECT_EQ(zero_test::count_containing(c.warnings(), "stage3_gather_fp16_weights_on_model_save is deprecated"), 1u);
  EXPECT_TRUE(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.zero_optimization.reduce_bucket_size, 0);
  EXPECT_EQ(c.zero_optimization.sub_group_size, 1000000000000);   // 1e12
  EXPECT_EQ(c.scheduler.params.warmup_num_steps, 800);
  EXPECT_EQ(c.scheduler.params.warmup_max_lr, 5e-5);
}

// Each bad file fails with a message naming what is wrong; the table and the
// folder list the same files.
TEST(ConfigFiles, BadConfigsFailWithTheirMessage) {
  const auto expected = zero_test::read_json_file(source_path("tests/config/bad/expected.json"));
  const auto files = json_files("tests/config/bad", "expected.json");
  ASSERT_GE(files.size(), 40u);
  ASSERT_EQ(files.size(), expected.size());
  for (const auto& name : files) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.contains(name)) << "add " << name << " to bad/expected.json";
    const auto& e = expected[name];
    const std::string path = source_path("tests/config/bad/" + name);
    std::string message = config_error([&] {
      Config c = Config::from_file(path);
      c.resolve(e["world_size"].get<int>());
    });
    for (const auto& needle : e["contains"]) {
      EXPECT_NE(message.find(needle.get<std::string>()), std::string::npos)
          << "message: " << message << "\nshould contain: " << needle;
    }
  }
}

// Parse errors name the file they come from.
TEST(ConfigFiles, FileErrorsNameTheFile) {
  const std::string path = source_path("tests/config/bad/stage4.json");
  std::string message = config_error([&] { Config::from_file(path); });
  EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;

  message = config_error([] { Config::from_file("/nonexistent/ds_config.json"); });
  EXPECT_NE(message.find("/nonexistent/ds_config.json"), std::string::npos);
  EXPECT_NE(message.find("No such file"), std::string::npos);

  message = config_error([] { Config::from_file(ZERO_SOURCE_DIR); });
  EXPECT_NE(message.find("directory"), std::string::npos);
}

// Hugging Face style files: they parse, resolve() names the value the
// program must fill in, and after filling it (as the HF Trainer does) they
// resolve.
TEST(ConfigFiles, HuggingFaceFilesNeedTheProgramToFillAuto) {
  const auto files = json_files("tests/config/hf");
  ASSERT_GE(files.size(), 4u);
  for (const auto& name : files) {
    SCOPED_TRACE(name);
    const std::string path = source_path("tests/config/hf/" + name);
    Config c = Config::from_file(path);
    std::string message = config_error([&] { Config(c).resolve(1); });
    bool names_value = message.find("train_micro_batch_size_per_gpu") != std::string::npos ||
                       message.find("total_num_steps") != std::string::npos;
    EXPECT_TRUE(names_value) << message;
    for (int ws : kWorldSizes) {
      Config filled = Config::from_file(path);
      if (!filled.batch.train_micro_batch_size_per_gpu) filled.batch.train_micro_batch_size_per_gpu = 4;
      if (filled.scheduler.type == "WarmupDecayLR" && !filled.scheduler.params.total_num_steps)
        filled.scheduler.params.total_num_steps = 1000;
      ASSERT_NO_THROW(filled.resolve(ws));
      EXPECT_EQ(*filled.batch.train_batch_size, 4 * *filled.batch.gradient_accumulation_steps * ws);
    }
  }
}

}  // namespace
