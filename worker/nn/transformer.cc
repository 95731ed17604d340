#include "worker/nn/transformer.h"

#include <cmath>

#include "common/error.h"
#include "worker/nn/gpu/ops.h"
#include "worker/nn/kernels.h"

namespace tessera {
namespace {

// gpu::gemm_batched's products, on the device or (one gemm() each, in the layer's precision) on the host.
void gemm_batched(Device device, Precision precision, char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t lda, int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta,
                  float* c, int64_t ldc, int64_t sc, int64_t batch) {
  if (device == Device::kCuda) {
    gpu::gemm_batched(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
    return;
  }
  for (int64_t i = 0; i < batch; ++i)
    gemm(precision, ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * sc, ldc);
}

}  // namespace

// ---- Embedding ----

Embedding::Embedding(std::string name, int vocab, int context, int width, uint64_t seed, float stddev)
    : Layer(std::move(name)), vocab_(vocab), context_(context), width_(width) {
  if (vocab < 1 || context < 1 || width < 1)
    throw ConfigError("model.layers." + this->name(), detail::concat("embedding: invalid sizes (vocabulary ", vocab,
                                                                     ", context ", context, ", width ", width, ")"));
  token_ = Param{this->name() + ".token", Tensor({vocab, width}), Tensor::zeros({vocab, width}), true};
  position_ = Param{this->name() + ".position", Tensor({context, width}), Tensor::zeros({context, width}), true};
  init_normal(token_.value, stddev, seed);
  init_normal(position_.value, stddev, seed + 1);
}

Shape Embedding::output_shape(const Shape& in) const {
  if (in.size() != 2 || in[1] != context_)
    shape_error(detail::concat("expects token ids (N, ", context_, "), got ", shape_str(in)));
  return {in[0] * context_, width_};
}

Tensor Embedding::forward(const Tensor& ids, bool training) {
  const Shape out = output_shape(ids.shape());
  const int64_t n = ids.dim(0), t = context_, d = width_;
  if (ids.on_device()) {
    // The ids are checked on the host side of the loader (TokenDataset checks them against the
    // vocabulary the model is built for); a device pass reads them as they are.
    Tensor y(out, Layout::kPlain, Device::kCuda);
    gpu::embedding_forward(ids.data(), token_.value.data(), position_.value.data(), y.data(), n, t, d);
    if (training) ids_ = ids;
    return y;
  }
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const float id = ids[i];
    if (!(id >= 0 && id < vocab_) || id != std::floor(id))
      throw ConfigError("dataset.vocabSize", detail::concat("token id ", id, " at position ", i % t, " of sequence ",
                                                            i / t, " is not below the vocabulary size ", vocab_));
  }
  Tensor y(out);
  const float* tok = token_.value.data();
  const float* pos = position_.value.data();
  float* yp = y.data();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n * t; ++r) {
    const float* a = tok + static_cast<int64_t>(ids[r]) * d;
    const float* b = pos + (r % t) * d;
    for (int64_t j = 0; j < d; ++j) yp[r * d + j] = a[j] + b[j];
  }
  if (training) ids_ = ids;
  return y;
}

Tensor Embedding::backward(const Tensor& dy) {
  TESSERA_CHECK(!ids_.empty() && dy.shape() == output_shape(ids_.shape()) && dy.device() == ids_.device(), "layer ",
                name(), ": gradient shape ", shape_str(dy.shape()));
  const int64_t n = ids_.dim(0), t = context_, d = width_;
  if (dy.on_device()) {
    gpu::embedding_backward(ids_.data(), dy.data(), token_.grad.data(), position_.grad.data(), n, t, d);
    return Tensor();
  }
  float* dtok = token_.grad.data();
  float* dpos = position_.grad.data();
  const float* g = dy.data();
  for (int64_t r = 0; r < n * t; ++r) {  // in order: rows of one token add up the same way every run
    float* a = dtok + static_cast<int64_t>(ids_[r]) * d;
    float* b = dpos + (r % t) * d;
    for (int64_t j = 0; j < d; ++j) {
      a[j] += g[r * d + j];
      b[j] += g[r * d + j];
    }
  }
  return Tensor();
}

// ---- TiedOutput ----

TiedOutput::TiedOutput(std::string name, Param& embedding) : Layer(std::move(name)), e_(&embedding) {}

Shape TiedOutput::output_shape(const Shape& in) const {
  if (in.size() != 2 || in[1] != e_->value.dim(1))
    shape_error(detail::concat("expects rows (N, ", e_->value.dim(1), "), got ", shape_str(in)));
  return {in[0], e_->value.dim(0)};
}

double TiedOutput::forward_flops(const Shape& in) const { return 2.0 * in[0] * e_->value.dim(0) * e_->value.dim(1); }

