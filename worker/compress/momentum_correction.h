// Momentum correction (Deep Gradient Compression, Lin et al., ICLR 2018): SGD's momentum kept by each
// rank before the exchange, so that a sparse exchange sends velocity and not gradient.
//
// Per bucket: u := m u + g, and what the rank sends is u. Summed over the ranks, u is SGD's momentum
// buffer exactly (it is linear), so where every entry is sent (a dense exchange) the update equals
// SGD with momentum applied after the exchange. After a sparse exchange, the velocity of every entry
// the gang sent restarts (u := 0 where the exchanged sum is non-zero: momentum factor masking): an
// entry sent once in many steps carries their velocity, and its momentum must not carry it again.
// What a rank did not send stays in the error-feedback residual, so no gradient is lost.
//
// Not thread-safe: the communication thread uses it bucket by bucket, the training thread between steps.
#pragma once

#include <map>
#include <span>
#include <vector>

namespace tessera {

class MomentumCorrection {
 public:
  explicit MomentumCorrection(float momentum) : momentum_(momentum) {}

  // u := momentum * u + grad, then grad := u. A bucket's size is fixed by its first use.
  void accumulate(int bucket, std::span<float> grad);
  // The same for the part of a bucket of `bucket_size` at `offset`, with the gradient read from
  // `grad` and u written to `into` (the fused bucket): one pass where a copy into the bucket and
  // accumulate would take two.
  void accumulate_into(int bucket, size_t bucket_size, size_t offset, std::span<const float> grad,
                       std::span<float> into);
  // After a sparse exchange: u := 0 wherever `exchanged` (the gang's sum) is non-zero.
  void mask(int bucket, std::span<const float> exchanged);

  // Every velocity by bucket (for checkpoints), and restoring them.
  const std::map<int, std::vector<float>>& velocities() const { return velocity_; }
  void restore(std::map<int, std::vector<float>> v) { velocity_ = std::move(v); }

 private:
  std::vector<float>& velocity(int bucket, size_t size);

  float momentum_;
  std::map<int, std::vector<float>> velocity_;
};

}  // namespace tessera
