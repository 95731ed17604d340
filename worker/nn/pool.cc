#include "worker/nn/pool.h"

#include "common/error.h"
#include "worker/nn/dnnl_util.h"
#include "worker/nn/gpu/ops.h"

namespace tessera {

using dnnl::memory;

namespace {
int pool_pad_l(const PoolOptions& o, int i) { return o.pad_l.empty() ? o.padding : o.pad_l.at(i); }
int pool_pad_r(const PoolOptions& o, int i) { return o.pad_r.empty() ? o.padding : o.pad_r.at(i); }
}  // namespace

struct Pool::Plan {
  Shape in, out;
  Layout layout;
  dnnl::pooling_forward::primitive_desc fwd_pd;
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward::primitive_desc bwd_pd;
  dnnl::pooling_backward bwd;
  memory workspace;
  dnnl_util::Converter dy_bwd;
};

Pool::Pool(std::string name, PoolOptions o) : Layer(std::move(name)), options_(o) {
  bool pads_ok =
      o.pad_l.size() == o.pad_r.size() && (o.pad_l.empty() || static_cast<int>(o.pad_l.size()) == o.spatial_dims);
  for (size_t i = 0; i < o.pad_l.size() && pads_ok; ++i)
    pads_ok = o.pad_l[i] >= 0 && o.pad_r[i] >= 0 && o.pad_l[i] < o.kernel && o.pad_r[i] < o.kernel;
  if (o.kernel < 1 || o.stride < 1 || o.padding < 0 || 2 * o.padding >= o.kernel + 1 || !pads_ok ||
      (o.spatial_dims != 2 && o.spatial_dims != 3))
    throw ConfigError("model.layers." + this->name(),
                      detail::concat(kind(), ": invalid options (kernel ", o.kernel, ", stride ", o.stride,
                                     ", padding ", o.padding, ", spatial dims ", o.spatial_dims, ")"));
}

Pool::~Pool() = default;

Shape Pool::output_shape(const Shape& in) const {
  const auto& o = options_;
  if (static_cast<int>(in.size()) != 2 + o.spatial_dims)
    shape_error(detail::concat("expects ", 2 + o.spatial_dims, "-d input (N, C, spatial...), got ", shape_str(in)));
  Shape out = {in[0], in[1]};
  for (int i = 0; i < o.spatial_dims; ++i) {
    const int pads = pool_pad_l(o, i) + pool_pad_r(o, i);
    if (in[2 + i] + pads < o.kernel)
      shape_error(detail::concat("spatial size ", in[2 + i], " is smaller than the window ", o.kernel));
    out.push_back((in[2 + i] + pads - o.kernel) / o.stride + 1);
  }
  return out;
}

Pool::Plan& Pool::plan_for(const Shape& in, Layout layout) {
  if (plan_ && plan_->in == in && plan_->layout == layout) return *plan_;
  const auto& o = options_;
  auto p = std::make_unique<Plan>();
  p->in = in;
  p->layout = layout;
  p->out = output_shape(in);
  memory::dims k(o.spatial_dims, o.kernel), s(o.spatial_dims, o.stride), pad(o.spatial_dims), pad_r(o.spatial_dims);
  for (int i = 0; i < o.spatial_dims; ++i) {
    pad[i] = pool_pad_l(o, i);
    pad_r[i] = pool_pad_r(o, i);
  }
  auto alg = o.max ? dnnl::algorithm::pooling_max : dnnl::algorithm::pooling_avg_exclude_padding;
  const memory::desc src = dnnl_util::desc_of(in, layout), dst = dnnl_util::desc_of(p->out, layout);
  dnnl::pooling_forward::desc fd(dnnl::prop_kind::forward_training, alg, src, dst, s, k, pad, pad_r);
  p->fwd_pd = dnnl::pooling_forward::primitive_desc(fd, dnnl_util::engine());
  p->fwd = dnnl::pooling_forward(p->fwd_pd);
  dnnl::pooling_backward::desc bd(alg, src, dst, s, k, pad, pad_r);
  p->bwd_pd = dnnl::pooling_backward::primitive_desc(bd, dnnl_util::engine(), p->fwd_pd);
  p->bwd = dnnl::pooling_backward(p->bwd_pd);
  if (o.max) p->workspace = memory(p->fwd_pd.workspace_desc(), dnnl_util::engine());
  plan_ = std::move(p);
  return *plan_;
}

Tensor Pool::forward_device(const Tensor& x, bool training) {
  if (!device_pool_ || device_in_ != x.shape()) {
    std::vector<int> pad;
    for (int i = 0; i < options_.spatial_dims; ++i) {
      if (pool_pad_l(options_, i) != pool_pad_r(options_, i))
        shape_error("uneven padding (a spatial block at the volume's edge) is not supported on the GPU");
      pad.push_back(pool_pad_l(options_, i));
    }
    device_pool_ = std::make_unique<gpu::Pool>(x.shape(), output_shape(x.shape()), options_.max, options_.kernel,
                                               options_.stride, pad);
    device_in_ = x.shape();
  }
  Tensor y(output_shape(x.shape()), Layout::kPlain, Device::kCuda);
  device_pool_->forward(x.data(), y.data());
  if (training) {
    x_ = x;
    y_ = y;
  }
  return y;
}

Tensor Pool::forward(const Tensor& x, bool training) {
  if (x.on_device()) return forward_device(x, training);
  auto& p = plan_for(x.shape(), x.layout());
  Tensor y(p.out, x.layout());
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, dnnl_util::memory_of(x)},
                                          {DNNL_ARG_DST, dnnl_util::memory_of(y)}};
  if (options_.max) args[DNNL_ARG_WORKSPACE] = p.workspace;
  p.fwd.execute(dnnl_util::stream(), args);
  dnnl_util::stream().wait();
  return y;
}

Tensor Pool::backward(const Tensor& dy) {
  if (dy.on_device()) {
    TESSERA_CHECK(device_pool_ && !x_.empty() && dy.shape() == y_.shape(), "layer ", name(),
                  ": backward without a training forward of its shape");
    Tensor dx(x_.shape(), Layout::kPlain, Device::kCuda);
    device_pool_->backward(x_.data(), y_.data(), dy.data(), dx.data());
    return dx;
  }
  TESSERA_CHECK(plan_ != nullptr, "layer ", name(), ": backward before forward");
  auto& p = *plan_;
  TESSERA_CHECK(dy.shape() == p.out, "layer ", name(), ": gradient shape ", shape_str(dy.shape()));
  Tensor dx(p.in, p.layout);
  std::unordered_map<int, memory> args = {{DNNL_ARG_DIFF_DST, p.dy_bwd.to(p.bwd_pd.diff_dst_desc(), dy)},
                                          {DNNL_ARG_DIFF_SRC, dnnl_util::memory_of(dx)}};
  if (options_.max) args[DNNL_ARG_WORKSPACE] = p.workspace;
  p.bwd.execute(dnnl_util::stream(), args);
  dnnl_util::stream().wait();
  return dx;
}

}  // namespace tessera
