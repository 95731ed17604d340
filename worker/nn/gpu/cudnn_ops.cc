// cuDNN convolution and pooling, cuBLAS products (see ops.h). One cuDNN and one cuBLAS handle per
// thread, bound to the thread's stream; one workspace per thread, grown to the largest an algorithm
// asked for. A transposed convolution is the convolution it transposes run the other way: its
// forward pass is that convolution's backward-data, its backward-data that convolution's forward.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <map>
#include <mutex>
#include <string>

#include "common/error.h"
#include "worker/core/device.h"
#include "worker/nn/gpu/ops.h"

namespace tessera::gpu {
namespace {

void check(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw Error(std::string("cudnn: ") + what + ": " + cudnnGetErrorString(s));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cublas: ") + what + ": status " + std::to_string(static_cast<int>(s)));
}

struct Handles {
  int device = -1;
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
thread_local Handles t_handles;

Handles& handles() {
  Handles& h = t_handles;
  const int dev = current_device();
  if (h.device != dev) {
    // A thread that moved to another device gets new handles (the old ones stay: they may still be referenced).
    h = Handles{};
    h.device = dev;
    check(cudnnCreate(&h.cudnn), "cudnnCreate");
    check(cublasCreate(&h.cublas), "cublasCreate");
  }
  auto* s = static_cast<cudaStream_t>(stream());
  check(cudnnSetStream(h.cudnn, s), "cudnnSetStream");
  check(cublasSetStream(h.cublas, s), "cublasSetStream");
  return h;
}

void* workspace(size_t bytes) {
  Handles& h = handles();
  if (bytes > h.workspace_bytes) {
    if (h.workspace) free(h.workspace, stream());
    h.workspace = alloc(bytes);
    h.workspace_bytes = bytes;
  }
  return h.workspace;
}

bool g_tf32 = true;

std::vector<int> dims_of(const Shape& s) { return std::vector<int>(s.begin(), s.end()); }

cudnnTensorDescriptor_t tensor_desc(const Shape& s, bool channels_last = false) {
  cudnnTensorDescriptor_t d = nullptr;
  check(cudnnCreateTensorDescriptor(&d), "cudnnCreateTensorDescriptor");
  const std::vector<int> dims = dims_of(s);
  check(cudnnSetTensorNdDescriptorEx(d, channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT,
                                     static_cast<int>(dims.size()), dims.data()),
        "cudnnSetTensorNdDescriptorEx");
  return d;
}

// The algorithms chosen for one convolution shape (and math mode), shared by every layer of that shape.
struct Algos {
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  cudnnMathType_t fwd_math, bwd_data_math, bwd_filter_math;
};
std::mutex g_algos_mu;
std::map<std::string, Algos> g_algos;

std::string key_of(const ConvShape& s, bool tf32) {
  std::string k =
      detail::concat(shape_str(s.in), shape_str(s.out), s.in_channels, '>', s.out_channels, 'k', s.kernel, 's',
                     s.stride, s.transposed ? "T" : "C", tf32 ? "tf32" : "fp32", s.channels_last ? "cl" : "", 'p');
  for (int p : s.pad) k += std::to_string(p) + ",";
  return k;
}

}  // namespace

void set_conv_tf32(bool on) { g_tf32 = on; }

struct Conv::Impl {
  cudnnTensorDescriptor_t cx = nullptr, cy = nullptr;  // the underlying convolution's input and output
  cudnnFilterDescriptor_t filter = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  Algos algos{};
  size_t ws_fwd = 0, ws_bwd_data = 0, ws_bwd_filter = 0;
  Tensor wt;  // transposed: the weight as the underlying convolution's filter (in, out, k...)

