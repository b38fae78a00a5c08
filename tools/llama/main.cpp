// zero-llama: a Hugging Face Llama checkpoint evaluated and trained with zero.
//
//   zero-run --nproc N zero-llama eval --hf-dir DIR --tokens FILE
//                                      [--tokens-dtype uint16|uint32] [--ctx T] [--config DS_CONFIG]
//
// The token file (raw little-endian ids, nanoGPT's uint16 or uint32) is
// memory-mapped and cut into consecutive sequences of T tokens (a shorter
// remainder dropped); each gives T-1 next-token predictions. The last line
// printed is "loss X": the mean cross-entropy over all of them, the ranks
// sharing the sequences. T defaults to max_position_embeddings. --config:
// a ds_config for the layout (e.g. tensor_parallel.autotp_size: the
// tensor-parallel ranks of a group evaluate the same sequences).
//
//   zero-run --nproc N zero-llama train --hf-dir DIR --config DS_CONFIG --tokens FILE --steps N --ctx T
//                                       [--tokens-dtype D] [--save-hf OUT] [--save CKPT] [--load CKPT]
//
// trains with zero from the Hugging Face weights (or resumes CKPT) up to
// global step N and prints one line per step. The sequences come through
// the engine's data loader, in the file's order, repeated: micro-batch k of
// step s on data-parallel rank d holds the sequences (s*gas + k)*micro*dp +
// d*micro + i (i < micro), modulo the file's sequences: the same data at
// any world size with the same global batch. --save writes a zero checkpoint;
// --save-hf the weights in Hugging Face's layout (model.safetensors and
// config.json), which transformers loads. --timing adds each step's wall
// time in seconds to its line ("time S"), for bench/run_llama.sh. --tiles N
// computes every MLP and the loss over N slices of the sequence (ALST's
// tiled compute, zero::tiled_compute), --attention-block R the attention
// over blocks of R query rows (blockwise_causal_attention): the same losses,
// less memory at long contexts.
#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/llama.h"
#include "zero/zero.h"

namespace {

using zero::llama::LlamaConfig;
using zero::llama::LlamaForCausalLM;

const char* const kUsage =
    "usage: zero-llama eval --hf-dir DIR --tokens FILE [--tokens-dtype uint16|uint32] [--ctx T] [--config DS_CONFIG]\n"
    "       zero-llama train --hf-dir DIR --config DS_CONFIG --tokens FILE --steps N --ctx T\n"
    "                        [--tokens-dtype uint16|uint32] [--save-hf OUT] [--save CKPT] [--load CKPT] [--timing]\n"
    "       both: [--tiles N] (the MLPs and the loss over N slices of each sequence)\n"
    "             [--attention-block R] (attention over blocks of R query rows; 0: eager, the default)\n";

struct Args {
  std::string command, hf_dir, tokens, tokens_dtype = "uint16", config, save_hf, save, load;
  int64_t ctx = 0, steps = -1, tiles = 1, attention_block = 0;
  bool timing = false;
};

Args parse(int argc, char** argv) {
  if (argc < 2) throw std::invalid_argument("no command given (eval)");
  Args a;
  a.command = argv[1];
  if (a.command != "eval" && a.command != "train")
    throw std::invalid_argument("unknown command \"" + a.command + "\" (eval or train)");
  std::map<std::string, std::string*> texts{{"--hf-dir", &a.hf_dir}, {"--tokens", &a.tokens}, {"--tokens-dtype", &a.tokens_dtype},
                                            {"--config", &a.config}, {"--save-hf", &a.save_hf},
                                            {"--save", &a.save},     {"--load", &a.load}};
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--timing") {  // a flag without a value
      a.timing = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[i + 1];
    if (texts.count(flag)) {
      *texts[flag] = value;
    } else if (flag == "--ctx" || flag == "--steps" || flag == "--tiles" || flag == "--attention-block") {
      const int64_t least = flag == "--ctx" ? 2 : flag == "--tiles" ? 1 : 0;
      if (value.empty() || value.size() > 9 || value.find_first_not_of("0123456789") != std::string::npos ||
          std::stoll(value) < least)
        throw std::invalid_argument(flag + " " + value + (flag == "--ctx"     ? ": a number of tokens, 2 or more"
                                                         : flag == "--tiles" ? ": a number of slices, 1 or more"
                                                         : flag == "--steps" ? ": a number of steps"
                                                                             : ": a number of query rows, 0 for eager"));
      (flag == "--ctx" ? a.ctx : flag == "--tiles" ? a.tiles : flag == "--steps" ? a.steps : a.attention_block) =
          std::stoll(value);
    } else {
      throw std::invalid_argument("unknown option " + flag);
    }
  }
  if (a.hf_dir.empty() || a.tokens.empty()) throw std::invalid_argument(a.command + " needs --hf-dir and --tokens");
  if (a.command == "train" && (a.config.empty() || a.steps < 0 || a.ctx == 0))
    throw std::invalid_argument("train needs --config, --steps and --ctx");
  if (a.command == "eval" && (!a.save_hf.empty() || !a.save.empty() || !a.load.empty() || a.steps >= 0))
    throw std::invalid_argument("--steps, --save-hf, --save and --load are for train");
  if (a.tokens_dtype != "uint16" && a.tokens_dtype != "uint32")
    throw std::invalid_argument("--tokens-dtype " + a.tokens_dtype + ": uint16 or uint32");
  return a;
}

