#include "worker/nn/batchnorm.h"

#include <cmath>

#include "common/error.h"
#include "worker/nn/gpu/ops.h"
#include "worker/nn/kernels.h"

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

void BatchNorm::to(Device device) {
  Layer::to(device);
  running_mean_ = running_mean_.to(device);
  running_var_ = running_var_.to(device);
}

Tensor BatchNorm::forward(const Tensor& x, bool training) {
  output_shape(x.shape());
  const int64_t n = x.dim(0), c = channels_, inner = x.numel() / std::max<int64_t>(1, n * c);
  if (x.on_device()) {
    TESSERA_CHECK(gamma_.value.on_device() && running_mean_.on_device(), "layer ", name(),
                  ": input on the GPU, parameters on the host");
    Tensor y(x.shape(), Layout::kPlain, Device::kCuda);
    if (!training) {
      gpu::batchnorm_forward_eval(x.data(), y.data(), gamma_.value.data(), beta_.value.data(), running_mean_.data(),
                                  running_var_.data(), n, c, inner, eps_);
      return y;
    }
    xhat_ = Tensor(x.shape(), Layout::kPlain, Device::kCuda);
    Tensor mean({c}, Layout::kPlain, Device::kCuda);
    device_inv_std_ = Tensor({c}, Layout::kPlain, Device::kCuda);
    if (reducer_) {  // statistics of the whole spatial group: the sums cross through the host
      std::vector<double> stats = gpu::channel_sums(x.data(), nullptr, n, c, inner);
      stats.push_back(static_cast<double>(n * inner));
      reducer_(stats);
      count_ = stats.back();
      stats.pop_back();
      gpu::batchnorm_forward_with_sums(x.data(), xhat_.data(), y.data(), gamma_.value.data(), beta_.value.data(), mean.data(),
                                       device_inv_std_.data(), running_mean_.data(), running_var_.data(), n, c, inner, stats,
                                       count_, momentum_, eps_);
      return y;
    }
    gpu::batchnorm_forward_train(x.data(), xhat_.data(), y.data(), gamma_.value.data(), beta_.value.data(), mean.data(),
                                 device_inv_std_.data(), running_mean_.data(), running_var_.data(), n, c, inner,
                                 momentum_, eps_);
    return y;
  }
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
    for (int64_t ch = 0; ch < c; ++ch)
      kernels::bn_statistics(stats[ch], stats[c + ch], count_, eps_, momentum_, mean[ch], inv[ch], running_mean_[ch],
                             running_var_[ch]);
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
        const float h = kernels::bn_normalize(x[off + j], m, s);
        if (training) xhat_[off + j] = h;
        y[off + j] = kernels::bn_output(h, g, b);
      }
    }
  return y;
}

Tensor BatchNorm::backward(const Tensor& dy) {
  TESSERA_CHECK(dy.shape() == xhat_.shape() && dy.device() == xhat_.device(), "layer ", name(), ": gradient shape ",
                shape_str(dy.shape()));
  const int64_t n = dy.dim(0), c = channels_, inner = dy.numel() / std::max<int64_t>(1, n * c);
  if (dy.on_device()) {
    Tensor dx(dy.shape(), Layout::kPlain, Device::kCuda);
    if (reducer_) {
      const std::vector<double> local = gpu::channel_sums(dy.data(), xhat_.data(), n, c, inner);
      std::vector<double> reduced = local;
      reduced.push_back(0.0);  // the count slot of the forward statistics' layout
      reducer_(reduced);
      reduced.pop_back();
      gpu::batchnorm_backward_with_sums(dy.data(), xhat_.data(), gamma_.value.data(), device_inv_std_.data(), gamma_.grad.data(),
                                        beta_.grad.data(), dx.data(), n, c, inner, local, reduced, count_);
      return dx;
    }
    gpu::batchnorm_backward(dy.data(), xhat_.data(), gamma_.value.data(), device_inv_std_.data(), gamma_.grad.data(),
                            beta_.grad.data(), dx.data(), n, c, inner);
    return dx;
  }
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
      for (int64_t j = 0; j < inner; ++j) dx[off + j] = kernels::bn_input_grad(dy[off + j], xhat_[off + j], k, mdy, mdyx);
    }
  return dx;
}

}  // namespace tessera
