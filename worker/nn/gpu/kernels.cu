// CUDA kernels of the element-wise layers, losses, optimisers and batch normalisation. Most are one
// launch helper, for_each(n, f): f(i) for every index on the calling thread's stream, one thread an
// index (grid-stride), f a device lambda whose entry is the nn/kernels.h function the CPU path runs
// too. What needs another shape of grid has a kernel of its own: the reductions (a block's partial
// sum, added atomically), per-channel sums, bias planes and tiled max pooling.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "worker/core/device.h"
#include "worker/nn/gpu/ops.h"
#include "worker/nn/kernels.h"

namespace tessera::gpu {
namespace {

constexpr int kThreads = 256;

cudaStream_t cur() { return static_cast<cudaStream_t>(stream()); }

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 8192)); }

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

#define TESSERA_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

template <class F>
__global__ void k_for_each(int64_t n, F f) {
  TESSERA_GRID_STRIDE(i, n) f(i);
}

// f(i) for i in [0, n) on the calling thread's stream; `what` names the launch in an error. Nothing
// runs for n <= 0.
template <class F>
void for_each(const char* what, int64_t n, F f) {
  if (n <= 0) return;
  k_for_each<<<blocks_for(n), kThreads, 0, cur()>>>(n, f);
  check_launch(what);
}

// y = leaky(y + b) (b may be null; without `act` only the sum) over planes of `inner` entries: block
// row blockIdx.y takes whole planes, so that no entry divides its index to find its channel.
__global__ void k_bias_act_planes(float* __restrict y, const float* __restrict b, int64_t planes, int64_t c,
                                  int64_t inner, bool act, float slope) {
  for (int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
    const float add = b ? b[p % c] : 0.0f;
    float* row = y + p * inner;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < inner; j += (int64_t)gridDim.x * blockDim.x) {
      const float v = row[j] + add;
      row[j] = act ? kernels::leaky_relu(v, slope) : v;
    }
  }
}

