#include "worker/nn/conv.h"

#include <omp.h>

#include <cstring>

#include "common/error.h"
#include "worker/nn/dnnl_util.h"
#include "worker/nn/elementwise.h"
#include "worker/nn/gpu/ops.h"

namespace tessera {

int pad_before(const ConvOptions& o, int i) { return o.pad_l.empty() ? o.padding : o.pad_l.at(i); }
int pad_after(const ConvOptions& o, int i) { return o.pad_r.empty() ? o.padding : o.pad_r.at(i); }

namespace detail {

using dnnl::memory;
using dnnl_util::Converter;

struct ConvTraits {
  using Fwd = dnnl::convolution_forward;
  using BwdData = dnnl::convolution_backward_data;
  using BwdWeights = dnnl::convolution_backward_weights;
  static constexpr dnnl::algorithm kAlg = dnnl::algorithm::convolution_direct;
  static constexpr const char* kKind = "conv";
  static constexpr const char* kKindRelu = "conv+relu";
  static constexpr const char* kKindLeaky = "conv+leaky_relu";
  static int64_t out_size(int64_t in, const ConvOptions& o, int i) {
    return (in + pad_before(o, i) + pad_after(o, i) - o.kernel) / o.stride + 1;
  }
  static bool fits(int64_t in, const ConvOptions& o, int i) {
    return in + pad_before(o, i) + pad_after(o, i) >= o.kernel;
  }
};

struct DeconvTraits {
  using Fwd = dnnl::deconvolution_forward;
  using BwdData = dnnl::deconvolution_backward_data;
  using BwdWeights = dnnl::deconvolution_backward_weights;
  static constexpr dnnl::algorithm kAlg = dnnl::algorithm::deconvolution_direct;
  static constexpr const char* kKind = "deconv";
  static constexpr const char* kKindRelu = "deconv+relu";
  static constexpr const char* kKindLeaky = "deconv+leaky_relu";
  static int64_t out_size(int64_t in, const ConvOptions& o, int i) {
    return (in - 1) * o.stride - pad_before(o, i) - pad_after(o, i) + o.kernel;
  }
  static bool fits(int64_t in, const ConvOptions& o, int i) {
    return (in - 1) * o.stride + o.kernel > pad_before(o, i) + pad_after(o, i);
  }
};

template <class T>
struct ConvPlan {
  Shape in, out;
  typename T::Fwd::primitive_desc fwd_pd;
  typename T::Fwd fwd;
  typename T::BwdData::primitive_desc bd_pd;
  typename T::BwdData bd;
  typename T::BwdWeights::primitive_desc bw_pd;
  typename T::BwdWeights bw;
  Converter src_fwd, wei_fwd, dst_fwd, dy_bd, wei_bd, dx_bd, src_bw, dy_bw, dw_bw;
};

}  // namespace detail

using dnnl::memory;

template <class T>
ConvLayer<T>::ConvLayer(std::string name, ConvOptions o) : Layer(std::move(name)), options_(o) {
  bool pads_ok =
      o.pad_l.size() == o.pad_r.size() && (o.pad_l.empty() || static_cast<int>(o.pad_l.size()) == o.spatial_dims);
  for (size_t i = 0; i < o.pad_l.size() && pads_ok; ++i) pads_ok = o.pad_l[i] >= 0 && o.pad_r[i] >= 0;
  const bool slope_ok = !o.activation || (o.activation_slope >= 0.0f && o.activation_slope <= 1.0f);
  if (o.in_channels < 1 || !slope_ok || o.out_channels < 1 || o.kernel < 1 || o.stride < 1 || o.padding < 0 ||
      !pads_ok || (o.spatial_dims != 2 && o.spatial_dims != 3))
    throw ConfigError(
        "model.layers." + this->name(),
        detail::concat(T::kKind, ": invalid options (channels ", o.in_channels, " -> ", o.out_channels, ", kernel ",
                       o.kernel, ", stride ", o.stride, ", padding ", o.padding, ", spatial dims ", o.spatial_dims,
                       ", activation slope ", o.activation_slope, ")"));
  Shape ws = {o.out_channels, o.in_channels};
  int64_t fan_in = o.in_channels, fan_out = o.out_channels;
  for (int i = 0; i < o.spatial_dims; ++i) {
    ws.push_back(o.kernel);
    fan_in *= o.kernel;
    fan_out *= o.kernel;
  }
  weight_ = Param{this->name() + ".weight", Tensor(ws), Tensor::zeros(ws), true};
  if (o.bias)
    bias_ = Param{this->name() + ".bias", Tensor::zeros({o.out_channels}), Tensor::zeros({o.out_channels}), false};
  init_params(weight_.value, o.bias ? &bias_.value : nullptr, fan_in, fan_out, o.seed, o.init);
}

template <class T>
ConvLayer<T>::~ConvLayer() = default;

template <class T>
const char* ConvLayer<T>::kind() const {
  if (!options_.activation) return T::kKind;
  return options_.activation_slope == 0.0f ? T::kKindRelu : T::kKindLeaky;
}

template <class T>
Shape ConvLayer<T>::output_shape(const Shape& in) const {
  const auto& o = options_;
  if (static_cast<int>(in.size()) != 2 + o.spatial_dims)
    shape_error(detail::concat("expects ", 2 + o.spatial_dims, "-d input (N, C, spatial...), got ", shape_str(in)));
  if (in[1] != o.in_channels)
    shape_error(detail::concat("expects ", o.in_channels, " input channels, got ", in[1], " in ", shape_str(in)));
  Shape out = {in[0], o.out_channels};
  for (int i = 0; i < o.spatial_dims; ++i) {
    if (!T::fits(in[2 + i], o, i))
      shape_error(detail::concat("spatial size ", in[2 + i], " is too small for kernel ", o.kernel, " with padding ",
                                 pad_before(o, i), "+", pad_after(o, i)));
    out.push_back(T::out_size(in[2 + i], o, i));
  }
  return out;
}

template <class T>
detail::ConvPlan<T>& ConvLayer<T>::plan_for(const Shape& in) {
  if (plan_ && plan_->in == in) return *plan_;
  const auto& o = options_;
  auto p = std::make_unique<detail::ConvPlan<T>>();
  p->in = in;
  p->out = output_shape(in);
  // Activations channels-last (on CPU the fastest for all three primitives here: backward-weights
  // has no direct kernel for 3D blocked layouts and runs about 2x faster on channels-last than on
  // plain), weights in whatever layout each primitive picks.
  // Under bf16 the primitives' inputs (src, weights, diff_dst) are bf16 in the layouts they pick,
  // and what they write (dst, diff_src, diff_weights) fp32 as in fp32.
  const auto in_type = precision() == Precision::kBf16 ? memory::data_type::bf16 : memory::data_type::f32;
  auto act = [](const Shape& s) { return dnnl_util::desc_of(s, Layout::kChannelsLast); };
  auto any = [](const Shape& s, memory::data_type t = memory::data_type::f32) {
    return memory::desc(dnnl_util::dims_of(s), t, memory::format_tag::any);
  };
  auto input = [&](const Shape& s) { return in_type == memory::data_type::f32 ? act(s) : any(s, in_type); };
  // oneDNN's bf16 kernels take their fp32 outputs in the blocked layouts they choose too.
  auto output = [&](const Shape& s) { return in_type == memory::data_type::f32 ? act(s) : any(s); };
  memory::dims strides(o.spatial_dims, o.stride), pad_l(o.spatial_dims), pad_r(o.spatial_dims);
  for (int i = 0; i < o.spatial_dims; ++i) {
    pad_l[i] = pad_before(o, i);
    pad_r[i] = pad_after(o, i);
  }
  memory::desc bias_md = o.bias ? dnnl_util::plain_desc(bias_.value.shape()) : memory::desc();
  auto& eng = dnnl_util::engine();
  typename T::Fwd::desc fd(dnnl::prop_kind::forward_training, T::kAlg, input(in), any(weight_.value.shape(), in_type),
                           bias_md, output(p->out), strides, pad_l, pad_r);
  dnnl::primitive_attr attr;
  if (o.activation) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, o.activation_slope, 0.0f);
    attr.set_post_ops(ops);
  }
  p->fwd_pd = typename T::Fwd::primitive_desc(fd, attr, eng);
  p->fwd = typename T::Fwd(p->fwd_pd);
  typename T::BwdData::desc bdd(T::kAlg, output(in), any(weight_.value.shape(), in_type), input(p->out), strides, pad_l,
                                pad_r);
  p->bd_pd = typename T::BwdData::primitive_desc(bdd, eng, p->fwd_pd);
  p->bd = typename T::BwdData(p->bd_pd);
  typename T::BwdWeights::desc bwd(T::kAlg, input(in), any(weight_.value.shape()), bias_md, input(p->out), strides,
                                   pad_l, pad_r);
  p->bw_pd = typename T::BwdWeights::primitive_desc(bwd, eng, p->fwd_pd);
  p->bw = typename T::BwdWeights(p->bw_pd);
  plan_ = std::move(p);
  return *plan_;
}

