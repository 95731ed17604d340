// Host tensor storage under keep_freed_tensor_memory(), as the worker and the benchmarks run: a
// freed block comes back to the next tensor of its size (a training step's allocations fault in no
// fresh pages after the first step), and what is held and alive together stays within a quarter
// over the most ever alive at once. Its own test binary: the setting is process-wide.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "worker/core/tensor.h"

namespace tessera {
namespace {

class TensorMemoryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { keep_freed_tensor_memory(); }
};

// One "step": tensors of a few sizes alive together, as a forward pass keeps its activations, then
// freed. Returns the storage each one had.
std::set<const float*> step(const std::vector<int64_t>& sizes) {
  std::vector<Tensor> alive;
  std::set<const float*> blocks;
  for (int64_t n : sizes) {
    alive.emplace_back(Shape{n});
    alive.back().fill(1.0f);
    blocks.insert(alive.back().data());
  }
  return blocks;
}

TEST_F(TensorMemoryTest, AStepReusesTheBlocksOfTheStepBefore) {
  const std::vector<int64_t> sizes = {1 << 18, 1 << 19, 1 << 18, 3 << 17, 1 << 20};
  const std::set<const float*> first = step(sizes);
  EXPECT_GT(cached_tensor_bytes(), 0);
  EXPECT_EQ(step(sizes), first) << "the second step got storage the first had not held";
  EXPECT_EQ(step(sizes), first);
}

TEST_F(TensorMemoryTest, SmallTensorsAreNotHeld) {
  const int64_t before = cached_tensor_bytes();
  { Tensor small(Shape{1000}); }
  EXPECT_EQ(cached_tensor_bytes(), before);
}

TEST_F(TensorMemoryTest, HeldAndAliveStayNearTheMostEverAlive) {
  // Steps of other sizes each time: without a bound the held blocks would grow with every step.
  for (int s = 1; s <= 12; ++s) {
    std::vector<Tensor> alive;
    for (int i = 0; i < 4; ++i) {
      alive.emplace_back(Shape{(1 << 18) + s * 4096 + i * 64});
      const int64_t most = peak_tensor_bytes();  // never reset in this binary: the most ever alive
      EXPECT_LE(live_tensor_bytes() + cached_tensor_bytes(), most + most / 4) << "step " << s << ", tensor " << i;
    }
  }
  EXPECT_GT(cached_tensor_bytes(), 0);
  EXPECT_LE(cached_tensor_bytes(), peak_tensor_bytes() + peak_tensor_bytes() / 4);
}

}  // namespace
}  // namespace tessera