// Block-wide sum of one double per thread into *out (atomically, over blocks).
__device__ void block_sum_into(double v, double* out) {
  __shared__ double part[kThreads];
  part[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

__global__ void k_sum_squares(const float* __restrict x, int64_t n, double* out) {
  double s = 0;
  TESSERA_GRID_STRIDE(i, n) s += double(x[i]) * x[i];
  block_sum_into(s, out);
}
__global__ void k_mse(const float* __restrict y, const float* __restrict t, float* __restrict g, int64_t n, double inv,
                      double* out) {
  double s = 0;
  TESSERA_GRID_STRIDE(i, n) {
    s += kernels::mse_term(y[i], t[i], inv);
    g[i] = kernels::mse_grad(y[i], t[i], inv);
  }
  block_sum_into(s, out);
}
// One thread per position (n * inner); out[1] counts labels outside [0, c), out[2] holds the first's position + 1.
__global__ void k_softmax_xent(const float* __restrict x, const float* __restrict labels, float* __restrict g,
                               int64_t n, int64_t c, int64_t inner, double inv, double eps, double* out) {
  double s = 0;
  TESSERA_GRID_STRIDE(p, n * inner) {
    const int64_t i = p / inner, j = p % inner, base = i * c * inner + j;
    const double term =
        kernels::softmax_xent_position(x + base, inner, c, static_cast<int64_t>(labels[p]), inv, g + base, eps);
    if (term != term) {
      atomicAdd(&out[1], 1.0);
    } else {
      s += term;
    }
  }
  block_sum_into(s, out);
}

// Per channel: sums over (n, inner) of a into out[ch] and, with `second`, of a * b (b null: a * a)
// into out[c + ch]. Block (ch, part) takes part `blockIdx.y` of each sample's run of `inner`
// entries, so that a layer of few channels over a large volume still fills the GPU; the blocks'
// partial sums meet by atomic addition.
__global__ void k_channel_sums(const float* __restrict a, const float* __restrict b, int64_t n, int64_t c,
                               int64_t inner, double* out, bool second) {
  const int64_t ch = blockIdx.x;
  double s = 0, q = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t off = (i * c + ch) * inner;
    for (int64_t j = blockIdx.y * (int64_t)blockDim.x + threadIdx.x; j < inner; j += (int64_t)gridDim.y * blockDim.x) {
      const float v = a[off + j];
      s += v;
      if (second) q += double(v) * (b ? b[off + j] : v);
    }
  }
  block_sum_into(s, &out[ch]);
  if (!second) return;
  __syncthreads();
  block_sum_into(q, &out[c + ch]);
}

// k_channel_sums over c channels of n x inner entries each: about 2048 blocks in all where there
// are entries for them (at least 16 a thread in each part).
void channel_sums_into(const float* a, const float* b, int64_t n, int64_t c, int64_t inner, double* out, bool second) {
  const int64_t by_entries = std::max<int64_t>(1, inner / (16 * kThreads));
  const int64_t by_grid = std::max<int64_t>(1, 2048 / std::max<int64_t>(1, c));
  const dim3 grid(static_cast<unsigned>(c), static_cast<unsigned>(std::min<int64_t>({by_entries, by_grid, 65535})));
  k_channel_sums<<<grid, kThreads, 0, cur()>>>(a, b, n, c, inner, out, second);
}

// copy_box's shapes, captured by its lambda: plain arrays, since std::array's members are host functions.
struct Box {
  int64_t src_shape[5], from[5], dst_shape[5], to[5], extent[5];
};

// Doubles in device memory on the calling thread's stream: zeroed, or a copy of host values (the
// host vector may go once the constructor returns); read() copies them back.
class Scratch {
 public:
  explicit Scratch(size_t n) : n_(n) {
    check(cudaMallocAsync(reinterpret_cast<void**>(&d_), std::max<size_t>(1, n) * sizeof(double), cur()),
          "cudaMallocAsync");
    check(cudaMemsetAsync(d_, 0, n * sizeof(double), cur()), "cudaMemsetAsync");
  }
  explicit Scratch(const std::vector<double>& v) : Scratch(v.size()) {
    if (n_) check(cudaMemcpyAsync(d_, v.data(), n_ * sizeof(double), cudaMemcpyHostToDevice, cur()), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(cur()), "cudaStreamSynchronize");
  }
  ~Scratch() { cudaFreeAsync(d_, cur()); }
  double* get() const { return d_; }
  std::vector<double> read() {
    std::vector<double> h(n_);
    check(cudaMemcpyAsync(h.data(), d_, n_ * sizeof(double), cudaMemcpyDeviceToHost, cur()), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(cur()), "cudaStreamSynchronize");
    return h;
  }

 private:
  size_t n_;
  double* d_ = nullptr;
};

// One thread per output: its window's first largest entry; y gets the value, or that entry of dx
// gets dy and the window's other entries zero. I: 32-bit indices where the tensor allows them (a
// 64-bit division costs several times a 32-bit one, and there are four per output).
template <class I>
__global__ void k_max_pool_tiles(const float* __restrict x, float* __restrict y, const float* __restrict dy,
                                 float* __restrict dx, I outputs, I D, I H, I W, I od, I oh, I ow, int kd, int k) {
  for (I o = blockIdx.x * blockDim.x + threadIdx.x; o < outputs; o += gridDim.x * blockDim.x) {
    I t = o;
    const I w = t % ow;
    t /= ow;
    const I h = t % oh;
    t /= oh;
    const I d = t % od;
    const I plane = t / od;
    const I base = ((plane * D + d * kd) * H + h * k) * W + w * k;
    I best = base;
    float top = x[base];
    for (int a = 0; a < kd; ++a)
      for (int b = 0; b < k; ++b)
        for (int c = 0; c < k; ++c) {
          const I i = base + (a * H + b) * W + c;
          if (x[i] > top) {
            top = x[i];
            best = i;
          }
        }
    if (y) y[o] = top;
    if (!dx) continue;
    for (int a = 0; a < kd; ++a)
      for (int b = 0; b < k; ++b)
        for (int c = 0; c < k; ++c) {
          const I i = base + (a * H + b) * W + c;
          dx[i] = i == best ? dy[o] : 0.0f;
        }
  }
}

void max_pool_tiles_launch(const float* x, float* y, const float* dy, float* dx, const Dims5& in, int kd, int k) {
  const int64_t od = in[2] / kd, oh = in[3] / k, ow = in[4] / k, outputs = in[0] * in[1] * od * oh * ow;
  const int64_t entries = in[0] * in[1] * in[2] * in[3] * in[4];
  if (dx && (in[2] % kd || in[3] % k || in[4] % k))  // rows past the last window
    check(cudaMemsetAsync(dx, 0, entries * sizeof(float), cur()), "cudaMemsetAsync");
  if (outputs <= 0) return;
  if (entries < (int64_t(1) << 31))
    k_max_pool_tiles<uint32_t>
        <<<blocks_for(outputs), kThreads, 0, cur()>>>(x, y, dy, dx, uint32_t(outputs), uint32_t(in[2]), uint32_t(in[3]),
                                                      uint32_t(in[4]), uint32_t(od), uint32_t(oh), uint32_t(ow), kd, k);
  else
    k_max_pool_tiles<int64_t>
        <<<blocks_for(outputs), kThreads, 0, cur()>>>(x, y, dy, dx, outputs, in[2], in[3], in[4], od, oh, ow, kd, k);
  check_launch("max_pool_tiles");
}

// k_bias_act_planes over n x c planes of `inner` entries.
void bias_act_planes(float* y, const float* bias, int64_t n, int64_t c, int64_t inner, bool act, float slope) {
  const int64_t planes = n * c;
  const int64_t rows = std::min<int64_t>(planes, 65535);
  const int64_t across = std::min<int64_t>((inner + kThreads - 1) / kThreads, std::max<int64_t>(1, 8192 / rows));
  k_bias_act_planes<<<dim3(static_cast<unsigned>(across), static_cast<unsigned>(rows)), kThreads, 0, cur()>>>(
      y, bias, planes, c, inner, act, slope);
}

}  // namespace

