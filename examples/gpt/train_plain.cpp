// zero-gpt-plain: trains the main job's GPT on the generated corpus with
// plain LibTorch (torch::optim::AdamW, one process, no engine). The reference
// for the main job: same model, same data stream (the Batcher's global
// batches do not depend on the world size), so its loss curve is what the
// engine's must reproduce; it also measures steps/s.
//
//   zero-gpt-plain [--steps 300] [--depth 4] [--width 128] [--heads 4]
//                  [--context 64] [--batch 32] [--gas 1] [--lr 3e-3]
//                  [--threads N] [--seed 0] [--log-every 25]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gpt/corpus.h"
#include "gpt/gpt.h"

using namespace zero_examples;

int main(int argc, char** argv) {
  int64_t steps = 300, batch = 32, gas = 1, log_every = 25, threads = 0, seed = 0;
  double lr = 3e-3;
  GPTOptions options;
  const char* usage =
      "usage: zero-gpt-plain [--steps 300] [--depth 4] [--width 128] [--heads 4] [--context 64] [--batch 32]\n"
      "                      [--gas 1] [--lr 3e-3] [--threads N] [--seed 0] [--log-every 25]\n";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::fputs(usage, stdout);
      return 0;
    }
  }
  if (argc % 2 == 0) {  // a trailing option without its value was ignored before
    std::fprintf(stderr, "zero-gpt-plain: %s needs a value\n\n%s", argv[argc - 1], usage);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string v = argv[i + 1];
    // The whole text must be the number: "10s" or "abc" is an error, not 10 or 0.
    auto whole = [&](int64_t least) {
      size_t used = 0;
      long long n = least - 1;
      try {
        n = std::stoll(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || n < least) {
        std::fprintf(stderr, "zero-gpt-plain: %s %s: a whole number >= %lld\n", key.c_str(), v.c_str(),
                     static_cast<long long>(least));
        std::exit(2);
      }
      return static_cast<int64_t>(n);
    };
    if (key == "--steps") steps = whole(0);
    else if (key == "--depth") options.depth = whole(1);
    else if (key == "--width") options.width = whole(1);
    else if (key == "--heads") options.heads = whole(1);
    else if (key == "--context") options.context = whole(1);
    else if (key == "--batch") batch = whole(1);
    else if (key == "--gas") gas = whole(1);
    else if (key == "--lr") {
      size_t used = 0;
      try {
        lr = std::stod(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != v.size() || !(lr > 0)) {
        std::fprintf(stderr, "zero-gpt-plain: --lr %s: a number > 0\n", v.c_str());
        return 2;
      }
    } else if (key == "--threads") threads = whole(0);
    else if (key == "--seed") seed = whole(0);
    else if (key == "--log-every") log_every = whole(1);
    else {
      std::fprintf(stderr, "zero-gpt-plain: unknown option %s\n\n%s", key.c_str(), usage);
      return 2;
    }
  }
  if (threads > 0) torch::set_num_threads(static_cast<int>(threads));

  Corpus corpus;
  Batcher train(corpus.train_tokens(), BatcherOptions{static_cast<uint64_t>(seed), gas});
  Batcher val(corpus.validation_tokens(), BatcherOptions{static_cast<uint64_t>(seed) + 1, 1});
  options.vocab_size = corpus.vocab_size();
  torch::manual_seed(static_cast<uint64_t>(seed));
  GPT model(options);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(lr).weight_decay(0.01));
  std::printf("zero-gpt-plain: %lld parameters (depth %lld, width %lld, heads %lld, context %lld), "
              "%lld chars (vocab %lld), batch %lld x gas %lld, %d threads\n",
              (long long)model->num_parameters(), (long long)options.depth, (long long)options.width,
              (long long)options.heads, (long long)options.context, (long long)corpus.tokens().numel(),
              (long long)corpus.vocab_size(), (long long)batch, (long long)gas, torch::get_num_threads());

  auto evaluate = [&]() {
    torch::NoGradGuard no_grad;
    model->eval();
    Batch b = val.sequences(0, 64, options.context);
    const double l = model->loss(b.inputs, b.targets).item<double>();
    model->train();
    return l;
  };

  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    double loss_sum = 0;
    for (int m = 0; m < gas; ++m) {
      Batch b = train.next_batch(batch, options.context, 0, 1, step, m);
      at::Tensor loss = model->loss(b.inputs, b.targets) / static_cast<double>(gas);
      loss.backward();
      loss_sum += loss.item<double>();
    }
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    optimizer.step();
    if (step % log_every == 0 || step + 1 == steps) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("step %5lld  loss %.4f  %.2f steps/s\n", (long long)step, loss_sum, (step + 1) / secs);
      std::fflush(stdout);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("done: %lld steps in %.1f s (%.2f steps/s), validation loss %.4f\n", (long long)steps, secs,
              steps / secs, evaluate());
  model->eval();
  at::Tensor prompt = corpus.tokenizer().encode_tensor("the ").unsqueeze(0);
  std::printf("sample: %s\n", corpus.tokenizer().decode(model->generate(prompt, 120)).c_str());
  return 0;
}
