// The arithmetic the CUDA kernels run (nn/kernels.h), checked on the CPU: the layers built on it
// against oneDNN's own primitives on the same inputs (activation, softmax, batch normalisation), and
// the optimiser updates against their definitions evaluated in double precision.
#include <gtest/gtest.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cmath>
#include <random>
#include <set>

#include "worker/nn/batchnorm.h"
#include "worker/nn/dnnl_util.h"
#include "worker/nn/elementwise.h"
#include "worker/nn/kernels.h"
#include "worker/nn/loss.h"
#include "worker/nn/optim.h"

namespace tessera {
namespace {

using dnnl::memory;

Tensor random_tensor(Shape s, uint64_t seed, float scale = 1.0f) {
  Tensor t(std::move(s));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> n(0.0f, scale);
  for (float& v : t.span()) v = n(rng);
  return t;
}

void expect_close(const Tensor& a, const Tensor& b, double rel, const char* what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = std::fabs(double(a[i]) - b[i]) / std::max(1e-3, std::fabs(double(b[i])));
    worst = std::max(worst, d);
  }
  EXPECT_LE(worst, rel) << what;
}

TEST(KernelsTest, LeakyReluMatchesOneDnnEltwise) {
  for (float slope : {0.0f, 0.3f}) {
    const Shape s = {2, 3, 4, 5, 6};
    Tensor x = random_tensor(s, 1), dy = random_tensor(s, 2);
    x[0] = 0.0f;  // the kink: both sides take the slope branch at 0
    LeakyReLU layer("act", slope);
    const Tensor y = layer.forward(x, true);
    const Tensor dx = layer.backward(dy);

    auto& eng = dnnl_util::engine();
    const memory::desc md = dnnl_util::plain_desc(s);
    dnnl::eltwise_forward::primitive_desc fpd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::eltwise_relu, md, slope, 0.0f),
        eng);
    Tensor y_ref(s), dx_ref(s);
    dnnl::eltwise_forward(fpd).execute(
        dnnl_util::stream(), {{DNNL_ARG_SRC, dnnl_util::memory_of(x)}, {DNNL_ARG_DST, dnnl_util::memory_of(y_ref)}});
    dnnl::eltwise_backward::primitive_desc bpd(
        dnnl::eltwise_backward::desc(dnnl::algorithm::eltwise_relu, md, md, slope, 0.0f), eng, fpd);
    dnnl::eltwise_backward(bpd).execute(dnnl_util::stream(), {{DNNL_ARG_SRC, dnnl_util::memory_of(x)},
                                                              {DNNL_ARG_DIFF_DST, dnnl_util::memory_of(dy)},
                                                              {DNNL_ARG_DIFF_SRC, dnnl_util::memory_of(dx_ref)}});
    dnnl_util::stream().wait();
    expect_close(y, y_ref, 0, "leaky relu forward");
    expect_close(dx, dx_ref, 0, "leaky relu backward");
  }
}

// exp_f and GELU in float arithmetic against their definitions in double precision, over the range
// a network's activations span and beyond: e^x within 2 float roundings, x * Phi(x) and its
// derivative within 3e-7 of max(1, |x|), and Phi's lower tail within 4% of its own size (at x = -12,
// 2e-33: where 1 + erf in float is 0).
TEST(KernelsTest, ExpAndGeluMatchTheirDefinitions) {
  double worst_exp = 0, worst_gelu = 0, worst_grad = 0, worst_tail = 0;
  for (int i = -24000; i <= 24000; ++i) {
    const float x = i * 5e-4f;  // [-12, 12]
    const double xd = x, cdf = 0.5 * std::erfc(-xd / std::sqrt(2.0)),
                 pdf = std::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI);
    const float y = x * 7.0f;  // [-84, 84]
    const double e = std::exp(double(y));
    worst_exp = std::max(worst_exp, std::fabs(kernels::exp_f(y) - e) / e);
    const double scale = std::max(1.0, std::fabs(xd));
    worst_gelu = std::max(worst_gelu, std::fabs(kernels::gelu(x) - xd * cdf) / scale);
    worst_grad = std::max(worst_grad, std::fabs(kernels::gelu_grad(x, 1.0f) - (cdf + xd * pdf)) / scale);
    if (x < -1.0f) worst_tail = std::max(worst_tail, std::fabs(kernels::normal_cdf(x).cdf - cdf) / cdf);
  }
  EXPECT_LE(worst_exp, 1.2e-7);
  EXPECT_LE(worst_gelu, 3e-7);
  EXPECT_LE(worst_grad, 3e-7);
  EXPECT_LE(worst_tail, 0.04);
  EXPECT_EQ(kernels::gelu(0.0f), 0.0f);
  EXPECT_LE(std::fabs(kernels::gelu(-100.0f)), 1e-30f);
  EXPECT_EQ(kernels::gelu(100.0f), 100.0f);
  EXPECT_GT(kernels::exp_f(-200.0f), 0.0f);
  EXPECT_LT(kernels::exp_f(-200.0f), 1e-37f);
}

