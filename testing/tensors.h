// Test and benchmark data: tensors of reproducible standard-normal values, and how far one tensor is
// from another.
#pragma once

#include <algorithm>
#include <cmath>
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

// ||a - b|| / ||b|| over every entry (the same shapes and layouts), in double.
inline double relative_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace tessera::testing
