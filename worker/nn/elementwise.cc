#include "worker/nn/elementwise.h"

#include <cstring>

#include "common/error.h"

namespace tessera {

Tensor LeakyReLU::forward(const Tensor& x, bool training) {
  Tensor y(x.shape(), x.layout());
  const float* xp = x.data();
  float* yp = y.data();
  const float s = slope_;
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] > 0.0f ? xp[i] : s * xp[i];
  if (training) x_ = x;
  return y;
}

Tensor LeakyReLU::backward(const Tensor& dy) {
  TESSERA_CHECK(dy.shape() == x_.shape() && dy.layout() == x_.layout(), "layer ", name(), ": gradient shape ",
                shape_str(dy.shape()), " or layout differs from the forward pass");
  return leaky_relu_grad(x_, dy, slope_);
}

Tensor leaky_relu_grad(const Tensor& gate, const Tensor& dy, float slope) {
  Tensor dx(dy.shape(), dy.layout());
  const float* gp = gate.data();
  const float* g = dy.data();
  float* o = dx.data();
  const int64_t n = dy.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = gp[i] > 0.0f ? g[i] : slope * g[i];
  return dx;
}

Dropout::Dropout(std::string name, float rate, uint64_t seed) : Layer(std::move(name)), rate_(rate), rng_(seed) {
  if (!(rate >= 0.0f && rate < 1.0f))
    throw ConfigError("model.layers." + this->name(), detail::concat("dropout: rate ", rate, " is outside [0, 1)"));
}

Tensor Dropout::forward(const Tensor& x, bool training) {
  if (!training || rate_ == 0.0f) {
    mask_ = Tensor();
    return x;
  }
  mask_ = Tensor(x.shape());
  Tensor y(x.shape());
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const float keep = 1.0f / (1.0f - rate_);
  for (int64_t i = 0; i < x.numel(); ++i) {
    mask_[i] = u(rng_) < rate_ ? 0.0f : keep;
    y[i] = x[i] * mask_[i];
  }
  return y;
}

Tensor Dropout::backward(const Tensor& dy) {
  if (mask_.empty()) return dy;
  TESSERA_CHECK(dy.shape() == mask_.shape(), "layer ", name(), ": gradient shape ", shape_str(dy.shape()));
  Tensor dx(dy.shape());
  for (int64_t i = 0; i < dy.numel(); ++i) dx[i] = dy[i] * mask_[i];
  return dx;
}

Shape Flatten::output_shape(const Shape& in) const {
  if (in.size() < 2) shape_error("expects at least 2 dimensions, got " + shape_str(in));
  int64_t rest = 1;
  for (size_t i = 1; i < in.size(); ++i) rest *= in[i];
  return {in[0], rest};
}

Tensor Flatten::forward(const Tensor& x, bool) {
  in_ = x.shape();
  return x.reshape(output_shape(x.shape()));
}

Tensor concat_channels(const Tensor& a, const Tensor& b) {
  TESSERA_CHECK(a.rank() >= 2 && a.rank() == b.rank(), "concat of ", shape_str(a.shape()), " and ", shape_str(b.shape()));
  for (int i = 0; i < a.rank(); ++i)
    if (i != 1) TESSERA_CHECK_EQ(a.dim(i), b.dim(i), "concat of ", shape_str(a.shape()), " and ", shape_str(b.shape()));
  Shape out = a.shape();
  out[1] = a.dim(1) + b.dim(1);
  Tensor y(out);
  const int64_t n = a.dim(0);
  const int64_t sa = a.numel() / n, sb = b.numel() / n;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(y.data() + i * (sa + sb), a.data() + i * sa, sa * sizeof(float));
    std::memcpy(y.data() + i * (sa + sb) + sa, b.data() + i * sb, sb * sizeof(float));
  }
  return y;
}

void split_channels(const Tensor& dy, int64_t channels_a, Tensor& da, Tensor& db) {
  Shape sa = dy.shape(), sb = dy.shape();
  TESSERA_CHECK(channels_a > 0 && channels_a < dy.dim(1), "split of ", shape_str(dy.shape()), " at ", channels_a);
  sa[1] = channels_a;
  sb[1] = dy.dim(1) - channels_a;
  da = Tensor(sa);
  db = Tensor(sb);
  const int64_t n = dy.dim(0);
  const int64_t a = da.numel() / n, b = db.numel() / n;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(da.data() + i * a, dy.data() + i * (a + b), a * sizeof(float));
    std::memcpy(db.data() + i * b, dy.data() + i * (a + b) + a, b * sizeof(float));
  }
}

}  // namespace tessera
