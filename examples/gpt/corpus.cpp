#include "gpt/corpus.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace zero_examples {

namespace {

// ---- RNG: splitmix64, the same numbers everywhere ------------------------

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_); }
  // Uniform in [0, n), n > 0 (multiply-high: no modulo, no platform-specific
  // distribution).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
  int64_t between(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo + 1)));
  }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }

 private:
  uint64_t state_;
};

// ---- the grammar ---------------------------------------------------------

const std::vector<std::string> kNouns = {"robot", "cat", "dog", "farmer", "child",
                                         "teacher", "bird", "king", "queen", "sailor"};
const std::vector<std::string> kAdjectives = {"small", "big", "old", "young", "happy", "quiet", "clever", "tired"};
const std::vector<std::string> kVerbs = {"carries", "brings", "takes", "pushes", "sends", "throws"};
const std::vector<std::string> kColors = {"red", "blue", "green", "yellow", "white", "black"};
const std::vector<std::string> kObjects = {"box", "ball", "book", "apple", "cup", "letter", "key", "stone"};
const std::vector<std::string> kPlaces = {"market", "school", "river", "garden",
                                          "house", "castle", "village", "station"};
const std::vector<std::string> kNumbers = {"zero",     "one",     "two",       "three",    "four",
                                           "five",     "six",     "seven",     "eight",    "nine",
                                           "ten",      "eleven",  "twelve",    "thirteen", "fourteen",
                                           "fifteen",  "sixteen", "seventeen", "eighteen", "nineteen",
                                           "twenty"};
const std::vector<std::string> kOtherWords = {"the", "a",  "to",  "plus",  "minus",  "times", "is",
                                              "has", "who", "count", "sleeps", "in", ".", "?"};

std::string number(int64_t n) { return kNumbers.at(static_cast<size_t>(n)); }

// Every random draw is its own statement: the order of evaluation of the
// operands of `+` is unspecified, and the text must not depend on the compiler.
std::string sentence(Rng& rng) {
  const uint64_t kind = rng.below(100);
  if (kind < 30) {  // the [adj] noun verb a color object to the place .
    const bool with_adjective = rng.below(2) == 1;
    const std::string adjective = with_adjective ? rng.pick(kAdjectives) + " " : std::string();
    const std::string& noun = rng.pick(kNouns);
    const std::string& verb = rng.pick(kVerbs);
    const std::string& color = rng.pick(kColors);
    const std::string& object = rng.pick(kObjects);
    const std::string& place = rng.pick(kPlaces);
    return "the " + adjective + noun + " " + verb + " a " + color + " " + object + " to the " + place + " .";
  }
  if (kind < 50) {  // a plus b is a+b .   (sum <= 20)
    const int64_t a = rng.between(0, 10);
    const int64_t b = rng.between(0, 10);
    return number(a) + " plus " + number(b) + " is " + number(a + b) + " .";
  }
  if (kind < 60) {  // a minus b is a-b .
    const int64_t a = rng.between(0, 20);
    const int64_t b = rng.between(0, a);
    return number(a) + " minus " + number(b) + " is " + number(a - b) + " .";
  }
  if (kind < 65) {  // a times b is a*b .   (product <= 20)
    const int64_t a = rng.between(1, 5);
    const int64_t b = rng.between(0, 20 / a);
    return number(a) + " times " + number(b) + " is " + number(a * b) + " .";
  }
  if (kind < 80) {  // the noun has a color object . who has the color object ? the noun .
    const std::string& noun = rng.pick(kNouns);
    const std::string& color = rng.pick(kColors);
    const std::string& object = rng.pick(kObjects);
    const std::string thing = color + " " + object;
    return "the " + noun + " has a " + thing + " . who has the " + thing + " ? the " + noun + " .";
  }
  if (kind < 90) {  // count a a+1 ... .
    const int64_t start = rng.between(0, 16);
    const int64_t len = rng.between(3, 5);
    std::string s = "count";
    for (int64_t i = 0; i < len && start + i <= 20; ++i) s += " " + number(start + i);
    return s + " .";
  }
  if (kind < 95) {  // the noun is adj .
    const std::string& noun = rng.pick(kNouns);
    const std::string& adjective = rng.pick(kAdjectives);
    return "the " + noun + " is " + adjective + " .";
  }
  // the adj noun sleeps in the place .
  const std::string& adjective = rng.pick(kAdjectives);
  const std::string& noun = rng.pick(kNouns);
  const std::string& place = rng.pick(kPlaces);
  return "the " + adjective + " " + noun + " sleeps in the " + place + " .";
}

}  // namespace

// ---- tokenizer -----------------------------------------------------------

Tokenizer::Tokenizer(const std::string& text) {
  std::set<unsigned char> seen(text.begin(), text.end());
  chars_.assign(seen.begin(), seen.end());
  index_.fill(-1);
  for (size_t i = 0; i < chars_.size(); ++i) index_[static_cast<unsigned char>(chars_[i])] = static_cast<int>(i);
}

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int id = index_[static_cast<unsigned char>(text[i])];
    if (id < 0) {
      throw std::invalid_argument("Tokenizer::encode: character code " +
                                  std::to_string(static_cast<unsigned char>(text[i])) + " at position " +
                                  std::to_string(i) + " is not in the vocabulary");
    }
    ids.push_back(id);
  }
  return ids;
}

