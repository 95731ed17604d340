#include "worker/nn/batchnorm.h"

#include <cmath>

#include "common/error.h"

namespace tessera {

BatchNorm::BatchNorm(std::string name, int channels, float momentum, float eps)
    : Layer(std::move(name)), channels_(channels), momentum_(momentum), eps_(eps) {
  if (channels < 1) throw ConfigError("model.layers." + this->name(), "batchnorm: channels must be positive");
  gamma_ = Param{this->name() + ".gamma", Tensor::filled({channels}, 1.0f), Tensor::zeros({channels}), false};
  beta_ = Param{this->name() + ".beta", Tensor::zeros({channels}), Tensor::zeros({channels}), false};
  running_mean_ = Tensor::zeros({channels});
  running_var_ = Tensor::filled({channels}, 1.0f);
}

Shape BatchNorm::output_shape(const Shape& in) const {
  if (in.size() < 2 || in[1] != channels_)
    shape_error(detail::concat("expects (N, ", channels_, ", ...), got ", shape_str(in)));
  return in;
}

Tensor BatchNorm::forward(const Tensor& x, bool training) {
  output_shape(x.shape());
  const int64_t n = x.dim(0), c = channels_, inner = x.numel() / (n * c);
  Tensor y(x.shape());
  std::vector<float> mean(c), inv(c);
  if (training) {
    // Partial sums (sum, sum of squares, count) per channel, reduced across ranks when asked.
    std::vector<double> stats(2 * c + 1, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* p = x.data() + (i * c + ch) * inner;
        double s = 0, q = 0;
        for (int64_t j = 0; j < inner; ++j) {
          s += p[j];
          q += double(p[j]) * p[j];
        }
        stats[ch] += s;
        stats[c + ch] += q;
      }
    stats[2 * c] = static_cast<double>(n * inner);
    if (reducer_) reducer_(stats);
    count_ = stats[2 * c];
    for (int64_t ch = 0; ch < c; ++ch) {
      double m = stats[ch] / count_;
      double v = std::max(0.0, stats[c + ch] / count_ - m * m);
      mean[ch] = static_cast<float>(m);
      inv[ch] = static_cast<float>(1.0 / std::sqrt(v + eps_));
      double unbiased = count_ > 1 ? v * count_ / (count_ - 1) : v;
      running_mean_[ch] = (1 - momentum_) * running_mean_[ch] + momentum_ * static_cast<float>(m);
      running_var_[ch] = (1 - momentum_) * running_var_[ch] + momentum_ * static_cast<float>(unbiased);
    }
    xhat_ = Tensor(x.shape());
    inv_std_.assign(inv.begin(), inv.end());
  } else {
    for (int64_t ch = 0; ch < c; ++ch) {
      mean[ch] = running_mean_[ch];
      inv[ch] = 1.0f / std::sqrt(running_var_[ch] + eps_);
    }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t off = (i * c + ch) * inner;
      const float g = gamma_.value[ch], b = beta_.value[ch], m = mean[ch], s = inv[ch];
      for (int64_t j = 0; j < inner; ++j) {
        float h = (x[off + j] - m) * s;
        if (training) xhat_[off + j] = h;
        y[off + j] = g * h + b;
      }
    }
  return y;
}

Tensor BatchNorm::backward(const Tensor& dy) {
  TESSERA_CHECK(dy.shape() == xhat_.shape(), "layer ", name(), ": gradient shape ", shape_str(dy.shape()));
  const int64_t n = dy.dim(0), c = channels_, inner = dy.numel() / (n * c);
  // Global sums of dy and dy * xhat per channel (reduced like the forward statistics).
  std::vector<double> sums(2 * c + 1, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t off = (i * c + ch) * inner;
      double s = 0, q = 0;
      for (int64_t j = 0; j < inner; ++j) {
        s += dy[off + j];
        q += double(dy[off + j]) * xhat_[off + j];
      }
      sums[ch] += s;
      sums[c + ch] += q;
    }
  // Parameter gradients are this rank's share; the caller sums them over ranks like any weight.
  for (int64_t ch = 0; ch < c; ++ch) {
    beta_.grad[ch] += static_cast<float>(sums[ch]);
    gamma_.grad[ch] += static_cast<float>(sums[c + ch]);
  }
  if (reducer_) reducer_(sums);
  Tensor dx(dy.shape());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      const int64_t off = (i * c + ch) * inner;
      const float k = gamma_.value[ch] * inv_std_[ch];
      const float mdy = static_cast<float>(sums[ch] / count_), mdyx = static_cast<float>(sums[c + ch] / count_);
      for (int64_t j = 0; j < inner; ++j) dx[off + j] = k * (dy[off + j] - mdy - xhat_[off + j] * mdyx);
    }
  return dx;
}

}  // namespace tessera