// The token file's sequences repeated to `size` samples: sample i is
// sequence i modulo the file's.
class Repeated : public zero::Dataset {
 public:
  Repeated(std::shared_ptr<const zero::TokenDataset> file, int64_t size) : file_(std::move(file)), size_(size) {}
  int64_t size() const override { return size_; }
  std::vector<at::Tensor> get(int64_t index) const override { return file_->get(index % file_->size()); }
  std::vector<at::Tensor> get_batch(const std::vector<int64_t>& indices) const override {
    std::vector<int64_t> in_file;
    for (int64_t i : indices) in_file.push_back(i % file_->size());
    return file_->get_batch(in_file);
  }

 private:
  std::shared_ptr<const zero::TokenDataset> file_;
  int64_t size_;
};

// The model and its engine: the whole model, or with pipeline.stages > 1
// this rank's stage of the pipeline layer list (llama.h).
struct Trained {
  LlamaForCausalLM model{nullptr};
  std::shared_ptr<zero::pipe::PipelineModule> pipe;
  std::unique_ptr<zero::Engine> engine;
  zero::sp::Group sp;  // set with sequence parallelism
  int64_t micro = 1, gas = 1;

  Trained(const LlamaConfig& config, const zero::Config& ds) {
    micro = ds.batch.train_micro_batch_size_per_gpu.value_or(1);
    gas = ds.batch.gradient_accumulation_steps.value_or(1);
    torch::manual_seed(0);
    if (ds.parallelism.pipeline_parallel() > 1) {
      auto world = zero::comm::init_process_group();
      auto mesh = std::make_shared<zero::Mesh>(world, static_cast<int>(ds.parallelism.tensor_parallel()),
                                               static_cast<int>(ds.parallelism.pipeline_parallel()),
                                               static_cast<int>(ds.parallelism.sequence_parallel()));
      if (ds.parallelism.sequence_parallel() > 1) sp = mesh->sp_group();  // Ulysses in every decoder layer
      zero::pipe::PipelineOptions options;
      options.loss = sp ? zero::llama::pipeline_loss_over(sp) : zero::llama::pipeline_loss;
      pipe = std::make_shared<zero::pipe::PipelineModule>(zero::llama::pipeline_layers(config, sp), mesh, options);
      zero::InitOptions init;
      init.group = world;
      init.mesh = mesh;
      engine = std::make_unique<zero::Engine>(zero::initialize(ds, pipe, init));
    } else if (ds.parallelism.tensor_parallel() > 1) {
      // Built on the mesh: the vocabulary split (embedding and head), then
      // AutoTP's Llama rules for the decoder layers.
      auto world = zero::comm::init_process_group();
      auto mesh = std::make_shared<zero::Mesh>(world, static_cast<int>(ds.parallelism.tensor_parallel()), 1,
                                               static_cast<int>(ds.parallelism.sequence_parallel()));
      model = LlamaForCausalLM(config, mesh->tp_group());
      zero::tp::auto_tensor_parallel(*model, mesh->tp_group(), zero::tp::llama_rules());
      zero::InitOptions init;
      init.group = world;
      init.mesh = mesh;
      engine = std::make_unique<zero::Engine>(zero::initialize(ds, model, init));
      // Ulysses over each tp rank's heads (the mesh puts sp between tp and dp).
      if (ds.parallelism.sequence_parallel() > 1) sp = mesh->sp_group();
      model->sequence_parallel(sp);
    } else {
      model = LlamaForCausalLM(config);
      engine = std::make_unique<zero::Engine>(zero::initialize(ds, model));
      // Ulysses: the ranks of one sp group read one sequence, each its tokens.
      if (ds.parallelism.sequence_parallel() > 1) sp = engine->mesh().sp_group();
      model->sequence_parallel(sp);
    }
  }
  void load_weights(const LlamaConfig& config, const std::string& dir) {
    zero::WeightsLoadOptions o;
    if (pipe) o.name_in_files = [config](const std::string& name) { return zero::llama::hf_name(config, name); };
    engine->load_weights(dir, o);
  }
  zero::comm::ProcessGroup& dp() { return *engine->mesh().dp_group(); }
  void long_context(int64_t tiles, int64_t attention_block) {
    if (tiles <= 1 && attention_block == 0) return;
    if (pipe) {
      throw std::invalid_argument("--tiles and --attention-block with pipeline stages: not built yet; leave them out");
    }
    model->tiled(tiles, tiles);
    model->blockwise_attention(attention_block);
  }
  // Rows of ctx tokens -> the model's inputs and next-token labels. With
  // sequence parallelism every token is an input (the last one's label is
  // -100, none), so that ctx splits over the ranks, and each rank keeps its
  // slice of both: the same predictions, and so the same mean, as ctx - 1
  // inputs on one rank.
  std::pair<at::Tensor, at::Tensor> inputs_and_labels(const at::Tensor& batch) const {
    const int64_t T = batch.size(1);
    if (!sp) return {batch.slice(1, 0, T - 1), batch.slice(1, 1, T)};
    at::Tensor labels = torch::cat({batch.slice(1, 1, T), torch::full({batch.size(0), 1}, -100, batch.options())}, 1);
    return {zero::sp::own_tokens(batch, sp), zero::sp::own_tokens(labels, sp)};
  }
  // One micro-batch's mean loss (whole model), or one optimizer step's (pipeline).
  // `rows(k)`: micro-batch k's token sequences [micro, T].
  double run(const std::function<at::Tensor(int64_t)>& rows, bool training) {
    if (pipe) {
      int64_t k = 0;
      auto next = [&]() -> zero::Engine::Batch {
        auto [inputs, labels] = inputs_and_labels(rows(k++));
        return {inputs, labels};
      };
      return training ? engine->train_batch(next) : engine->eval_batch(next);
    }
    double total = 0;
    for (int64_t k = 0; k < (training ? gas : 1); ++k) {
      const auto [inputs, labels] = inputs_and_labels(rows(k));
      at::Tensor loss = model->loss(inputs, labels);
      if (training) {
        engine->backward(loss);
        engine->step();
      }
      total += loss.item<double>();
    }
    return total / static_cast<double>(training ? gas : 1);
  }
};