void leaky_relu(const float* x, float* y, int64_t n, float slope) {
  for_each("leaky_relu", n, [=] __device__(int64_t i) { y[i] = kernels::leaky_relu(x[i], slope); });
}
void leaky_relu_grad(const float* gate, const float* dy, float* dx, int64_t n, float slope) {
  for_each("leaky_relu_grad", n,
           [=] __device__(int64_t i) { dx[i] = kernels::leaky_relu_grad(gate[i], dy[i], slope); });
}
void gelu(const float* x, float* y, int64_t n) {
  for_each("gelu", n, [=] __device__(int64_t i) { y[i] = kernels::gelu(x[i]); });
}
void gelu_grad(const float* x, const float* dy, float* dx, int64_t n) {
  for_each("gelu_grad", n, [=] __device__(int64_t i) { dx[i] = kernels::gelu_grad(x[i], dy[i]); });
}
void dropout(const float* x, float* y, float* mask, int64_t n, float rate, uint64_t seed, uint64_t call) {
  for_each("dropout", n, [=] __device__(int64_t i) {
    const float m = kernels::dropout_scale(seed, call, static_cast<uint64_t>(i), rate);
    mask[i] = m;
    y[i] = x[i] * m;
  });
}
void multiply(const float* a, const float* b, float* y, int64_t n) {
  for_each("multiply", n, [=] __device__(int64_t i) { y[i] = a[i] * b[i]; });
}

