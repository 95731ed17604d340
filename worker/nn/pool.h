// Max and average pooling (2D and 3D) on oneDNN, in the input's layout (plain or channels-last);
// max pooling keeps its workspace for backward. Average pooling excludes padding from the divisor.
// On the GPU: cuDNN pooling (gpu::Pool), keeping the training input and output for backward.
#pragma once

#include <memory>
#include <vector>

#include "worker/nn/layer.h"

namespace tessera {

namespace gpu {
class Pool;
}  // namespace gpu

struct PoolOptions {
  bool max = true;  // max pooling, else average
  int kernel = 2;
  int stride = 2;
  int padding = 0;
  int spatial_dims = 3;               // 2 or 3
  std::vector<int> pad_l{}, pad_r{};  // per spatial dimension, overriding `padding` when given
};

class Pool : public Layer {
 public:
  Pool(std::string name, PoolOptions options);
  ~Pool() override;
  const char* kind() const override { return options_.max ? "maxpool" : "avgpool"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  Layouts layouts() const override { return Layouts::kChannelsLast; }
  const PoolOptions& options() const { return options_; }

 private:
  struct Plan;
  Plan& plan_for(const Shape& in, Layout layout);
  Tensor forward_device(const Tensor& x, bool training);
  PoolOptions options_;
  std::unique_ptr<Plan> plan_;
  std::unique_ptr<gpu::Pool> device_pool_;
  Shape device_in_;
  Tensor x_, y_;  // the last training pass on the device
};

}  // namespace tessera