TEST(KernelsTest, SoftmaxCrossEntropyMatchesOneDnnSoftmax) {
  const int64_t n = 3, c = 5, inner = 7;
  const Tensor logits = random_tensor({n, c, inner}, 3, 3.0f);
  Tensor labels({n, inner});
  for (int64_t i = 0; i < labels.numel(); ++i) labels[i] = static_cast<float>(i % c);
  const LossResult r = softmax_cross_entropy(logits, labels);

  auto& eng = dnnl_util::engine();
  const memory::desc md = dnnl_util::plain_desc(logits.shape());
  Tensor p(logits.shape()), logp(logits.shape());
  dnnl::softmax_forward(dnnl::softmax_forward::primitive_desc(
                            dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, md, 1), eng))
      .execute(dnnl_util::stream(),
               {{DNNL_ARG_SRC, dnnl_util::memory_of(logits)}, {DNNL_ARG_DST, dnnl_util::memory_of(p)}});
  dnnl::logsoftmax_forward(dnnl::logsoftmax_forward::primitive_desc(
                               dnnl::logsoftmax_forward::desc(dnnl::prop_kind::forward_inference, md, 1), eng))
      .execute(dnnl_util::stream(),
               {{DNNL_ARG_SRC, dnnl_util::memory_of(logits)}, {DNNL_ARG_DST, dnnl_util::memory_of(logp)}});
  dnnl_util::stream().wait();
  double loss = 0;
  Tensor grad(logits.shape());
  const double inv = 1.0 / (n * inner);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t label = static_cast<int64_t>(labels[i * inner + j]);
      loss -= logp[(i * c + label) * inner + j] * inv;
      for (int64_t k = 0; k < c; ++k)
        grad[(i * c + k) * inner + j] = static_cast<float>((p[(i * c + k) * inner + j] - (k == label)) * inv);
    }
  EXPECT_NEAR(r.loss, loss, 1e-5 * loss);
  expect_close(r.grad, grad, 1e-4, "cross-entropy gradient");
  EXPECT_TRUE(std::isnan(kernels::softmax_xent_position(logits.data(), inner, c, c, inv, grad.data())))
      << "a label outside [0, c) is reported, not read past the logits";
}

