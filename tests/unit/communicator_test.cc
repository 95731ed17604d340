// Collectives of the Gloo communicator, one thread per rank, over world sizes 1..8 and element counts
// that include 0 and odd numbers; failures that must not hang.
#include "worker/comm/gloo/gloo_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <numeric>

#include "common/error.h"
#include "testing/rank_threads.h"

namespace tessera {
namespace {

using testing::message;
using testing::rethrow_first;
using testing::run_ranks;

std::vector<int> iota_ranks(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::unique_ptr<GlooCommunicator> connect(MemoryStore& store, int rank, int world, Millis timeout = Millis(20000)) {
  GlooCommunicator::Options o;
  o.timeout = timeout;
  return GlooCommunicator::connect(store, rank, iota_ranks(world), o);
}

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, AllOperationsMatchReference) {
  const int world = GetParam();
  MemoryStore store;
  rethrow_first(run_ranks(world, [&](int r) {
    auto c = connect(store, r, world);
    for (size_t n : {0ul, 1ul, 3ul, 7ul, 1000ul, 65537ul}) {
      SCOPED_TRACE("n=" + std::to_string(n));
      // allreduce sum / max of integers (exact in float)
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 3 + r * 5) % 11);
      std::vector<float> mx = x;
      c->allreduce(std::span<float>(x));
      c->allreduce(std::span<float>(mx), ReduceOp::kMax);
      for (size_t i = 0; i < n; ++i) {
        float sum = 0, best = 0;
        for (int q = 0; q < world; ++q) {
          float v = static_cast<float>((i * 3 + q * 5) % 11);
          sum += v;
          best = std::max(best, v);
        }
        ASSERT_EQ(x[i], sum) << "allreduce element " << i;
        ASSERT_EQ(mx[i], best) << "allreduce max element " << i;
      }
      // reduce_scatter with uneven segments
      auto counts = even_split(n, world);
      std::vector<double> in(n), out(counts[r]);
      for (size_t i = 0; i < n; ++i) in[i] = static_cast<double>(i + 1000 * r);
      c->reduce_scatter(in.data(), out.data(), counts, DType::kFloat64, ReduceOp::kSum, Millis(0));
      size_t off = 0;
      for (int q = 0; q < r; ++q) off += counts[q];
      for (size_t i = 0; i < counts[r]; ++i)
        ASSERT_EQ(out[i], world * static_cast<double>(off + i) + 1000.0 * world * (world - 1) / 2);
      // allgatherv with a different count per rank (rank q contributes q + n % 3 values)
      std::vector<size_t> gcounts(world);
      size_t total = 0;
      for (int q = 0; q < world; ++q) total += gcounts[q] = q + n % 3;
      std::vector<int64_t> mine(gcounts[r], 100 * r), all(total, -1);
      c->allgatherv(mine.data(), all.data(), gcounts, DType::kInt64, Millis(0));
      size_t pos = 0;
      for (int q = 0; q < world; ++q)
        for (size_t i = 0; i < gcounts[q]; ++i) ASSERT_EQ(all[pos++], 100 * q);
      // broadcast from the last rank
      std::vector<int32_t> b(n, r == world - 1 ? 42 : 0);
      c->broadcast(std::span<int32_t>(b), world - 1);
      for (auto v : b) ASSERT_EQ(v, 42);
      c->barrier(Millis(0));
    }
    // point-to-point around the ring
    if (world > 1) {
      int64_t token = r, got = -1;
      if (r % 2 == 0) {
        c->send(&token, sizeof(token), (r + 1) % world, 7, Millis(0));
        c->recv(&got, sizeof(got), (r + world - 1) % world, 7, Millis(0));
      } else {
        c->recv(&got, sizeof(got), (r + world - 1) % world, 7, Millis(0));
        c->send(&token, sizeof(token), (r + 1) % world, 7, Millis(0));
      }
      ASSERT_EQ(got, (r + world - 1) % world);
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesTest, ::testing::Values(1, 2, 3, 4, 6, 8));

TEST(CommunicatorTest, RingAllreduceCountsExactBytes) {
  const int world = 4;
  const size_t n = 1000;
  MemoryStore store;
  std::vector<std::vector<uint64_t>> sent(world);
  rethrow_first(run_ranks(world, [&](int r) {
    auto c = connect(store, r, world);
    std::vector<float> x(n, 1.0f);
    c->allreduce(std::span<float>(x));
    sent[r] = c->bytes_sent();
  }));
  for (int r = 0; r < world; ++r) {
    for (int q = 0; q < world; ++q) {
      // Ring: 2(p-1) segments of n/p floats, all to the next rank.
      uint64_t want = q == (r + 1) % world ? 2 * (world - 1) * (n / world) * sizeof(float) : 0;
      EXPECT_EQ(sent[r][q], want) << "rank " << r << " to " << q;
    }
  }
}

TEST(CommunicatorTest, RankThatNeverJoinsFailsTheOthersWithinTimeout) {
  const int world = 4;
  MemoryStore store;
  auto t0 = std::chrono::steady_clock::now();
  auto errors = run_ranks(world - 1, [&](int r) { connect(store, r, world, Millis(1000)); });
  auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  for (int r = 0; r < world - 1; ++r) {
    std::string m = message(errors[r]);
    EXPECT_NE(m.find("rendezvous of group 'world'"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 3 (global 3) did not join within 1000 ms"), std::string::npos) << m;
    EXPECT_NE(m.find("this is rank " + std::to_string(r)), std::string::npos) << m;
  }
}

TEST(CommunicatorTest, PeerThatStopsAnsweringFailsTheCollective) {
  MemoryStore store;
  std::atomic<bool> done{false};
  std::string first, second;
  auto errors = run_ranks(2, [&](int r) {
    auto c = connect(store, r, 2, Millis(5000));
    if (r == 1) {
      while (!done) std::this_thread::sleep_for(Millis(5));  // alive, but never joins the allreduce
      return;
    }
    std::vector<float> x(1000, 1.0f);
    auto t0 = std::chrono::steady_clock::now();
    try {
      c->allreduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, Millis(300));
    } catch (const CommError& e) {
      first = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
    try {
      c->barrier(Millis(300));
    } catch (const CommError& e) {
      second = e.what();
    }
    done = true;
  });
  rethrow_first(errors);
  EXPECT_NE(first.find("allreduce on group 'world' (rank 0 of 2, global rank 0)"), std::string::npos) << first;
  EXPECT_NE(first.find("rank 1 (global 1) did not answer within 300 ms"), std::string::npos) << first;
  EXPECT_NE(second.find("unusable after an earlier failure"), std::string::npos) << second;
}

TEST(CommunicatorTest, InvalidArgumentsAreRejected) {
  MemoryStore store;
  rethrow_first(run_ranks(2, [&](int r) {
    auto c = connect(store, r, 2);
    float x = 0;
    EXPECT_THROW(c->send(&x, 4, r, 0, Millis(0)), std::invalid_argument);
    EXPECT_THROW(c->broadcast(&x, 1, DType::kFloat32, 5, Millis(0)), std::invalid_argument);
    std::vector<size_t> wrong = {1, 1, 1};
    EXPECT_THROW(c->allgatherv(&x, &x, wrong, DType::kFloat32, Millis(0)), std::invalid_argument);
  }));
  EXPECT_THROW(connect(store, 3, 2), ConfigError);
}

}  // namespace
}  // namespace tessera
