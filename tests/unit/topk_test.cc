#include "worker/compress/topk.h"

#include <gtest/gtest.h>

#include "testing/random.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "common/error.h"

namespace tessera {
namespace {

using testing::gaussian;

// The selected indices are k distinct valid indices whose magnitudes, sorted, equal the true top k.
void expect_true_topk(const std::vector<float>& x, size_t k, const std::vector<uint32_t>& idx) {
  ASSERT_EQ(idx.size(), k);
  std::set<uint32_t> distinct(idx.begin(), idx.end());
  ASSERT_EQ(distinct.size(), k) << "duplicate indices";
  std::vector<float> got, want;
  for (uint32_t i : idx) {
    ASSERT_LT(i, x.size());
    got.push_back(std::fabs(x[i]));
  }
  for (float v : x) want.push_back(std::fabs(v));
  std::sort(want.begin(), want.end(), std::greater<float>());
  want.resize(k);
  std::sort(got.begin(), got.end(), std::greater<float>());
  ASSERT_EQ(got, want);
}

TEST(TopkTest, CountFromDensity) {
  EXPECT_EQ(topk_count(0, 0.5), 0u);
  EXPECT_EQ(topk_count(1000, 0.001), 1u);
  EXPECT_EQ(topk_count(1001, 0.001), 2u);
  EXPECT_EQ(topk_count(7, 1e-9), 1u);
  EXPECT_EQ(topk_count(7, 1.0), 7u);
  EXPECT_THROW(topk_count(7, 0.0), ConfigError);
  EXPECT_THROW(topk_count(7, 1.5), ConfigError);
  EXPECT_THROW(topk_count(7, std::nan("")), ConfigError);
}

TEST(TopkTest, ExactAndMSTopKOnManyShapes) {
  MSTopK ms;
  std::vector<uint32_t> idx;
  for (size_t d : {1ul, 2ul, 3ul, 31ul, 33ul, 4095ul, 4097ul, 10001ul, 100003ul, 1000001ul}) {
    auto x = gaussian(d, static_cast<uint32_t>(d));
    std::set<size_t> ks = {0, 1, d / 2, d - 1, d, std::max<size_t>(1, d / 1000), std::max<size_t>(1, d / 100)};
    for (size_t k : ks) {
      if (k > d) continue;
      SCOPED_TRACE("d=" + std::to_string(d) + " k=" + std::to_string(k));
      exact_topk(x, k, idx);
      expect_true_topk(x, k, idx);
      ms.select(x, k, idx);
      expect_true_topk(x, k, idx);
    }
  }
}

TEST(TopkTest, MSTopKUsesOnePassOnTypicalGradients) {
  MSTopK ms;
  std::vector<uint32_t> idx;
  auto x = gaussian(2000000, 7);
  for (int rep = 0; rep < 5; ++rep) {
    ms.select(x, 2000, idx);
    expect_true_topk(x, 2000, idx);
    EXPECT_EQ(ms.last().passes, 1u);
    EXPECT_FALSE(ms.last().fell_back);
    EXPECT_LT(ms.last().candidates, 4000u);
  }
}

TEST(TopkTest, TiesAndZeros) {
  MSTopK ms;
  std::vector<uint32_t> idx;
  // All equal magnitudes (signs differ): any k of them is correct.
  std::vector<float> x(50000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 2) ? 0.5f : -0.5f;
  ms.select(x, 123, idx);
  expect_true_topk(x, 123, idx);
  // Mostly zeros with a few spikes: more zeros than d - k.
  std::vector<float> z(100000, 0.0f);
  for (size_t i = 0; i < 10; ++i) z[i * 9973] = static_cast<float>(i + 1);
  ms.select(z, 50, idx);
  expect_true_topk(z, 50, idx);
  ms.select(z, 10, idx);
  expect_true_topk(z, 10, idx);
  // A heavy tie exactly at the threshold.
  auto g = gaussian(200000, 3);
  for (size_t i = 0; i < 5000; ++i) g[i * 40] = 2.5f;
  ms.select(g, 3000, idx);
  expect_true_topk(g, 3000, idx);
}

TEST(TopkTest, NonFiniteNamesBucketAndElement) {
  MSTopK ms;
  std::vector<uint32_t> idx;
  for (size_t d : {100ul, 300000ul}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      auto x = gaussian(d, 1);
      x[d - 3] = bad;
      try {
        ms.select(x, 10, idx, "conv1.weight");
        FAIL() << "non-finite accepted";
      } catch (const NumericError& e) {
        std::string m = e.what();
        EXPECT_NE(m.find("conv1.weight"), std::string::npos) << m;
        EXPECT_NE(m.find(std::to_string(d - 3)), std::string::npos) << m;
        EXPECT_NE(m.find(std::isnan(bad) ? "NaN" : "Inf"), std::string::npos) << m;
      }
      EXPECT_THROW(exact_topk(x, 10, idx, "b"), NumericError);
      EXPECT_THROW(ms.select(x, 0, idx, "b"), NumericError);
    }
  }
}

TEST(TopkTest, KLargerThanSizeIsRejected) {
  MSTopK ms;
  std::vector<uint32_t> idx;
  std::vector<float> x(5, 1.0f);
  EXPECT_THROW(ms.select(x, 6, idx, "b"), std::invalid_argument);
  EXPECT_THROW(exact_topk(x, 6, idx, "b"), std::invalid_argument);
}

}  // namespace
}  // namespace tessera