namespace {

// The weight gradient of a 3D convolution with kernel 3, stride 1 and padding 1 from few input
// channels (a model's first layer: CosmoFlow's 4). oneDNN's GEMM path spends that layer's backward
// pass building im2col rows of 108 values from 4-channel voxels (about 25 GFLOP/s on 2 AVX2 cores).
// Here, for each output row (n, z, y) and each (kd, kh), the 3 x CIN input values a voxel's window
// spans in W are contiguous in a channels-last copy of the input row, so
//   dW[kd][kh][kw * CIN + ci][co] += sum over x of row[(x + kw - 1) * CIN + ci] * dy[x][co]
// is an outer product per voxel whose 3 * CIN x 8 tile stays in registers. Rows are split over the
// threads, each with its own accumulators, added up at the end. Any layout; dw (Cout, Cin, 3, 3, 3).
using v8 = float __attribute__((vector_size(32)));

// Row (n, z, y) of t, (N, C, D, H, W) in either layout, as W x C values, channels last, into out
// (out + C: the first voxel; the W + 2 voxels around are zero padding, written by the caller).
void gather_row(const Tensor& t, int64_t n, int64_t z, int64_t y, float* out) {
  const int64_t C = t.dim(1), D = t.dim(2), H = t.dim(3), W = t.dim(4);
  if (t.channels_last()) {
    std::memcpy(out, t.data() + (((n * D + z) * H + y) * W) * C, W * C * sizeof(float));
    return;
  }
  for (int64_t c = 0; c < C; ++c) {
    const float* src = t.data() + (((n * C + c) * D + z) * H + y) * W;
    for (int64_t x = 0; x < W; ++x) out[x * C + c] = src[x];
  }
}

template <int CIN>
void weight_grad_k3(const Tensor& x, const Tensor& dy, float* dw, float* db) {
  constexpr int K = 3 * CIN;  // a voxel's window along W: kw x ci
  const int64_t N = x.dim(0), D = x.dim(2), H = x.dim(3), W = x.dim(4), COUT = dy.dim(1);
  const int64_t blocks = COUT / 8, rows = N * D * H;
  // Each row's sums are taken in float (W terms), and added up over the rows in double: a sum over
  // every voxel of a volume, in float, would lose digits to the order it was taken in.
  std::vector<double> total(9 * K * COUT + COUT, 0.0);
#pragma omp parallel
  {
    std::vector<double> acc(9 * K * COUT + COUT, 0.0);  // [kd * 3 + kh][k][co], then db
    std::vector<float> dyrow(W * COUT);
    std::vector<float> in((W + 2) * CIN);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = r / (D * H), z = (r / H) % D, y = r % H;
      gather_row(dy, n, z, y, dyrow.data());
      for (int64_t b = 0; b < blocks; ++b) {
        v8 sum = {};
        for (int64_t xi = 0; xi < W; ++xi) {
          v8 dv;
          std::memcpy(&dv, dyrow.data() + xi * COUT + b * 8, sizeof(v8));
          sum += dv;
        }
        for (int j = 0; j < 8; ++j) acc[9 * K * COUT + b * 8 + j] += sum[j];
      }
      for (int kd = 0; kd < 3; ++kd) {
        const int64_t zz = z + kd - 1;
        if (zz < 0 || zz >= D) continue;
        for (int kh = 0; kh < 3; ++kh) {
          const int64_t yy = y + kh - 1;
          if (yy < 0 || yy >= H) continue;
          std::fill(in.begin(), in.begin() + CIN, 0.0f);
          std::fill(in.end() - CIN, in.end(), 0.0f);
          gather_row(x, n, zz, yy, in.data() + CIN);
          double* tile = acc.data() + (kd * 3 + kh) * K * COUT;
          for (int64_t b = 0; b < blocks; ++b) {
            v8 a[K] = {};
            const float* win = in.data();
            const float* d = dyrow.data() + b * 8;
            for (int64_t xi = 0; xi < W; ++xi, win += CIN, d += COUT) {
              v8 dv;
              std::memcpy(&dv, d, sizeof(v8));
              for (int k = 0; k < K; ++k) a[k] += win[k] * dv;
            }
            for (int k = 0; k < K; ++k)
              for (int j = 0; j < 8; ++j) tile[k * COUT + b * 8 + j] += a[k][j];
          }
        }
      }
    }
#pragma omp critical
    for (size_t i = 0; i < acc.size(); ++i) total[i] += acc[i];
  }
  for (int64_t co = 0; co < COUT; ++co) {
    for (int ci = 0; ci < CIN; ++ci)
      for (int kd = 0; kd < 3; ++kd)
        for (int kh = 0; kh < 3; ++kh)
          for (int kw = 0; kw < 3; ++kw)
            dw[(((co * CIN + ci) * 3 + kd) * 3 + kh) * 3 + kw] =
                static_cast<float>(total[((kd * 3 + kh) * K + kw * CIN + ci) * COUT + co]);
    if (db) db[co] = static_cast<float>(total[9 * K * COUT + co]);
  }
}

