// Every collective on the world group (run by ctest on 1-4 ranks through
// zero-run, over shared memory and over gloo), every dtype, sizes that are
// not multiples of the world size; expectations computed from each rank's
// known contribution.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>

#include "world_main.h"
#include "zero/comm.h"
#include "zero/error.h"

namespace {

// Rank r contributes (r + 1) * (i % 7 + 1) at element i: small integers, so
// sums and averages are exact in fp16 and bf16 too.
at::Tensor contribution(int rank, int64_t n, at::ScalarType dtype, int64_t offset = 0) {
  auto i = torch::arange(offset, offset + n, torch::kLong);
  return ((i % 7 + 1) * (rank + 1)).to(dtype);
}

double rank_sum(int world) { return world * (world + 1) / 2.0; }

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kHalf, at::kBFloat16, at::kLong};
const std::vector<int64_t> kSizes = {1, 7, 1000, 1 << 16 | 3};

std::string name(at::ScalarType t) { return c10::toString(t); }

// zero::initialize after the program's own init_process_group() (the usual
// order) joins nothing new: the live world comes back, and works.
TEST(Collectives, SecondInitReturnsTheLiveWorld) {
  auto again = zero::comm::init_process_group();
  EXPECT_EQ(again.get(), g_world.get());
  at::Tensor t = torch::full({3}, static_cast<float>(again->rank() + 1));
  again->all_reduce(t, zero::comm::ReduceOp::Sum);
  const int W = again->size();
  EXPECT_EQ(t[0].item<float>(), static_cast<float>(W * (W + 1) / 2));
}

// Ranks of one host use shared memory unless ZERO_HOST_TRANSPORT=gloo,
// sub-groups too.
TEST(Collectives, TransportIsTheOneAsked) {
  const char* asked = std::getenv("ZERO_HOST_TRANSPORT");
  const std::string expected = g_world->size() == 1 ? "local" : (asked && std::string(asked) == "gloo" ? "gloo" : "shm");
  EXPECT_EQ(g_world->host_transport(), expected);
  if (g_world->size() < 3) return;
  auto pair = g_world->new_group({0, 1});
  if (pair) EXPECT_EQ(pair->host_transport(), expected);
}

// Tensors of several chunks with a tail (the default chunk is 1 MiB per
// rank; ctest also runs this with 4 kB chunks), checked element by element.
TEST(Collectives, TensorsLargerThanOneChunk) {
  const int W = g_world->size(), R = g_world->rank();
  const int64_t n = (1 << 19) + 13;  // 2 MiB of floats and a bit
  auto base = (torch::arange(n, torch::kLong) % 7 + 1).to(torch::kDouble);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    auto t = contribution(R, n, dtype);
    g_world->all_reduce(t);
    EXPECT_TRUE(t.to(torch::kDouble).equal(base * rank_sum(W))) << name(dtype);
  }
  const int64_t m = 300001;
  auto out = torch::empty({m});
  g_world->reduce_scatter(out, contribution(R, W * m, at::kFloat));
  auto mine = (torch::arange(R * m, (R + 1) * m, torch::kLong) % 7 + 1).to(torch::kDouble);
  EXPECT_TRUE(out.to(torch::kDouble).equal(mine * rank_sum(W)));

  auto gathered = torch::empty({W * m});
  g_world->all_gather(gathered, contribution(R, m, at::kFloat));
  for (int r = 0; r < W; ++r) EXPECT_TRUE(gathered.slice(0, r * m, (r + 1) * m).equal(contribution(r, m, at::kFloat)));

  for (int root = 0; root < W; ++root) {
    auto b = R == root ? contribution(root, n, at::kFloat) : torch::zeros({n});
    g_world->broadcast(b, root);
    EXPECT_TRUE(b.equal(contribution(root, n, at::kFloat))) << "root " << root;
  }
}

TEST(Collectives, AllReduceSumAvgMax) {
  const int W = g_world->size(), R = g_world->rank();
  for (auto dtype : kDtypes) {
    for (int64_t n : kSizes) {
      auto base = torch::arange(n, torch::kLong) % 7 + 1;
      auto t = contribution(R, n, dtype);
      g_world->all_reduce(t, zero::comm::ReduceOp::Sum);
      EXPECT_TRUE(t.to(torch::kDouble).equal(base.to(torch::kDouble) * rank_sum(W))) << name(dtype) << " n=" << n;

      t = contribution(R, n, dtype);
      g_world->all_reduce(t, zero::comm::ReduceOp::Max);
      EXPECT_TRUE(t.to(torch::kDouble).equal(base.to(torch::kDouble) * W)) << name(dtype) << " n=" << n;

      t = contribution(R, n, dtype);
      g_world->all_reduce(t, zero::comm::ReduceOp::Avg);
      auto expected = base.to(torch::kDouble) * rank_sum(W) / W;
      if (dtype == at::kLong) expected = expected.floor();
      EXPECT_TRUE(t.to(torch::kDouble).equal(expected)) << name(dtype) << " n=" << n;
    }
  }
}

