// The arithmetic of the element-wise layers, losses and optimiser updates, one entry at a time, in
// functions that compile for the host and (under nvcc) for the device. The CPU layers run them in
// loops and the CUDA kernels (nn/gpu/) run them one thread per entry, so both paths compute every
// entry with the same expression, and the CPU tests check the arithmetic the GPU runs.
// Reductions (a loss's sum, a norm) are the one place the paths differ: their order of summation.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ inline
#else
#define TESSERA_HD inline
#endif

namespace tessera::kernels {

// ---- bf16: the top 16 bits of a float ----
// The bf16 nearest to x, ties to even (as oneDNN and PyTorch round); a NaN stays a quiet NaN.
TESSERA_HD uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
TESSERA_HD float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
TESSERA_HD float round_bf16(float x) { return bf16_value(bf16_bits(x)); }

// ---- activations ----
TESSERA_HD float leaky_relu(float x, float slope) { return x > 0.0f ? x : slope * x; }
// The gradient through a leaky ReLU whose input (or output: both are positive at the same entries
// for slopes in [0, 1]) was `gate`.
TESSERA_HD float leaky_relu_grad(float gate, float dy, float slope) { return gate > 0.0f ? dy : slope * dy; }

// e^x in float arithmetic alone, so that loops of it vectorise (no library call): x = n ln 2 + r with
// |r| <= ln 2 / 2 (ln 2 in two parts, Cody and Waite), e^r by its Taylor polynomial of degree 7
// (relative error under 1e-8 on that range, so about one float rounding in all), 2^n from the
// exponent bits. Below -87 it gives about 1e-38 rather than smaller values, which only GELU's tails
// see, times a Gaussian of less than 1e-37.
TESSERA_HD float exp_f(float x) {
  x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;  // (fminf and fmaxf would be library calls)
  const float n = floorf(x * 1.44269504088896341f + 0.5f);
  float r = fmaf(n, -0.693145751953125f, x);
  r = fmaf(n, -1.428606765330187e-06f, r);
  float p = 1.0f / 5040.0f;
  p = fmaf(p, r, 1.0f / 720.0f);
  p = fmaf(p, r, 1.0f / 120.0f);
  p = fmaf(p, r, 1.0f / 24.0f);
  p = fmaf(p, r, 1.0f / 6.0f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// Phi(x), the standard normal CDF, and its density phi(x), as x * Phi(x) (GELU, PyTorch's exact
// form) needs: Phi(x) = erfc(-x / sqrt 2) / 2, erfc(z) for z >= 0 by Abramowitz and Stegun 7.1.26
// (absolute error under 1.5e-7, about two float roundings near 1), whose e^(-z^2) is phi's exp too.
// Both tails keep their size: Phi(x) for x < 0 is computed as erfc / 2, never 1 - something.
struct NormalCdf {
  float cdf, pdf;
};
TESSERA_HD NormalCdf normal_cdf(float x) {
  const float z = fabsf(x) * 0.70710678118654752f;
  const float t = 1.0f / fmaf(0.3275911f, z, 1.0f);
  float q = 1.061405429f;
  q = fmaf(q, t, -1.453152027f);
  q = fmaf(q, t, 1.421413741f);
  q = fmaf(q, t, -0.284496736f);
  q = fmaf(q, t, 0.254829592f);
  const float e = exp_f(-z * z);        // e^(-x^2 / 2)
  const float tail = 0.5f * q * t * e;  // Phi(-|x|)
  return {x < 0.0f ? tail : 1.0f - tail, 0.39894228040143268f * e};
}
// GELU, exact (PyTorch's nn.GELU()): x * Phi(x), Phi the standard normal distribution function.
TESSERA_HD float gelu(float x) { return x * normal_cdf(x).cdf; }
TESSERA_HD float gelu_grad(float x, float dy) {
  const NormalCdf n = normal_cdf(x);
  return dy * fmaf(x, n.pdf, n.cdf);
}

// ---- dropout ----
// A counter-based random stream: entry i of draw `call` of a layer seeded `seed` gets the same
// uniform number on every device and in any order (splitmix64's finaliser over the three).
TESSERA_HD uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
TESSERA_HD float uniform01(uint64_t seed, uint64_t call, uint64_t i) {
  const uint64_t r = mix64(mix64(mix64(seed) ^ call) ^ i);
  return static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // 24 bits: exact in a float, in [0, 1)
}
// Inverted dropout's factor for an entry: 0 with probability `rate`, else 1 / (1 - rate).
TESSERA_HD float dropout_scale(uint64_t seed, uint64_t call, uint64_t i, float rate) {
  return uniform01(seed, call, i) < rate ? 0.0f : 1.0f / (1.0f - rate);
}

// ---- losses ----
// Mean squared error over n entries: an entry's term of the loss and its gradient.
TESSERA_HD double mse_term(float y, float t, double inv_n) {
  const double d = double(y) - t;
  return d * d * inv_n;
}
TESSERA_HD float mse_grad(float y, float t, double inv_n) { return static_cast<float>(2.0 * (double(y) - t) * inv_n); }

// Softmax cross-entropy at one position: `c` logits at x[0], x[stride], ..., its label, its weight
// in the mean (inv), and label smoothing eps: the target distribution is (1 - eps) on the label and
// eps / c on every class (PyTorch's cross_entropy(label_smoothing=eps)). Writes the gradient
// (p - target) * inv at the same offsets of g; returns the position's loss term. A label outside
// [0, c) gives NaN (the caller reports it).
TESSERA_HD double softmax_xent_position(const float* x, int64_t stride, int64_t c, int64_t label, double inv, float* g,
                                        double eps = 0.0) {
  if (label < 0 || label >= c) return NAN;
  float mx = x[0];
  for (int64_t k = 1; k < c; ++k) mx = fmaxf(mx, x[k * stride]);
  double z = 0, mean = 0;
  for (int64_t k = 0; k < c; ++k) {
    z += exp(double(x[k * stride]) - mx);
    mean += x[k * stride];
  }
  mean /= c;
  for (int64_t k = 0; k < c; ++k) {
    const double p = exp(double(x[k * stride]) - mx) / z;
    g[k * stride] = static_cast<float>((p - (k == label ? 1.0 - eps : 0.0) - eps / c) * inv);
  }
  // -sum_k target_k log p_k, with log p_k = x_k - mx - log z.
  return (log(z) + mx - (1.0 - eps) * x[label * stride] - eps * mean) * inv;
}

// ---- optimiser updates, one parameter entry: w the weight, g its gradient ----
// SGD with momentum v (mu 0: plain SGD, v unused) and L2 weight decay wd.
TESSERA_HD void sgd_update(float& w, float& v, float g, float lr, float mu, float wd, bool nesterov) {
  const float d = g + wd * w;
  if (mu == 0.0f) {
    w -= lr * d;
    return;
  }
  v = mu * v + d;
  w -= lr * (nesterov ? d + mu * v : v);
}

// Adam with moments m, v: b1, b2 and their complements c1 = 1 - b1, c2 = 1 - b2 (rounded from
// double); step_size = lr * sqrt(1 - b2^t) / (1 - b1^t) and eps_hat = eps * sqrt(1 - b2^t).
struct AdamArgs {
  float b1, c1, b2, c2, step_size, eps_hat;
};
TESSERA_HD void adam_update(float& w, float& m, float& v, float g, const AdamArgs& a, float wd) {
  const float d = g + wd * w;
  m = a.b1 * m + a.c1 * d;
  v = a.b2 * v + a.c2 * d * d;
  w -= a.step_size * m / (sqrtf(v) + a.eps_hat);
}

// LARS's rate for a parameter from its norms: lr * trust * |w| / (|g| + wd |w|) where it decays and
// both norms are positive, lr otherwise.
TESSERA_HD double lars_rate(double lr, double trust, double wd, bool decay, double w_norm, double g_norm) {
  if (decay && w_norm > 0 && g_norm > 0) return lr * (trust * w_norm / (g_norm + wd * w_norm));
  return lr;
}
TESSERA_HD void lars_update(float& w, float& v, float g, float rate, float mu, float wd) {
  v = mu * v + rate * (g + wd * w);
  w -= v;
}

// ---- batch normalisation, per channel from its sums over a batch (count entries) ----
// Mean and inverse deviation of the batch; the running averages move by `momentum` towards the
// batch's mean and unbiased variance.
TESSERA_HD void bn_statistics(double sum, double sum_sq, double count, float eps, float momentum, float& mean,
                              float& inv_std, float& running_mean, float& running_var) {
  const double m = sum / count;
  const double v = fmax(0.0, sum_sq / count - m * m);
  mean = static_cast<float>(m);
  inv_std = static_cast<float>(1.0 / sqrt(v + eps));
  const double unbiased = count > 1 ? v * count / (count - 1) : v;
  running_mean = (1 - momentum) * running_mean + momentum * static_cast<float>(m);
  running_var = (1 - momentum) * running_var + momentum * static_cast<float>(unbiased);
}
TESSERA_HD float bn_normalize(float x, float mean, float inv_std) { return (x - mean) * inv_std; }
TESSERA_HD float bn_output(float xhat, float gamma, float beta) { return gamma * xhat + beta; }
// The input gradient from the channel's gamma * inv_std (k) and its means of dy (mdy) and dy * xhat (mdyx).
TESSERA_HD float bn_input_grad(float dy, float xhat, float k, float mdy, float mdyx) {
  return k * (dy - mdy - xhat * mdyx);
}

// ---- layer normalisation, one row of d entries (statistics in double) ----
// xhat = (x - mean) / sqrt(var + eps) (var biased, as PyTorch's), y = gamma * xhat + beta; returns
// the row's 1 / sqrt(var + eps).
TESSERA_HD float layernorm_row(const float* x, int64_t d, float eps, const float* gamma, const float* beta, float* xhat,
                               float* y) {
  double s = 0, ss = 0;
  for (int64_t i = 0; i < d; ++i) {
    s += x[i];
    ss += double(x[i]) * x[i];
  }
  const double m = s / d, v = fmax(0.0, ss / d - m * m);
  const float rstd = static_cast<float>(1.0 / sqrt(v + eps));
  for (int64_t i = 0; i < d; ++i) {
    xhat[i] = static_cast<float>((x[i] - m) * rstd);
    y[i] = gamma[i] * xhat[i] + beta[i];
  }
  return rstd;
}
// The row's input gradient from dy: rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
TESSERA_HD void layernorm_row_grad(const float* dy, const float* xhat, const float* gamma, float rstd, int64_t d,
                                   float* dx) {
  double mg = 0, mgx = 0;
  for (int64_t i = 0; i < d; ++i) {
    const double g = double(dy[i]) * gamma[i];
    mg += g;
    mgx += g * xhat[i];
  }
  mg /= d;
  mgx /= d;
  for (int64_t i = 0; i < d; ++i) dx[i] = static_cast<float>(rstd * (double(dy[i]) * gamma[i] - mg - xhat[i] * mgx));
}
// Column j of the parameter gradients over `rows` rows of d: dgamma[j] += sum of dy * xhat, dbeta[j]
// += sum of dy (in double, row by row).
TESSERA_HD void layernorm_column_grads(const float* dy, const float* xhat, int64_t rows, int64_t d, int64_t j,
                                       float* dgamma, float* dbeta) {
  double g = 0, b = 0;
  for (int64_t r = 0; r < rows; ++r) {
    g += double(dy[r * d + j]) * xhat[r * d + j];
    b += dy[r * d + j];
  }
  dgamma[j] += static_cast<float>(g);
  dbeta[j] += static_cast<float>(b);
}

// ---- causal attention, one row of scores ----
// Softmax over the first `len` entries of s (the positions a query may attend to: itself and those
// before it); the entries from len to t are set to 0.
TESSERA_HD void causal_softmax_row(float* s, int64_t len, int64_t t) {
  float mx = s[0];
  for (int64_t j = 1; j < len; ++j) mx = fmaxf(mx, s[j]);
  double z = 0;
  for (int64_t j = 0; j < len; ++j) z += exp(double(s[j]) - mx);
  for (int64_t j = 0; j < len; ++j) s[j] = static_cast<float>(exp(double(s[j]) - mx) / z);
  for (int64_t j = len; j < t; ++j) s[j] = 0.0f;
}
// The scores' gradient from the probabilities p of a row whose first `len` of t entries were
// attended to and their gradient dp (in place into dp): ds_j = scale * p_j (dp_j - sum_k p_k dp_k),
// 0 for the masked entries.
TESSERA_HD void softmax_row_grad(const float* p, float* dp, int64_t len, int64_t t, float scale) {
  double dot = 0;
  for (int64_t j = 0; j < len; ++j) dot += double(p[j]) * dp[j];
  for (int64_t j = 0; j < len; ++j) dp[j] = static_cast<float>(scale * p[j] * (dp[j] - dot));
  for (int64_t j = len; j < t; ++j) dp[j] = 0.0f;
}

}  // namespace tessera::kernels