// Transformer rows: one thread a row (or a column, for the parameter gradients).
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* xhat, float* y, float* rstd,
                       int64_t rows, int64_t d, float eps) {
  for_each("layernorm_forward", rows, [=] __device__(int64_t r) {
    rstd[r] = kernels::layernorm_row(x + r * d, d, eps, gamma, beta, xhat + r * d, y + r * d);
  });
}
void layernorm_backward(const float* dy, const float* xhat, const float* gamma, const float* rstd, float* dgamma,
                        float* dbeta, float* dx, int64_t rows, int64_t d) {
  if (rows == 0) return;
  for_each("layernorm_backward", rows, [=] __device__(int64_t r) {
    kernels::layernorm_row_grad(dy + r * d, xhat + r * d, gamma, rstd[r], d, dx + r * d);
  });
  for_each("layernorm_param_grad", d,
           [=] __device__(int64_t j) { kernels::layernorm_column_grads(dy, xhat, rows, d, j, dgamma, dbeta); });
}
void embedding_forward(const float* ids, const float* token, const float* position, float* y, int64_t n, int64_t t,
                       int64_t d) {
  for_each("embedding_forward", n * t * d, [=] __device__(int64_t i) {
    const int64_t row = i / d, col = i % d;
    y[i] = token[static_cast<int64_t>(ids[row]) * d + col] + position[(row % t) * d + col];
  });
}
void embedding_backward(const float* ids, const float* dy, float* dtoken, float* dposition, int64_t n, int64_t t,
                        int64_t d) {
  for_each("embedding_backward", n * t * d, [=] __device__(int64_t i) {
    const int64_t row = i / d, col = i % d;
    atomicAdd(dtoken + static_cast<int64_t>(ids[row]) * d + col, dy[i]);
    atomicAdd(dposition + (row % t) * d + col, dy[i]);
  });
}
void causal_softmax(float* s, int64_t rows, int64_t t) {
  for_each("causal_softmax", rows, [=] __device__(int64_t r) { kernels::causal_softmax_row(s + r * t, r % t + 1, t); });
}
void causal_softmax_grad(const float* p, float* dp, int64_t rows, int64_t t, float scale) {
  for_each("causal_softmax_grad", rows,
           [=] __device__(int64_t r) { kernels::softmax_row_grad(p + r * t, dp + r * t, r % t + 1, t, scale); });
}

void add_bias(float* y, const float* bias, int64_t n, int64_t c, int64_t inner) {
  if (inner < kThreads) {  // a fully connected layer's rows: too short for a block each
    for_each("add_bias", n * c * inner, [=] __device__(int64_t i) { y[i] += bias[(i / inner) % c]; });
    return;
  }
  if (n * c * inner <= 0) return;
  bias_act_planes(y, bias, n, c, inner, false, 0.0f);
  check_launch("add_bias");
}
void bias_leaky_relu(float* y, const float* bias, int64_t n, int64_t c, int64_t inner, float slope) {
  if (n * c * inner <= 0) return;
  bias_act_planes(y, bias, n, c, inner, true, slope);
  check_launch("bias_leaky_relu");
}
void bias_grad(const float* dy, float* db, int64_t n, int64_t c, int64_t inner) {
  if (n * c * inner <= 0) return;
  Scratch sums(c);
  channel_sums_into(dy, nullptr, n, c, inner, sums.get(), false);
  check_launch("bias_grad");
  const double* s = sums.get();
  for_each("bias_grad", c, [=] __device__(int64_t ch) { db[ch] += static_cast<float>(s[ch]); });
}

void copy_box(const float* src, const Dims5& src_shape, const Dims5& from, float* dst, const Dims5& dst_shape,
              const Dims5& to, const Dims5& extent, bool add) {
  int64_t total = 1;
  for (int64_t e : extent) total *= std::max<int64_t>(0, e);
  Box b;
  for (int k = 0; k < 5; ++k) {
    b.src_shape[k] = src_shape[k];
    b.from[k] = from[k];
    b.dst_shape[k] = dst_shape[k];
    b.to[k] = to[k];
    b.extent[k] = extent[k];
  }
  for_each("copy_box", total, [=] __device__(int64_t i) {
    int64_t rest = i, s = 0, d = 0;
    int64_t idx[5];
    for (int k = 4; k >= 0; --k) {
      idx[k] = rest % b.extent[k];
      rest /= b.extent[k];
    }
    for (int k = 0; k < 5; ++k) {
      s = s * b.src_shape[k] + b.from[k] + idx[k];
      d = d * b.dst_shape[k] + b.to[k] + idx[k];
    }
    dst[d] = add ? dst[d] + src[s] : src[s];
  });
}

void max_pool_tiles(const float* x, float* y, const Dims5& in, int kd, int k) {
  max_pool_tiles_launch(x, y, nullptr, nullptr, in, kd, k);
}
void max_pool_tiles_backward(const float* x, const float* dy, float* dx, const Dims5& in, int kd, int k) {
  max_pool_tiles_launch(x, nullptr, dy, dx, in, kd, k);
}

