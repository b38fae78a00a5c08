// zero::checkpoint and zero::Unit's checkpointing on one process, against
// the same computation without checkpointing: outputs, the gradients of the
// inputs and parameters, and the random generator after backward, all equal.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "zero/activation_checkpointing.h"
#include "zero/error.h"
#include "zero/unit.h"

namespace {

// Linear -> GELU -> dropout -> Linear, with an extra scale and a mask.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    fc = register_module("fc", torch::nn::Linear(6, 10));
    proj = register_module("proj", torch::nn::Linear(10, 6));
    drop = register_module("drop", torch::nn::Dropout(0.3));
  }
  at::Tensor forward(const at::Tensor& x) { return x + proj(drop(torch::gelu(fc(x)))); }
  at::Tensor forward_with(const at::Tensor& x, double scale, const at::Tensor& mask) {
    return (x + proj(drop(torch::gelu(fc(x))))) * scale * mask;
  }
  torch::nn::Linear fc{nullptr}, proj{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Block);

std::vector<at::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
  return out;
}

void expect_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].defined(), b[i].defined()) << "tensor " << i;
    if (a[i].defined()) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i << " differs";
  }
}

// One forward and backward of `run` from the same seed, parameters and
// input; returns the output, the input's gradient, the parameters'
// gradients and the generator's next draw.
struct Outcome {
  at::Tensor out, input_grad;
  std::vector<at::Tensor> grads;
  at::Tensor next_draw;
};
Outcome run_once(Block& block, const std::function<at::Tensor(const at::Tensor&)>& run, bool input_requires_grad = true) {
  block->zero_grad();
  torch::manual_seed(7);
  at::Tensor x = torch::randn({4, 6}).requires_grad_(input_requires_grad);
  at::Tensor out = run(x);
  (out * out).sum().backward();
  return {out.detach(), x.grad().defined() ? x.grad().clone() : at::Tensor(), grads_of(*block), torch::rand({3})};
}

TEST(Checkpoint, SameOutputsGradientsAndRandomStreamWithDropout) {
  torch::manual_seed(0);
  Block block;
  block->train();
  const Outcome plain = run_once(block, [&](const at::Tensor& x) { return block(x); });
  const Outcome checkpointed =
      run_once(block, [&](const at::Tensor& x) { return zero::checkpoint([&](const at::Tensor& in) { return block(in); }, x); });
  EXPECT_TRUE(torch::equal(plain.out, checkpointed.out));
  EXPECT_TRUE(torch::equal(plain.input_grad, checkpointed.input_grad));
  expect_same(plain.grads, checkpointed.grads);
  // The recompute drew the forward's masks again and left the generator
  // where the run without checkpointing leaves it.
  EXPECT_TRUE(torch::equal(plain.next_draw, checkpointed.next_draw));
  // Dropout was on: without the restored state the masks would differ.
  const Outcome other_seed = run_once(block, [&](const at::Tensor& x) {
    return zero::checkpoint([&](const at::Tensor& in) { torch::rand({1}); return block(in); }, x);
  });
  EXPECT_FALSE(torch::equal(plain.out, other_seed.out));
}

TEST(Checkpoint, NonTensorArgumentsAndInputsWithoutGradient) {
  torch::manual_seed(0);
  Block block;
  const at::Tensor mask = (torch::rand({4, 6}) > 0.2).to(at::kFloat);  // does not require grad
  const double scale = 0.75;
  const Outcome plain = run_once(block, [&](const at::Tensor& x) { return block->forward_with(x, scale, mask); });
  const Outcome checkpointed = run_once(block, [&](const at::Tensor& x) {
    return zero::checkpoint([&](const at::Tensor& in, double s, const at::Tensor& m) { return block->forward_with(in, s, m); },
                            x, scale, mask);
  });
  EXPECT_TRUE(torch::equal(plain.out, checkpointed.out));
  EXPECT_TRUE(torch::equal(plain.input_grad, checkpointed.input_grad));
  expect_same(plain.grads, checkpointed.grads);

  // No input requires grad: the parameters inside still get theirs.
  const Outcome plain_frozen_input = run_once(block, [&](const at::Tensor& x) { return block(x); }, false);
  const Outcome frozen_input = run_once(
      block, [&](const at::Tensor& x) { return zero::checkpoint([&](const at::Tensor& in) { return block(in); }, x); }, false);
  EXPECT_FALSE(frozen_input.input_grad.defined());
  expect_same(plain_frozen_input.grads, frozen_input.grads);
  for (const auto& g : frozen_input.grads) EXPECT_TRUE(g.defined());
}

