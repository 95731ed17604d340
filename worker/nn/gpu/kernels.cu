// CUDA kernels of the element-wise layers, losses, optimisers and batch normalisation: one thread
// per entry (grid-stride), each entry computed by the nn/kernels.h function the CPU path runs too.
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

__global__ void k_leaky_relu(const float* __restrict x, float* __restrict y, int64_t n, float s) {
  TESSERA_GRID_STRIDE(i, n) y[i] = kernels::leaky_relu(x[i], s);
}
__global__ void k_leaky_relu_grad(const float* __restrict gate, const float* __restrict dy, float* __restrict dx,
                                  int64_t n, float s) {
  TESSERA_GRID_STRIDE(i, n) dx[i] = kernels::leaky_relu_grad(gate[i], dy[i], s);
}
__global__ void k_gelu(const float* __restrict x, float* __restrict y, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) y[i] = kernels::gelu(x[i]);
}
__global__ void k_gelu_grad(const float* __restrict x, const float* __restrict dy, float* __restrict dx, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) dx[i] = kernels::gelu_grad(x[i], dy[i]);
}
// Transformer rows: one thread per row (or per column for the parameter gradients).
__global__ void k_layernorm(const float* __restrict x, const float* __restrict gamma, const float* __restrict beta,
                            float* __restrict xhat, float* __restrict y, float* __restrict rstd, int64_t rows, int64_t d, float eps) {
  TESSERA_GRID_STRIDE(r, rows) rstd[r] = kernels::layernorm_row(x + r * d, d, eps, gamma, beta, xhat + r * d, y + r * d);
}
__global__ void k_layernorm_grad(const float* __restrict dy, const float* __restrict xhat, const float* __restrict gamma,
                                 const float* __restrict rstd, float* __restrict dx, int64_t rows, int64_t d) {
  TESSERA_GRID_STRIDE(r, rows) kernels::layernorm_row_grad(dy + r * d, xhat + r * d, gamma, rstd[r], d, dx + r * d);
}
__global__ void k_layernorm_param_grad(const float* __restrict dy, const float* __restrict xhat, float* __restrict dgamma,
                                       float* __restrict dbeta, int64_t rows, int64_t d) {
  TESSERA_GRID_STRIDE(j, d) {
    double g = 0, b = 0;
    for (int64_t r = 0; r < rows; ++r) {
      g += double(dy[r * d + j]) * xhat[r * d + j];
      b += dy[r * d + j];
    }
    dgamma[j] += static_cast<float>(g);
    dbeta[j] += static_cast<float>(b);
  }
}
__global__ void k_embedding(const float* __restrict ids, const float* __restrict token, const float* __restrict position,
                            float* __restrict y, int64_t total, int64_t t, int64_t d) {
  TESSERA_GRID_STRIDE(i, total) {
    const int64_t row = i / d, col = i % d;
    y[i] = token[static_cast<int64_t>(ids[row]) * d + col] + position[(row % t) * d + col];
  }
}
__global__ void k_embedding_grad(const float* __restrict ids, const float* __restrict dy, float* __restrict dtoken,
                                 float* __restrict dposition, int64_t total, int64_t t, int64_t d) {
  TESSERA_GRID_STRIDE(i, total) {
    const int64_t row = i / d, col = i % d;
    atomicAdd(dtoken + static_cast<int64_t>(ids[row]) * d + col, dy[i]);
    atomicAdd(dposition + (row % t) * d + col, dy[i]);
  }
}
__global__ void k_causal_softmax(float* __restrict s, int64_t rows, int64_t t) {
  TESSERA_GRID_STRIDE(r, rows) kernels::causal_softmax_row(s + r * t, r % t + 1, t);
}
__global__ void k_causal_softmax_grad(const float* __restrict p, float* __restrict dp, int64_t rows, int64_t t, float scale) {
  TESSERA_GRID_STRIDE(r, rows) kernels::softmax_row_grad(p + r * t, dp + r * t, r % t + 1, t, scale);
}
__global__ void k_dropout(const float* __restrict x, float* __restrict y, float* __restrict mask, int64_t n, float rate,
                          uint64_t seed, uint64_t call) {
  TESSERA_GRID_STRIDE(i, n) {
    const float m = kernels::dropout_scale(seed, call, static_cast<uint64_t>(i), rate);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}
__global__ void k_multiply(const float* __restrict a, const float* __restrict b, float* __restrict y, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) y[i] = a[i] * b[i];
}
__global__ void k_add_bias(float* __restrict y, const float* __restrict b, int64_t total, int64_t c, int64_t inner) {
  TESSERA_GRID_STRIDE(i, total) y[i] += b[(i / inner) % c];
}
// y = leaky(y + b) (b may be null; without `act` only the sum) over planes of `inner` entries: block
// row blockIdx.y takes whole planes, so that no entry divides its index to find its channel.
__global__ void k_bias_act_planes(float* __restrict y, const float* __restrict b, int64_t planes, int64_t c, int64_t inner,
                                  bool act, float slope) {
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
__global__ void k_softmax_xent(const float* __restrict x, const float* __restrict labels, float* __restrict g, int64_t n,
                               int64_t c, int64_t inner, double inv, double eps, double* out) {
  double s = 0;
  TESSERA_GRID_STRIDE(p, n * inner) {
    const int64_t i = p / inner, j = p % inner, base = i * c * inner + j;
    const double term = kernels::softmax_xent_position(x + base, inner, c, static_cast<int64_t>(labels[p]), inv, g + base, eps);
    if (term != term) {
      atomicAdd(&out[1], 1.0);
    } else {
      s += term;
    }
  }
  block_sum_into(s, out);
}

__global__ void k_sgd(float* __restrict w, float* __restrict v, const float* __restrict g, int64_t n, float lr, float mu,
                      float wd, bool nesterov) {
  float unused = 0;
  TESSERA_GRID_STRIDE(i, n) kernels::sgd_update(w[i], v ? v[i] : unused, g[i], lr, mu, wd, nesterov);
}
__global__ void k_adam(float* __restrict w, float* __restrict m, float* __restrict v, const float* __restrict g, int64_t n,
                       kernels::AdamArgs a, float wd) {
  TESSERA_GRID_STRIDE(i, n) kernels::adam_update(w[i], m[i], v[i], g[i], a, wd);
}
__global__ void k_lars(float* __restrict w, float* __restrict v, const float* __restrict g, int64_t n, float rate, float mu,
                       float wd) {
  TESSERA_GRID_STRIDE(i, n) kernels::lars_update(w[i], v[i], g[i], rate, mu, wd);
}

// Per channel: sums over (n, inner) of a into out[ch] and, with `second`, of a * b (b null: a * a)
// into out[c + ch]. Block (ch, part) takes part `blockIdx.y` of each sample's run of `inner`
// entries, so that a layer of few channels over a large volume still fills the GPU; the blocks'
// partial sums meet by atomic addition.
__global__ void k_channel_sums(const float* __restrict a, const float* __restrict b, int64_t n, int64_t c, int64_t inner,
                               double* out, bool second) {
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
__global__ void k_bn_finalize(const double* __restrict sums, float* mean, float* inv_std, float* running_mean,
                              float* running_var, int64_t c, double count, float momentum, float eps) {
  const int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (ch >= c) return;
  kernels::bn_statistics(sums[ch], sums[c + ch], count, eps, momentum, mean[ch], inv_std[ch], running_mean[ch],
                         running_var[ch]);
}
__global__ void k_bn_normalize(const float* __restrict x, float* __restrict xhat, float* __restrict y,
                               const float* __restrict gamma, const float* __restrict beta, const float* __restrict mean,
                               const float* __restrict inv, int64_t total, int64_t c, int64_t inner) {
  TESSERA_GRID_STRIDE(i, total) {
    const int64_t ch = (i / inner) % c;
    const float h = kernels::bn_normalize(x[i], mean[ch], inv[ch]);
    if (xhat) xhat[i] = h;
    y[i] = kernels::bn_output(h, gamma[ch], beta[ch]);
  }
}
__global__ void k_bn_eval_stats(const float* __restrict running_mean, const float* __restrict running_var, float* mean,
                                float* inv, int64_t c, float eps) {
  const int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (ch >= c) return;
  mean[ch] = running_mean[ch];
  inv[ch] = 1.0f / sqrtf(running_var[ch] + eps);
}
__global__ void k_bn_param_grads(const double* __restrict sums, float* dgamma, float* dbeta, int64_t c) {
  const int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (ch >= c) return;
  dbeta[ch] += static_cast<float>(sums[ch]);
  dgamma[ch] += static_cast<float>(sums[c + ch]);
}
__global__ void k_add_sums(const double* __restrict sums, float* out, int64_t c) {
  const int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (ch < c) out[ch] += static_cast<float>(sums[ch]);
}
// src (a, b, inner) -> dst (b, a, inner).
__global__ void k_swap_leading(const float* __restrict src, float* __restrict dst, int64_t a, int64_t b, int64_t inner,
                               bool accumulate) {
  TESSERA_GRID_STRIDE(i, a * b * inner) {
    const int64_t r = i % inner, j = (i / inner) % b, k = i / (inner * b);
    const int64_t o = (j * a + k) * inner + r;
    dst[o] = accumulate ? dst[o] + src[i] : src[i];
  }
}
struct Box {  // plain arrays: std::array's members are host functions
  int64_t src_shape[5], from[5], dst_shape[5], to[5], extent[5];
};
__global__ void k_copy_box(const float* __restrict src, float* __restrict dst, Box b, int64_t total, bool add) {
  TESSERA_GRID_STRIDE(i, total) {
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
  }
}
__global__ void k_bn_backward(const float* __restrict dy, const float* __restrict xhat, const float* __restrict gamma,
                              const float* __restrict inv, const double* __restrict sums, float* __restrict dx,
                              int64_t total, int64_t c, int64_t inner, double count) {
  TESSERA_GRID_STRIDE(i, total) {
    const int64_t ch = (i / inner) % c;
    const float k = gamma[ch] * inv[ch];
    const float mdy = static_cast<float>(sums[ch] / count), mdyx = static_cast<float>(sums[c + ch] / count);
    dx[i] = kernels::bn_input_grad(dy[i], xhat[i], k, mdy, mdyx);
  }
}

// Doubles in device memory on the calling thread's stream: zeroed, or a copy of host values (the
// host vector may go once the constructor returns); read() copies them back.
class Scratch {
 public:
  explicit Scratch(size_t n) : n_(n) {
    check(cudaMallocAsync(reinterpret_cast<void**>(&d_), std::max<size_t>(1, n) * sizeof(double), cur()), "cudaMallocAsync");
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
    k_max_pool_tiles<uint32_t><<<blocks_for(outputs), kThreads, 0, cur()>>>(
        x, y, dy, dx, uint32_t(outputs), uint32_t(in[2]), uint32_t(in[3]), uint32_t(in[4]), uint32_t(od), uint32_t(oh),
        uint32_t(ow), kd, k);
  else
    k_max_pool_tiles<int64_t><<<blocks_for(outputs), kThreads, 0, cur()>>>(x, y, dy, dx, outputs, in[2], in[3], in[4], od,
                                                                          oh, ow, kd, k);
  check_launch("max_pool_tiles");
}

}  // namespace

void leaky_relu(const float* x, float* y, int64_t n, float slope) {
  if (n <= 0) return;
  k_leaky_relu<<<blocks_for(n), kThreads, 0, cur()>>>(x, y, n, slope);
  check_launch("leaky_relu");
}
void leaky_relu_grad(const float* gate, const float* dy, float* dx, int64_t n, float slope) {
  if (n <= 0) return;
  k_leaky_relu_grad<<<blocks_for(n), kThreads, 0, cur()>>>(gate, dy, dx, n, slope);
  check_launch("leaky_relu_grad");
}
void gelu(const float* x, float* y, int64_t n) {
  if (n == 0) return;
  k_gelu<<<blocks_for(n), kThreads, 0, cur()>>>(x, y, n);
  check_launch("gelu");
}

void gelu_grad(const float* x, const float* dy, float* dx, int64_t n) {
  if (n == 0) return;
  k_gelu_grad<<<blocks_for(n), kThreads, 0, cur()>>>(x, dy, dx, n);
  check_launch("gelu_grad");
}

void layernorm_forward(const float* x, const float* gamma, const float* beta, float* xhat, float* y, float* rstd,
                       int64_t rows, int64_t d, float eps) {
  if (rows == 0) return;
  k_layernorm<<<blocks_for(rows), kThreads, 0, cur()>>>(x, gamma, beta, xhat, y, rstd, rows, d, eps);
  check_launch("layernorm_forward");
}

void layernorm_backward(const float* dy, const float* xhat, const float* gamma, const float* rstd, float* dgamma,
                        float* dbeta, float* dx, int64_t rows, int64_t d) {
  if (rows == 0) return;
  k_layernorm_grad<<<blocks_for(rows), kThreads, 0, cur()>>>(dy, xhat, gamma, rstd, dx, rows, d);
  check_launch("layernorm_backward");
  k_layernorm_param_grad<<<blocks_for(d), kThreads, 0, cur()>>>(dy, xhat, dgamma, dbeta, rows, d);
  check_launch("layernorm_param_grad");
}

void embedding_forward(const float* ids, const float* token, const float* position, float* y, int64_t n, int64_t t, int64_t d) {
  const int64_t total = n * t * d;
  if (total == 0) return;
  k_embedding<<<blocks_for(total), kThreads, 0, cur()>>>(ids, token, position, y, total, t, d);
  check_launch("embedding_forward");
}

void embedding_backward(const float* ids, const float* dy, float* dtoken, float* dposition, int64_t n, int64_t t, int64_t d) {
  const int64_t total = n * t * d;
  if (total == 0) return;
  k_embedding_grad<<<blocks_for(total), kThreads, 0, cur()>>>(ids, dy, dtoken, dposition, total, t, d);
  check_launch("embedding_backward");
}

void causal_softmax(float* s, int64_t rows, int64_t t) {
  if (rows == 0) return;
  k_causal_softmax<<<blocks_for(rows), kThreads, 0, cur()>>>(s, rows, t);
  check_launch("causal_softmax");
}

void causal_softmax_grad(const float* p, float* dp, int64_t rows, int64_t t, float scale) {
  if (rows == 0) return;
  k_causal_softmax_grad<<<blocks_for(rows), kThreads, 0, cur()>>>(p, dp, rows, t, scale);
  check_launch("causal_softmax_grad");
}

void dropout(const float* x, float* y, float* mask, int64_t n, float rate, uint64_t seed, uint64_t call) {
  if (n <= 0) return;
  k_dropout<<<blocks_for(n), kThreads, 0, cur()>>>(x, y, mask, n, rate, seed, call);
  check_launch("dropout");
}
void multiply(const float* a, const float* b, float* y, int64_t n) {
  if (n <= 0) return;
  k_multiply<<<blocks_for(n), kThreads, 0, cur()>>>(a, b, y, n);
  check_launch("multiply");
}
namespace {
// k_bias_act_planes over n x c planes of `inner` entries.
void bias_act_planes(float* y, const float* bias, int64_t n, int64_t c, int64_t inner, bool act, float slope) {
  const int64_t planes = n * c;
  const int64_t rows = std::min<int64_t>(planes, 65535);
  const int64_t across = std::min<int64_t>((inner + kThreads - 1) / kThreads, std::max<int64_t>(1, 8192 / rows));
  k_bias_act_planes<<<dim3(static_cast<unsigned>(across), static_cast<unsigned>(rows)), kThreads, 0, cur()>>>(
      y, bias, planes, c, inner, act, slope);
}
}  // namespace

void add_bias(float* y, const float* bias, int64_t n, int64_t c, int64_t inner) {
  const int64_t total = n * c * inner;
  if (total <= 0) return;
  if (inner < kThreads)  // a fully connected layer's rows: too short for a block each
    k_add_bias<<<blocks_for(total), kThreads, 0, cur()>>>(y, bias, total, c, inner);
  else
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
  k_add_sums<<<static_cast<int>((c + kThreads - 1) / kThreads), kThreads, 0, cur()>>>(sums.get(), db, c);
  check_launch("bias_grad");
}

void copy_box(const float* src, const Dims5& src_shape, const Dims5& from, float* dst, const Dims5& dst_shape,
              const Dims5& to, const Dims5& extent, bool add) {
  int64_t total = 1;
  for (int64_t e : extent) total *= std::max<int64_t>(0, e);
  if (total <= 0) return;
  Box b;
  for (int k = 0; k < 5; ++k) {
    b.src_shape[k] = src_shape[k];
    b.from[k] = from[k];
    b.dst_shape[k] = dst_shape[k];
    b.to[k] = to[k];
    b.extent[k] = extent[k];
  }
  k_copy_box<<<blocks_for(total), kThreads, 0, cur()>>>(src, dst, b, total, add);
  check_launch("copy_box");
}

void max_pool_tiles(const float* x, float* y, const Dims5& in, int kd, int k) {
  max_pool_tiles_launch(x, y, nullptr, nullptr, in, kd, k);
}
void max_pool_tiles_backward(const float* x, const float* dy, float* dx, const Dims5& in, int kd, int k) {
  max_pool_tiles_launch(x, nullptr, dy, dx, in, kd, k);
}

void swap_leading_dims(const float* src, float* dst, int64_t a, int64_t b, int64_t inner, bool accumulate) {
  const int64_t total = a * b * inner;
  if (total <= 0) return;
  k_swap_leading<<<blocks_for(total), kThreads, 0, cur()>>>(src, dst, a, b, inner, accumulate);
  check_launch("swap_leading_dims");
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
  k_softmax_xent<<<blocks_for(positions), kThreads, 0, cur()>>>(logits, labels, grad, n, c, inner,
                                                                 1.0 / static_cast<double>(positions), label_smoothing, out.get());
  check_launch("softmax_cross_entropy");
  const std::vector<double> r = out.read();
  if (r[1] > 0)
    throw Error(detail::concat("cross-entropy: ", static_cast<int64_t>(r[1]), " label(s) outside [0, ", c, ")"));
  return r[0];
}

void sgd_update(float* w, float* v, const float* g, int64_t n, float lr, float mu, float wd, bool nesterov) {
  if (n <= 0) return;
  k_sgd<<<blocks_for(n), kThreads, 0, cur()>>>(w, v, g, n, lr, mu, wd, nesterov);
  check_launch("sgd_update");
}
void adam_update(float* w, float* m, float* v, const float* g, int64_t n, const kernels::AdamArgs& a, float wd) {
  if (n <= 0) return;
  k_adam<<<blocks_for(n), kThreads, 0, cur()>>>(w, m, v, g, n, a, wd);
  check_launch("adam_update");
}
void lars_update(float* w, float* v, const float* g, int64_t n, float rate, float mu, float wd) {
  if (n <= 0) return;
  k_lars<<<blocks_for(n), kThreads, 0, cur()>>>(w, v, g, n, rate, mu, wd);
  check_launch("lars_update");
}

void batchnorm_forward_train(const float* x, float* xhat, float* y, const float* gamma, const float* beta, float* mean,
                             float* inv_std, float* running_mean, float* running_var, int64_t n, int64_t c, int64_t inner,
                             float momentum, float eps) {
  const int64_t total = n * c * inner;
  if (total <= 0) return;
  Scratch sums(2 * c);
  channel_sums_into(x, nullptr, n, c, inner, sums.get(), true);
  k_bn_finalize<<<static_cast<int>((c + kThreads - 1) / kThreads), kThreads, 0, cur()>>>(
      sums.get(), mean, inv_std, running_mean, running_var, c, static_cast<double>(n * inner), momentum, eps);
  k_bn_normalize<<<blocks_for(total), kThreads, 0, cur()>>>(x, xhat, y, gamma, beta, mean, inv_std, total, c, inner);
  check_launch("batchnorm_forward_train");
}

void batchnorm_forward_eval(const float* x, float* y, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, int64_t n, int64_t c, int64_t inner, float eps) {
  const int64_t total = n * c * inner;
  if (total <= 0) return;
  float* stats = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&stats), 2 * c * sizeof(float), cur()), "cudaMallocAsync");
  k_bn_eval_stats<<<static_cast<int>((c + kThreads - 1) / kThreads), kThreads, 0, cur()>>>(running_mean, running_var, stats,
                                                                                          stats + c, c, eps);
  k_bn_normalize<<<blocks_for(total), kThreads, 0, cur()>>>(x, nullptr, y, gamma, beta, stats, stats + c, total, c, inner);
  check_launch("batchnorm_forward_eval");
  cudaFreeAsync(stats, cur());
}

