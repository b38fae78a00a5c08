// The main job's data: a small English-like text corpus generated at run
// time from a seed (nothing downloaded, nothing read from disk), a
// character-level tokenizer, and a deterministic batcher whose global batches
// do not depend on the world size.
//
// The text comes from a tiny probabilistic grammar, one sentence per line:
//   the small robot carries a red box to the market .
//   seven plus two is nine .
//   twelve minus five is seven .
//   three times four is twelve .
//   the cat has a blue key . who has the blue key ? the cat .
//   count four five six seven .
//   the old farmer sleeps in the garden .
// Words are spelled the same every time, arithmetic facts are true, the
// "who has" answer is copied from earlier in the line and counts continue:
// a character-level model goes from ln(vocab) ~ 3.4 nats/char to well below
// 1.5 within a few hundred steps and keeps improving on the long-range parts.
//
// Everything here uses its own integer RNG (splitmix64), never std::
// distributions or torch generators, so the text and the batches are the
// same on every machine, standard library and LibTorch version.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace zero_examples {

// Character-level tokenizer: the vocabulary is the sorted set of distinct
// characters of the text it was built from; token id = rank in that set.
class Tokenizer {
 public:
  explicit Tokenizer(const std::string& text);

  int64_t vocab_size() const { return static_cast<int64_t>(chars_.size()); }
  const std::string& chars() const { return chars_; }  // id -> character

  // Throws std::invalid_argument on a character outside the vocabulary.
  std::vector<int64_t> encode(const std::string& text) const;
  at::Tensor encode_tensor(const std::string& text) const;  // 1-D int64
  // Throws std::out_of_range on an id outside [0, vocab_size).
  std::string decode(const std::vector<int64_t>& ids) const;
  std::string decode(const at::Tensor& ids) const;  // any shape, int64, read in order

 private:
  std::string chars_;
  std::array<int, 256> index_;  // byte -> id, -1 when absent
};

struct CorpusOptions {
  uint64_t seed = 1234;
  int64_t num_sentences = 20000;      // ~ 45 characters each
  double validation_fraction = 0.1;   // the last part of the text, in [0, 1)
};

// All characters the grammar can emit (letters of its words, ' ', '.', '?',
// '\n'), sorted. The corpus tokenizer is built from this, so the vocabulary
// (29 symbols: "\n .?" and the letters but j) does not depend on the seed or
// the corpus size.
std::string grammar_alphabet();

// `num_sentences` lines of the grammar, each ending in '\n'; a pure function
// of (seed, num_sentences), and a prefix of the text for more sentences.
std::string generate_text(uint64_t seed, int64_t num_sentences);

class Corpus {
 public:
  explicit Corpus(const CorpusOptions& options = CorpusOptions());

  const CorpusOptions& options() const { return options_; }
  const std::string& text() const { return text_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  int64_t vocab_size() const { return tokenizer_.vocab_size(); }

  at::Tensor tokens() const { return tokens_; }              // whole text, 1-D int64
  at::Tensor train_tokens() const;                           // first (1 - validation_fraction)
  at::Tensor validation_tokens() const;                      // the rest

 private:
  CorpusOptions options_;
  std::string text_;
  Tokenizer tokenizer_;
  at::Tensor tokens_;
  int64_t split_;  // first validation token
};

struct Batch {
  at::Tensor inputs;   // [micro_batch, context] int64
  at::Tensor targets;  // [micro_batch, context] int64: inputs shifted left by one token
};

struct BatcherOptions {
  uint64_t seed = 0;
  int64_t gradient_accumulation_steps = 1;  // gas, used to number global batches
};

// Samples training windows from a 1-D token tensor.
//
// Determinism and world-size independence: there is one fixed infinite
// stream of sequences; sequence n is the window of context+1 tokens starting
// at an offset drawn from an RNG seeded by (seed, n) only. Global batch
// g = step * gas + micro_step is sequences [g*W*m, (g+1)*W*m) of that stream
// (W = world_size, m = micro_batch), and rank r takes its rows
// [r*m, (r+1)*m). Hence:
//   - the global batch of (step, micro_step) is the same tensor for every
//     world size with the same W*m: concatenating the slices of ranks
//     0..W-1 gives identical tensors for W = 1, 2, 4, ...;
//   - more strongly, the sequences of optimizer step s are stream positions
//     [s*B, (s+1)*B) with B = gas*W*m the train batch size, however B is
//     split into ranks, micro batches and accumulation steps; so a run on
//     1 rank with gas=4 sees exactly the data of a run on 4 ranks with
//     gas=1 (parity tests rely on this).
// No state: next_batch may be called in any order, and resuming at a step
// needs nothing but the step number.
class Batcher {
 public:
  Batcher(at::Tensor tokens, const BatcherOptions& options = BatcherOptions());

  Batch next_batch(int64_t micro_batch, int64_t context, int rank, int world_size, int64_t step,
                   int micro_step) const;

  // Sequences [first, first + count) of the stream, as rows.
  Batch sequences(int64_t first, int64_t count, int64_t context) const;

  // Start offset in the token tensor of sequence n for this context.
  int64_t sequence_offset(int64_t n, int64_t context) const;

  const BatcherOptions& options() const { return options_; }
  int64_t num_tokens() const { return tokens_.numel(); }

 private:
  at::Tensor tokens_;
  BatcherOptions options_;
};

}  // namespace zero_examples