Tensor TiedOutput::forward(const Tensor& x, bool training) {
  const Shape out = output_shape(x.shape());
  const int64_t n = x.dim(0), v = e_->value.dim(0), d = e_->value.dim(1);
  Tensor y(out, Layout::kPlain, x.device());
  if (training) {
    x_ = x;
    have_input_ = true;
  }
  if (x.on_device()) {
    gpu::linear_forward(x.data(), e_->value.data(), y.data(), n, d, v);
    return y;
  }
  if (n) gemm(precision(), 'N', 'T', n, v, d, 1.0f, x.data(), d, e_->value.data(), d, 0.0f, y.data(), v);
  return y;
}

Tensor TiedOutput::backward(const Tensor& dy) {
  TESSERA_CHECK(have_input_, "layer ", name(), ": backward without a training forward");
  const int64_t n = x_.dim(0), v = e_->value.dim(0), d = e_->value.dim(1);
  TESSERA_CHECK(dy.shape() == (Shape{n, v}) && dy.device() == x_.device(), "layer ", name(), ": gradient shape ",
                shape_str(dy.shape()));
  Tensor dx({n, d}, Layout::kPlain, dy.device());
  if (dy.on_device()) {
    gpu::linear_backward_data(dy.data(), e_->value.data(), dx.data(), n, d, v);
    gpu::linear_backward_weights(dy.data(), x_.data(), e_->grad.data(), n, d, v);
    return dx;
  }
  if (n == 0) return dx;
  gemm(precision(), 'N', 'N', n, d, v, 1.0f, dy.data(), v, e_->value.data(), d, 0.0f, dx.data(), d);
  gemm(precision(), 'T', 'N', v, d, n, 1.0f, dy.data(), v, x_.data(), d, 1.0f, e_->grad.data(), d);
  return dx;
}

// ---- LayerNorm ----

LayerNorm::LayerNorm(std::string name, int width, float eps) : Layer(std::move(name)), width_(width), eps_(eps) {
  if (width < 1) throw ConfigError("model.layers." + this->name(), detail::concat("layer_norm: invalid width ", width));
  gamma_ = Param{this->name() + ".weight", Tensor::filled({width}, 1.0f), Tensor::zeros({width}), false};
  beta_ = Param{this->name() + ".bias", Tensor::zeros({width}), Tensor::zeros({width}), false};
}

Shape LayerNorm::output_shape(const Shape& in) const {
  if (in.empty() || in.back() != width_)
    shape_error(detail::concat("expects rows of ", width_, ", got ", shape_str(in)));
  return in;
}

Tensor LayerNorm::forward(const Tensor& x, bool training) {
  output_shape(x.shape());
  const int64_t d = width_, rows = x.numel() / d;
  Tensor y(x.shape(), Layout::kPlain, x.device()), xhat(x.shape(), Layout::kPlain, x.device()),
      rstd({rows}, Layout::kPlain, x.device());
  if (x.on_device()) {
    gpu::layernorm_forward(x.data(), gamma_.value.data(), beta_.value.data(), xhat.data(), y.data(), rstd.data(), rows,
                           d, eps_);
  } else {
    const float* xp = x.data();
    const float* g = gamma_.value.data();
    const float* b = beta_.value.data();
    float* xh = xhat.data();
    float* yp = y.data();
    float* rs = rstd.data();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      rs[r] = kernels::layernorm_row(xp + r * d, d, eps_, g, b, xh + r * d, yp + r * d);
  }
  if (training) {
    xhat_ = xhat;
    rstd_ = rstd;
  }
  return y;
}

Tensor LayerNorm::backward(const Tensor& dy) {
  TESSERA_CHECK(dy.shape() == xhat_.shape() && dy.device() == xhat_.device(), "layer ", name(), ": gradient shape ",
                shape_str(dy.shape()), " differs from the forward pass");
  const int64_t d = width_, rows = dy.numel() / d;
  Tensor dx(dy.shape(), Layout::kPlain, dy.device());
  if (dy.on_device()) {
    gpu::layernorm_backward(dy.data(), xhat_.data(), gamma_.value.data(), rstd_.data(), gamma_.grad.data(),
                            beta_.grad.data(), dx.data(), rows, d);
    return dx;
  }
  const float* g = dy.data();
  const float* xh = xhat_.data();
  const float* gm = gamma_.value.data();
  const float* rs = rstd_.data();
  float* o = dx.data();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) kernels::layernorm_row_grad(g + r * d, xh + r * d, gm, rs[r], d, o + r * d);
  float* dg = gamma_.grad.data();
  float* db = beta_.grad.data();
  for (int64_t j = 0; j < d; ++j) kernels::layernorm_column_grads(g, xh, rows, d, j, dg, db);
  return dx;
}

// ---- CausalAttention ----

