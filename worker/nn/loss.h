// Losses (value and gradient with respect to the prediction) and metrics.
// mse: mean over all elements of (y - t)^2. softmax_cross_entropy: logits (N, C, spatial...) and
// integer class labels (N, spatial...) stored as floats; mean over all positions; label smoothing
// eps puts 1 - eps on the label and eps / C on every class.
#pragma once

#include "worker/core/tensor.h"

namespace tessera {

struct LossResult {
  double loss = 0;
  Tensor grad;  // d loss / d prediction
};

LossResult mse_loss(const Tensor& prediction, const Tensor& target);
LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing = 0.0);

double mean_absolute_error(const Tensor& prediction, const Tensor& target);
// Fraction of positions whose label is among the `top` highest logits (1: the arg-max).
double accuracy(const Tensor& logits, const Tensor& labels, int top = 1);

}  // namespace tessera