TEST(Checkpoint, SeveralOutputsSomeIntegerAndSomeUnused) {
  torch::manual_seed(0);
  Block block;
  auto body = [&](const at::Tensor& in) {
    at::Tensor h = block(in);
    return std::vector<at::Tensor>{h.tanh(), h.sum(1), h.argmax(1)};
  };
  auto run = [&](bool checkpointed) {
    block->zero_grad();
    torch::manual_seed(3);
    at::Tensor x = torch::randn({4, 6}).requires_grad_(true);
    std::vector<at::Tensor> outs = checkpointed ? zero::checkpoint(body, x) : body(x);
    EXPECT_FALSE(outs[2].requires_grad());       // integer: no gradient
    (outs[0].sum() * 2).backward();              // outs[1] unused
    return std::make_pair(x.grad().clone(), grads_of(*block));
  };
  const auto plain = run(false), checkpointed = run(true);
  EXPECT_TRUE(torch::equal(plain.first, checkpointed.first));
  expect_same(plain.second, checkpointed.second);
}

TEST(Checkpoint, UnitUsedTwiceAndEveryOtherUnit) {
  torch::manual_seed(0);
  zero::Unit<Block> a{Block()}, b{Block()};
  auto run = [&](bool first, bool second) {
    a->checkpoint_activations(first);
    b->checkpoint_activations(second);
    a->zero_grad();
    b->zero_grad();
    torch::manual_seed(11);
    at::Tensor x = torch::randn({4, 6}).requires_grad_(true);
    at::Tensor y = a(b(a(x)));  // a twice, b between
    y.pow(2).mean().backward();
    std::vector<at::Tensor> g = grads_of(*a);
    for (auto& t : grads_of(*b)) g.push_back(t);
    g.push_back(x.grad().clone());
    g.push_back(y.detach());
    return g;
  };
  const auto plain = run(false, false);
  expect_same(plain, run(true, true));
  expect_same(plain, run(true, false));  // only some units
  expect_same(plain, run(false, true));
}

TEST(Checkpoint, CpuCheckpointingKeepsTheSameResults) {
  torch::manual_seed(0);
  Block block;
  const Outcome plain = run_once(block, [&](const at::Tensor& x) { return block(x); });
  zero::ActivationCheckpointOptions options;
  options.cpu_checkpointing = true;
  options.profile = true;
  zero::configure_activation_checkpointing(options);
  zero::take_activation_checkpoint_stats();
  const Outcome on_host =
      run_once(block, [&](const at::Tensor& x) { return zero::checkpoint([&](const at::Tensor& in) { return block(in); }, x); });
  const zero::ActivationCheckpointStats stats = zero::take_activation_checkpoint_stats();
  zero::configure_activation_checkpointing({});
  EXPECT_TRUE(torch::equal(plain.out, on_host.out));
  expect_same(plain.grads, on_host.grads);
  EXPECT_EQ(stats.forwards, 1);
  EXPECT_EQ(stats.recomputes, 1);
  EXPECT_EQ(stats.saved_bytes, 4 * 6 * 4);  // the one fp32 input
  EXPECT_GT(stats.recompute_s, 0.0);
}

