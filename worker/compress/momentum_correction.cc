#include "worker/compress/momentum_correction.h"

#include "common/error.h"

namespace tessera {

void MomentumCorrection::accumulate(int bucket, std::span<float> grad) {
  auto [it, inserted] = velocity_.try_emplace(bucket);
  std::vector<float>& u = it->second;
  if (inserted) u.assign(grad.size(), 0.0f);
  TESSERA_CHECK_EQ(u.size(), grad.size(), "the velocity of bucket ", bucket, " changed size");
  const float m = momentum_;
  float* __restrict up = u.data();
  float* __restrict gp = grad.data();
  for (size_t i = 0; i < u.size(); ++i) {
    up[i] = m * up[i] + gp[i];
    gp[i] = up[i];
  }
}

void MomentumCorrection::mask(int bucket, std::span<const float> exchanged) {
  auto it = velocity_.find(bucket);
  TESSERA_CHECK(it != velocity_.end(), "bucket ", bucket, " has no velocity");
  std::vector<float>& u = it->second;
  TESSERA_CHECK_EQ(u.size(), exchanged.size(), "the velocity of bucket ", bucket, " against its exchange");
  for (size_t i = 0; i < u.size(); ++i)
    if (exchanged[i] != 0.0f) u[i] = 0.0f;
}

}  // namespace tessera