  ~Impl() {
    if (cx) cudnnDestroyTensorDescriptor(cx);
    if (cy) cudnnDestroyTensorDescriptor(cy);
    if (filter) cudnnDestroyFilterDescriptor(filter);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  }
};

Conv::Conv(const ConvShape& s) : shape_(s), impl_(std::make_unique<Impl>()) {
  const int sd = static_cast<int>(s.in.size()) - 2;
  TESSERA_CHECK(sd == 2 || sd == 3, "cudnn conv of ", shape_str(s.in));
  TESSERA_CHECK(!(s.transposed && s.channels_last), "cudnn deconv of ", shape_str(s.in), " channels-last");
  TESSERA_CHECK_EQ(static_cast<int>(s.pad.size()), sd, "cudnn conv padding");
  Impl& m = *impl_;
  Handles& h = handles();
  // The underlying convolution maps cx (C channels) to cy (K channels) with a (K, C, k...) filter.
  const Shape& conv_in = s.transposed ? s.out : s.in;
  const Shape& conv_out = s.transposed ? s.in : s.out;
  m.cx = tensor_desc(conv_in, s.channels_last);
  m.cy = tensor_desc(conv_out, s.channels_last);
  std::vector<int> fdims = {static_cast<int>(conv_out[1]), static_cast<int>(conv_in[1])};
  for (int i = 0; i < sd; ++i) fdims.push_back(s.kernel);
  check(cudnnCreateFilterDescriptor(&m.filter), "cudnnCreateFilterDescriptor");
  check(cudnnSetFilterNdDescriptor(m.filter, CUDNN_DATA_FLOAT, s.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                   static_cast<int>(fdims.size()), fdims.data()),
        "cudnnSetFilterNdDescriptor");
  check(cudnnCreateConvolutionDescriptor(&m.conv), "cudnnCreateConvolutionDescriptor");
  const std::vector<int> stride(sd, s.stride), dilation(sd, 1);
  check(cudnnSetConvolutionNdDescriptor(m.conv, sd, s.pad.data(), stride.data(), dilation.data(),
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        "cudnnSetConvolutionNdDescriptor");
  check(cudnnSetConvolutionMathType(m.conv, g_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH),
        "cudnnSetConvolutionMathType");

  const std::string key = key_of(s, g_tf32);
  std::lock_guard<std::mutex> lock(g_algos_mu);
  auto it = g_algos.find(key);
  if (it == g_algos.end()) {
    // cudnnFind* times every algorithm on scratch buffers it allocates; the fastest that works wins.
    Algos a{};
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fp[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    check(cudnnFindConvolutionForwardAlgorithm(h.cudnn, m.cx, m.filter, m.conv, m.cy, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                               &got, fp),
          "cudnnFindConvolutionForwardAlgorithm");
    int i = 0;
    while (i < got && fp[i].status != CUDNN_STATUS_SUCCESS) ++i;
    if (i == got) throw Error("cudnn: no forward algorithm for convolution " + key);
    a.fwd = fp[i].algo;
    a.fwd_math = fp[i].mathType;
    cudnnConvolutionBwdDataAlgoPerf_t dp[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    check(cudnnFindConvolutionBackwardDataAlgorithm(h.cudnn, m.filter, m.cy, m.conv, m.cx,
                                                    CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, dp),
          "cudnnFindConvolutionBackwardDataAlgorithm");
    i = 0;
    while (i < got && dp[i].status != CUDNN_STATUS_SUCCESS) ++i;
    if (i == got) throw Error("cudnn: no backward-data algorithm for convolution " + key);
    a.bwd_data = dp[i].algo;
    a.bwd_data_math = dp[i].mathType;
    cudnnConvolutionBwdFilterAlgoPerf_t wp[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    check(cudnnFindConvolutionBackwardFilterAlgorithm(h.cudnn, m.cx, m.cy, m.conv, m.filter,
                                                      CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, wp),
          "cudnnFindConvolutionBackwardFilterAlgorithm");
    i = 0;
    while (i < got && wp[i].status != CUDNN_STATUS_SUCCESS) ++i;
    if (i == got) throw Error("cudnn: no backward-filter algorithm for convolution " + key);
    a.bwd_filter = wp[i].algo;
    a.bwd_filter_math = wp[i].mathType;
    it = g_algos.emplace(key, a).first;
  }
  m.algos = it->second;
  check(cudnnGetConvolutionForwardWorkspaceSize(h.cudnn, m.cx, m.filter, m.conv, m.cy, m.algos.fwd, &m.ws_fwd),
        "cudnnGetConvolutionForwardWorkspaceSize");
  check(cudnnGetConvolutionBackwardDataWorkspaceSize(h.cudnn, m.filter, m.cy, m.conv, m.cx, m.algos.bwd_data,
                                                     &m.ws_bwd_data),
        "cudnnGetConvolutionBackwardDataWorkspaceSize");
  check(cudnnGetConvolutionBackwardFilterWorkspaceSize(h.cudnn, m.cx, m.cy, m.conv, m.filter, m.algos.bwd_filter,
                                                       &m.ws_bwd_filter),
        "cudnnGetConvolutionBackwardFilterWorkspaceSize");
  if (s.transposed) {
    Shape ws = {s.in_channels, s.out_channels};
    for (int d = 0; d < sd; ++d) ws.push_back(s.kernel);
    m.wt = Tensor(ws, Layout::kPlain, Device::kCuda);
  }
}

Conv::~Conv() = default;

namespace {
int64_t kernel_volume(const ConvShape& s) {
  int64_t v = 1;
  for (size_t i = 2; i < s.in.size(); ++i) v *= s.kernel;
  return v;
}
}  // namespace

void Conv::forward(const float* x, const float* w, float* y) {
  Impl& m = *impl_;
  Handles& h = handles();
  const float one = 1.0f, zero = 0.0f;
  if (!shape_.transposed) {
    check(cudnnSetConvolutionMathType(m.conv, m.algos.fwd_math), "cudnnSetConvolutionMathType");
    check(cudnnConvolutionForward(h.cudnn, &one, m.cx, x, m.filter, w, m.conv, m.algos.fwd, workspace(m.ws_fwd),
                                  m.ws_fwd, &zero, m.cy, y),
          "cudnnConvolutionForward");
    return;
  }
  // Tessera's deconv weight (out, in, k...) as the filter (in, out, k...) of the convolution it transposes.
  swap_leading_dims(w, m.wt.data(), shape_.out_channels, shape_.in_channels, kernel_volume(shape_), false);
  check(cudnnSetConvolutionMathType(m.conv, m.algos.bwd_data_math), "cudnnSetConvolutionMathType");
  check(cudnnConvolutionBackwardData(h.cudnn, &one, m.filter, m.wt.data(), m.cy, x, m.conv, m.algos.bwd_data,
                                     workspace(m.ws_bwd_data), m.ws_bwd_data, &zero, m.cx, y),
        "cudnnConvolutionBackwardData");
}

void Conv::backward_data(const float* dy, const float* w, float* dx) {
  Impl& m = *impl_;
  Handles& h = handles();
  const float one = 1.0f, zero = 0.0f;
  if (!shape_.transposed) {
    check(cudnnSetConvolutionMathType(m.conv, m.algos.bwd_data_math), "cudnnSetConvolutionMathType");
    check(cudnnConvolutionBackwardData(h.cudnn, &one, m.filter, w, m.cy, dy, m.conv, m.algos.bwd_data,
                                       workspace(m.ws_bwd_data), m.ws_bwd_data, &zero, m.cx, dx),
          "cudnnConvolutionBackwardData");
    return;
  }
  swap_leading_dims(w, m.wt.data(), shape_.out_channels, shape_.in_channels, kernel_volume(shape_), false);
  check(cudnnSetConvolutionMathType(m.conv, m.algos.fwd_math), "cudnnSetConvolutionMathType");
  check(cudnnConvolutionForward(h.cudnn, &one, m.cx, dy, m.filter, m.wt.data(), m.conv, m.algos.fwd,
                                workspace(m.ws_fwd), m.ws_fwd, &zero, m.cy, dx),
        "cudnnConvolutionForward");
}

void Conv::backward_weights(const float* x, const float* dy, float* dw) {
  Impl& m = *impl_;
  Handles& h = handles();
  const float one = 1.0f, zero = 0.0f;
  check(cudnnSetConvolutionMathType(m.conv, m.algos.bwd_filter_math), "cudnnSetConvolutionMathType");
  if (!shape_.transposed) {
    check(cudnnConvolutionBackwardFilter(h.cudnn, &one, m.cx, x, m.cy, dy, m.conv, m.algos.bwd_filter,
                                         workspace(m.ws_bwd_filter), m.ws_bwd_filter, &one, m.filter, dw),
          "cudnnConvolutionBackwardFilter");
    return;
  }
  // The underlying convolution's input is the deconv's output gradient, its output the deconv's input.
  check(cudnnConvolutionBackwardFilter(h.cudnn, &one, m.cx, dy, m.cy, x, m.conv, m.algos.bwd_filter,
                                       workspace(m.ws_bwd_filter), m.ws_bwd_filter, &zero, m.filter, m.wt.data()),
        "cudnnConvolutionBackwardFilter");
  swap_leading_dims(m.wt.data(), dw, shape_.in_channels, shape_.out_channels, kernel_volume(shape_), true);
}

struct Pool::Impl {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnPoolingDescriptor_t pool = nullptr;
  // Max pooling whose windows tile the input runs Tessera's kernel (max_pool_tiles), which reads
  // each entry once; cuDNN's takes several times as long on CosmoFlow's volumes.
  bool tiles = false;
  Dims5 dims{};
  int kd = 1, k = 1;
  ~Impl() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (pool) cudnnDestroyPoolingDescriptor(pool);
  }
};

Pool::Pool(const Shape& in, const Shape& out, bool max, int kernel, int stride, const std::vector<int>& pad)
    : impl_(std::make_unique<Impl>()) {
  const int sd = static_cast<int>(in.size()) - 2;
  TESSERA_CHECK((sd == 2 || sd == 3) && static_cast<int>(pad.size()) == sd, "cudnn pooling of ", shape_str(in));
  bool unpadded = true;
  for (int p : pad) unpadded &= p == 0;
  if (max && kernel == stride && unpadded) {
    impl_->tiles = true;
    impl_->dims = sd == 3 ? Dims5{in[0], in[1], in[2], in[3], in[4]} : Dims5{in[0], in[1], 1, in[2], in[3]};
    impl_->kd = sd == 3 ? kernel : 1;
    impl_->k = kernel;
    return;
  }
  impl_->x = tensor_desc(in);
  impl_->y = tensor_desc(out);
  check(cudnnCreatePoolingDescriptor(&impl_->pool), "cudnnCreatePoolingDescriptor");
  const std::vector<int> window(sd, kernel), strides(sd, stride);
  check(cudnnSetPoolingNdDescriptor(impl_->pool,
                                    max ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
                                    CUDNN_NOT_PROPAGATE_NAN, sd, window.data(), pad.data(), strides.data()),
        "cudnnSetPoolingNdDescriptor");
}

Pool::~Pool() = default;

void Pool::forward(const float* x, float* y) {
  if (impl_->tiles) return max_pool_tiles(x, y, impl_->dims, impl_->kd, impl_->k);
  const float one = 1.0f, zero = 0.0f;
  check(cudnnPoolingForward(handles().cudnn, impl_->pool, &one, impl_->x, x, &zero, impl_->y, y),
        "cudnnPoolingForward");
}

void Pool::backward(const float* x, const float* y, const float* dy, float* dx) {
  if (impl_->tiles) return max_pool_tiles_backward(x, dy, dx, impl_->dims, impl_->kd, impl_->k);
  const float one = 1.0f, zero = 0.0f;
  check(cudnnPoolingBackward(handles().cudnn, impl_->pool, &one, impl_->y, y, impl_->y, dy, impl_->x, x, &zero,
                             impl_->x, dx),
        "cudnnPoolingBackward");
}

// The fully connected layer's three products, row-major, as gemm_batched's one product.
void linear_forward(const float* x, const float* w, float* y, int64_t n, int64_t in, int64_t out) {
  if (n == 0) return;
  gemm_batched('N', 'T', n, out, in, 1.0f, x, in, 0, w, in, 0, 0.0f, y, out, 0, 1);  // y = x w^T
}

void linear_backward_data(const float* dy, const float* w, float* dx, int64_t n, int64_t in, int64_t out) {
  if (n == 0) return;
  gemm_batched('N', 'N', n, in, out, 1.0f, dy, out, 0, w, in, 0, 0.0f, dx, in, 0, 1);  // dx = dy w
}

void linear_backward_weights(const float* dy, const float* x, float* dw, int64_t n, int64_t in, int64_t out) {
  if (n == 0) return;
  gemm_batched('T', 'N', out, in, n, 1.0f, dy, out, 0, x, in, 0, 1.0f, dw, in, 0, 1);  // dw += dy^T x
}

// C = op(A) op(B) row-major is C^T = op(B)^T op(A)^T column-major: the operands swap places.
void gemm_batched(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
                  int64_t stride_c, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  auto op = [](char t) { return t == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N; };
  check(cublasSgemmStridedBatched(handles().cublas, op(trans_b), op(trans_a), static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, b, static_cast<int>(ldb), stride_b, a,
                                  static_cast<int>(lda), stride_a, &beta, c, static_cast<int>(ldc), stride_c,
                                  static_cast<int>(batch)),
        "batched gemm");
}

}  // namespace tessera::gpu
