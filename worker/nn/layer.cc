#include "worker/nn/layer.h"

#include <cmath>
#include <random>

#include "worker/core/error.h"

namespace tessera {

void Layer::shape_error(const std::string& reason) const {
  throw ConfigError("model.layers." + name_, std::string(kind()) + ": " + reason);
}

Layer& Sequential::add(std::unique_ptr<Layer> layer) {
  layers_.push_back(std::move(layer));
  return *layers_.back();
}

Tensor Sequential::forward(const Tensor& x, bool training) {
  Tensor h = x;
  for (auto& l : layers_) h = l->forward(h, training);
  return h;
}

Tensor Sequential::backward(const Tensor& dy, const GradReady* ready) {
  Tensor g = dy;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    g = (*it)->backward(g);
    if (ready) (*ready)(**it);
  }
  return g;
}

std::vector<Param*> Sequential::params() {
  std::vector<Param*> out;
  for (auto& l : layers_)
    for (Param* p : l->params()) out.push_back(p);
  return out;
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

void init_he_normal(Tensor& w, int64_t fan_in, uint64_t seed, float gain) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, gain / std::sqrt(static_cast<float>(std::max<int64_t>(fan_in, 1))));
  for (auto& v : w.span()) v = n(rng);
}

}  // namespace tessera