TEST(Collectives, ReduceScatterGivesRankItsChunk) {
  const int W = g_world->size(), R = g_world->rank();
  for (auto dtype : kDtypes) {
    for (int64_t n : kSizes) {  // n per rank: the flat input holds W * n
      auto input = contribution(R, W * n, dtype);
      auto output = torch::full({n}, -1, torch::TensorOptions().dtype(dtype));
      g_world->reduce_scatter(output, input, zero::comm::ReduceOp::Sum);
      auto mine = (torch::arange(R * n, (R + 1) * n, torch::kLong) % 7 + 1).to(torch::kDouble);
      EXPECT_TRUE(output.to(torch::kDouble).equal(mine * rank_sum(W))) << name(dtype) << " n=" << n;

      g_world->reduce_scatter(output, contribution(R, W * n, dtype), zero::comm::ReduceOp::Max);
      EXPECT_TRUE(output.to(torch::kDouble).equal(mine * W)) << name(dtype) << " n=" << n;

      g_world->reduce_scatter(output, contribution(R, W * n, dtype), zero::comm::ReduceOp::Avg);
      auto avg = mine * rank_sum(W) / W;
      if (dtype == at::kLong) avg = avg.floor();
      EXPECT_TRUE(output.to(torch::kDouble).equal(avg)) << name(dtype) << " n=" << n;
    }
  }
}

TEST(Collectives, AllGatherConcatenatesInRankOrder) {
  const int W = g_world->size(), R = g_world->rank();
  for (auto dtype : kDtypes) {
    for (int64_t n : kSizes) {
      auto input = contribution(R, n, dtype);
      auto output = torch::empty({W * n}, torch::TensorOptions().dtype(dtype));
      g_world->all_gather(output, input);
      for (int r = 0; r < W; ++r) {
        EXPECT_TRUE(output.slice(0, r * n, (r + 1) * n).equal(contribution(r, n, dtype))) << name(dtype) << " r=" << r;
      }
    }
  }
}

// Element i of chunk q on rank r is a value that names (r, q, i): after the
// all-to-all, chunk p on rank R must be rank p's chunk R, and the bytes
// counted are every chunk but the rank's own ((W-1)/W of its input).
TEST(Collectives, AllToAllSwapsChunksBetweenRanks) {
  const int W = g_world->size(), R = g_world->rank();
  auto chunk_of = [](int from, int to, int64_t n, at::ScalarType dtype) {
    return ((torch::arange(n, torch::kLong) + 7 * from + 3 * to) % 101).to(dtype);
  };
  for (auto dtype : kDtypes) {
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{4099}, int64_t{300001}}) {  // n per chunk; the last crosses chunks
      std::vector<at::Tensor> chunks;
      for (int q = 0; q < W; ++q) chunks.push_back(chunk_of(R, q, n, dtype));
      at::Tensor input = torch::cat(chunks);
      at::Tensor output = torch::full({W * n}, -1, torch::TensorOptions().dtype(dtype));
      const auto before = g_world->stats().all_to_all_bytes;
      g_world->all_to_all(output, input);
      EXPECT_EQ(g_world->stats().all_to_all_bytes - before, int64_t(input.nbytes()) * (W - 1) / W);
      for (int p = 0; p < W; ++p) {
        EXPECT_TRUE(output.slice(0, p * n, (p + 1) * n).equal(chunk_of(p, R, n, dtype)))
            << name(dtype) << " n=" << n << " from rank " << p;
      }
    }
  }
  if (W > 1) {
    try {
      g_world->all_to_all(torch::zeros({W * 3 + 1}), torch::zeros({W * 3 + 1}));
      FAIL() << "expected a CommError";
    } catch (const zero::CommError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(W * 3 + 1)), std::string::npos) << e.what();
    }
  }
}

// In place: the input is this rank's slot of the output (as the engine's
// persistent buckets gather); the other slots start as garbage.
TEST(Collectives, AllGatherInPlace) {
  const int W = g_world->size(), R = g_world->rank();
  for (auto dtype : kDtypes) {
    for (int64_t n : kSizes) {
      auto output = torch::full({W * n}, -7, torch::TensorOptions().dtype(dtype));
      auto slot = output.slice(0, R * n, (R + 1) * n);
      slot.copy_(contribution(R, n, dtype));
      g_world->all_gather(output, slot);
      for (int r = 0; r < W; ++r) {
        EXPECT_TRUE(output.slice(0, r * n, (r + 1) * n).equal(contribution(r, n, dtype))) << name(dtype) << " r=" << r;
      }
    }
  }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  const int W = g_world->size(), R = g_world->rank();
  for (auto dtype : kDtypes) {
    for (int root = 0; root < W; ++root) {
      auto t = contribution(R, 1003, dtype);
      g_world->broadcast(t, root);
      EXPECT_TRUE(t.equal(contribution(root, 1003, dtype))) << name(dtype) << " root=" << root;
    }
  }
}

