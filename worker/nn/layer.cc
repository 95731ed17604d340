#include "worker/nn/layer.h"

#include <cmath>
#include <random>

#include "common/error.h"
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
}  // namespace

Layer& Sequential::add(std::unique_ptr<Layer> layer) {
  layers_.push_back(std::move(layer));
  return *layers_.back();
}

Tensor Sequential::forward(const Tensor& x, bool training) {
  out_layout_.resize(layers_.size());
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = *layers_[i];
    if (l.layouts() == Layer::Layouts::kChannelsLast && h.rank() >= 3) h = in_layout(h, Layout::kChannelsLast);
    if (l.layouts() == Layer::Layouts::kPlain) h = in_layout(h, Layout::kPlain);
    h = l.forward(h, training);
    out_layout_[i] = h.layout();
  }
  return in_layout(h, Layout::kPlain);
}

Tensor Sequential::backward(const Tensor& dy, const GradReady* ready) {
  TESSERA_CHECK(out_layout_.size() == layers_.size(), "backward before forward");
  Tensor g = dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    g = layers_[i]->backward(in_layout(g, out_layout_[i]));
    if (ready) (*ready)(*layers_[i]);
  }
  return in_layout(g, Layout::kPlain);
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
  for (const auto& l : layers_) {
    f += l->forward_flops(in);
    in = l->output_shape(in);
  }
  return f;
}

void init_params(Tensor& weight, Tensor* bias, int64_t fan_in, uint64_t seed, const ParamInit& init) {
  std::mt19937_64 rng(seed);
  const float inv = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(fan_in, 1)));
  if (init.weights == ParamInit::Weights::kHeNormal) {
    std::normal_distribution<float> n(0.0f, init.gain * std::sqrt(2.0f) * inv);
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
