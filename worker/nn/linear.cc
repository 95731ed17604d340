#include "worker/nn/linear.h"

#include "common/error.h"
#include "worker/nn/gpu/ops.h"

namespace tessera {

Linear::Linear(std::string name, int in_features, int out_features, uint64_t seed, ParamInit init)
    : Layer(std::move(name)), in_(in_features), out_(out_features) {
  if (in_ < 1 || out_ < 1)
    throw ConfigError("model.layers." + this->name(), detail::concat("linear: invalid sizes ", in_, " -> ", out_));
  weight_ = Param{this->name() + ".weight", Tensor({out_, in_}), Tensor::zeros({out_, in_}), true};
  bias_ = Param{this->name() + ".bias", Tensor::zeros({out_}), Tensor::zeros({out_}), false};
  init_params(weight_.value, &bias_.value, in_, out_, seed, init);
}

Shape Linear::output_shape(const Shape& in) const {
  if (in.size() != 2 || in[1] != in_) shape_error(detail::concat("expects input (N, ", in_, "), got ", shape_str(in)));
  return {in[0], out_};
}

Tensor Linear::forward(const Tensor& x, bool training) {
  Shape out = output_shape(x.shape());
  const int64_t n = x.dim(0);
  Tensor y(out, Layout::kPlain, x.device());
  if (training) {
    x_ = x;
    have_input_ = true;
  }
  if (x.on_device()) {
    gpu::linear_forward(x.data(), weight_.value.data(), y.data(), n, in_, out_);
    gpu::add_bias(y.data(), bias_.value.data(), n, out_, 1);
    return y;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < out_; ++j) y[i * out_ + j] = bias_.value[j];
  gemm(precision(), 'N', 'T', n, out_, in_, 1.0f, x.data(), in_, weight_.value.data(), in_, 1.0f, y.data(), out_);
  return y;
}

Tensor Linear::backward(const Tensor& dy) {
  TESSERA_CHECK(have_input_, "layer ", name(), ": backward without a training forward");
  if (x_.dim(0) == 0) return Tensor({0, in_}, Layout::kPlain, x_.device());
  const int64_t n = x_.dim(0);
  TESSERA_CHECK(dy.shape() == (Shape{n, out_}) && dy.device() == x_.device(), "layer ", name(), ": gradient shape ",
                shape_str(dy.shape()));
  Tensor dx({n, in_}, Layout::kPlain, dy.device());
  if (dy.on_device()) {
    gpu::linear_backward_data(dy.data(), weight_.value.data(), dx.data(), n, in_, out_);
    gpu::linear_backward_weights(dy.data(), x_.data(), weight_.grad.data(), n, in_, out_);
    gpu::bias_grad(dy.data(), bias_.grad.data(), n, out_, 1);
    return dx;
  }
  gemm(precision(), 'N', 'N', n, in_, out_, 1.0f, dy.data(), out_, weight_.value.data(), in_, 0.0f, dx.data(), in_);
  gemm(precision(), 'T', 'N', out_, in_, n, 1.0f, dy.data(), out_, x_.data(), in_, 1.0f, weight_.grad.data(), in_);
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < out_; ++j) bias_.grad[j] += dy[i * out_ + j];
  return dx;
}

}  // namespace tessera