TEST(Collectives, AsyncWorkCompletesInIssueOrder) {
  const int W = g_world->size(), R = g_world->rank();
  std::vector<at::Tensor> tensors;
  std::vector<zero::comm::WorkHandle> works;
  for (int k = 0; k < 8; ++k) {
    tensors.push_back(torch::full({4096}, double(R + k), torch::kFloat));
    works.push_back(g_world->all_reduce_async(tensors.back()));
  }
  for (int k = 0; k < 8; ++k) {
    works[k]->wait();
    EXPECT_TRUE(works[k]->is_completed());
    const double expected = rank_sum(W) - W + double(k) * W;  // sum over r of (r + k)
    EXPECT_EQ(tensors[k][0].item<double>(), expected) << "k=" << k;
  }
}

TEST(Collectives, SizesNotMultipleOfWorldAreRejectedWithTheNumbers) {
  const int W = g_world->size();
  if (W == 1) GTEST_SKIP() << "every size is a multiple of 1";
  auto input = torch::zeros({W * 5 + 1});
  auto output = torch::zeros({5});
  try {
    g_world->reduce_scatter(output, input);
    FAIL() << "expected a CommError";
  } catch (const zero::CommError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(W * 5 + 1)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pad"), std::string::npos) << e.what();
  }
}

TEST(Collectives, SubGroupsOfEvenAndOddRanks) {
  const int W = g_world->size(), R = g_world->rank();
  std::vector<int> even, odd;
  for (int r = 0; r < W; ++r) (r % 2 ? odd : even).push_back(r);
  auto g_even = g_world->new_group(even);
  auto g_odd = odd.empty() ? nullptr : g_world->new_group(odd);
  auto mine = R % 2 ? g_odd : g_even;
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(R % 2 ? g_even : g_odd, nullptr);
  const auto& members = R % 2 ? odd : even;
  EXPECT_EQ(mine->size(), static_cast<int>(members.size()));
  EXPECT_EQ(mine->global_rank(mine->rank()), R);

  auto t = torch::full({33}, double(R + 1));
  mine->all_reduce(t);
  double expected = 0;
  for (int r : members) expected += r + 1;
  EXPECT_TRUE(t.equal(torch::full({33}, expected)));

  auto gathered = torch::empty({mine->size() * 3});
  mine->all_gather(gathered, torch::full({3}, double(R)));
  for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(gathered[i * 3].item<double>(), members[i]);
  g_world->barrier();
}

TEST(Collectives, CudaTensors) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
  // Several ranks on one GPU need ZERO_CUDA_BACKEND=gloo (NCCL refuses
  // two ranks on one device); one rank per GPU uses NCCL.
  const int W = g_world->size(), R = g_world->rank();
  for (auto dtype : kDtypes) {
    auto t = contribution(R, 4099, dtype).to(torch::kCUDA);
    g_world->all_reduce(t);
    auto base = (torch::arange(4099, torch::kLong) % 7 + 1).to(torch::kDouble);
    EXPECT_TRUE(t.cpu().to(torch::kDouble).equal(base * rank_sum(W))) << name(dtype);

    auto out = torch::empty({1001}, t.options());
    g_world->reduce_scatter(out, contribution(R, W * 1001, dtype).to(torch::kCUDA));
    auto mine = (torch::arange(R * 1001, (R + 1) * 1001, torch::kLong) % 7 + 1).to(torch::kDouble);
    EXPECT_TRUE(out.cpu().to(torch::kDouble).equal(mine * rank_sum(W))) << name(dtype);

    auto gathered = torch::empty({W * 1001}, t.options());
    g_world->all_gather(gathered, contribution(R, 1001, dtype).to(torch::kCUDA));
    for (int r = 0; r < W; ++r) {
      EXPECT_TRUE(gathered.slice(0, r * 1001, (r + 1) * 1001).cpu().equal(contribution(r, 1001, dtype))) << name(dtype);
    }

    auto swapped = torch::empty({W * 1001}, t.options());
    g_world->all_to_all(swapped, contribution(R, W * 1001, dtype).to(torch::kCUDA));
    for (int p = 0; p < W; ++p) {
      EXPECT_TRUE(swapped.slice(0, p * 1001, (p + 1) * 1001)
                      .cpu()
                      .equal(contribution(p, W * 1001, dtype).slice(0, R * 1001, (R + 1) * 1001)))
          << name(dtype) << " from rank " << p;
    }
  }
}

}  // namespace
