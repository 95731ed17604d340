#include "worker/nn/elementwise.h"

#include <cstring>

#include "common/error.h"
#include "worker/nn/gpu/ops.h"
#include "worker/nn/kernels.h"

namespace tessera {

Tensor LeakyReLU::forward(const Tensor& x, bool training) {
  Tensor y(x.shape(), x.layout(), x.device());
  const float* xp = x.data();
  float* yp = y.data();
  const float s = slope_;
  const int64_t n = x.numel();
  if (x.on_device()) {
    gpu::leaky_relu(xp, yp, n, s);
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) yp[i] = kernels::leaky_relu(xp[i], s);
  }
  if (training) x_ = x;
  return y;
}

Tensor LeakyReLU::backward(const Tensor& dy) {
  TESSERA_CHECK(dy.shape() == x_.shape() && dy.layout() == x_.layout(), "layer ", name(), ": gradient shape ",
                shape_str(dy.shape()), " or layout differs from the forward pass");
  return leaky_relu_grad(x_, dy, slope_);
}

Tensor leaky_relu_grad(const Tensor& gate, const Tensor& dy, float slope) {
  TESSERA_CHECK(gate.device() == dy.device(), "leaky_relu_grad: gate and gradient on different devices");
  Tensor dx(dy.shape(), dy.layout(), dy.device());
  const float* gp = gate.data();
  const float* g = dy.data();
  float* o = dx.data();
  const int64_t n = dy.numel();
  if (dy.on_device()) {
    gpu::leaky_relu_grad(gp, g, o, n, slope);
    return dx;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = kernels::leaky_relu_grad(gp[i], g[i], slope);
  return dx;
}

Tensor GELU::forward(const Tensor& x, bool training) {
  Tensor y(x.shape(), x.layout(), x.device());
  const float* xp = x.data();
  float* yp = y.data();
  const int64_t n = x.numel();
  if (x.on_device()) {
    gpu::gelu(xp, yp, n);
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) yp[i] = kernels::gelu(xp[i]);
  }
  if (training) x_ = x;
  return y;
}

Tensor GELU::backward(const Tensor& dy) {
  TESSERA_CHECK(dy.shape() == x_.shape() && dy.layout() == x_.layout() && dy.device() == x_.device(), "layer ", name(),
                ": gradient shape ", shape_str(dy.shape()), " or layout differs from the forward pass");
  Tensor dx(dy.shape(), dy.layout(), dy.device());
  const float* xp = x_.data();
  const float* g = dy.data();
  float* o = dx.data();
  const int64_t n = dy.numel();
  if (dy.on_device()) {
    gpu::gelu_grad(xp, g, o, n);
    return dx;
  }
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = kernels::gelu_grad(xp[i], g[i]);
  return dx;
}

Dropout::Dropout(std::string name, float rate, uint64_t seed) : Layer(std::move(name)), rate_(rate), seed_(seed) {
  if (!(rate >= 0.0f && rate < 1.0f))
    throw ConfigError("model.layers." + this->name(), detail::concat("dropout: rate ", rate, " is outside [0, 1)"));
}

Tensor Dropout::forward(const Tensor& x, bool training) {
  if (!training || rate_ == 0.0f) {
    mask_ = Tensor();
    return x;
  }
  mask_ = Tensor(x.shape(), Layout::kPlain, x.device());
  Tensor y(x.shape(), Layout::kPlain, x.device());
  const uint64_t call = calls_++;
  if (x.on_device()) {
    gpu::dropout(x.data(), y.data(), mask_.data(), x.numel(), rate_, seed_, call);
    return y;
  }
  for (int64_t i = 0; i < x.numel(); ++i) {
    mask_[i] = kernels::dropout_scale(seed_, call, static_cast<uint64_t>(i), rate_);
    y[i] = x[i] * mask_[i];
  }
  return y;
}

Tensor Dropout::backward(const Tensor& dy) {
  if (mask_.empty()) return dy;
  TESSERA_CHECK(dy.shape() == mask_.shape() && dy.device() == mask_.device(), "layer ", name(), ": gradient shape ",
                shape_str(dy.shape()));
  Tensor dx(dy.shape(), Layout::kPlain, dy.device());
  if (dy.on_device()) {
    gpu::multiply(dy.data(), mask_.data(), dx.data(), dy.numel());
    return dx;
  }
  for (int64_t i = 0; i < dy.numel(); ++i) dx[i] = dy[i] * mask_[i];
  return dx;
}

namespace {
// n floats from src to dst, both on `device`.
void copy_floats(float* dst, const float* src, int64_t n, Device device) {
  if (device == Device::kCuda) gpu::copy(dst, device, src, device, static_cast<size_t>(n) * sizeof(float));
  else std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
}  // namespace

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
  TESSERA_CHECK(a.rank() >= 2 && a.rank() == b.rank(), "concat of ", shape_str(a.shape()), " and ",
                shape_str(b.shape()));
  for (int i = 0; i < a.rank(); ++i)
    if (i != 1) TESSERA_CHECK_EQ(a.dim(i), b.dim(i), "concat of ", shape_str(a.shape()), " and ", shape_str(b.shape()));
  TESSERA_CHECK(a.device() == b.device(), "concat of tensors on different devices");
  Shape out = a.shape();
  out[1] = a.dim(1) + b.dim(1);
  Tensor y(out, Layout::kPlain, a.device());
  const int64_t n = a.dim(0);
  const int64_t sa = a.numel() / n, sb = b.numel() / n;
  for (int64_t i = 0; i < n; ++i) {
    copy_floats(y.data() + i * (sa + sb), a.data() + i * sa, sa, a.device());
    copy_floats(y.data() + i * (sa + sb) + sa, b.data() + i * sb, sb, a.device());
  }
  return y;
}

void split_channels(const Tensor& dy, int64_t channels_a, Tensor& da, Tensor& db) {
  Shape sa = dy.shape(), sb = dy.shape();
  TESSERA_CHECK(channels_a > 0 && channels_a < dy.dim(1), "split of ", shape_str(dy.shape()), " at ", channels_a);
  sa[1] = channels_a;
  sb[1] = dy.dim(1) - channels_a;
  da = Tensor(sa, Layout::kPlain, dy.device());
  db = Tensor(sb, Layout::kPlain, dy.device());
  const int64_t n = dy.dim(0);
  const int64_t a = da.numel() / n, b = db.numel() / n;
  for (int64_t i = 0; i < n; ++i) {
    copy_floats(da.data() + i * a, dy.data() + i * (a + b), a, dy.device());
    copy_floats(db.data() + i * b, dy.data() + i * (a + b) + a, b, dy.device());
  }
}

}  // namespace tessera