void swap_leading_dims(const float* src, float* dst, int64_t a, int64_t b, int64_t inner, bool accumulate) {
  for_each("swap_leading_dims", a * b * inner, [=] __device__(int64_t i) {  // src (a, b, inner) -> dst (b, a, inner)
    const int64_t r = i % inner, j = (i / inner) % b, k = i / (inner * b);
    const int64_t o = (j * a + k) * inner + r;
    dst[o] = accumulate ? dst[o] + src[i] : src[i];
  });
}

double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0;
  Scratch out(1);
  k_sum_squares<<<blocks_for(n), kThreads, 0, cur()>>>(x, n, out.get());
  check_launch("sum_squares");
  return out.read()[0];
}

double mse(const float* y, const float* t, float* grad, int64_t n) {
  if (n <= 0) return 0;
  Scratch out(1);
  k_mse<<<blocks_for(n), kThreads, 0, cur()>>>(y, t, grad, n, 1.0 / static_cast<double>(n), out.get());
  check_launch("mse");
  return out.read()[0];
}

double softmax_cross_entropy(const float* logits, const float* labels, float* grad, int64_t n, int64_t c, int64_t inner,
                             double label_smoothing) {
  const int64_t positions = n * inner;
  if (positions <= 0) return 0;
  Scratch out(2);
  k_softmax_xent<<<blocks_for(positions), kThreads, 0, cur()>>>(
      logits, labels, grad, n, c, inner, 1.0 / static_cast<double>(positions), label_smoothing, out.get());
  check_launch("softmax_cross_entropy");
  const std::vector<double> r = out.read();
  if (r[1] > 0)
    throw Error(detail::concat("cross-entropy: ", static_cast<int64_t>(r[1]), " label(s) outside [0, ", c, ")"));
  return r[0];
}

void sgd_update(float* w, float* v, const float* g, int64_t n, float lr, float mu, float wd, bool nesterov) {
  for_each("sgd_update", n, [=] __device__(int64_t i) {
    float unused = 0;
    kernels::sgd_update(w[i], v ? v[i] : unused, g[i], lr, mu, wd, nesterov);
  });
}
void adam_update(float* w, float* m, float* v, const float* g, int64_t n, const kernels::AdamArgs& a, float wd) {
  for_each("adam_update", n, [=] __device__(int64_t i) { kernels::adam_update(w[i], m[i], v[i], g[i], a, wd); });
}
void lars_update(float* w, float* v, const float* g, int64_t n, float rate, float mu, float wd) {
  for_each("lars_update", n, [=] __device__(int64_t i) { kernels::lars_update(w[i], v[i], g[i], rate, mu, wd); });
}

// ---- batch normalisation: the per-channel steps one thread a channel, the rest one an entry ----
namespace {

// mean, inv_std and the running averages from the channels' sums (count entries each).
void bn_finalize(const double* sums, float* mean, float* inv_std, float* running_mean, float* running_var, int64_t c,
                 double count, float momentum, float eps) {
  for_each("batchnorm statistics", c, [=] __device__(int64_t ch) {
    kernels::bn_statistics(sums[ch], sums[c + ch], count, eps, momentum, mean[ch], inv_std[ch], running_mean[ch],
                           running_var[ch]);
  });
}
// y (and xhat, unless null) from x and the channels' statistics.
void bn_normalize(const float* x, float* xhat, float* y, const float* gamma, const float* beta, const float* mean,
                  const float* inv, int64_t total, int64_t c, int64_t inner) {
  for_each("batchnorm normalize", total, [=] __device__(int64_t i) {
    const int64_t ch = (i / inner) % c;
    const float h = kernels::bn_normalize(x[i], mean[ch], inv[ch]);
    if (xhat) xhat[i] = h;
    y[i] = kernels::bn_output(h, gamma[ch], beta[ch]);
  });
}
// dbeta += the sums of dy, dgamma += those of dy * xhat.
void bn_param_grads(const double* sums, float* dgamma, float* dbeta, int64_t c) {
  for_each("batchnorm parameter gradients", c, [=] __device__(int64_t ch) {
    dbeta[ch] += static_cast<float>(sums[ch]);
    dgamma[ch] += static_cast<float>(sums[c + ch]);
  });
}
// dx from dy, xhat and the sums of dy and dy * xhat over `count` entries a channel.
void bn_backward(const float* dy, const float* xhat, const float* gamma, const float* inv, const double* sums,
                 float* dx, int64_t total, int64_t c, int64_t inner, double count) {
  for_each("batchnorm backward", total, [=] __device__(int64_t i) {
    const int64_t ch = (i / inner) % c;
    const float k = gamma[ch] * inv[ch];
    const float mdy = static_cast<float>(sums[ch] / count), mdyx = static_cast<float>(sums[c + ch] / count);
    dx[i] = kernels::bn_input_grad(dy[i], xhat[i], k, mdy, mdyx);
  });
}

}  // namespace

