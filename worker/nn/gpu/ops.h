// The layers' device side: CUDA kernels over the arithmetic of nn/kernels.h, cuDNN convolution and
// pooling, and cuBLAS matrix products. Pointers are device pointers; everything runs on the calling
// thread's stream (gpu::stream()) and is asynchronous, except the functions that return a number
// (they wait for it). Layers call these when their input is on the device (Tensor::on_device()), so
// a CPU-only build never reaches them: there each one throws Error saying the build has no CUDA.
//
// Device activations are plain (N, C, spatial...), the layout cuDNN's NCDHW descriptors describe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "worker/core/tensor.h"
#include "worker/nn/kernels.h"

namespace tessera::gpu {

// ---- element-wise (n entries) ----
void leaky_relu(const float* x, float* y, int64_t n, float slope);
void leaky_relu_grad(const float* gate, const float* dy, float* dx, int64_t n, float slope);
void gelu(const float* x, float* y, int64_t n);
void gelu_grad(const float* x, const float* dy, float* dx, int64_t n);
// y = x * mask with mask[i] = kernels::dropout_scale(seed, call, i, rate).
void dropout(const float* x, float* y, float* mask, int64_t n, float rate, uint64_t seed, uint64_t call);
void multiply(const float* a, const float* b, float* y, int64_t n);               // y = a * b
void add_bias(float* y, const float* bias, int64_t n, int64_t c, int64_t inner);  // y(n, c, inner) += bias(c)
// y(n, c, inner) = leaky_relu(y + bias(c), slope) in one pass (bias may be null): a convolution's
// bias and activation.
void bias_leaky_relu(float* y, const float* bias, int64_t n, int64_t c, int64_t inner, float slope);
void bias_grad(const float* dy, float* db, int64_t n, int64_t c, int64_t inner);  // db(c) += sum over n, inner
// The box `extent` at offset `from` of src (5-D, plain) into dst at offset `to` (+= when adding):
// halos, explicit padding and crops on the device.
using Dims5 = std::array<int64_t, 5>;
void copy_box(const float* src, const Dims5& src_shape, const Dims5& from, float* dst, const Dims5& dst_shape,
              const Dims5& to, const Dims5& extent, bool add);
// Max pooling whose windows tile the input (kernel = stride, no padding) over (N, C, D, H, W), a 2D
// input as D = 1 with kd = 1: y, or dx from dy (each window's gradient goes to its first largest
// entry; entries no window reaches get zero).
void max_pool_tiles(const float* x, float* y, const Dims5& in, int kd, int k);
void max_pool_tiles_backward(const float* x, const float* dy, float* dx, const Dims5& in, int kd, int k);
// dst (b, a, inner) = src (a, b, inner) with the first two dimensions swapped (+= when accumulating).
void swap_leading_dims(const float* src, float* dst, int64_t a, int64_t b, int64_t inner, bool accumulate);

// ---- reductions (return after reading the result back) ----
double sum_squares(const float* x, int64_t n);
// Mean squared error of y against t: the loss, and its gradient into grad.
double mse(const float* y, const float* t, float* grad, int64_t n);
// Softmax cross-entropy of logits (n, c, inner) against labels (n, inner) stored as floats, with
// label smoothing (kernels::softmax_xent_position); throws Error counting the labels outside [0, c).
double softmax_cross_entropy(const float* logits, const float* labels, float* grad, int64_t n, int64_t c, int64_t inner,
                             double label_smoothing);

// ---- optimiser updates (n entries of one parameter) ----
void sgd_update(float* w, float* v, const float* g, int64_t n, float lr, float mu, float wd, bool nesterov);
void adam_update(float* w, float* m, float* v, const float* g, int64_t n, const kernels::AdamArgs& a, float wd);
void lars_update(float* w, float* v, const float* g, int64_t n, float rate, float mu, float wd);

// ---- batch normalisation over (n, c, inner), statistics kept on the device ----
// Training forward: per-channel mean and inverse deviation into mean/inv_std (c each), running
// averages updated (momentum; running variance unbiased), xhat and y written.
void batchnorm_forward_train(const float* x, float* xhat, float* y, const float* gamma, const float* beta, float* mean,
                             float* inv_std, float* running_mean, float* running_var, int64_t n, int64_t c,
                             int64_t inner, float momentum, float eps);
void batchnorm_forward_eval(const float* x, float* y, const float* gamma, const float* beta, const float* running_mean,
                            const float* running_var, int64_t n, int64_t c, int64_t inner, float eps);
// With statistics shared across ranks (spatial parallelism) the per-channel sums go through the host:
// channel_sums() reads back the sums over (n, inner) of a and of a * b (b null: a * a), 2c values;
// the _with_sums variants take them reduced (sums: 2c; count: the entries they cover). Backward's
// parameter gradients take this rank's `local` sums, its input gradient the reduced ones.
std::vector<double> channel_sums(const float* a, const float* b, int64_t n, int64_t c, int64_t inner);
void batchnorm_forward_with_sums(const float* x, float* xhat, float* y, const float* gamma, const float* beta,
                                 float* mean, float* inv_std, float* running_mean, float* running_var, int64_t n,
                                 int64_t c, int64_t inner, const std::vector<double>& sums, double count,
                                 float momentum, float eps);
void batchnorm_backward_with_sums(const float* dy, const float* xhat, const float* gamma, const float* inv_std,
                                  float* dgamma, float* dbeta, float* dx, int64_t n, int64_t c, int64_t inner,
                                  const std::vector<double>& local, const std::vector<double>& reduced, double count);
// dgamma, dbeta accumulate (+=); dx written.
void batchnorm_backward(const float* dy, const float* xhat, const float* gamma, const float* inv_std, float* dgamma,
                        float* dbeta, float* dx, int64_t n, int64_t c, int64_t inner);

// ---- Transformer rows (nn/transformer.h) ----
// Layer normalisation of `rows` rows of d: xhat, y and each row's rstd written.
void layernorm_forward(const float* x, const float* gamma, const float* beta, float* xhat, float* y, float* rstd,
                       int64_t rows, int64_t d, float eps);
// dx written; dgamma, dbeta accumulate (+=) over the rows.
void layernorm_backward(const float* dy, const float* xhat, const float* gamma, const float* rstd, float* dgamma,
                        float* dbeta, float* dx, int64_t rows, int64_t d);
// y (n*t, d): row (i, j) = token[ids[i, j]] + position[j]. ids are floats, already checked below the vocabulary.
void embedding_forward(const float* ids, const float* token, const float* position, float* y, int64_t n, int64_t t,
                       int64_t d);
// dtoken[ids[i, j]] += dy row (i, j); dposition[j] += the same.
void embedding_backward(const float* ids, const float* dy, float* dtoken, float* dposition, int64_t n, int64_t t,
                        int64_t d);
// Rows of t scores, row r the query at position r % t: kernels::causal_softmax_row in place.
void causal_softmax(float* s, int64_t rows, int64_t t);
// kernels::softmax_row_grad of each row, in place into dp.
void causal_softmax_grad(const float* p, float* dp, int64_t rows, int64_t t, float scale);
// `batch` row-major products C_b = alpha op(A_b) op(B_b) + beta C_b, op(A) m x k, op(B) k x n, with
// the matrices of product b at A + b * stride_a (and so on); trans_a / trans_b: 'N' or 'T'.
void gemm_batched(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                  int64_t stride_c, int64_t batch);

// ---- cuDNN convolution: conv (y = x * w) or transposed (deconv), 2D or 3D ----
struct ConvShape {
  Shape in;   // (N, C, spatial...)
  Shape out;  // (N, K, spatial...)
  int in_channels = 0, out_channels = 0, kernel = 1, stride = 1;
  std::vector<int> pad;     // per spatial dimension (cuDNN pads both sides alike)
  bool transposed = false;  // deconv: the weight is (out_channels, in_channels, k...) as on the CPU
  // Input, output and weight stored channels-last, (N, spatial..., C) and (K, k..., C); the shapes
  // above still name (N, C, spatial...).
  bool channels_last = false;
};

// Descriptors and the algorithms chosen for one shape. The algorithm search (cudnnFind*, which
// times the candidates) runs once per shape in the process and is cached.
class Conv {
 public:
  explicit Conv(const ConvShape& s);
  ~Conv();
  Conv(const Conv&) = delete;
  Conv& operator=(const Conv&) = delete;
  const ConvShape& shape() const { return shape_; }
  void forward(const float* x, const float* w, float* y);
  void backward_data(const float* dy, const float* w, float* dx);
  // dw += the gradient of the weight.
  void backward_weights(const float* x, const float* dy, float* dw);

 private:
  struct Impl;
  ConvShape shape_;
  std::unique_ptr<Impl> impl_;
};

// Whether cuDNN may use TF32 tensor cores for convolutions (on by default, as PyTorch's
// torch.backends.cudnn.allow_tf32). Off for bitwise comparisons with the CPU.
void set_conv_tf32(bool on);

// ---- cuDNN pooling, 2D or 3D ----
class Pool {
 public:
  Pool(const Shape& in, const Shape& out, bool max, int kernel, int stride, const std::vector<int>& pad);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  void forward(const float* x, float* y);
  void backward(const float* x, const float* y, const float* dy, float* dx);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- cuBLAS ----
// Row-major products for a fully connected layer with x (n, in), w (out, in), y (n, out):
void linear_forward(const float* x, const float* w, float* y, int64_t n, int64_t in, int64_t out);          // y = x w^T
void linear_backward_data(const float* dy, const float* w, float* dx, int64_t n, int64_t in, int64_t out);  // dx = dy w
void linear_backward_weights(const float* dy, const float* x, float* dw, int64_t n, int64_t in,
                             int64_t out);  // dw += dy^T x

}  // namespace tessera::gpu
