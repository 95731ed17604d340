#include "worker/nn/loss.h"

#include <cmath>

#include "common/error.h"

namespace tessera {

LossResult mse_loss(const Tensor& y, const Tensor& t) {
  TESSERA_CHECK(y.shape() == t.shape(), "mse of ", shape_str(y.shape()), " and ", shape_str(t.shape()));
  LossResult r{0, Tensor(y.shape())};
  const double inv = 1.0 / std::max<int64_t>(1, y.numel());
  for (int64_t i = 0; i < y.numel(); ++i) {
    double d = double(y[i]) - t[i];
    r.loss += d * d * inv;
    r.grad[i] = static_cast<float>(2.0 * d * inv);
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

LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels) {
  check_labels(logits, labels);
  const int64_t n = logits.dim(0), c = logits.dim(1), inner = logits.numel() / (n * c);
  LossResult r{0, Tensor(logits.shape())};
  const double inv = 1.0 / std::max<int64_t>(1, n * inner);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t base = i * c * inner + j;
      float mx = logits[base];
      for (int64_t k = 1; k < c; ++k) mx = std::max(mx, logits[base + k * inner]);
      double z = 0;
      for (int64_t k = 0; k < c; ++k) z += std::exp(double(logits[base + k * inner]) - mx);
      const int64_t label = static_cast<int64_t>(labels[i * inner + j]);
      TESSERA_CHECK(label >= 0 && label < c, "label ", label, " outside [0, ", c, ")");
      for (int64_t k = 0; k < c; ++k) {
        double p = std::exp(double(logits[base + k * inner]) - mx) / z;
        r.grad[base + k * inner] = static_cast<float>((p - (k == label ? 1.0 : 0.0)) * inv);
      }
      r.loss += (std::log(z) + mx - logits[base + label * inner]) * inv;
    }
  return r;
}

double mean_absolute_error(const Tensor& y, const Tensor& t) {
  TESSERA_CHECK(y.shape() == t.shape(), "mae of ", shape_str(y.shape()), " and ", shape_str(t.shape()));
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += std::fabs(double(y[i]) - t[i]);
  return y.numel() ? s / y.numel() : 0;
}

double accuracy(const Tensor& logits, const Tensor& labels) {
  check_labels(logits, labels);
  const int64_t n = logits.dim(0), c = logits.dim(1), inner = logits.numel() / (n * c);
  int64_t right = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t base = i * c * inner + j;
      int64_t best = 0;
      for (int64_t k = 1; k < c; ++k)
        if (logits[base + k * inner] > logits[base + best * inner]) best = k;
      right += best == static_cast<int64_t>(labels[i * inner + j]);
    }
  return n * inner > 0 ? static_cast<double>(right) / static_cast<double>(n * inner) : 0.0;
}

}  // namespace tessera
