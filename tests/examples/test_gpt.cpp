// Tests of the main job's model and data (examples/gpt): plain LibTorch, no
// engine. References are independent: formulas, the token tensor itself, a
// separately built model, torch::optim.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gpt/corpus.h"
#include "gpt/gpt.h"

using namespace zero_examples;

namespace {

GPTOptions small_options(int64_t vocab = 28) {
  GPTOptions o;
  o.vocab_size = vocab;
  o.context = 16;
  o.depth = 2;
  o.width = 32;
  o.heads = 4;
  return o;
}

// Parameter count from the architecture, written out independently of the
// model code.
int64_t expected_parameters(const GPTOptions& o) {
  const int64_t C = o.width, V = o.vocab_size, H = o.mlp_ratio * o.width;
  const int64_t per_block = 2 * C            // ln1
                            + 3 * C * C + 3 * C  // attn.qkv
                            + C * C + C          // attn.proj
                            + 2 * C              // ln2
                            + C * H + H          // mlp.fc
                            + H * C + C;         // mlp.proj
  return V * C                      // wte (also the head when tied)
         + o.context * C            // wpe
         + o.depth * per_block + 2 * C  // blocks, ln_f
         + (o.tie_embeddings ? 0 : V * C);
}

bool same_parameters(GPT& a, GPT& b) {
  auto pa = a->named_parameters(), pb = b->named_parameters();
  if (pa.size() != pb.size()) return false;
  for (size_t i = 0; i < pa.size(); ++i) {
    if (pa[i].key() != pb[i].key() || !torch::equal(pa[i].value(), pb[i].value())) return false;
  }
  return true;
}

}  // namespace

// ---- model ----------------------------------------------------------------

TEST(GPT, ShapesAndLoss) {
  torch::manual_seed(0);
  GPTOptions o = small_options();
  GPT model(o);
  at::Tensor tokens = torch::randint(o.vocab_size, {3, 10}, torch::kLong);
  at::Tensor logits = model->forward(tokens);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10, o.vocab_size}));
  EXPECT_EQ(logits.scalar_type(), torch::kFloat);

  // The whole context fits; one more position does not.
  EXPECT_EQ(model->forward(torch::zeros({1, o.context}, torch::kLong)).size(1), o.context);
  EXPECT_THROW(model->forward(torch::zeros({1, o.context + 1}, torch::kLong)), c10::Error);
  EXPECT_THROW(model->forward(torch::zeros({10}, torch::kLong)), c10::Error);

  // loss = cross-entropy of the logits; at init, close to ln(vocab).
  at::Tensor targets = torch::randint(o.vocab_size, {3, 10}, torch::kLong);
  at::Tensor loss = model->loss(tokens, targets);
  EXPECT_EQ(loss.dim(), 0);
  at::Tensor ref = torch::nn::functional::cross_entropy(model->forward(tokens).view({-1, o.vocab_size}),
                                                        targets.view({-1}));
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-6);
  EXPECT_NEAR(loss.item<double>(), std::log(static_cast<double>(o.vocab_size)), 0.15);

  // Generation appends tokens and respects the context window.
  at::Tensor out = model->generate(tokens.slice(0, 0, 1), 2 * o.context);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{1, 10 + 2 * o.context}));
}

TEST(GPT, OptionsAreValidated) {
  GPTOptions o = small_options();
  o.heads = 5;  // 32 % 5 != 0
  EXPECT_THROW(GPT{o}, std::invalid_argument);
  o = small_options(0);
  EXPECT_THROW(GPT{o}, std::invalid_argument);
}

TEST(GPT, IsCausal) {
  torch::manual_seed(1);
  GPTOptions o = small_options();
  GPT model(o);
  model->eval();
  torch::NoGradGuard no_grad;
  const int64_t T = o.context;
  at::Tensor tokens = torch::randint(o.vocab_size, {2, T}, torch::kLong);
  at::Tensor base = model->forward(tokens);
  for (int64_t t : {0L, 3L, 7L, T - 2}) {
    at::Tensor changed = tokens.clone();
    // Change token t+1 (and everything after it in one row).
    changed.select(1, t + 1).add_(1).remainder_(o.vocab_size);
    changed[1].slice(0, t + 1, T).copy_(torch::randint(o.vocab_size, {T - t - 1}, torch::kLong));
    at::Tensor out = model->forward(changed);
    EXPECT_TRUE(torch::allclose(out.slice(1, 0, t + 1), base.slice(1, 0, t + 1), 0, 1e-6))
        << "logits at positions <= " << t << " depend on later tokens";
    EXPECT_FALSE(torch::allclose(out.select(1, t + 1), base.select(1, t + 1), 0, 1e-6))
        << "position " << t + 1 << " ignores its own token";
  }
}