// Whether backward() takes the direct weight-gradient kernel above for input x.
template <class T>
bool direct_weight_grad(const ConvOptions& o, const Tensor& x) {
  if (!std::is_same_v<T, detail::ConvTraits> || o.spatial_dims != 3 || o.kernel != 3 || o.stride != 1) return false;
  for (int i = 0; i < 3; ++i)
    if (pad_before(o, i) != 1 || pad_after(o, i) != 1) return false;
  return o.in_channels >= 1 && o.in_channels <= 4 && o.out_channels % 8 == 0 && x.rank() == 5;
}

void conv3d_k3_weight_grad(const Tensor& x, const Tensor& dy, float* dw, float* db) {
  switch (x.dim(1)) {
    case 1: return weight_grad_k3<1>(x, dy, dw, db);
    case 2: return weight_grad_k3<2>(x, dy, dw, db);
    case 3: return weight_grad_k3<3>(x, dy, dw, db);
    case 4: return weight_grad_k3<4>(x, dy, dw, db);
    default: TESSERA_CHECK(false, "direct weight gradient for ", x.dim(1), " input channels");
  }
}

}  // namespace

namespace {
gpu::Dims5 dims5(const Shape& s) { return {s[0], s[1], s[2], s[3], s[4]}; }
}  // namespace