std::vector<double> channel_sums(const float* a, const float* b, int64_t n, int64_t c, int64_t inner) {
  if (n * c * inner <= 0) return std::vector<double>(2 * c, 0.0);
  Scratch sums(2 * c);
  channel_sums_into(a, b, n, c, inner, sums.get(), true);
  check_launch("channel_sums");
  return sums.read();
}

void batchnorm_forward_with_sums(const float* x, float* xhat, float* y, const float* gamma, const float* beta, float* mean,
                                 float* inv_std, float* running_mean, float* running_var, int64_t n, int64_t c, int64_t inner,
                                 const std::vector<double>& sums, double count, float momentum, float eps) {
  const int64_t total = n * c * inner;
  const Scratch s(sums);
  k_bn_finalize<<<static_cast<int>((c + kThreads - 1) / kThreads), kThreads, 0, cur()>>>(
      s.get(), mean, inv_std, running_mean, running_var, c, count, momentum, eps);
  if (total > 0)
    k_bn_normalize<<<blocks_for(total), kThreads, 0, cur()>>>(x, xhat, y, gamma, beta, mean, inv_std, total, c, inner);
  check_launch("batchnorm_forward_with_sums");
}

void batchnorm_backward_with_sums(const float* dy, const float* xhat, const float* gamma, const float* inv_std, float* dgamma,
                                  float* dbeta, float* dx, int64_t n, int64_t c, int64_t inner, const std::vector<double>& local,
                                  const std::vector<double>& reduced, double count) {
  const int64_t total = n * c * inner;
  const Scratch l(local), r(reduced);
  k_bn_param_grads<<<static_cast<int>((c + kThreads - 1) / kThreads), kThreads, 0, cur()>>>(l.get(), dgamma, dbeta, c);
  if (total > 0)
    k_bn_backward<<<blocks_for(total), kThreads, 0, cur()>>>(dy, xhat, gamma, inv_std, r.get(), dx, total, c, inner, count);
  check_launch("batchnorm_backward_with_sums");
}

void batchnorm_backward(const float* dy, const float* xhat, const float* gamma, const float* inv_std, float* dgamma,
                        float* dbeta, float* dx, int64_t n, int64_t c, int64_t inner) {
  const int64_t total = n * c * inner;
  if (total <= 0) return;
  Scratch sums(2 * c);
  channel_sums_into(dy, xhat, n, c, inner, sums.get(), true);
  k_bn_param_grads<<<static_cast<int>((c + kThreads - 1) / kThreads), kThreads, 0, cur()>>>(sums.get(), dgamma, dbeta, c);
  k_bn_backward<<<blocks_for(total), kThreads, 0, cur()>>>(dy, xhat, gamma, inv_std, sums.get(), dx, total, c, inner,
                                                            static_cast<double>(n * inner));
  check_launch("batchnorm_backward");
}

}  // namespace tessera::gpu
