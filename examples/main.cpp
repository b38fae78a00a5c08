// The main job: a GPT-style decoder trained with zero on a text corpus that
// is generated at run time (examples/gpt), its blocks stage-3 units.
//
//   zero-run --nproc 2 zero-main [--config configs/main.json] [--stage S] [--steps 600]
//            [--depth 4] [--width 128] [--heads 4] [--context 64] [--expect-learning 1]
//            [--checkpoint DIR --save-every K] [--final-weights FILE] [--step-log FILE]
//
// With --checkpoint it resumes from DIR's newest checkpoint when there is
// one (as it would after `zero-run --max-restarts` started it again) and
// saves one every K steps; --final-weights writes the trained parameters'
// bytes (rank 0, by name), --step-log a line per completed step with its
// wall-clock time (bench/run_chaos.sh reads both).
//
// Exits 0 when the validation loss fell below 0.6 of its start (with
// --expect-learning 0: when the run completed), 1 otherwise, 2 on a config
// this build cannot train.
//
// Every rank reads the same config (any file in configs/ works); the engine
// logs progress every steps_per_print steps. At the end: validation loss and
// a greedy sample, which should read like the corpus' sentences.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <string>

#include "gpt/corpus.h"
#include "gpt/gpt.h"
#include "zero/zero.h"

using namespace zero_examples;