// cuDNN pads both sides of a dimension alike. A spatial block at the volume's edge is padded on one
// side only: there the convolution pads its input explicitly (zeros around a copy) and runs
// unpadded, and the transposed convolution runs uncropped and crops its output.
template <class T>
gpu::Conv& ConvLayer<T>::device_plan_for(const Shape& in) {
  if (device_plan_ && device_in_ == in) return *device_plan_;
  const auto& o = options_;
  constexpr bool transposed = std::is_same_v<T, detail::DeconvTraits>;
  gpu::ConvShape s;
  s.in = in;
  s.out = output_shape(in);
  s.in_channels = o.in_channels;
  s.out_channels = o.out_channels;
  s.kernel = o.kernel;
  s.stride = o.stride;
  s.transposed = transposed;
  device_explicit_pad_ = false;
  for (int i = 0; i < o.spatial_dims; ++i) device_explicit_pad_ |= pad_before(o, i) != pad_after(o, i);
  if (device_explicit_pad_ && o.spatial_dims != 3)
    shape_error("uneven padding of a 2D convolution is not supported on the GPU");
  for (int i = 0; i < o.spatial_dims; ++i) {
    s.pad.push_back(device_explicit_pad_ ? 0 : pad_before(o, i));
    if (!device_explicit_pad_) continue;
    if (transposed) s.out[2 + i] = (in[2 + i] - 1) * o.stride + o.kernel;  // uncropped
    else s.in[2 + i] = in[2 + i] + pad_before(o, i) + pad_after(o, i);     // padded
  }
  device_plan_ = std::make_unique<gpu::Conv>(s);
  device_in_ = in;
  return *device_plan_;
}

template <class T>
std::array<int64_t, 5> ConvLayer<T>::device_pad_lo() const {
  std::array<int64_t, 5> lo = {0, 0, 0, 0, 0};
  if (device_explicit_pad_)
    for (int i = 0; i < 3; ++i) lo[2 + i] = pad_before(options_, i);
  return lo;
}

