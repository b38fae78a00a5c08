// The main job's GPT (examples/gpt) trained the Hugging Face Accelerate way:
// a launch config decides processes, ZeRO stage, offload and precision; the
// program itself has no launcher, rank or ZeRO code.
//
//   zero-run config --output launch.yaml --num-processes 2 --zero-stage 2
//   zero-run --config-file launch.yaml zero-accelerate-gpt [--epochs 2] [--depth 2] [--width 64]
//            [--context 32] [--batch 32] [--resume DIR] [--save DIR]
//
// configs/accelerate_zero2.yaml is a ready launch config. --batch is the
// global batch (split_batches), so any num_processes trains on the same
// batches. --save DIR writes save_state at the end of each epoch; --resume
// DIR continues from it. Exits 0 when the validation loss fell below 0.75
// of its start.
#include <torch/torch.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "gpt/corpus.h"
#include "gpt/gpt.h"
#include "zero/accelerate.h"
#include "zero/error.h"

using namespace zero_examples;

namespace {

// Non-overlapping windows of context+1 tokens: inputs and their next tokens.
class Windows : public zero::Dataset {
 public:
  Windows(at::Tensor tokens, int64_t context) : tokens_(std::move(tokens)), context_(context) {}
  int64_t size() const override { return (tokens_.numel() - 1) / context_; }
  std::vector<at::Tensor> get(int64_t i) const override {
    at::Tensor window = tokens_.narrow(0, i * context_, context_ + 1);
    return {window.narrow(0, 0, context_), window.narrow(0, 1, context_)};
  }

 private:
  at::Tensor tokens_;
  int64_t context_;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t epochs = 2, batch = 32;
  std::string resume, save;
  GPTOptions options;
  options.depth = 2;
  options.width = 64;
  options.heads = 4;
  options.context = 32;
  const char* usage =
      "usage: zero-run --config-file launch.yaml zero-accelerate-gpt [--epochs 2] [--depth 2] [--width 64]\n"
      "                [--context 32] [--batch 32] [--resume DIR] [--save DIR]\n"
      "(zero-run config --output launch.yaml --num-processes 2 --zero-stage 2 writes a launch config)\n";
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (key == "-h" || key == "--help") {
      std::fputs(usage, stdout);
      return 0;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "zero-accelerate-gpt: %s needs a value\n\n%s", argv[argc - 1], usage);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    int64_t number = 0;
    const bool numeric = key == "--epochs" || key == "--batch" || key == "--depth" || key == "--width" || key == "--context";
    if (numeric) {
      try {
        size_t used = 0;
        number = std::stoll(value, &used);
        if (used != value.size() || number < 1) throw std::invalid_argument(value);
      } catch (const std::exception&) {
        std::fprintf(stderr, "zero-accelerate-gpt: %s %s: a whole number >= 1\n", key.c_str(), value.c_str());
        return 2;
      }
    }
    if (key == "--epochs") epochs = number;
    else if (key == "--batch") batch = number;
    else if (key == "--depth") options.depth = number;
    else if (key == "--width") options.width = number;
    else if (key == "--context") options.context = number;
    else if (key == "--resume") resume = value;
    else if (key == "--save") save = value;
    else {
      std::fprintf(stderr, "zero-accelerate-gpt: unknown option %s\n\n%s", key.c_str(), usage);
      return 2;
    }
  }
  try {
    // Before training, what the first and last lines would refuse (Note [Refuse at the start]).
    if (!save.empty()) zero::check_save_dir(save, "--save");
    if (!resume.empty()) zero::checkpoint_to_load(resume);
    zero::AcceleratorOptions accelerate;
    accelerate.split_batches = true;
    zero::Accelerator acc(accelerate);

    CorpusOptions corpus_options;
    corpus_options.num_sentences = 4000;
    Corpus corpus(corpus_options);
    options.vocab_size = corpus.vocab_size();
    auto train = std::make_shared<Windows>(corpus.train_tokens(), options.context);
    auto val = std::make_shared<Windows>(corpus.validation_tokens(), options.context);
    zero::DataLoaderOptions train_options;
    train_options.batch_size = batch;
    zero::DataLoaderOptions val_options = train_options;
    val_options.shuffle = false;
    auto train_loader = acc.prepare(train, train_options);
    auto val_loader = acc.prepare(val, val_options);

    torch::manual_seed(0);
    GPT model(options);
    const int64_t parameters = model->num_parameters();  // before stage 3 releases them
    zero::OptimizerConfig adamw;
    adamw.type = "AdamW";
    adamw.params.lr = 3e-3;
    adamw.params.betas = {0.9, 0.95};
    adamw.params.weight_decay = 0.01;
    acc.prepare(model, adamw);
    if (!resume.empty()) acc.load_state(resume);

    // Mean validation loss over every validation window (padding dropped).
    auto validate = [&] {
      torch::NoGradGuard no_grad;
      model->eval();
      double sum = 0;
      int64_t count = 0;
      val_loader.set_epoch(0);
      for (const auto& b : val_loader) {
        at::Tensor logits = model->forward(b[0]);
        at::Tensor per_window =
            torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), b[1].reshape({-1}),
                                                 torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone))
                .reshape({b[0].size(0), -1})
                .mean(1);
        at::Tensor all = acc.gather_for_metrics(per_window);
        sum += all.sum().item<double>();
        count += all.size(0);
      }
      model->train();
      return sum / static_cast<double>(count);
    };

    const double initial = validate();
    acc.print("zero-accelerate-gpt: " + std::to_string(parameters) + " parameters, " +
              std::to_string(acc.num_processes()) + " process(es), mixed precision " + acc.mixed_precision() +
              ", ZeRO stage " + std::to_string(acc.ds_config().zero_optimization.stage) + ", " +
              std::to_string(train->size()) + " training windows in global batches of " + std::to_string(batch));
    for (int64_t epoch = train_loader.epoch(); epoch < epochs; ++epoch) {
      train_loader.set_epoch(epoch);
      for (const auto& b : train_loader) {
        acc.accumulate([&] {
          acc.backward(model->loss(b[0], b[1]));
          if (acc.sync_gradients()) acc.clip_grad_norm(1.0);
        });
      }
      char line[160];
      std::snprintf(line, sizeof line, "zero-accelerate-gpt: epoch %lld: validation loss %.3f", (long long)epoch,
                    validate());
      acc.print(line);
      if (!save.empty()) acc.save_state(save);
    }
    const double final_loss = validate();
    char line[160];
    std::snprintf(line, sizeof line, "zero-accelerate-gpt: validation loss %.3f -> %.3f nats/char (%s)", initial,
                  final_loss, final_loss < 0.75 * initial ? "learning" : "NOT LEARNING");
    acc.print(line);
    return final_loss < 0.75 * initial ? 0 : 1;
  } catch (const zero::Error& e) {
    std::fprintf(stderr, "zero-accelerate-gpt: %s\n", e.what());
    return 2;
  }
}
