#include "worker/nn/layer.h"

#include <chrono>
#include <cmath>
#include <random>

#include "common/error.h"
#include "worker/core/device.h"
#include "worker/nn/dnnl_util.h"

namespace tessera {

void Layer::shape_error(const std::string& reason) const {
  throw ConfigError("model.layers." + name_, std::string(kind()) + ": " + reason);
}

void Layer::to(Device device) {
  for (Param* p : params()) {
    p->value = p->value.to(device);
    p->grad = p->grad.to(device);
  }
}

namespace {
// t in `layout` (host tensors; device activations are plain).
Tensor in_layout(const Tensor& t, Layout layout) { return t.on_device() ? t : dnnl_util::to_layout(t, layout); }

LayerTimer g_layer_timer;

// f() for layer l, timed when a LayerTimer is set (on the GPU, with the stream idle at both ends).
template <class F>
Tensor timed(const Layer& l, bool backward, F f) {
  if (!g_layer_timer) return f();
  static const bool device = gpu::device_count() > 0;
  if (device) gpu::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  Tensor out = f();
  if (device) gpu::synchronize();
  g_layer_timer(l, backward, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return out;
}
}  // namespace

void set_layer_timer(LayerTimer timer) { g_layer_timer = std::move(timer); }

Layer& Sequential::add(std::unique_ptr<Layer> layer) {
  layers_.push_back(std::move(layer));
  return *layers_.back();
}

Tensor Sequential::forward(const Tensor& x, bool training) {
  out_layout_.resize(layers_.size());
  in_layout_ = x.layout();
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = *layers_[i];
    if (l.layouts() == Layer::Layouts::kChannelsLast && h.rank() >= 3) h = in_layout(h, Layout::kChannelsLast);
    if (l.layouts() == Layer::Layouts::kPlain) h = in_layout(h, Layout::kPlain);
    h = timed(l, false, [&] { return l.forward(h, training); });
    out_layout_[i] = h.layout();
  }
  return keep_layouts_ ? h : in_layout(h, Layout::kPlain);
}

Tensor Sequential::backward(const Tensor& dy, const GradReady* ready) {
  TESSERA_CHECK(out_layout_.size() == layers_.size(), "backward before forward");
  Tensor g = dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    const Tensor dy_i = in_layout(g, out_layout_[i]);
    g = timed(*layers_[i], true, [&] { return layers_[i]->backward(dy_i); });
    if (ready) (*ready)(*layers_[i]);
  }
  return in_layout(g, keep_layouts_ ? in_layout_ : Layout::kPlain);
}

std::vector<Param*> Sequential::params() {
  std::vector<Param*> out;
  for (auto& l : layers_)
    for (Param* p : l->params()) out.push_back(p);
  return out;
}

void Sequential::to(Device device) {
  for (auto& l : layers_) l->to(device);
}

Shape Sequential::output_shape(Shape in) const {
  for (const auto& l : layers_) in = l->output_shape(in);
  return in;
}

double Sequential::forward_flops(Shape in) const {
  double f = 0;
  for (const cost::LayerCost& c : cost_layers(std::move(in))) f += c.forward_flops;
  return f;
}

std::vector<cost::LayerCost> Sequential::cost_layers(Shape in) const {
  std::vector<cost::LayerCost> out;
  for (const auto& l : layers_) {
    double params = 0;
    for (const Param* p : l->params()) params += static_cast<double>(p->value.numel());
    out.push_back({params, l->forward_flops(in)});
    in = l->output_shape(in);
  }
  return out;
}

void add_into(Tensor& acc, const Tensor& x) {
  TESSERA_CHECK(acc.shape() == x.shape() && acc.device() == x.device() && acc.layout() == x.layout(), "sum of ",
                shape_str(acc.shape()), " and ", shape_str(x.shape()));
  if (acc.on_device()) {
    gpu::add_into(acc.data(), x.data(), static_cast<size_t>(acc.numel()));
    return;
  }
  float* a = acc.data();
  const float* b = x.data();
  const int64_t n = acc.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

Shape Residual::output_shape(const Shape& in) const {
  const Shape out = body_.output_shape(in), side = shortcut_.output_shape(in);
  if (out != side)
    shape_error(detail::concat("its body gives ", shape_str(out), " but its shortcut ", shape_str(side), " for input ",
                               shape_str(in)));
  return out;
}

Tensor Residual::forward(const Tensor& x, bool training) {
  Tensor y = body_.forward(x, training);
  const Tensor side = in_layout(shortcut_.layers().empty() ? x : shortcut_.forward(x, training), y.layout());
  TESSERA_CHECK(y.shape() == side.shape() && y.device() == side.device(), "layer ", name(), ": body ",
                shape_str(y.shape()), " and shortcut ", shape_str(side.shape()));
  if (y.data() == side.data()) y = y.clone();  // a body that passes its input on (an identity dropout)
  add_into(y, side);
  return y;
}

Tensor Residual::backward(const Tensor& dy) {
  Tensor dx = body_.backward(dy);
  if (!input_grad()) return Tensor();
  const Tensor side = in_layout(shortcut_.layers().empty() ? dy : shortcut_.backward(dy), dx.layout());
  if (dx.data() == side.data()) dx = dx.clone();
  add_into(dx, side);
  return dx;
}

std::vector<Param*> Residual::params() {
  std::vector<Param*> out = body_.params();
  for (Param* p : shortcut_.params()) out.push_back(p);
  return out;
}

void Residual::to(Device device) {
  body_.to(device);
  shortcut_.to(device);
}

double Residual::forward_flops(const Shape& in) const { return body_.forward_flops(in) + shortcut_.forward_flops(in); }

std::vector<Layer*> Residual::sublayers() {
  std::vector<Layer*> out;
  for (Sequential* s : {&body_, &shortcut_})
    for (auto& l : s->layers()) {
      out.push_back(l.get());
      for (Layer* inner : l->sublayers()) out.push_back(inner);
    }
  return out;
}

void init_normal(Tensor& t, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  for (auto& v : t.span()) v = d(rng);
}

void init_params(Tensor& weight, Tensor* bias, int64_t fan_in, int64_t fan_out, uint64_t seed, const ParamInit& init) {
  std::mt19937_64 rng(seed);
  const float inv = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(fan_in, 1)));
  if (init.weights == ParamInit::Weights::kHeNormal) {
    const int64_t fan = init.fan == ParamInit::Fan::kOut ? fan_out : fan_in;
    const float spread = std::sqrt(2.0f / static_cast<float>(std::max<int64_t>(fan, 1)));
    std::normal_distribution<float> n(0.0f, init.gain * spread);
    for (auto& v : weight.span()) v = n(rng);
  } else {
    std::uniform_real_distribution<float> u(-init.gain * inv, init.gain * inv);
    for (auto& v : weight.span()) v = u(rng);
  }
  if (!bias) return;
  if (init.biases == ParamInit::Biases::kZero) {
    bias->zero();
  } else {
    std::uniform_real_distribution<float> u(-inv, inv);
    for (auto& v : bias->span()) v = u(rng);
  }
}

}  // namespace tessera
