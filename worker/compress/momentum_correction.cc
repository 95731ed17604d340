#include "worker/compress/momentum_correction.h"

#include "common/error.h"

namespace tessera {

std::vector<float>& MomentumCorrection::velocity(int bucket, size_t size) {
  auto [it, inserted] = velocity_.try_emplace(bucket);
  std::vector<float>& u = it->second;
  if (inserted) u.assign(size, 0.0f);
  TESSERA_CHECK_EQ(u.size(), size, "the velocity of bucket ", bucket, " changed size");
  return u;
}

void MomentumCorrection::accumulate(int bucket, std::span<float> grad) {
  accumulate_into(bucket, grad.size(), 0, grad, grad);
}

void MomentumCorrection::accumulate_into(int bucket, size_t bucket_size, size_t offset, std::span<const float> grad,
                                         std::span<float> into) {
  std::vector<float>& u = velocity(bucket, bucket_size);
  TESSERA_CHECK(offset + grad.size() <= u.size() && into.size() == grad.size(), "bucket ", bucket, ": ", grad.size(),
                " floats at ", offset, " of its velocity of ", u.size());
  const float m = momentum_;
  float* up = u.data() + offset;
  const float* gp = grad.data();
  float* out = into.data();
  for (size_t i = 0; i < grad.size(); ++i) {
    const float v = m * up[i] + gp[i];
    up[i] = v;
    out[i] = v;
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
