#include "worker/compress/error_feedback.h"

#include "common/error.h"
#include "worker/nn/kernels.h"

namespace tessera {

std::span<float> ErrorFeedback::accumulate(int bucket, std::span<const float> grad) {
  auto [it, inserted] = residuals_.try_emplace(bucket);
  std::vector<float>& r = it->second;
  if (inserted) r.assign(grad.size(), 0.0f);
  TESSERA_CHECK_EQ(r.size(), grad.size(), "bucket ", bucket, " changed size");
  float* __restrict rp = r.data();
  const float* __restrict gp = grad.data();
  for (size_t i = 0; i < r.size(); ++i) rp[i] += gp[i];
  return r;
}

void ErrorFeedback::mark_sent(int bucket, std::span<const uint32_t> idx, bool bf16) {
  auto it = residuals_.find(bucket);
  TESSERA_CHECK(it != residuals_.end(), "bucket ", bucket, " was never accumulated");
  for (uint32_t i : idx) {
    TESSERA_CHECK_LT(i, it->second.size(), "index sent from bucket ", bucket);
    float& r = it->second[i];
    r = bf16 ? r - kernels::round_bf16(r) : 0.0f;
  }
}

std::span<const float> ErrorFeedback::residual(int bucket) const {
  auto it = residuals_.find(bucket);
  if (it == residuals_.end()) return {};
  return it->second;
}

}  // namespace tessera