// contiguous_memory_optimization: the inputs of one forward's checkpoints
// share one buffer, made at the second forward (sized by the first) and
// reused after; two forwards whose backward comes later (their rounds
// overlap) still get correct results, from separate allocations.
TEST(Checkpoint, ContiguousMemoryReusesOneBufferAndKeepsTheResults) {
  torch::manual_seed(0);
  Block a, b, c;
  auto three = [&](const at::Tensor& x, bool checkpointed) {
    auto run = [&](Block& m, const at::Tensor& in) {
      return checkpointed ? zero::checkpoint([&](const at::Tensor& t) { return m(t); }, in) : m(in);
    };
    return run(c, run(b, run(a, x)));
  };
  auto step = [&](bool checkpointed, int forwards_before_backward) {
    for (Block* m : {&a, &b, &c}) (*m)->zero_grad();
    torch::manual_seed(11);
    std::vector<at::Tensor> outs;
    for (int i = 0; i < forwards_before_backward; ++i) outs.push_back(three(torch::randn({5, 6}), checkpointed));
    for (auto& out : outs) (out * out).sum().backward();
    std::vector<at::Tensor> grads = grads_of(*a);
    for (Block* m : {&b, &c}) {
      for (auto& g : grads_of(**m)) grads.push_back(g);
    }
    return grads;
  };
  zero::ActivationCheckpointOptions options;
  options.contiguous_memory = true;
  for (int overlapping : {1, 2}) {
    const auto plain = step(false, overlapping);
    zero::configure_activation_checkpointing(options);
    zero::take_activation_checkpoint_stats();
    std::vector<zero::ActivationCheckpointStats> rounds;
    for (int round = 0; round < 3; ++round) {
      expect_same(plain, step(true, overlapping));
      rounds.push_back(zero::take_activation_checkpoint_stats());
    }
    zero::configure_activation_checkpointing({});
    if (overlapping == 1) {
      EXPECT_EQ(rounds[0].buffer_misses, 3) << "no buffer before the first forward";
      EXPECT_EQ(rounds[1].buffers_made, 1) << "sized by the first forward";
      EXPECT_EQ(rounds[1].buffer_misses, 0);
      EXPECT_EQ(rounds[2].buffers_made, 0) << "reused";
      EXPECT_EQ(rounds[2].buffer_misses, 0);
    } else {  // the second forward's round is the first's: it does not fit, then the buffer grows
      EXPECT_EQ(rounds[1].buffers_made, 1);
      EXPECT_EQ(rounds[2].buffers_made, 0);
      EXPECT_EQ(rounds[2].buffer_misses, 0);
    }
  }
}

TEST(Checkpoint, KeepsOnlyTheInputsForBackward) {
  // Without checkpointing, autograd keeps the block's intermediates alive
  // through the output; with it, only the input: dropping every reference
  // but the output shows which storages stay.
  torch::manual_seed(0);
  Block block;
  at::Tensor x = torch::randn({64, 6}).requires_grad_(true);
  auto weak_hidden = [&](bool checkpointed) {
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> hidden;  // of every run of the body
    auto body = [&](const at::Tensor& in) {
      at::Tensor h = torch::gelu(block->fc(in));
      hidden.push_back(h.storage().getWeakStorageImpl());
      return in + block->proj(h);
    };
    at::Tensor out = checkpointed ? zero::checkpoint(body, x) : body(x);
    const bool alive = !hidden.front().expired();
    out.sum().backward();
    return alive;
  };
  EXPECT_TRUE(weak_hidden(false));
  EXPECT_FALSE(weak_hidden(true));
}

TEST(Checkpoint, EvaluationRunsThePlainFunction) {
  torch::manual_seed(0);
  Block block;
  block->eval();
  torch::NoGradGuard no_grad;
  at::Tensor x = torch::randn({2, 6});
  EXPECT_TRUE(torch::equal(block(x), zero::checkpoint([&](const at::Tensor& in) { return block(in); }, x)));
}

TEST(Checkpoint, ARecomputeThatReturnsOtherOutputsIsNamed) {
  int calls = 0;
  at::Tensor w = torch::ones({3}).requires_grad_(true);
  std::vector<at::Tensor> outs = zero::checkpoint(
      [&](const at::Tensor& in) {
        ++calls;
        return calls == 1 ? std::vector<at::Tensor>{in * w} : std::vector<at::Tensor>{in * w, in};
      },
      torch::ones({3}));
  try {
    outs[0].sum().backward();
    FAIL() << "backward accepted a recompute with a different number of outputs";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("must return the same outputs each time"), std::string::npos) << e.what();
  }
}

}  // namespace