TEST(KernelsTest, BatchNormMatchesOneDnnBatchNormalization) {
  const Shape s = {4, 3, 5, 6, 2};
  const int64_t c = 3;
  Tensor x = random_tensor(s, 4, 2.0f), dy = random_tensor(s, 5);
  BatchNorm bn("bn", static_cast<int>(c));
  for (int64_t ch = 0; ch < c; ++ch) {
    bn.params()[0]->value[ch] = 0.5f + 0.25f * ch;  // gamma
    bn.params()[1]->value[ch] = -0.1f * ch;         // beta
  }
  const Tensor y = bn.forward(x, true);
  const Tensor dx = bn.backward(dy);

  auto& eng = dnnl_util::engine();
  const memory::desc md = dnnl_util::plain_desc(s);
  const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  dnnl::batch_normalization_forward::primitive_desc fpd(
      dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, md, 1e-5f, flags), eng);
  Tensor y_ref(s), mean({c}), var({c}), dx_ref(s), dgamma({c}), dbeta({c});
  const Tensor& gamma = bn.params()[0]->value;
  const Tensor& beta = bn.params()[1]->value;
  dnnl::batch_normalization_forward(fpd).execute(dnnl_util::stream(), {{DNNL_ARG_SRC, dnnl_util::memory_of(x)},
                                                                       {DNNL_ARG_SCALE, dnnl_util::memory_of(gamma)},
                                                                       {DNNL_ARG_SHIFT, dnnl_util::memory_of(beta)},
                                                                       {DNNL_ARG_MEAN, dnnl_util::memory_of(mean)},
                                                                       {DNNL_ARG_VARIANCE, dnnl_util::memory_of(var)},
                                                                       {DNNL_ARG_DST, dnnl_util::memory_of(y_ref)}});
  dnnl::batch_normalization_backward::primitive_desc bpd(
      dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, md, md, 1e-5f, flags), eng, fpd);
  dnnl::batch_normalization_backward(bpd).execute(dnnl_util::stream(),
                                                  {{DNNL_ARG_SRC, dnnl_util::memory_of(x)},
                                                   {DNNL_ARG_MEAN, dnnl_util::memory_of(mean)},
                                                   {DNNL_ARG_VARIANCE, dnnl_util::memory_of(var)},
                                                   {DNNL_ARG_DIFF_DST, dnnl_util::memory_of(dy)},
                                                   {DNNL_ARG_SCALE, dnnl_util::memory_of(gamma)},
                                                   {DNNL_ARG_SHIFT, dnnl_util::memory_of(beta)},
                                                   {DNNL_ARG_DIFF_SRC, dnnl_util::memory_of(dx_ref)},
                                                   {DNNL_ARG_DIFF_SCALE, dnnl_util::memory_of(dgamma)},
                                                   {DNNL_ARG_DIFF_SHIFT, dnnl_util::memory_of(dbeta)}});
  dnnl_util::stream().wait();
  expect_close(y, y_ref, 1e-4, "batchnorm forward");
  expect_close(dx, dx_ref, 1e-3, "batchnorm input gradient");
  expect_close(bn.params()[0]->grad, dgamma, 1e-4, "batchnorm gamma gradient");
  expect_close(bn.params()[1]->grad, dbeta, 1e-4, "batchnorm beta gradient");
  // The running averages took one step of 0.1 towards the batch's mean and unbiased variance.
  const double count = static_cast<double>(x.numel() / c);
  for (int64_t ch = 0; ch < c; ++ch) {
    EXPECT_NEAR(bn.running_mean()[ch], 0.1 * mean[ch], 1e-5);
    EXPECT_NEAR(bn.running_var()[ch], 0.9 + 0.1 * var[ch] * count / (count - 1), 1e-4);
  }
}

TEST(KernelsTest, MseMatchesItsDefinition) {
  const Tensor y = random_tensor({6, 4}, 6), t = random_tensor({6, 4}, 7);
  const LossResult r = mse_loss(y, t);
  double loss = 0;
  for (int64_t i = 0; i < y.numel(); ++i) loss += (double(y[i]) - t[i]) * (double(y[i]) - t[i]) / y.numel();
  EXPECT_NEAR(r.loss, loss, 1e-9);
  for (int64_t i = 0; i < y.numel(); ++i)
    EXPECT_FLOAT_EQ(r.grad[i], static_cast<float>(2.0 * (double(y[i]) - t[i]) / y.numel()));
}

