#include "worker/nn/loss.h"

#include <cmath>

#include "common/error.h"
#include "worker/nn/gpu/ops.h"
#include "worker/nn/kernels.h"

namespace tessera {

LossResult mse_loss(const Tensor& y, const Tensor& t) {
  TESSERA_CHECK(y.shape() == t.shape(), "mse of ", shape_str(y.shape()), " and ", shape_str(t.shape()));
  TESSERA_CHECK(y.device() == t.device(), "mse of a prediction and a target on different devices");
  LossResult r{0, Tensor(y.shape(), Layout::kPlain, y.device())};
  if (y.on_device()) {
    r.loss = gpu::mse(y.data(), t.data(), r.grad.data(), y.numel());
    return r;
  }
  const double inv = 1.0 / std::max<int64_t>(1, y.numel());
  for (int64_t i = 0; i < y.numel(); ++i) {
    r.loss += kernels::mse_term(y[i], t[i], inv);
    r.grad[i] = kernels::mse_grad(y[i], t[i], inv);
  }
  return r;
}

namespace {
// Logits (N, C, inner...) with labels (N, inner...): calls fn(n, j, offset of class 0, stride).
void check_labels(const Tensor& logits, const Tensor& labels) {
  TESSERA_CHECK(logits.rank() >= 2 && labels.numel() * logits.dim(1) == logits.numel(), "cross-entropy of logits ",
                shape_str(logits.shape()), " and labels ", shape_str(labels.shape()));
}
}  // namespace

LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing) {
  check_labels(logits, labels);
  TESSERA_CHECK(logits.device() == labels.device(), "cross-entropy of logits and labels on different devices");
  const int64_t n = logits.dim(0), c = logits.dim(1), inner = logits.numel() / (n * c);
  LossResult r{0, Tensor(logits.shape(), Layout::kPlain, logits.device())};
  if (logits.on_device()) {
    r.loss = gpu::softmax_cross_entropy(logits.data(), labels.data(), r.grad.data(), n, c, inner, label_smoothing);
    return r;
  }
  const double inv = 1.0 / std::max<int64_t>(1, n * inner);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t base = i * c * inner + j;
      const int64_t label = static_cast<int64_t>(labels[i * inner + j]);
      TESSERA_CHECK(label >= 0 && label < c, "label ", label, " outside [0, ", c, ")");
      r.loss += kernels::softmax_xent_position(logits.data() + base, inner, c, label, inv, r.grad.data() + base,
                                               label_smoothing);
    }
  return r;
}

double mean_absolute_error(const Tensor& prediction, const Tensor& target) {
  // Metrics are read on the host (they are not computed every training step).
  const Tensor y = prediction.to(Device::kCpu), t = target.to(Device::kCpu);
  TESSERA_CHECK(y.shape() == t.shape(), "mae of ", shape_str(y.shape()), " and ", shape_str(t.shape()));
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += std::fabs(double(y[i]) - t[i]);
  return y.numel() ? s / y.numel() : 0;
}

double accuracy(const Tensor& logits_in, const Tensor& labels_in, int top) {
  const Tensor logits = logits_in.to(Device::kCpu), labels = labels_in.to(Device::kCpu);
  check_labels(logits, labels);
  const int64_t n = logits.dim(0), c = logits.dim(1), inner = logits.numel() / (n * c);
  int64_t right = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t base = i * c * inner + j;
      const int64_t label = static_cast<int64_t>(labels[i * inner + j]);
      // The label is among the top when fewer than `top` classes rank above it: a higher logit, or an
      // equal one of a lower class (the arg-max takes the first).
      int64_t above = 0;
      const float mine = label >= 0 && label < c ? logits[base + label * inner] : 0.0f;
      for (int64_t k = 0; k < c && above < top; ++k) {
        const float v = logits[base + k * inner];
        above += v > mine || (v == mine && k < label);
      }
      right += label >= 0 && label < c && above < top;
    }
  return n * inner > 0 ? static_cast<double>(right) / static_cast<double>(n * inner) : 0.0;
}

}  // namespace tessera