at::Tensor Tokenizer::encode_tensor(const std::string& text) const {
  std::vector<int64_t> ids = encode(text);
  return torch::tensor(ids, torch::kLong);
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw std::out_of_range("Tokenizer::decode: id " + std::to_string(id) + " outside [0, " +
                              std::to_string(vocab_size()) + ")");
    }
    out.push_back(chars_[static_cast<size_t>(id)]);
  }
  return out;
}

std::string Tokenizer::decode(const at::Tensor& ids) const {
  at::Tensor flat = ids.to(torch::kCPU, torch::kLong).contiguous().view({-1});
  const int64_t* p = flat.data_ptr<int64_t>();
  return decode(std::vector<int64_t>(p, p + flat.numel()));
}

// ---- corpus --------------------------------------------------------------

std::string grammar_alphabet() {
  std::string all = "\n";
  for (const auto* words : {&kNouns, &kAdjectives, &kVerbs, &kColors, &kObjects, &kPlaces, &kNumbers, &kOtherWords}) {
    for (const auto& w : *words) all += w + " ";
  }
  return Tokenizer(all).chars();
}

std::string generate_text(uint64_t seed, int64_t num_sentences) {
  if (num_sentences < 0) throw std::invalid_argument("generate_text: num_sentences must be >= 0");
  Rng rng(seed);
  std::string text;
  text.reserve(static_cast<size_t>(num_sentences) * 48);
  for (int64_t i = 0; i < num_sentences; ++i) {
    text += sentence(rng);
    text += '\n';
  }
  return text;
}

Corpus::Corpus(const CorpusOptions& options)
    : options_(options), text_(generate_text(options.seed, options.num_sentences)), tokenizer_(grammar_alphabet()) {
  if (!(options.validation_fraction >= 0.0 && options.validation_fraction < 1.0)) {
    throw std::invalid_argument("CorpusOptions: validation_fraction must be in [0, 1) (got " +
                                std::to_string(options.validation_fraction) + ")");
  }
  tokens_ = tokenizer_.encode_tensor(text_);
  split_ = tokens_.numel() - static_cast<int64_t>(static_cast<double>(tokens_.numel()) * options.validation_fraction);
}

at::Tensor Corpus::train_tokens() const { return tokens_.slice(0, 0, split_); }
at::Tensor Corpus::validation_tokens() const { return tokens_.slice(0, split_, tokens_.numel()); }

// ---- batcher -------------------------------------------------------------

Batcher::Batcher(at::Tensor tokens, const BatcherOptions& options)
    : tokens_(tokens.to(torch::kCPU, torch::kLong).contiguous().view({-1})), options_(options) {
  if (options_.gradient_accumulation_steps < 1) {
    throw std::invalid_argument("BatcherOptions: gradient_accumulation_steps must be >= 1 (got " +
                                std::to_string(options_.gradient_accumulation_steps) + ")");
  }
}

int64_t Batcher::sequence_offset(int64_t n, int64_t context) const {
  const int64_t windows = tokens_.numel() - context;  // valid starts: [0, windows)
  if (context < 1 || windows < 1) {
    throw std::invalid_argument("Batcher: " + std::to_string(tokens_.numel()) +
                                " tokens are too few for windows of context " + std::to_string(context) + " + 1");
  }
  // Seeded by (seed, n) only: independent of how the stream is split.
  uint64_t state = options_.seed ^ (0xD1B54A32D192ED03ULL * (static_cast<uint64_t>(n) + 1));
  Rng rng(splitmix64(state));
  return static_cast<int64_t>(rng.below(static_cast<uint64_t>(windows)));
}

Batch Batcher::sequences(int64_t first, int64_t count, int64_t context) const {
  if (first < 0 || count < 1) {
    throw std::invalid_argument("Batcher::sequences: need first >= 0 and count >= 1 (got " + std::to_string(first) +
                                ", " + std::to_string(count) + ")");
  }
  std::vector<int64_t> starts(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) starts[static_cast<size_t>(i)] = sequence_offset(first + i, context);
  at::Tensor index = torch::tensor(starts, torch::kLong).unsqueeze(1) + torch::arange(context + 1, torch::kLong);
  at::Tensor windows = tokens_.index_select(0, index.view({-1})).view({count, context + 1});
  return Batch{windows.slice(1, 0, context).contiguous(), windows.slice(1, 1, context + 1).contiguous()};
}

Batch Batcher::next_batch(int64_t micro_batch, int64_t context, int rank, int world_size, int64_t step,
                          int micro_step) const {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("Batcher::next_batch: rank " + std::to_string(rank) + " outside world of size " +
                                std::to_string(world_size));
  }
  if (micro_step < 0 || micro_step >= options_.gradient_accumulation_steps) {
    throw std::invalid_argument("Batcher::next_batch: micro_step " + std::to_string(micro_step) + " outside [0, " +
                                std::to_string(options_.gradient_accumulation_steps) +
                                ") (gradient_accumulation_steps)");
  }
  if (micro_batch < 1 || step < 0) {
    throw std::invalid_argument("Batcher::next_batch: need micro_batch >= 1 and step >= 0");
  }
  const int64_t global = step * options_.gradient_accumulation_steps + micro_step;  // global batch g
  const int64_t first = (global * world_size + rank) * micro_batch;
  return sequences(first, micro_batch, context);
}

}  // namespace zero_examples
