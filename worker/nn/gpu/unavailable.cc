// The device side of the layers in a build without CUDA: a layer reaches these only with an input on
// the device, which such a build cannot allocate, so each one throws.
#include "common/error.h"
#include "worker/nn/gpu/ops.h"

namespace tessera::gpu {
namespace {
[[noreturn]] void no_cuda() { throw Error("this build of Tessera has no CUDA: the layers run on the CPU only"); }
}  // namespace

void leaky_relu(const float*, float*, int64_t, float) { no_cuda(); }
void leaky_relu_grad(const float*, const float*, float*, int64_t, float) { no_cuda(); }
void gelu(const float*, float*, int64_t) { no_cuda(); }
void gelu_grad(const float*, const float*, float*, int64_t) { no_cuda(); }
void dropout(const float*, float*, float*, int64_t, float, uint64_t, uint64_t) { no_cuda(); }
void multiply(const float*, const float*, float*, int64_t) { no_cuda(); }
void add_bias(float*, const float*, int64_t, int64_t, int64_t) { no_cuda(); }
void bias_leaky_relu(float*, const float*, int64_t, int64_t, int64_t, float) { no_cuda(); }
void bias_grad(const float*, float*, int64_t, int64_t, int64_t) { no_cuda(); }
void copy_box(const float*, const Dims5&, const Dims5&, float*, const Dims5&, const Dims5&, const Dims5&, bool) {
  no_cuda();
}
void max_pool_tiles(const float*, float*, const Dims5&, int, int) { no_cuda(); }
void max_pool_tiles_backward(const float*, const float*, float*, const Dims5&, int, int) { no_cuda(); }
std::vector<double> channel_sums(const float*, const float*, int64_t, int64_t, int64_t) { no_cuda(); }
void batchnorm_forward_with_sums(const float*, float*, float*, const float*, const float*, float*, float*, float*,
                                 float*, int64_t, int64_t, int64_t, const std::vector<double>&, double, float, float) {
  no_cuda();
}
void batchnorm_backward_with_sums(const float*, const float*, const float*, const float*, float*, float*, float*,
                                  int64_t, int64_t, int64_t, const std::vector<double>&, const std::vector<double>&,
                                  double) {
  no_cuda();
}
void swap_leading_dims(const float*, float*, int64_t, int64_t, int64_t, bool) { no_cuda(); }
double sum_squares(const float*, int64_t) { no_cuda(); }
double mse(const float*, const float*, float*, int64_t) { no_cuda(); }
double softmax_cross_entropy(const float*, const float*, float*, int64_t, int64_t, int64_t, double) { no_cuda(); }
void sgd_update(float*, float*, const float*, int64_t, float, float, float, bool) { no_cuda(); }
void adam_update(float*, float*, float*, const float*, int64_t, const kernels::AdamArgs&, float) { no_cuda(); }
void lars_update(float*, float*, const float*, int64_t, float, float, float) { no_cuda(); }
void batchnorm_forward_train(const float*, float*, float*, const float*, const float*, float*, float*, float*, float*,
                             int64_t, int64_t, int64_t, float, float) {
  no_cuda();
}
void batchnorm_forward_eval(const float*, float*, const float*, const float*, const float*, const float*, int64_t,
                            int64_t, int64_t, float) {
  no_cuda();
}
void batchnorm_backward(const float*, const float*, const float*, const float*, float*, float*, float*, int64_t,
                        int64_t, int64_t) {
  no_cuda();
}
struct Conv::Impl {};
Conv::Conv(const ConvShape& s) : shape_(s) { no_cuda(); }
Conv::~Conv() = default;
void Conv::forward(const float*, const float*, float*) { no_cuda(); }
void Conv::backward_data(const float*, const float*, float*) { no_cuda(); }
void Conv::backward_weights(const float*, const float*, float*) { no_cuda(); }
void set_conv_tf32(bool) {}
struct Pool::Impl {};
Pool::Pool(const Shape&, const Shape&, bool, int, int, const std::vector<int>&) { no_cuda(); }
Pool::~Pool() = default;
void Pool::forward(const float*, float*) { no_cuda(); }
void Pool::backward(const float*, const float*, const float*, float*) { no_cuda(); }
void linear_forward(const float*, const float*, float*, int64_t, int64_t, int64_t) { no_cuda(); }
void linear_backward_data(const float*, const float*, float*, int64_t, int64_t, int64_t) { no_cuda(); }
void linear_backward_weights(const float*, const float*, float*, int64_t, int64_t, int64_t) { no_cuda(); }
void layernorm_forward(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t, float) {
  no_cuda();
}
void layernorm_backward(const float*, const float*, const float*, const float*, float*, float*, float*, int64_t,
                        int64_t) {
  no_cuda();
}
void embedding_forward(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t) { no_cuda(); }
void embedding_backward(const float*, const float*, float*, float*, int64_t, int64_t, int64_t) { no_cuda(); }
void causal_softmax(float*, int64_t, int64_t) { no_cuda(); }
void causal_softmax_grad(const float*, float*, int64_t, int64_t, float) { no_cuda(); }
void gemm_batched(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, int64_t, const float*, int64_t,
                  int64_t, float, float*, int64_t, int64_t, int64_t) {
  no_cuda();
}

}  // namespace tessera::gpu