int64_t ways(const zero::Config& ds) { return ds.parallelism.tensor_parallel() * ds.parallelism.pipeline_parallel(); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string gigabytes(double bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.3g GB", bytes / 1e9);
  return text;
}

// The model config.json describes, against the weights and this machine,
// before LlamaForCausalLM allocates it: an absurd size (vocab_size 1e12,
// hidden_size 2^40) is named here in one line instead of ending in
// LibTorch's allocator. `weights`: the folder load_weights will read, or
// empty (a checkpoint is loaded instead). `split`: tp x pp, the ways each
// rank's share of the model is cut.
void check_model_size(const LlamaConfig& config, const std::string& hf_dir, bool weights, int64_t split) {
  using zero::llama::elements;
  using zero::llama::parameter_count;
  const std::string where = hf_dir + "/config.json";
  if (weights) {
    const auto files = zero::weight_shapes(hf_dir);
    for (const auto& p : zero::llama::parameter_shapes(config, 2)) {
      const auto it = files.find(p.name);
      if (it == files.end() || it->second == p.shape) continue;  // a missing tensor: load_weights names it
      throw std::invalid_argument(where + ": " + p.keys + " make " + p.name + " " + shape_text(p.shape) +
                                  ", but the weights in " + hf_dir + " hold " + shape_text(it->second) +
                                  "; this config.json does not describe these weights");
    }
  }
  // Each rank builds its share whole in fp32 before initialize partitions it.
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int64_t ranks = local && std::atoll(local) > 0 ? std::atoll(local) : 1;
  const double bytes = static_cast<double>(parameter_count(config)) * 4 / static_cast<double>(split);
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (bytes * static_cast<double>(ranks) <= memory) return;
  // The key to look at: the largest tensor's, or the layer count's when the layers weigh more.
  std::string keys;
  int64_t largest = 0, layer = 0;
  for (const auto& p : zero::llama::parameter_shapes(config, 1)) {
    if (p.name.rfind("model.layers.", 0) == 0) layer += elements(p.shape);
    if (elements(p.shape) > largest) largest = elements(p.shape), keys = p.keys + " (" + p.name + " " + shape_text(p.shape) + ")";
  }
  if (elements({layer, config.num_hidden_layers}) > largest)
    keys = "num_hidden_layers " + std::to_string(config.num_hidden_layers) + " and the layer sizes";
  throw std::invalid_argument(where + ": " + keys + " make a model of " + std::to_string(parameter_count(config)) +
                              " parameters, " + gigabytes(bytes) + " in fp32 for each of " + std::to_string(ranks) +
                              " rank(s) to build, above this machine's " + gigabytes(memory) +
                              " of memory; check the config's sizes");
}

int eval(const Args& a) {
  const LlamaConfig config = LlamaConfig::from_file(a.hf_dir + "/config.json");
  const int64_t ctx = a.ctx > 0 ? a.ctx : config.max_position_embeddings;
  if (ctx > config.max_position_embeddings)
    throw std::invalid_argument("--ctx " + std::to_string(ctx) + " is beyond the model's max_position_embeddings " +
                                std::to_string(config.max_position_embeddings));
  const zero::TokenDataset tokens(a.tokens, ctx, a.tokens_dtype == "uint16" ? 2 : 4);
  const int64_t sequences = tokens.size();
  if (sequences == 0)
    throw std::invalid_argument("the token file " + a.tokens + " holds " + std::to_string(tokens.tokens()) +
                                " tokens, fewer than one sequence of --ctx " + std::to_string(ctx));
  tokens.check_ids(config.vocab_size);

  const zero::Config ds_config =
      a.config.empty()
          ? zero::Config::from_json(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0}}})")
          : zero::Config::from_file(a.config);
  check_model_size(config, a.hf_dir, /*weights=*/true, ways(ds_config));
  zero::llama::check_sequence_parallel(config, ds_config.parallelism.sequence_parallel(), ctx);
  Trained t(config, ds_config);
  t.long_context(a.tiles, a.attention_block);
  t.load_weights(config, a.hf_dir);
  t.engine->train(false);
  // Data-parallel ranks share the sequences; tensor-parallel (and pipeline) ranks compute each together.
  zero::comm::ProcessGroup& dp = t.dp();
  double total = 0;
  int64_t evaluated = 0;
  torch::NoGradGuard no_grad;
  if (t.pipe) {
    // Each eval_batch: micro sequences per data-parallel rank, its mean over all of them.
    const int64_t per_call = t.micro * dp.size();
    for (int64_t first = 0; first + per_call <= sequences; first += per_call) {
      auto rows = [&](int64_t) {
        std::vector<int64_t> mine;
        for (int64_t i = 0; i < t.micro; ++i) mine.push_back(first + dp.rank() * t.micro + i);
        return tokens.get_batch(mine)[0];
      };
      total += t.run(rows, false) * static_cast<double>(per_call * (ctx - 1));
      evaluated += per_call;
    }
  } else {
    for (int64_t s = dp.rank(); s < sequences; s += dp.size()) {
      const auto [inputs, labels] = t.inputs_and_labels(tokens.get_batch({s})[0]);
      at::Tensor logits = t.model->forward(inputs).to(torch::kFloat);
      at::Tensor ce = torch::nn::functional::cross_entropy(
          logits[0], labels[0], torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
      total += ce.to(torch::kDouble).sum().item<double>();  // a label of -100 adds 0
    }
    // Each sequence's predictions are on its sp ranks: the sum is over ZeRO's group (sp x dp).
    at::Tensor sum = torch::tensor({total}, torch::kDouble);
    t.engine->mesh().zero_group()->all_reduce(sum, zero::comm::ReduceOp::Sum);
    total = sum.item<double>();
    evaluated = sequences;
  }
  if (t.engine->group().rank() == 0) {
    std::printf("%lld sequences of %lld tokens, %lld predictions\n", static_cast<long long>(evaluated),
                static_cast<long long>(ctx), static_cast<long long>(evaluated * (ctx - 1)));
    std::printf("loss %.10g\n", total / static_cast<double>(evaluated * (ctx - 1)));
  }
  return 0;
}

