// Momentum correction's arithmetic: the ranks' velocities sum to SGD's momentum buffer, and a sent
// entry's velocity restarts.
#include "worker/compress/momentum_correction.h"

#include <gtest/gtest.h>

#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera {
namespace {

TEST(MomentumCorrectionTest, TheRanksVelocitiesSumToSgdsMomentumBuffer) {
  // two ranks, three steps of gradients of 3 entries; SGD's buffer: b := 0.9 b + (g0 + g1)
  const std::vector<std::vector<float>> g0 = {{1, -2, 0.5f}, {0.25f, 1, -1}, {3, 0, 2}};
  const std::vector<std::vector<float>> g1 = {{-1, 4, 1.5f}, {0.75f, -3, 2}, {1, 1, -2}};
  MomentumCorrection r0(0.9f), r1(0.9f);
  std::vector<double> buffer(3, 0.0);
  for (size_t s = 0; s < g0.size(); ++s) {
    std::vector<float> a = g0[s], b = g1[s];
    r0.accumulate(7, a);
    r1.accumulate(7, b);
    for (size_t i = 0; i < 3; ++i) {
      buffer[i] = 0.9 * buffer[i] + g0[s][i] + g1[s][i];
      EXPECT_NEAR(a[i] + b[i], buffer[i], 1e-5) << "step " << s << " entry " << i;  // what the ranks send
    }
  }
  EXPECT_EQ(r0.velocities().at(7).size(), 3u);
}

TEST(MomentumCorrectionTest, FillingABucketPartByPartIsAccumulatingItWhole) {
  // a bucket of two parameters (3 and 2 floats), filled from their gradients as BucketExchange fuses
  // them, against the same bucket copied and accumulated in place; the gradients stay as they were
  const std::vector<float> w = {1, -2, 0.5f}, v = {4, 0.25f};
  MomentumCorrection parts(0.9f), whole(0.9f);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> bucket(5, -7.0f);
    parts.accumulate_into(3, 5, 0, w, std::span<float>(bucket.data(), 3));
    parts.accumulate_into(3, 5, 3, v, std::span<float>(bucket.data() + 3, 2));
    std::vector<float> copied = {w[0], w[1], w[2], v[0], v[1]};
    whole.accumulate(3, copied);
    EXPECT_EQ(bucket, copied) << "step " << step;
  }
  EXPECT_EQ(parts.velocities(), whole.velocities());
  EXPECT_EQ(w, (std::vector<float>{1, -2, 0.5f}));
  std::vector<float> out(2);
  try {
    parts.accumulate_into(3, 5, 4, v, out);  // past the bucket's end
    FAIL() << "expected a failed check";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("2 floats at 4 of its velocity of 5"), std::string::npos) << e.what();
  }
}

TEST(MomentumCorrectionTest, ASentEntrysVelocityRestarts) {
  MomentumCorrection mc(0.5f);
  std::vector<float> g = {2, 4, 6, 8};
  mc.accumulate(0, g);
  const std::vector<float> exchanged = {0, 5, 0, -1};  // entries 1 and 3 were sent by the gang
  mc.mask(0, exchanged);
  EXPECT_EQ(mc.velocities().at(0), (std::vector<float>{2, 0, 6, 0}));
  std::vector<float> next = {1, 1, 1, 1};
  mc.accumulate(0, next);
  EXPECT_EQ(next, (std::vector<float>{2, 1, 4, 1}));  // 0.5 u + g
  // restored velocities carry on
  MomentumCorrection again(0.5f);
  again.restore({{0, {2, 1, 4, 1}}});
  std::vector<float> zero(4, 0.0f);
  again.accumulate(0, zero);
  EXPECT_EQ(zero, (std::vector<float>{1, 0.5f, 2, 0.5f}));
}

TEST(MomentumCorrectionTest, ABucketKeepsItsSize) {
  MomentumCorrection mc(0.9f);
  std::vector<float> g(4, 1.0f), h(5, 1.0f);
  mc.accumulate(3, g);
  EXPECT_ANY_THROW(mc.accumulate(3, h));
  EXPECT_ANY_THROW(mc.mask(4, g));  // never accumulated
}

}  // namespace
}  // namespace tessera
