// Test and benchmark data: reproducible standard-normal vectors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace tessera::testing {

// d standard-normal floats from `seed` (mt19937): the same values on every run.
inline std::vector<float> gaussian(size_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(d);
  for (auto& v : x) v = n(rng);
  return x;
}

}  // namespace tessera::testing