// The model's weights in Hugging Face's layout: model.safetensors and the
// config.json the model was built from.
// config.json is written to a fresh file and renamed over the old name, so
// a link planted at OUT/config.json is replaced, never written through.
void save_hf(zero::Engine& engine, const std::string& hf_dir, const std::string& out) {
  if (!engine.save_16bit_model(out))  // a collective; rank 0 writes (check_at_start refused the config that declines)
    throw std::logic_error("save_16bit_model declined after the start checks passed");
  if (engine.group().rank() != 0) return;
  std::ifstream in(hf_dir + "/config.json", std::ios::binary);  // read once already, as the model's config
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw std::runtime_error("cannot read " + hf_dir + "/config.json again to save it beside the weights");
  const std::string staged = out + "/.config.json." + std::to_string(::getpid()) + ".tmp";
  const int fd = ::open(staged.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + staged + ": " + std::strerror(errno));
  const std::string bytes = text.str();
  const bool written = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()) && ::fsync(fd) == 0;
  const int saved_errno = errno;
  ::close(fd);
  if (!written || std::rename(staged.c_str(), (out + "/config.json").c_str()) != 0) {
    const std::string why = std::strerror(written ? errno : saved_errno);
    ::unlink(staged.c_str());
    throw std::runtime_error("cannot write " + out + "/config.json: " + why);
  }
}

