// Batch normalisation over (N, C, spatial...): per-channel statistics over N and the spatial
// dimensions in training (running averages kept for evaluation), learnable scale and shift.
// A StatsReducer, when set, sums the per-channel partial statistics across ranks (spatial
// parallelism: a sample split over ranks still normalises with global statistics).
// On the GPU the statistics, running averages and normalisation are CUDA kernels (gpu::batchnorm_*)
// that keep everything on the device but, with a reducer, the per-channel sums, which cross through
// the host to be reduced.
#pragma once

#include <functional>
#include <span>

#include "worker/nn/layer.h"

namespace tessera {

class BatchNorm : public Layer {
 public:
  // Sums its argument elementwise over the ranks that share the statistics.
  using StatsReducer = std::function<void(std::span<double>)>;

  BatchNorm(std::string name, int channels, float momentum = 0.1f, float eps = 1e-5f);
  const char* kind() const override { return "batchnorm"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Param*> params() override { return {&gamma_, &beta_}; }
  // Per channel on the host in either layout; on the device plain, as every device activation.
  Layouts layouts() const override { return Layouts::kEither; }
  void to(Device device) override;  // the running statistics too
  void set_stats_reducer(StatsReducer r) { reducer_ = std::move(r); }
  // Running statistics (part of a checkpoint).
  Tensor& running_mean() { return running_mean_; }
  Tensor& running_var() { return running_var_; }

 private:
  int channels_;
  float momentum_, eps_;
  Param gamma_, beta_;
  Tensor running_mean_, running_var_;
  StatsReducer reducer_;
  // From the last training forward:
  Tensor xhat_;
  std::vector<float> inv_std_;
  Tensor device_inv_std_;  // on the GPU
  double count_ = 0;
};

}  // namespace tessera
