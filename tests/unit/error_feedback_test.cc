#include "worker/compress/error_feedback.h"

#include <gtest/gtest.h>

#include <random>

#include "worker/compress/topk.h"
#include "worker/nn/kernels.h"

namespace tessera {
namespace {

// sent + residual_after == residual_before + grad, exactly and elementwise, at every step, for two
// interleaved buckets.
TEST(ErrorFeedbackTest, ConservesTheGradientExactly) {
  ErrorFeedback ef;
  MSTopK ms;
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const size_t sizes[2] = {10007, 300};
  std::vector<uint32_t> idx;
  for (int step = 0; step < 20; ++step) {
    for (int b = 0; b < 2; ++b) {
      std::vector<float> g(sizes[b]);
      for (auto& v : g) v = n(rng) * (b ? 100.0f : 1e-3f);
      std::vector<float> before(ef.residual(b).begin(), ef.residual(b).end());
      if (before.empty()) before.assign(sizes[b], 0.0f);
      std::vector<float> expect(sizes[b]);
      for (size_t i = 0; i < sizes[b]; ++i) expect[i] = before[i] + g[i];

      auto acc = ef.accumulate(b, g);
      ms.select(acc, topk_count(acc.size(), 0.01), idx, "b");
      std::vector<float> sent(sizes[b], 0.0f);
      for (uint32_t i : idx) sent[i] = acc[i];
      ef.mark_sent(b, idx);

      auto after = ef.residual(b);
      for (size_t i = 0; i < sizes[b]; ++i) {
        ASSERT_EQ(sent[i] + after[i], expect[i]) << "step " << step << " bucket " << b << " element " << i;
        ASSERT_TRUE(sent[i] == 0.0f || after[i] == 0.0f);
      }
    }
  }
}

// Sent in bf16, an entry leaves what the rounding dropped in the residual: sent + residual_after ==
// residual_before + grad still holds exactly, and what stays is at most half a bf16 step (2^-8 of
// the value: bf16 keeps 8 significant bits).
TEST(ErrorFeedbackTest, Bf16KeepsWhatRoundingLeftOut) {
  ErrorFeedback ef;
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<uint32_t> idx;
  for (int step = 0; step < 10; ++step) {
    std::vector<float> g(4096);
    for (auto& v : g) v = n(rng);
    std::vector<float> before(ef.residual(0).begin(), ef.residual(0).end());
    if (before.empty()) before.assign(g.size(), 0.0f);
    auto acc = ef.accumulate(0, g);
    exact_topk(acc, 64, idx, "b");
    std::vector<float> sent(g.size(), 0.0f);
    for (uint32_t i : idx) sent[i] = kernels::round_bf16(acc[i]);
    ef.mark_sent(0, idx, /*bf16=*/true);
    auto after = ef.residual(0);
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(sent[i] + after[i], before[i] + g[i]) << "step " << step;
    for (uint32_t i : idx) ASSERT_LE(std::abs(after[i]), std::abs(sent[i]) * 0x1p-8f) << "step " << step;
  }
}

TEST(ErrorFeedbackTest, ResidualCarriesUnsentMass) {
  ErrorFeedback ef;
  std::vector<float> g = {1.0f, 5.0f, 2.0f};
  auto acc = ef.accumulate(0, g);
  std::vector<uint32_t> idx = {1};
  ef.mark_sent(0, idx);
  auto r = ef.residual(0);
  EXPECT_EQ(std::vector<float>(r.begin(), r.end()), (std::vector<float>{1.0f, 0.0f, 2.0f}));
  acc = ef.accumulate(0, g);
  EXPECT_EQ(std::vector<float>(acc.begin(), acc.end()), (std::vector<float>{2.0f, 5.0f, 4.0f}));
  ef.clear();
  EXPECT_TRUE(ef.residual(0).empty());
}

TEST(ErrorFeedbackTest, ChangingBucketSizeIsAnInvariantFailure) {
  ErrorFeedback ef;
  std::vector<float> a(4, 1.0f), b(5, 1.0f);
  ef.accumulate(3, a);
  EXPECT_THROW(ef.accumulate(3, b), std::logic_error);
}

}  // namespace
}  // namespace tessera
