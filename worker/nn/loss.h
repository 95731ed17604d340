// Losses (value and gradient with respect to the prediction) and metrics.
// mse: mean over all elements of (y - t)^2. softmax_cross_entropy: logits (N, C, spatial...) and
// integer class labels (N, spatial...) stored as floats; mean over all positions.
#pragma once

#include "worker/core/tensor.h"

namespace tessera {

struct LossResult {
  double loss = 0;
  Tensor grad;  // d loss / d prediction
};

LossResult mse_loss(const Tensor& prediction, const Tensor& target);
LossResult softmax_cross_entropy(const Tensor& logits, const Tensor& labels);

double mean_absolute_error(const Tensor& prediction, const Tensor& target);
// Fraction of positions whose arg-max class equals the label.
double accuracy(const Tensor& logits, const Tensor& labels);

}  // namespace tessera
