// Error feedback for sparsified gradients: what a rank did not send stays in a per-bucket residual
// and is added to the next gradient of that bucket, so no gradient mass is lost, only delayed.
//
// Per step: acc = accumulate(bucket, g) (acc := residual + g, in place in the residual), select
// and send entries of acc, then mark_sent(bucket, idx) zeroes them. Invariant, exactly, elementwise:
// sent + residual_after == residual_before + g. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace tessera {

class ErrorFeedback {
 public:
  // residual(bucket) += grad; returns the residual buffer, now the accumulated gradient. A bucket's
  // size is fixed by its first use; a different size later is an invariant failure.
  std::span<float> accumulate(int bucket, std::span<const float> grad);
  // Zeroes the entries that were sent; with `bf16`, where each was sent rounded to bf16, keeps what
  // the rounding left out (acc - round_bf16(acc), exact in fp32).
  void mark_sent(int bucket, std::span<const uint32_t> idx, bool bf16 = false);
  // The current residual of `bucket` (empty if never used).
  std::span<const float> residual(int bucket) const;
  // Drops every residual (e.g. when the strategy switches to dense).
  void clear() { residuals_.clear(); }
  // Every residual by bucket (for checkpoints), and restoring one.
  const std::unordered_map<int, std::vector<float>>& all() const { return residuals_; }
  void restore(int bucket, std::vector<float> residual) { residuals_[bucket] = std::move(residual); }

 private:
  std::unordered_map<int, std::vector<float>> residuals_;
};

}  // namespace tessera