TEST(GPT, TiedWeightIsSharedAndListedOnce) {
  torch::manual_seed(2);
  GPTOptions o = small_options();
  GPT model(o);
  EXPECT_EQ(model->head_weight().data_ptr(), model->wte->weight.data_ptr());
  EXPECT_FALSE(model->lm_head);

  // parameters(): every tensor once (distinct storages), 4 + 12 per block.
  auto named = model->named_parameters();
  EXPECT_EQ(named.size(), static_cast<size_t>(2 + 12 * o.depth + 2));
  std::set<const void*> storages;
  for (const auto& p : model->parameters()) storages.insert(p.data_ptr());
  EXPECT_EQ(storages.size(), named.size());
  for (const auto& kv : named) EXPECT_EQ(kv.key().find("lm_head"), std::string::npos) << kv.key();

  // Both uses contribute to the one gradient: ids that never appear in the
  // input still get a gradient in their embedding row, from the head.
  at::Tensor tokens = torch::randint(o.vocab_size / 2, {2, 8}, torch::kLong);  // ids < V/2 only
  model->loss(tokens, tokens).backward();
  at::Tensor g = model->wte->weight.grad();
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g.slice(0, o.vocab_size / 2, o.vocab_size).abs().sum().item<double>(), 0.0);
  // The head contribution equals d(loss)/d(head weight) computed with an
  // untied copy of the same model.
  torch::manual_seed(2);
  GPTOptions untied_options = o;
  untied_options.tie_embeddings = false;
  GPT untied(untied_options);
  {
    torch::NoGradGuard no_grad;
    for (const auto& kv : model->named_parameters()) untied->named_parameters()[kv.key()].copy_(kv.value());
    untied->lm_head->weight.copy_(model->wte->weight);
  }
  untied->loss(tokens, tokens).backward();
  EXPECT_TRUE(torch::allclose(g, untied->wte->weight.grad() + untied->lm_head->weight.grad(), 1e-5, 1e-7));
}

TEST(GPT, UntiedHeadIsSeparate) {
  torch::manual_seed(3);
  GPTOptions o = small_options();
  o.tie_embeddings = false;
  GPT model(o);
  ASSERT_TRUE(model->lm_head);
  EXPECT_NE(model->head_weight().data_ptr(), model->wte->weight.data_ptr());
  EXPECT_FALSE(model->lm_head->bias.defined());
  EXPECT_TRUE(model->named_parameters().contains("lm_head.weight"));
}

TEST(GPT, ParameterCountMatchesFormula) {
  for (bool tie : {true, false}) {
    for (int64_t depth : {1, 3}) {
      GPTOptions o = small_options(37);
      o.depth = depth;
      o.width = 48;
      o.heads = 6;
      o.mlp_ratio = 3;
      o.context = 20;
      o.tie_embeddings = tie;
      GPT model(o);
      EXPECT_EQ(model->num_parameters(), expected_parameters(o)) << "tie " << tie << " depth " << depth;
    }
  }
  // The recommended main-job size: depth 4, width 128, heads 4, context 64.
  GPTOptions o;
  o.vocab_size = 28;
  EXPECT_EQ(GPT(o)->num_parameters(), expected_parameters(o));
}