void batchnorm_forward_train(const float* x, float* xhat, float* y, const float* gamma, const float* beta, float* mean,
                             float* inv_std, float* running_mean, float* running_var, int64_t n, int64_t c,
                             int64_t inner, float momentum, float eps) {
  const int64_t total = n * c * inner;
  if (total <= 0) return;
  Scratch sums(2 * c);
  channel_sums_into(x, nullptr, n, c, inner, sums.get(), true);
  check_launch("batchnorm_forward_train");
  bn_finalize(sums.get(), mean, inv_std, running_mean, running_var, c, static_cast<double>(n * inner), momentum, eps);
  bn_normalize(x, xhat, y, gamma, beta, mean, inv_std, total, c, inner);
}

void batchnorm_forward_eval(const float* x, float* y, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, int64_t n, int64_t c, int64_t inner, float eps) {
  const int64_t total = n * c * inner;
  if (total <= 0) return;
  float* stats = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&stats), 2 * c * sizeof(float), cur()), "cudaMallocAsync");
  float *mean = stats, *inv = stats + c;
  for_each("batchnorm_forward_eval", c, [=] __device__(int64_t ch) {
    mean[ch] = running_mean[ch];
    inv[ch] = 1.0f / sqrtf(running_var[ch] + eps);
  });
  bn_normalize(x, nullptr, y, gamma, beta, mean, inv, total, c, inner);
  cudaFreeAsync(stats, cur());
}

std::vector<double> channel_sums(const float* a, const float* b, int64_t n, int64_t c, int64_t inner) {
  if (n * c * inner <= 0) return std::vector<double>(2 * c, 0.0);
  Scratch sums(2 * c);
  channel_sums_into(a, b, n, c, inner, sums.get(), true);
  check_launch("channel_sums");
  return sums.read();
}

void batchnorm_forward_with_sums(const float* x, float* xhat, float* y, const float* gamma, const float* beta,
                                 float* mean, float* inv_std, float* running_mean, float* running_var, int64_t n,
                                 int64_t c, int64_t inner, const std::vector<double>& sums, double count,
                                 float momentum, float eps) {
  const Scratch s(sums);
  bn_finalize(s.get(), mean, inv_std, running_mean, running_var, c, count, momentum, eps);
  bn_normalize(x, xhat, y, gamma, beta, mean, inv_std, n * c * inner, c, inner);
}

void batchnorm_backward_with_sums(const float* dy, const float* xhat, const float* gamma, const float* inv_std,
                                  float* dgamma, float* dbeta, float* dx, int64_t n, int64_t c, int64_t inner,
                                  const std::vector<double>& local, const std::vector<double>& reduced, double count) {
  const Scratch l(local), r(reduced);
  bn_param_grads(l.get(), dgamma, dbeta, c);
  bn_backward(dy, xhat, gamma, inv_std, r.get(), dx, n * c * inner, c, inner, count);
}

void batchnorm_backward(const float* dy, const float* xhat, const float* gamma, const float* inv_std, float* dgamma,
                        float* dbeta, float* dx, int64_t n, int64_t c, int64_t inner) {
  const int64_t total = n * c * inner;
  if (total <= 0) return;
  Scratch sums(2 * c);
  channel_sums_into(dy, xhat, n, c, inner, sums.get(), true);
  check_launch("batchnorm_backward");
  bn_param_grads(sums.get(), dgamma, dbeta, c);
  bn_backward(dy, xhat, gamma, inv_std, sums.get(), dx, total, c, inner, static_cast<double>(n * inner));
}

}  // namespace tessera::gpu
