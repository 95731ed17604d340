// Fully connected layer: y = x W^T + b for x of shape (N, in), W (out, in), on oneDNN's sgemm (on
// the GPU: cuBLAS's).
#pragma once

#include "worker/nn/layer.h"

namespace tessera {

class Linear : public Layer {
 public:
  Linear(std::string name, int in_features, int out_features, uint64_t seed = 1, ParamInit init = {});
  const char* kind() const override { return "linear"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Param*> params() override { return {&weight_, &bias_}; }
  double forward_flops(const Shape& in) const override { return 2.0 * in[0] * in_ * out_; }
  Param& weight() { return weight_; }
  Param& bias() { return bias_; }

 private:
  int in_, out_;
  Param weight_, bias_;
  Tensor x_;
  bool have_input_ = false;  // a training forward ran (x_ may hold zero samples)
};

}  // namespace tessera
