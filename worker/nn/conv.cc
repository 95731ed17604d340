#include "worker/nn/conv.h"

#include "worker/core/error.h"
#include "worker/nn/dnnl_util.h"
#include "worker/nn/elementwise.h"

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
  static bool fits(int64_t in, const ConvOptions& o, int i) { return in + pad_before(o, i) + pad_after(o, i) >= o.kernel; }
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
  bool pads_ok = o.pad_l.size() == o.pad_r.size() && (o.pad_l.empty() || static_cast<int>(o.pad_l.size()) == o.spatial_dims);
  for (size_t i = 0; i < o.pad_l.size() && pads_ok; ++i) pads_ok = o.pad_l[i] >= 0 && o.pad_r[i] >= 0;
  const bool slope_ok = !o.activation || (o.activation_slope >= 0.0f && o.activation_slope <= 1.0f);
  if (o.in_channels < 1 || !slope_ok || o.out_channels < 1 || o.kernel < 1 || o.stride < 1 || o.padding < 0 || !pads_ok ||
      (o.spatial_dims != 2 && o.spatial_dims != 3))
    throw ConfigError("model.layers." + this->name(),
                      detail::concat(T::kKind, ": invalid options (channels ", o.in_channels, " -> ", o.out_channels,
                                     ", kernel ", o.kernel, ", stride ", o.stride, ", padding ", o.padding,
                                     ", spatial dims ", o.spatial_dims, ", activation slope ", o.activation_slope, ")"));
  Shape ws = {o.out_channels, o.in_channels};
  int64_t fan_in = o.in_channels;
  for (int i = 0; i < o.spatial_dims; ++i) {
    ws.push_back(o.kernel);
    fan_in *= o.kernel;
  }
  weight_ = Param{this->name() + ".weight", Tensor(ws), Tensor::zeros(ws), true};
  if (o.bias) bias_ = Param{this->name() + ".bias", Tensor::zeros({o.out_channels}), Tensor::zeros({o.out_channels}), false};
  init_params(weight_.value, o.bias ? &bias_.value : nullptr, fan_in, o.seed, o.init);
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
  auto act = [](const Shape& s) { return dnnl_util::desc_of(s, Layout::kChannelsLast); };
  auto any = [](const Shape& s) { return memory::desc(dnnl_util::dims_of(s), memory::data_type::f32, memory::format_tag::any); };
  memory::dims strides(o.spatial_dims, o.stride), pad_l(o.spatial_dims), pad_r(o.spatial_dims);
  for (int i = 0; i < o.spatial_dims; ++i) {
    pad_l[i] = pad_before(o, i);
    pad_r[i] = pad_after(o, i);
  }
  memory::desc bias_md = o.bias ? dnnl_util::plain_desc(bias_.value.shape()) : memory::desc();
  auto& eng = dnnl_util::engine();
  typename T::Fwd::desc fd(dnnl::prop_kind::forward_training, T::kAlg, act(in), any(weight_.value.shape()), bias_md,
                           act(p->out), strides, pad_l, pad_r);
  dnnl::primitive_attr attr;
  if (o.activation) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, o.activation_slope, 0.0f);
    attr.set_post_ops(ops);
  }
  p->fwd_pd = typename T::Fwd::primitive_desc(fd, attr, eng);
  p->fwd = typename T::Fwd(p->fwd_pd);
  typename T::BwdData::desc bdd(T::kAlg, act(in), any(weight_.value.shape()), act(p->out), strides, pad_l, pad_r);
  p->bd_pd = typename T::BwdData::primitive_desc(bdd, eng, p->fwd_pd);
  p->bd = typename T::BwdData(p->bd_pd);
  typename T::BwdWeights::desc bwd(T::kAlg, act(in), any(weight_.value.shape()), bias_md, act(p->out), strides, pad_l,
                                   pad_r);
  p->bw_pd = typename T::BwdWeights::primitive_desc(bwd, eng, p->fwd_pd);
  p->bw = typename T::BwdWeights(p->bw_pd);
  plan_ = std::move(p);
  return *plan_;
}

template <class T>
Tensor ConvLayer<T>::forward(const Tensor& x, bool training) {
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
  memory dwm = p.dw_bw.target(p.bw_pd.diff_weights_desc(), dw);
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, p.src_bw.to(p.bw_pd.src_desc(), x_)},
                                          {DNNL_ARG_DIFF_DST, p.dy_bw.to(p.bw_pd.diff_dst_desc(), dz)},
                                          {DNNL_ARG_DIFF_WEIGHTS, dwm}};
  Tensor db;
  if (options_.bias) {
    db = Tensor(bias_.value.shape());
    args[DNNL_ARG_DIFF_BIAS] = dnnl_util::memory_of(db);
  }
  p.bw.execute(s, args);
  s.wait();
  p.dw_bw.from(dwm, dw);
  float* g = weight_.grad.data();
  const float* d = dw.data();
  for (int64_t i = 0; i < dw.numel(); ++i) g[i] += d[i];
  if (options_.bias)
    for (int64_t i = 0; i < db.numel(); ++i) bias_.grad[i] += db[i];
  return dx;
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