template <class T>
Tensor ConvLayer<T>::forward_device(const Tensor& x, bool training) {
  TESSERA_CHECK(weight_.value.on_device(), "layer ", name(), ": input on the GPU, weights on the host");
  gpu::Conv& p = device_plan_for(x.shape());
  const gpu::ConvShape& s = p.shape();
  const gpu::Dims5 lo = device_pad_lo();
  Tensor xin = x;
  if (device_explicit_pad_ && !s.transposed) {
    xin = Tensor::zeros(s.in, Device::kCuda);
    gpu::copy_box(x.data(), dims5(x.shape()), {0, 0, 0, 0, 0}, xin.data(), dims5(s.in), lo, dims5(x.shape()), false);
  }
  Tensor y(s.out, Layout::kPlain, Device::kCuda);
  p.forward(xin.data(), weight_.value.data(), y.data());
  if (device_explicit_pad_ && s.transposed) {
    Tensor cropped(output_shape(x.shape()), Layout::kPlain, Device::kCuda);
    gpu::copy_box(y.data(), dims5(s.out), lo, cropped.data(), dims5(cropped.shape()), {0, 0, 0, 0, 0},
                  dims5(cropped.shape()), false);
    y = cropped;
  }
  const Shape& out = y.shape();
  const int64_t inner = y.numel() / std::max<int64_t>(1, out[0] * out[1]);
  if (options_.activation)
    gpu::bias_leaky_relu(y.data(), options_.bias ? bias_.value.data() : nullptr, out[0], out[1], inner,
                         options_.activation_slope);
  else if (options_.bias) gpu::add_bias(y.data(), bias_.value.data(), out[0], out[1], inner);
  if (training) {
    x_ = xin;  // padded where the convolution padded it
    if (options_.activation) y_ = y;
  }
  return y;
}

template <class T>
Tensor ConvLayer<T>::backward_device(const Tensor& dy) {
  TESSERA_CHECK(device_plan_ && !x_.empty(), "layer ", name(), ": backward without a training forward");
  gpu::Conv& p = *device_plan_;
  const gpu::ConvShape& s = p.shape();
  const Shape out = output_shape(device_in_);
  TESSERA_CHECK(dy.shape() == out && dy.on_device(), "layer ", name(), ": gradient shape ", shape_str(dy.shape()),
                " vs output ", shape_str(out));
  const Tensor dz = options_.activation ? leaky_relu_grad(y_, dy, options_.activation_slope) : dy;
  const gpu::Dims5 lo = device_pad_lo();
  Tensor dz_full = dz;  // the gradient of the convolution's own output
  if (device_explicit_pad_ && s.transposed) {
    dz_full = Tensor::zeros(s.out, Device::kCuda);
    gpu::copy_box(dz.data(), dims5(out), {0, 0, 0, 0, 0}, dz_full.data(), dims5(s.out), lo, dims5(out), false);
  }
  Tensor dx;
  if (input_grad()) {
    dx = Tensor(s.in, Layout::kPlain, Device::kCuda);
    p.backward_data(dz_full.data(), weight_.value.data(), dx.data());
    if (device_explicit_pad_ && !s.transposed) {
      Tensor inner(device_in_, Layout::kPlain, Device::kCuda);
      gpu::copy_box(dx.data(), dims5(s.in), lo, inner.data(), dims5(device_in_), {0, 0, 0, 0, 0}, dims5(device_in_),
                    false);
      dx = inner;
    }
  }
  p.backward_weights(x_.data(), dz_full.data(), weight_.grad.data());
  if (options_.bias)
    gpu::bias_grad(dz.data(), bias_.grad.data(), out[0], out[1], dz.numel() / std::max<int64_t>(1, out[0] * out[1]));
  return dx;
}

