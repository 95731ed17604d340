// Test and benchmark data: tensors of reproducible standard-normal values.
#pragma once

#include <cstdint>
#include <random>
#include <utility>

#include "worker/core/tensor.h"

namespace tessera::testing {

// A host tensor of `shape` filled with standard-normal floats from `seed` (mt19937).
inline Tensor random_tensor(Shape shape, uint64_t seed) {
  Tensor t(std::move(shape));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (float& v : t.span()) v = n(rng);
  return t;
}

}  // namespace tessera::testing