// What would fail only after the last step, refused before the first
// (Note [Refuse at the start], engine/start_checks.cpp).
void check_at_start(const Args& a, const zero::Config& ds_config) {
  if (!a.save_hf.empty()) {
    if (ds_config.parallelism.pipeline_parallel() > 1)
      throw std::invalid_argument("--save-hf with pipeline stages: save with --save and write Hugging Face's files with "
                                  "zero-ckpt export --to hf (each stage holds its own layers)");
    const auto& z = ds_config.zero_optimization;
    if (z.stage == 3 && !z.stage3_gather_16bit_weights_on_model_save)
      throw std::invalid_argument("--save-hf at ZeRO stage 3 needs \"stage3_gather_16bit_weights_on_model_save\": true in "
                                  "zero_optimization (DeepSpeed's rule), or --save and zero-ckpt export --to hf");
    zero::check_save_dir(a.save_hf, "--save-hf");
  }
  if (!a.save.empty()) zero::check_save_dir(a.save, "--save");
  if (!a.load.empty()) zero::checkpoint_to_load(a.load);
}

int train(const Args& a) {
  const zero::Config ds_config = zero::Config::from_file(a.config);
  check_at_start(a, ds_config);
  const LlamaConfig config = LlamaConfig::from_file(a.hf_dir + "/config.json");
  if (a.ctx > config.max_position_embeddings)
    throw std::invalid_argument("--ctx " + std::to_string(a.ctx) + " is beyond the model's max_position_embeddings " +
                                std::to_string(config.max_position_embeddings));
  auto tokens = std::make_shared<zero::TokenDataset>(a.tokens, a.ctx, a.tokens_dtype == "uint16" ? 2 : 4);
  if (tokens->size() == 0)
    throw std::invalid_argument("the token file " + a.tokens + " holds fewer than one sequence of --ctx " + std::to_string(a.ctx));
  tokens->check_ids(config.vocab_size);
  check_model_size(config, a.hf_dir, /*weights=*/a.load.empty(), ways(ds_config));
  zero::llama::check_sequence_parallel(config, ds_config.parallelism.sequence_parallel(), a.ctx);

  Trained t(config, ds_config);
  t.long_context(a.tiles, a.attention_block);
  if (a.load.empty()) {
    t.load_weights(config, a.hf_dir);
  } else {
    t.engine->load_checkpoint(a.load);
  }
  zero::comm::ProcessGroup& dp = t.dp();
  // The engine's data loader, in order, over the file's sequences repeated
  // as often as the steps need: global batch b (micro x dp sequences) is one
  // micro-batch of every data-parallel rank. On resume the position follows
  // from the steps taken.
  const int64_t global_batch = t.micro * dp.size();
  const int64_t needed = std::max<int64_t>(a.steps, 1) * t.gas * global_batch;
  zero::DataLoaderOptions in_order;
  in_order.shuffle = false;
  in_order.drop_last = true;
  zero::DataLoader loader = t.engine->data_loader(std::make_shared<Repeated>(tokens, needed), in_order);
  loader.set_position({0, t.engine->global_steps() * t.gas * global_batch});
  std::optional<zero::DataLoader::iterator> it;
  auto next_rows = [&](int64_t) {
    if (!it) it = loader.begin();
    at::Tensor batch = (**it)[0];
    ++*it;
    return batch;
  };
  const bool print = t.engine->group().rank() == 0;
  for (int64_t step = t.engine->global_steps(); step < a.steps; ++step) {
    const auto started = std::chrono::steady_clock::now();
    double loss = t.run(next_rows, true);
    if (!t.pipe) {  // train_batch averages over the data-parallel ranks itself
      at::Tensor mean = torch::tensor({loss}, torch::kDouble);
      dp.all_reduce(mean, zero::comm::ReduceOp::Sum);
      loss = mean.item<double>() / dp.size();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (print) {
      std::printf("step %lld loss %.10g grad_norm %.10g lr %.6g", static_cast<long long>(step + 1), loss,
                  t.engine->last_grad_norm(), t.engine->lr());
      if (a.timing) std::printf(" time %.6f", seconds);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
  if (!a.save.empty()) t.engine->save_checkpoint(a.save);
  if (!a.save_hf.empty()) save_hf(*t.engine, a.hf_dir, a.save_hf);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "zero-llama: %s\n\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    return a.command == "eval" ? eval(a) : train(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-llama: error: %s\n", e.what());
    return 1;
  }
}