TEST(GPT, BlocksAreRegisteredModules) {
  GPTOptions o = small_options();
  o.depth = 3;
  GPT model(o);
  ASSERT_EQ(model->blocks->size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(model->block(i), nullptr);
  auto children = model->named_children();
  EXPECT_TRUE(children.contains("blocks"));
  auto params = model->named_parameters();
  for (const char* name : {"wte.weight", "wpe.weight", "blocks.0.ln1.weight", "blocks.0.attn.qkv.weight",
                           "blocks.2.attn.proj.bias", "blocks.1.mlp.fc.weight", "blocks.2.mlp.proj.weight",
                           "ln_f.bias"}) {
    EXPECT_TRUE(params.contains(name)) << name;
  }
  // A block's own parameters are exactly those under its prefix.
  EXPECT_EQ(model->block(1)->parameters().size(), 12u);
}

TEST(GPT, DeterministicInit) {
  GPTOptions o = small_options();
  o.depth = 3;
  torch::manual_seed(7);
  GPT a(o);
  torch::manual_seed(7);
  GPT b(o);
  torch::manual_seed(8);
  GPT c(o);
  EXPECT_TRUE(same_parameters(a, b));
  EXPECT_FALSE(same_parameters(a, c));

  // GPT-2 initialisation.
  GPTOptions big = o;
  big.width = 256;
  big.heads = 8;
  torch::manual_seed(9);
  GPT m(big);
  const double residual_std = 0.02 / std::sqrt(2.0 * big.depth);
  for (const auto& kv : m->named_parameters()) {
    const std::string& name = kv.key();
    const at::Tensor& p = kv.value();
    const bool is_ln = name.find("ln") != std::string::npos;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      EXPECT_EQ(p.abs().max().item<double>(), 0.0) << name;
    } else if (is_ln) {
      EXPECT_TRUE(torch::equal(p, torch::ones_like(p))) << name;
    } else {
      const bool residual = name.find("proj.weight") != std::string::npos;
      const double expected = residual ? residual_std : 0.02;
      EXPECT_NEAR(p.std().item<double>(), expected, 0.1 * expected) << name;
      EXPECT_NEAR(p.mean().item<double>(), 0.0, 0.1 * expected) << name;
    }
  }
}

// ---- corpus and tokenizer ---------------------------------------------------

TEST(Corpus, DeterministicFromSeed) {
  EXPECT_EQ(generate_text(5, 300), generate_text(5, 300));
  EXPECT_NE(generate_text(5, 300), generate_text(6, 300));
  const std::string longer = generate_text(5, 400);
  EXPECT_EQ(longer.substr(0, generate_text(5, 300).size()), generate_text(5, 300));

  CorpusOptions options;
  options.num_sentences = 500;
  Corpus a(options), b(options);
  EXPECT_EQ(a.text(), b.text());
  EXPECT_TRUE(torch::equal(a.tokens(), b.tokens()));
  // Pinned: the first sentences of the default seed never change (a changed
  // grammar or RNG would silently change every recorded loss curve).
  Corpus d;
  EXPECT_EQ(d.text().substr(0, d.text().find('\n')),
            "the teacher has a blue book . who has the blue book ? the teacher .");
  EXPECT_EQ(d.vocab_size(), 29);
  EXPECT_EQ(grammar_alphabet(), "\n .?abcdefghiklmnopqrstuvwxyz");
  std::printf("first lines of the default corpus:\n%s", generate_text(1234, 6).c_str());
}

TEST(Corpus, SentencesFollowTheGrammar) {
  const std::vector<std::string> numbers = {"zero",    "one",       "two",      "three",    "four",    "five",
                                            "six",     "seven",     "eight",    "nine",     "ten",     "eleven",
                                            "twelve",  "thirteen",  "fourteen", "fifteen",  "sixteen", "seventeen",
                                            "eighteen", "nineteen", "twenty"};
  std::map<std::string, int> value;
  for (size_t i = 0; i < numbers.size(); ++i) value[numbers[i]] = static_cast<int>(i);

  std::istringstream lines(generate_text(42, 3000));
  std::string line;
  int arithmetic = 0, who = 0, total = 0;
  while (std::getline(lines, line)) {
    ++total;
    ASSERT_GE(line.size(), 3u);
    EXPECT_EQ(line.substr(line.size() - 2), " .") << line;
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string s; words >> s;) w.push_back(s);
    if (w.size() == 6 && (w[1] == "plus" || w[1] == "minus" || w[1] == "times")) {
      const int a = value.at(w[0]), b = value.at(w[2]), c = value.at(w[4]);
      const int expected = w[1] == "plus" ? a + b : w[1] == "minus" ? a - b : a * b;
      EXPECT_EQ(c, expected) << line;
      ++arithmetic;
    }
    if (line.find(" who has the ") != std::string::npos) {
      // "the N has a C O . who has the C O ? the N ."
      ASSERT_EQ(w.size(), 16u) << line;
      EXPECT_EQ(w[1], w[14]) << line;
      EXPECT_EQ(w[4] + w[5], w[10] + w[11]) << line;
      ++who;
    }
  }
  EXPECT_EQ(total, 3000);
  EXPECT_GT(arithmetic, 800);  // ~35%
  EXPECT_GT(who, 300);         // ~15%
}