TEST(KernelsTest, DropoutMasksAreCounterBased) {
  const float rate = 0.25f;
  const int64_t n = 200000;
  int64_t dropped = 0;
  std::set<float> values;
  for (int64_t i = 0; i < n; ++i) {
    const float m = kernels::dropout_scale(42, 0, static_cast<uint64_t>(i), rate);
    dropped += m == 0.0f;
    values.insert(m);
    // The same entry of the same draw is the same number whichever order (or device) computes it.
    ASSERT_EQ(m, kernels::dropout_scale(42, 0, static_cast<uint64_t>(i), rate));
  }
  EXPECT_EQ(values, (std::set<float>{0.0f, 1.0f / (1.0f - rate)}));
  EXPECT_NEAR(static_cast<double>(dropped) / n, rate, 0.005);
  int64_t differ = 0;
  for (int64_t i = 0; i < 1000; ++i)
    differ += kernels::dropout_scale(42, 0, i, rate) != kernels::dropout_scale(42, 1, i, rate);
  EXPECT_GT(differ, 250) << "each training pass draws a new mask";
  // The layer draws a new mask each training pass, and its backward multiplies by the same mask.
  Dropout layer("drop", rate, 42);
  const Tensor x = Tensor::filled({1000}, 1.0f);
  const Tensor y1 = layer.forward(x, true);
  const Tensor g1 = layer.backward(x);
  const Tensor y2 = layer.forward(x, true);
  int64_t changed = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(y1[i], kernels::dropout_scale(42, 0, i, rate));
    EXPECT_EQ(g1[i], y1[i]);
    changed += y1[i] != y2[i];
  }
  EXPECT_GT(changed, 250);
}

// Three steps of each optimiser on one parameter against the update rules in double precision.
TEST(KernelsTest, OptimiserUpdatesMatchTheirDefinitions) {
  std::vector<OptimizerConfig> configs(5);
  configs[0].name = "sgd";
  configs[0].momentum = 0.0;
  configs[0].weight_decay = 0.01;
  configs[1].name = "sgd";
  configs[1].weight_decay = 0.01;
  configs[2].name = "sgd";
  configs[2].nesterov = true;
  configs[3].name = "adam";
  configs[3].weight_decay = 0.001;
  configs[4].name = "lars";
  configs[4].weight_decay = 0.0005;
  for (const OptimizerConfig& c : configs) {
    SCOPED_TRACE(c.name + (c.nesterov ? " nesterov" : "") + " momentum " + std::to_string(c.momentum));
    Param p{"w", random_tensor({64}, 8), Tensor({64}), true};
    std::vector<double> w(p.value.span().begin(), p.value.span().end()), m(64, 0.0), v(64, 0.0);
    auto opt = make_optimizer(c);
    const double lr = 0.05;
    for (int step = 1; step <= 3; ++step) {
      const Tensor g = random_tensor({64}, 100 + step);
      p.grad.copy_from(g);
      opt->step({&p}, lr);
      double wn = 0, gn = 0;
      for (int i = 0; i < 64; ++i) {
        wn += w[i] * w[i];
        gn += double(g[i]) * g[i];
      }
      const double lars_local = c.trust * std::sqrt(wn) / (std::sqrt(gn) + c.weight_decay * std::sqrt(wn));
      for (int i = 0; i < 64; ++i) {
        const double d = g[i] + c.weight_decay * w[i];
        if (c.name == "sgd" && c.momentum == 0) {
          w[i] -= lr * d;
        } else if (c.name == "sgd") {
          m[i] = c.momentum * m[i] + d;
          w[i] -= lr * (c.nesterov ? d + c.momentum * m[i] : m[i]);
        } else if (c.name == "adam") {
          m[i] = c.beta1 * m[i] + (1 - c.beta1) * d;
          v[i] = c.beta2 * v[i] + (1 - c.beta2) * d * d;
          const double mh = m[i] / (1 - std::pow(c.beta1, step)), vh = v[i] / (1 - std::pow(c.beta2, step));
          w[i] -= lr * mh / (std::sqrt(vh) + c.eps);
        } else {
          m[i] = c.momentum * m[i] + lr * lars_local * d;
          w[i] -= m[i];
        }
      }
    }
    for (int i = 0; i < 64; ++i) EXPECT_NEAR(p.value[i], w[i], 1e-5 * std::max(1.0, std::fabs(w[i])));
  }
}

}  // namespace
}  // namespace tessera
