// zero-llama: a Hugging Face Llama checkpoint evaluated with zero.
//
//   zero-run --nproc N zero-llama eval --hf-dir DIR --tokens FILE
//                                      [--tokens-dtype uint16|uint32] [--ctx T]
//
// The token file (raw little-endian ids, nanoGPT's uint16 or uint32) is
// memory-mapped and cut into consecutive sequences of T tokens (a shorter
// remainder dropped); each gives T-1 next-token predictions. The last line
// printed is "loss X": the mean cross-entropy over all of them, the ranks
// sharing the sequences. T defaults to max_position_embeddings.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "llama/llama.h"
#include "zero/zero.h"

namespace {

using zero_examples::llama::LlamaConfig;
using zero_examples::llama::LlamaForCausalLM;

const char* const kUsage =
    "usage: zero-llama eval --hf-dir DIR --tokens FILE [--tokens-dtype uint16|uint32] [--ctx T]\n";

struct Args {
  std::string command, hf_dir, tokens, tokens_dtype = "uint16";
  int64_t ctx = 0;
};

Args parse(int argc, char** argv) {
  if (argc < 2) throw std::invalid_argument("no command given (eval)");
  Args a;
  a.command = argv[1];
  if (a.command != "eval") throw std::invalid_argument("unknown command \"" + a.command + "\" (eval)");
  std::map<std::string, std::string*> texts{{"--hf-dir", &a.hf_dir}, {"--tokens", &a.tokens}, {"--tokens-dtype", &a.tokens_dtype}};
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[i + 1];
    if (texts.count(flag)) {
      *texts[flag] = value;
    } else if (flag == "--ctx") {
      if (value.empty() || value.size() > 9 || value.find_first_not_of("0123456789") != std::string::npos || std::stoll(value) < 2)
        throw std::invalid_argument("--ctx " + value + ": a number of tokens, 2 or more");
      a.ctx = std::stoll(value);
    } else {
      throw std::invalid_argument("unknown option " + flag);
    }
  }
  if (a.hf_dir.empty() || a.tokens.empty()) throw std::invalid_argument("eval needs --hf-dir and --tokens");
  if (a.tokens_dtype != "uint16" && a.tokens_dtype != "uint32")
    throw std::invalid_argument("--tokens-dtype " + a.tokens_dtype + ": uint16 or uint32");
  return a;
}

// A token file mapped read-only; ids read as int64.
class TokenFile {
 public:
  TokenFile(const std::string& path, size_t width) : path_(path), width_(width) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))
      throw std::invalid_argument("cannot read the token file " + path + " (a regular file of token ids)");
    bytes_ = static_cast<size_t>(st.st_size);
    if (bytes_ % width_ != 0)
      throw std::invalid_argument("the token file " + path + " has " + std::to_string(bytes_) + " bytes, not a multiple of " +
                                  std::to_string(width_) + " (--tokens-dtype " + (width_ == 2 ? "uint16" : "uint32") + ")");
    if (bytes_ > 0) {
      data_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd_, 0);
      if (data_ == MAP_FAILED) throw std::invalid_argument("cannot map the token file " + path);
    }
  }
  ~TokenFile() {
    if (data_ && data_ != MAP_FAILED) ::munmap(data_, bytes_);
    if (fd_ >= 0) ::close(fd_);
  }
  int64_t size() const { return static_cast<int64_t>(bytes_ / width_); }
  int64_t at(int64_t i) const {
    const auto* p = static_cast<const unsigned char*>(data_) + i * width_;
    int64_t v = 0;
    for (size_t b = 0; b < width_; ++b) v |= static_cast<int64_t>(p[b]) << (8 * b);
    return v;
  }
  // Every id below `vocab`, or an error naming the byte offset of the first that is not.
  void check(int64_t count, int64_t vocab) const {
    for (int64_t i = 0; i < count; ++i)
      if (at(i) >= vocab)
        throw std::invalid_argument("the token file " + path_ + " holds id " + std::to_string(at(i)) + " at byte offset " +
                                    std::to_string(i * static_cast<int64_t>(width_)) + ", not below the model's vocab_size " +
                                    std::to_string(vocab));
  }
  at::Tensor sequence(int64_t first, int64_t length) const {
    at::Tensor ids = torch::empty({1, length}, torch::kLong);
    auto* out = ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < length; ++i) out[i] = at(first + i);
    return ids;
  }

 private:
  std::string path_;
  size_t width_;
  int fd_ = -1;
  size_t bytes_ = 0;
  void* data_ = nullptr;
};

int eval(const Args& a) {
  const LlamaConfig config = LlamaConfig::from_file(a.hf_dir + "/config.json");
  const int64_t ctx = a.ctx > 0 ? a.ctx : config.max_position_embeddings;
  if (ctx > config.max_position_embeddings)
    throw std::invalid_argument("--ctx " + std::to_string(ctx) + " is beyond the model's max_position_embeddings " +
                                std::to_string(config.max_position_embeddings));
  const TokenFile tokens(a.tokens, a.tokens_dtype == "uint16" ? 2 : 4);
  const int64_t sequences = tokens.size() / ctx;
  if (sequences == 0)
    throw std::invalid_argument("the token file " + a.tokens + " holds " + std::to_string(tokens.size()) +
                                " tokens, fewer than one sequence of --ctx " + std::to_string(ctx));
  tokens.check(sequences * ctx, config.vocab_size);

  torch::manual_seed(0);
  LlamaForCausalLM model(config);
  zero::Engine engine = zero::initialize(zero::Config::from_json(
      R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0}}})"), model);
  engine.load_weights(a.hf_dir);
  model->eval();
  const int rank = engine.group().rank(), world = engine.group().size();
  double total = 0;
  torch::NoGradGuard no_grad;
  for (int64_t s = rank; s < sequences; s += world) {
    at::Tensor ids = tokens.sequence(s * ctx, ctx);
    at::Tensor logits = model->forward(ids).to(torch::kFloat);
    at::Tensor ce = torch::nn::functional::cross_entropy(
        logits[0].slice(0, 0, ctx - 1), ids[0].slice(0, 1, ctx),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    total += ce.to(torch::kDouble).sum().item<double>();
  }
  at::Tensor sum = torch::tensor({total}, torch::kDouble);
  engine.group().all_reduce(sum, zero::comm::ReduceOp::Sum);
  if (rank == 0) {
    std::printf("%lld sequences of %lld tokens, %lld predictions\n", static_cast<long long>(sequences),
                static_cast<long long>(ctx), static_cast<long long>(sequences * (ctx - 1)));
    std::printf("loss %.10g\n", sum.item<double>() / static_cast<double>(sequences * (ctx - 1)));
  }
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
    return eval(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-llama: error: %s\n", e.what());
    return 1;
  }
}
