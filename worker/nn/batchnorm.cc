#include "worker/nn/batchnorm.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "common/error.h"
#include "worker/nn/gpu/ops.h"
#include "worker/nn/kernels.h"

namespace tessera {

namespace {

// Per-channel sums over (N, spatial) of a, and of a * b, of host tensors in either layout (plain:
// (n, c, inner); channels-last: (n * inner, c)), into s[0, c) and s[c, 2c). Threads sum their own
// parts, which are added in thread order: the same result for the same thread count.
void channel_sums(const float* a, const float* b, int64_t n, int64_t c, int64_t inner, bool channels_last, double* s) {
  if (!channels_last) {
#pragma omp parallel for schedule(static)
    for (int64_t ch = 0; ch < c; ++ch) {
      double sa = 0, sb = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float* pa = a + (i * c + ch) * inner;
        const float* pb = b + (i * c + ch) * inner;
        for (int64_t j = 0; j < inner; ++j) {
          sa += pa[j];
          sb += double(pa[j]) * pb[j];
        }
      }
      s[ch] = sa;
      s[c + ch] = sb;
    }
    return;
  }
  const int64_t rows = n * inner;
  const int threads = omp_get_max_threads();
  std::vector<double> parts(static_cast<size_t>(threads) * 2 * c, 0.0);
#pragma omp parallel num_threads(threads)
  {
    double* part = parts.data() + static_cast<size_t>(omp_get_thread_num()) * 2 * c;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* pa = a + r * c;
      const float* pb = b + r * c;
#pragma omp simd
      for (int64_t ch = 0; ch < c; ++ch) {
        part[ch] += pa[ch];
        part[c + ch] += double(pa[ch]) * pb[ch];
      }
    }
  }
  for (int64_t k = 0; k < 2 * c; ++k) s[k] = 0;
  for (int t = 0; t < threads; ++t)
    for (int64_t k = 0; k < 2 * c; ++k) s[k] += parts[static_cast<size_t>(t) * 2 * c + k];
}

// f(offset, channel) for every entry of a host tensor in either layout, threaded.
template <class F>
void for_each_entry(int64_t n, int64_t c, int64_t inner, bool channels_last, F f) {
  if (channels_last) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n * inner; ++r)
#pragma omp simd
      for (int64_t ch = 0; ch < c; ++ch) f(r * c + ch, ch);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t plane = 0; plane < n * c; ++plane) {
    const int64_t ch = plane % c;
#pragma omp simd
    for (int64_t j = 0; j < inner; ++j) f(plane * inner + j, ch);
  }
}

}  // namespace

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
      gpu::batchnorm_forward_with_sums(x.data(), xhat_.data(), y.data(), gamma_.value.data(), beta_.value.data(),
                                       mean.data(), device_inv_std_.data(), running_mean_.data(), running_var_.data(),
                                       n, c, inner, stats, count_, momentum_, eps_);
      return y;
    }
    gpu::batchnorm_forward_train(x.data(), xhat_.data(), y.data(), gamma_.value.data(), beta_.value.data(), mean.data(),
                                 device_inv_std_.data(), running_mean_.data(), running_var_.data(), n, c, inner,
                                 momentum_, eps_);
    return y;
  }
  const bool cl = x.channels_last();
  Tensor y(x.shape(), x.layout());
  std::vector<float> mean(c), inv(c);
  if (training) {
    // Partial sums (sum, sum of squares, count) per channel, reduced across ranks when asked.
    std::vector<double> stats(2 * c + 1, 0.0);
    channel_sums(x.data(), x.data(), n, c, inner, cl, stats.data());
    stats[2 * c] = static_cast<double>(n * inner);
    if (reducer_) reducer_(stats);
    count_ = stats[2 * c];
    for (int64_t ch = 0; ch < c; ++ch)
      kernels::bn_statistics(stats[ch], stats[c + ch], count_, eps_, momentum_, mean[ch], inv[ch], running_mean_[ch],
                             running_var_[ch]);
    // Last step's buffer when it fits (only this layer holds it): no fresh pages to fault in.
    if (xhat_.shape() != x.shape() || xhat_.layout() != x.layout() || xhat_.on_device())
      xhat_ = Tensor(x.shape(), x.layout());
    inv_std_.assign(inv.begin(), inv.end());
  } else {
    for (int64_t ch = 0; ch < c; ++ch) {
      mean[ch] = running_mean_[ch];
      inv[ch] = 1.0f / std::sqrt(running_var_[ch] + eps_);
    }
  }
  const float *xp = x.data(), *g = gamma_.value.data(), *b = beta_.value.data(), *m = mean.data(), *is = inv.data();
  float* yp = y.data();
  float* hp = training ? xhat_.data() : nullptr;
  for_each_entry(n, c, inner, cl, [&](int64_t k, int64_t ch) {
    const float h = kernels::bn_normalize(xp[k], m[ch], is[ch]);
    if (hp) hp[k] = h;
    yp[k] = kernels::bn_output(h, g[ch], b[ch]);
  });
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
      gpu::batchnorm_backward_with_sums(dy.data(), xhat_.data(), gamma_.value.data(), device_inv_std_.data(),
                                        gamma_.grad.data(), beta_.grad.data(), dx.data(), n, c, inner, local, reduced,
                                        count_);
      return dx;
    }
    gpu::batchnorm_backward(dy.data(), xhat_.data(), gamma_.value.data(), device_inv_std_.data(), gamma_.grad.data(),
                            beta_.grad.data(), dx.data(), n, c, inner);
    return dx;
  }
  TESSERA_CHECK(dy.layout() == xhat_.layout(), "layer ", name(), ": gradient layout differs from the forward pass");
  const bool cl = dy.channels_last();
  // Global sums of dy and dy * xhat per channel (reduced like the forward statistics).
  std::vector<double> sums(2 * c + 1, 0.0);
  channel_sums(dy.data(), xhat_.data(), n, c, inner, cl, sums.data());
  // Parameter gradients are this rank's share; the caller sums them over ranks like any weight.
  for (int64_t ch = 0; ch < c; ++ch) {
    beta_.grad[ch] += static_cast<float>(sums[ch]);
    gamma_.grad[ch] += static_cast<float>(sums[c + ch]);
  }
  if (reducer_) reducer_(sums);
  std::vector<float> k(c), mdy(c), mdyx(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    k[ch] = gamma_.value[ch] * inv_std_[ch];
    mdy[ch] = static_cast<float>(sums[ch] / count_);
    mdyx[ch] = static_cast<float>(sums[c + ch] / count_);
  }
  Tensor dx(dy.shape(), dy.layout());
  const float *g = dy.data(), *h = xhat_.data(), *kp = k.data(), *mp = mdy.data(), *mxp = mdyx.data();
  float* o = dx.data();
  for_each_entry(n, c, inner, cl,
                 [&](int64_t e, int64_t ch) { o[e] = kernels::bn_input_grad(g[e], h[e], kp[ch], mp[ch], mxp[ch]); });
  return dx;
}

}  // namespace tessera