CausalAttention::CausalAttention(std::string name, int context, int width, int heads)
    : Layer(std::move(name)), t_(context), d_(width), heads_(heads) {
  if (context < 1 || width < 1 || heads < 1)
    throw ConfigError("model.layers." + this->name(),
                      detail::concat("causal_attention: invalid sizes (context ", context, ", width ", width,
                                     ", heads ", heads, ")"));
  if (width % heads != 0)
    throw ConfigError("model.heads", detail::concat(heads, " heads do not divide model.width ", width));
}

Shape CausalAttention::output_shape(const Shape& in) const {
  if (in.size() != 2 || in[1] != 3 * d_ || in[0] % t_ != 0)
    shape_error(
        detail::concat("expects rows (N x ", t_, ", ", 3 * d_, ") of queries, keys and values, got ", shape_str(in)));
  return {in[0], d_};
}

double CausalAttention::forward_flops(const Shape& in) const {
  const double n = static_cast<double>(in[0] / t_);
  return n * 2.0 * 2.0 * t_ * static_cast<double>(t_) * d_;  // q k^T and p v, every head
}

// Per sequence, heads are side by side in each row: head h's queries are the columns h * dh of the
// first D, its keys of the next D, its values of the last. A batched product runs over the heads.
Tensor CausalAttention::forward(const Tensor& qkv, bool training) {
  const Shape out = output_shape(qkv.shape());
  const int64_t n = qkv.dim(0) / t_, t = t_, d = d_, h = heads_, dh = d_ / heads_, ld = 3 * d_;
  const Device dev = qkv.device();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));
  Tensor p({n, h, t, t}, Layout::kPlain, dev), y(out, Layout::kPlain, dev);
  for (int64_t i = 0; i < n; ++i) {
    const float* q = qkv.data() + i * t * ld;
    gemm_batched(dev, precision(), 'N', 'T', t, t, dh, scale, q, ld, dh, q + d, ld, dh, 0.0f, p.data() + i * h * t * t,
                 t, t * t, h);
  }
  if (dev == Device::kCuda) {
    gpu::causal_softmax(p.data(), n * h * t, t);
  } else {
    float* s = p.data();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n * h * t; ++r) kernels::causal_softmax_row(s + r * t, r % t + 1, t);
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* v = qkv.data() + i * t * ld + 2 * d;
    gemm_batched(dev, precision(), 'N', 'N', t, dh, t, 1.0f, p.data() + i * h * t * t, t, t * t, v, ld, dh, 0.0f,
                 y.data() + i * t * d, d, dh, h);
  }
  if (training) {
    qkv_ = qkv;
    p_ = p;
  }
  return y;
}

Tensor CausalAttention::backward(const Tensor& dy) {
  TESSERA_CHECK(!qkv_.empty() && dy.shape() == output_shape(qkv_.shape()) && dy.device() == qkv_.device(), "layer ",
                name(), ": gradient shape ", shape_str(dy.shape()));
  const int64_t n = qkv_.dim(0) / t_, t = t_, d = d_, h = heads_, dh = d_ / heads_, ld = 3 * d_;
  const Device dev = dy.device();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dh)));
  Tensor dp({n, h, t, t}, Layout::kPlain, dev), dqkv(qkv_.shape(), Layout::kPlain, dev);
  for (int64_t i = 0; i < n; ++i) {
    const float* q = qkv_.data() + i * t * ld;
    const float* g = dy.data() + i * t * d;
    const float* p = p_.data() + i * h * t * t;
    float* dq = dqkv.data() + i * t * ld;
    // dP = dY V^T; dV = P^T dY.
    gemm_batched(dev, precision(), 'N', 'T', t, t, dh, 1.0f, g, d, dh, q + 2 * d, ld, dh, 0.0f,
                 dp.data() + i * h * t * t, t, t * t, h);
    gemm_batched(dev, precision(), 'T', 'N', t, dh, t, 1.0f, p, t, t * t, g, d, dh, 0.0f, dq + 2 * d, ld, dh, h);
  }
  if (dev == Device::kCuda) {
    gpu::causal_softmax_grad(p_.data(), dp.data(), n * h * t, t, scale);
  } else {
    const float* p = p_.data();
    float* s = dp.data();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n * h * t; ++r) kernels::softmax_row_grad(p + r * t, s + r * t, r % t + 1, t, scale);
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* q = qkv_.data() + i * t * ld;
    const float* ds = dp.data() + i * h * t * t;
    float* dq = dqkv.data() + i * t * ld;
    // dQ = dS K; dK = dS^T Q (the scale is in dS).
    gemm_batched(dev, precision(), 'N', 'N', t, dh, t, 1.0f, ds, t, t * t, q + d, ld, dh, 0.0f, dq, ld, dh, h);
    gemm_batched(dev, precision(), 'T', 'N', t, dh, t, 1.0f, ds, t, t * t, q, ld, dh, 0.0f, dq + d, ld, dh, h);
  }
  return dqkv;
}

}  // namespace tessera