TEST(Corpus, TokenizerRoundTrip) {
  Corpus corpus;
  const Tokenizer& tok = corpus.tokenizer();
  // The vocabulary is the sorted set of the text's characters.
  std::set<char> chars(corpus.text().begin(), corpus.text().end());
  EXPECT_EQ(tok.chars(), std::string(chars.begin(), chars.end()));
  EXPECT_EQ(tok.chars(), grammar_alphabet());
  EXPECT_EQ(corpus.vocab_size(), static_cast<int64_t>(chars.size()));
  EXPECT_TRUE(std::is_sorted(tok.chars().begin(), tok.chars().end()));

  const std::string s = "seven plus two is nine .\nthe cat ?";
  EXPECT_EQ(tok.decode(tok.encode(s)), s);
  EXPECT_EQ(tok.decode(tok.encode_tensor(s)), s);
  EXPECT_EQ(tok.encode(" ")[0], static_cast<int64_t>(tok.chars().find(' ')));
  EXPECT_THROW(tok.encode("Seven"), std::invalid_argument);
  EXPECT_THROW(tok.decode(std::vector<int64_t>{tok.vocab_size()}), std::out_of_range);

  // Whole text round trip, and the train/validation split covers it.
  EXPECT_EQ(tok.decode(corpus.tokens()), corpus.text());
  EXPECT_EQ(corpus.train_tokens().numel() + corpus.validation_tokens().numel(), corpus.tokens().numel());
  EXPECT_NEAR(static_cast<double>(corpus.validation_tokens().numel()) / corpus.tokens().numel(), 0.1, 1e-3);
  EXPECT_GT(corpus.tokens().numel(), 500000);
}

// ---- batcher ------------------------------------------------------------------

TEST(Batcher, WindowsAndShiftedTargets) {
  Corpus corpus(CorpusOptions{1, 2000, 0.1});
  at::Tensor tokens = corpus.train_tokens();
  Batcher batcher(tokens, BatcherOptions{3, 2});
  const int64_t context = 24;
  Batch b = batcher.next_batch(5, context, 1, 2, 7, 1);
  ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{5, context}));
  ASSERT_EQ(b.targets.sizes(), (std::vector<int64_t>{5, context}));
  EXPECT_EQ(b.inputs.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(b.inputs.slice(1, 1, context), b.targets.slice(1, 0, context - 1)));
  // Each row is a window of the token tensor at the sequence's offset;
  // here g = 7*2+1 = 15 and rank 1 of 2 takes stream positions 155..159.
  for (int64_t row = 0; row < 5; ++row) {
    const int64_t off = batcher.sequence_offset((15 * 2 + 1) * 5 + row, context);
    EXPECT_TRUE(torch::equal(b.inputs[row], tokens.slice(0, off, off + context)));
    EXPECT_TRUE(torch::equal(b.targets[row], tokens.slice(0, off + 1, off + context + 1)));
  }
  // Deterministic, stateless, and different batches differ.
  EXPECT_TRUE(torch::equal(b.inputs, batcher.next_batch(5, context, 1, 2, 7, 1).inputs));
  EXPECT_FALSE(torch::equal(b.inputs, batcher.next_batch(5, context, 1, 2, 8, 1).inputs));
  EXPECT_FALSE(torch::equal(b.inputs, Batcher(tokens, BatcherOptions{4, 2}).next_batch(5, context, 1, 2, 7, 1).inputs));

  EXPECT_THROW(batcher.next_batch(5, context, 2, 2, 0, 0), std::invalid_argument);   // rank
  EXPECT_THROW(batcher.next_batch(5, context, 0, 2, 0, 2), std::invalid_argument);   // micro_step >= gas
  EXPECT_THROW(batcher.next_batch(5, tokens.numel(), 0, 1, 0, 0), std::invalid_argument);  // too short
}