namespace {

// Mean loss over `batches` validation batches, the same on every rank.
double validation_loss(GPT& model, zero::Engine& engine, const Batcher& val, int64_t micro, int64_t context) {
  torch::NoGradGuard no_grad;
  engine.eval();
  at::Tensor total = torch::zeros({1}, torch::kDouble);
  const int64_t batches = 8;
  for (int64_t b = 0; b < batches; ++b) {
    // Ranks of one tensor-parallel group read the same rows.
    Batch batch = val.next_batch(micro, context, engine.mesh().coordinates().dp, engine.mesh().shape().dp, b, 0);
    total += model->loss(batch.inputs, batch.targets).item<double>() / batches;
  }
  engine.group().all_reduce(total, zero::comm::ReduceOp::Avg);
  engine.train();
  return total.item<double>();
}

// A LibTorch error as one line: its message without the C++ frames.
std::string one_line(const c10::Error& e) {
  std::string text = e.what_without_backtrace();
  for (char& c : text) c = c == '\n' ? ' ' : c;
  return text;
}

// fp16 on CPU ranks trains only where this LibTorch's CPU kernels have fp16
// versions of the ops the GPT uses (1.13's lack LayerNorm): one tiny forward
// and backward in fp16 says so before the run starts. Empty when it works.
std::string fp16_cpu_problem(GPTOptions options) {
  options.depth = 1;
  options.width = 8;
  options.heads = 2;
  options.context = 4;
  GPT probe(options);
  probe->to(at::kHalf);
  const at::Tensor tokens = torch::zeros({1, options.context}, torch::kLong);
  try {
    probe->loss(tokens, tokens).backward();
  } catch (const c10::Error& e) {
    return one_line(e);
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = ZERO_DEFAULT_CONFIG;
  int64_t steps = 600;
  int stage = -1;  // -1: the config's
  bool expect_learning = true;
  std::string checkpoint, final_weights, step_log;
  int64_t save_every = 0;
  GPTOptions options;
  const char* usage =
      "usage: zero-run --nproc 2 zero-main [--config configs/main.json] [--stage S] [--steps 600]\n"
      "                [--depth 4] [--width 128] [--heads 4] [--context 64] [--expect-learning 1]\n"
      "                [--checkpoint DIR --save-every K] [--final-weights FILE] [--step-log FILE]\n";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::fputs(usage, stdout);
      return 0;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "zero-main: %s needs a value\n\n%s", argv[argc - 1], usage);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string value = argv[i + 1];
    // A number option: a whole number, 0 or more (--stage), else 1 or more.
    auto number = [&](int64_t least) {
      size_t used = 0;
      int64_t n = -1;
      try {
        n = std::stoll(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || n < least) {
        std::fprintf(stderr, "zero-main: %s %s: a whole number >= %lld\n", key.c_str(), value.c_str(),
                     static_cast<long long>(least));
        std::exit(2);
      }
      return n;
    };
    if (key == "--config") config_path = value;
    else if (key == "--steps") steps = number(1);
    else if (key == "--stage") stage = static_cast<int>(number(0));
    else if (key == "--depth") options.depth = number(1);
    else if (key == "--width") options.width = number(1);
    else if (key == "--heads") options.heads = number(1);
    else if (key == "--context") options.context = number(1);
    else if (key == "--expect-learning") expect_learning = value != "0";
    else if (key == "--checkpoint") checkpoint = value;
    else if (key == "--save-every") save_every = number(1);
    else if (key == "--final-weights") final_weights = value;
    else if (key == "--step-log") step_log = value;
    else {
      std::fprintf(stderr, "zero-main: unknown option %s\n\n%s", key.c_str(), usage);
      return 2;
    }
  }
  try {
    zero::Config config = zero::Config::from_file(config_path);
    if (stage >= 0) config.zero_optimization.stage = stage;  // checked again by the engine's resolve()
    Corpus corpus;
    options.vocab_size = corpus.vocab_size();
    if (config.fp16.enabled) {
      const std::string problem = fp16_cpu_problem(options);
      if (!problem.empty()) {
        std::fprintf(stderr,
                     "zero-main: %s asks for fp16, which this LibTorch cannot train on CPU ranks (%s); "
                     "use bf16 there (\"bf16\": {\"enabled\": true}, e.g. configs/zero3_bf16.json) and fp16 on a GPU\n",
                     config_path.c_str(), problem.c_str());
        return 2;
      }
    }
    torch::manual_seed(0);  // rank 0's initial weights are broadcast anyway
    GPT model(options);
    const int64_t parameters = model->num_parameters();  // before stage 3 releases them

    auto engine = zero::initialize(config, model);
    const auto& resolved = engine.config();
    const int64_t micro = *resolved.batch.train_micro_batch_size_per_gpu;
    const int64_t gas = *resolved.batch.gradient_accumulation_steps;
    const int rank = engine.group().rank(), world = engine.group().size();
    // The data splits over data-parallel ranks (with tensor parallelism a
    // tp group reads the same rows).
    const int data_rank = engine.mesh().coordinates().dp, data_ranks = engine.mesh().shape().dp;
    Batcher train(corpus.train_tokens(), BatcherOptions{0, gas});
    Batcher val(corpus.validation_tokens(), BatcherOptions{1, 1});
    if (rank == 0) {
      std::printf("zero-main: GPT with %lld parameters (depth %lld, width %lld, heads %lld, context %lld) on a "
                  "generated corpus of %lld characters; %s, %d rank(s), global batch %lld, %lld steps\n",
                  (long long)parameters, (long long)options.depth, (long long)options.width,
                  (long long)options.heads, (long long)options.context, (long long)corpus.tokens().numel(),
                  config_path.c_str(), world, (long long)*resolved.batch.train_batch_size, (long long)steps);
      std::fflush(stdout);
    }
    const double initial = validation_loss(model, engine, val, micro, options.context);
    if (!checkpoint.empty()) engine.load_checkpoint_if_present(checkpoint);  // a restart resumes here
    std::FILE* log = rank == 0 && !step_log.empty() ? std::fopen(step_log.c_str(), "a") : nullptr;
    for (int64_t step = engine.global_steps(); step < steps; ++step) {
      for (int64_t m = 0; m < gas; ++m) {
        Batch batch = train.next_batch(micro, options.context, data_rank, data_ranks, step, static_cast<int>(m));
        engine.backward(model->loss(batch.inputs, batch.targets));
        engine.step();
      }
      if (!checkpoint.empty() && save_every > 0 && (step + 1) % save_every == 0) engine.save_checkpoint(checkpoint);
      if (log) {
        const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        std::fprintf(log, "step %lld %.3f\n", static_cast<long long>(step + 1), now);
        std::fflush(log);
      }
    }
    if (log) std::fclose(log);
    if (!final_weights.empty()) {
      const auto state = engine.gathered_state_dict();  // every rank: stage 3 gathers collectively
      if (rank == 0) {
        std::ofstream out(final_weights, std::ios::binary | std::ios::trunc);
        for (const auto& [name, t] : state) {
          const at::Tensor c = t.contiguous();
          out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
        }
      }
    }
    const double final_loss = validation_loss(model, engine, val, micro, options.context);
    at::Tensor prompt = corpus.tokenizer().encode_tensor("the ").unsqueeze(0);
    at::Tensor sample = model->generate(prompt, 120);  // every rank: stage 3 gathers collectively
    if (rank == 0) {
      std::printf("zero-main: validation loss %.3f -> %.3f nats/char after %lld steps (%s)\n", initial, final_loss,
                  (long long)steps, final_loss < 0.6 * initial ? "learning" : "NOT LEARNING");
      std::printf("zero-main: memory per rank: %s\n", engine.memory_report().describe().c_str());
      std::string text = corpus.tokenizer().decode(sample[0]);
      for (char& c : text) c = c == '\n' ? '/' : c;
      std::printf("zero-main: sample: %s\n", text.c_str());
    }
    return final_loss < 0.6 * initial || !expect_learning ? 0 : 1;
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "zero-main: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {  // raised in the model's forward
    std::fprintf(stderr, "zero-main: LibTorch: %s\n", one_line(e).c_str());
    return 1;
  }
}