template <class T>
Tensor ConvLayer<T>::forward(const Tensor& x, bool training) {
  if (x.on_device()) return forward_device(x, training);
  auto& p = plan_for(x.shape());
  Tensor y(p.out, x.layout());
  std::unordered_map<int, memory> args;
  args[DNNL_ARG_SRC] = p.src_fwd.to(p.fwd_pd.src_desc(), x);
  args[DNNL_ARG_WEIGHTS] = p.wei_fwd.to(p.fwd_pd.weights_desc(), weight_.value);
  if (options_.bias) args[DNNL_ARG_BIAS] = dnnl_util::memory_of(bias_.value);
  memory dst = p.dst_fwd.target(p.fwd_pd.dst_desc(), y);
  args[DNNL_ARG_DST] = dst;
  p.fwd.execute(dnnl_util::stream(), args);
  dnnl_util::stream().wait();
  p.dst_fwd.from(dst, y);
  if (training) {
    x_ = x;
    if (options_.activation) y_ = y;
  }
  return y;
}

template <class T>
Tensor ConvLayer<T>::backward(const Tensor& dy) {
  if (x_.on_device()) return backward_device(dy);
  TESSERA_CHECK(plan_ && !x_.empty(), "layer ", name(), ": backward without a training forward");
  auto& p = *plan_;
  TESSERA_CHECK(dy.shape() == p.out, "layer ", name(), ": gradient shape ", shape_str(dy.shape()), " vs output ",
                shape_str(p.out));
  TESSERA_CHECK(dy.layout() == x_.layout(), "layer ", name(), ": gradient in another layout than the forward pass");
  auto& s = dnnl_util::stream();
  // Through the fused activation: its output is positive exactly where its input is.
  const Tensor dz = options_.activation ? leaky_relu_grad(y_, dy, options_.activation_slope) : dy;
  // Input gradient.
  Tensor dx;
  if (input_grad()) {
    dx = Tensor(p.in, x_.layout());
    memory dxm = p.dx_bd.target(p.bd_pd.diff_src_desc(), dx);
    p.bd.execute(s, {{DNNL_ARG_DIFF_DST, p.dy_bd.to(p.bd_pd.diff_dst_desc(), dz)},
                     {DNNL_ARG_WEIGHTS, p.wei_bd.to(p.bd_pd.weights_desc(), weight_.value)},
                     {DNNL_ARG_DIFF_SRC, dxm}});
    s.wait();
    p.dx_bd.from(dxm, dx);
  }
  // Weight and bias gradients, accumulated.
  Tensor dw(weight_.value.shape());
  Tensor db;
  if (direct_weight_grad<T>(options_, x_)) {
    if (options_.bias) db = Tensor(bias_.value.shape());
    conv3d_k3_weight_grad(x_, dz, dw.data(), options_.bias ? db.data() : nullptr);
  } else {
    memory dwm = p.dw_bw.target(p.bw_pd.diff_weights_desc(), dw);
    std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, p.src_bw.to(p.bw_pd.src_desc(), x_)},
                                            {DNNL_ARG_DIFF_DST, p.dy_bw.to(p.bw_pd.diff_dst_desc(), dz)},
                                            {DNNL_ARG_DIFF_WEIGHTS, dwm}};
    if (options_.bias) {
      db = Tensor(bias_.value.shape());
      args[DNNL_ARG_DIFF_BIAS] = dnnl_util::memory_of(db);
    }
    p.bw.execute(s, args);
    s.wait();
    p.dw_bw.from(dwm, dw);
  }
  float* g = weight_.grad.data();
  const float* d = dw.data();
  for (int64_t i = 0; i < dw.numel(); ++i) g[i] += d[i];
  if (options_.bias)
    for (int64_t i = 0; i < db.numel(); ++i) bias_.grad[i] += db[i];
  return dx;
}

template <class T>
void ConvLayer<T>::set_precision(Precision p) {
  if (p == precision()) return;
  Layer::set_precision(p);
  plan_.reset();  // the primitives are made for one precision
}

template <class T>
std::vector<Param*> ConvLayer<T>::params() {
  if (options_.bias) return {&weight_, &bias_};
  return {&weight_};
}

template <class T>
double ConvLayer<T>::forward_flops(const Shape& in) const {
  Shape out = output_shape(in);
  const Shape& small = std::is_same_v<T, detail::ConvTraits> ? out : in;  // positions the kernel visits
  double positions = 1;
  for (size_t i = 2; i < small.size(); ++i) positions *= static_cast<double>(small[i]);
  double k = 1;
  for (int i = 0; i < options_.spatial_dims; ++i) k *= options_.kernel;
  return 2.0 * in[0] * positions * options_.in_channels * options_.out_channels * k;
}

template class ConvLayer<detail::ConvTraits>;
template class ConvLayer<detail::DeconvTraits>;

}  // namespace tessera