TEST(Batcher, GlobalBatchesDoNotDependOnWorldSize) {
  Corpus corpus(CorpusOptions{1, 2000, 0.1});
  const int64_t context = 32, global_micro = 8, gas = 3;
  Batcher batcher(corpus.train_tokens(), BatcherOptions{11, gas});
  for (int64_t step : {0, 1, 5}) {
    for (int micro_step = 0; micro_step < gas; ++micro_step) {
      std::vector<at::Tensor> reference;
      for (int W : {1, 2, 4}) {
        std::vector<at::Tensor> inputs, targets;
        for (int r = 0; r < W; ++r) {
          Batch b = batcher.next_batch(global_micro / W, context, r, W, step, micro_step);
          inputs.push_back(b.inputs);
          targets.push_back(b.targets);
        }
        at::Tensor in = torch::cat(inputs), tg = torch::cat(targets);
        if (reference.empty()) {
          reference = {in, tg};
        } else {
          EXPECT_TRUE(torch::equal(in, reference[0])) << "W=" << W << " step " << step << " micro " << micro_step;
          EXPECT_TRUE(torch::equal(tg, reference[1])) << "W=" << W << " step " << step << " micro " << micro_step;
        }
      }
    }
  }
}

TEST(Batcher, OptimizerStepSeesTheSameDataForAnySplit) {
  // Train batch 8 per step as (W=1, gas=4, micro=2), (W=2, gas=2, micro=2),
  // (W=4, gas=1, micro=2), (W=2, gas=1, micro=4): the same 8 sequences.
  Corpus corpus(CorpusOptions{1, 2000, 0.1});
  const int64_t context = 16, step = 3;
  auto step_data = [&](int W, int64_t gas, int64_t micro) {
    Batcher batcher(corpus.train_tokens(), BatcherOptions{5, gas});
    std::vector<at::Tensor> rows;
    for (int m = 0; m < gas; ++m)
      for (int r = 0; r < W; ++r) rows.push_back(batcher.next_batch(micro, context, r, W, step, m).inputs);
    return torch::cat(rows);
  };
  at::Tensor ref = step_data(1, 4, 2);
  EXPECT_TRUE(torch::equal(step_data(2, 2, 2), ref));
  EXPECT_TRUE(torch::equal(step_data(4, 1, 2), ref));
  EXPECT_TRUE(torch::equal(step_data(2, 1, 4), ref));
  EXPECT_TRUE(torch::equal(step_data(1, 1, 8), ref));
}

// ---- training ---------------------------------------------------------------

TEST(Training, LossFallsWithAdamW) {
  const auto start = std::chrono::steady_clock::now();
  Corpus corpus(CorpusOptions{1234, 5000, 0.1});
  GPTOptions o;
  o.vocab_size = corpus.vocab_size();
  o.context = 64;
  o.depth = 2;
  o.width = 64;
  o.heads = 4;
  torch::manual_seed(0);
  GPT model(o);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  Batcher batcher(corpus.train_tokens(), BatcherOptions{0, 1});
  const int steps = 150;
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    Batch b = batcher.next_batch(16, o.context, 0, 1, step, 0);
    optimizer.zero_grad();
    at::Tensor loss = model->loss(b.inputs, b.targets);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  double last = 0;
  for (int i = steps - 10; i < steps; ++i) last += losses[i] / 10;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("loss %.3f -> %.3f (mean of last 10) in %d steps, %.1f s\n", losses[0], last, steps, secs);
  EXPECT_NEAR(losses[0], std::log(static_cast<double>(o.vocab_size)), 0.2);
  EXPECT_LT(last, 0.6 * losses[0]);
  for (double l : losses) ASSERT_TRUE(std::isfinite(l));
}
