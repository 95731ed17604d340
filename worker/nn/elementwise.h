// Parameter-free layers: ReLU, LeakyReLU, GELU, Dropout and Flatten; and channel concatenation for skip
// connections (a two-input operation, so functions rather than a Layer).
#pragma once

#include <cstdint>

#include "worker/nn/layer.h"

namespace tessera {

// y = x for x > 0, slope * x otherwise (slope 0: ReLU).
class LeakyReLU : public Layer {
 public:
  LeakyReLU(std::string name, float slope) : Layer(std::move(name)), slope_(slope) {}
  const char* kind() const override { return slope_ == 0.0f ? "relu" : "leaky_relu"; }
  Shape output_shape(const Shape& in) const override { return in; }
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  Layouts layouts() const override { return Layouts::kEither; }  // entry by entry

 private:
  float slope_;
  Tensor x_;
};

// The gradient through a leaky ReLU of slope `slope`: dy where gate > 0, slope * dy elsewhere. The
// gate is the activation's input, or its output (both are positive at the same entries for slopes
// in [0, 1]).
Tensor leaky_relu_grad(const Tensor& gate, const Tensor& dy, float slope);

class ReLU : public LeakyReLU {
 public:
  explicit ReLU(std::string name) : LeakyReLU(std::move(name), 0.0f) {}
};

// GELU, exact (kernels::gelu): x * Phi(x).
class GELU : public Layer {
 public:
  explicit GELU(std::string name) : Layer(std::move(name)) {}
  const char* kind() const override { return "gelu"; }
  Shape output_shape(const Shape& in) const override { return in; }
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  Layouts layouts() const override { return Layouts::kEither; }  // entry by entry

 private:
  Tensor x_;
};

// Inverted dropout: in training, zeroes each entry with probability `rate` and scales the rest by
// 1/(1-rate); identity in evaluation. The masks are deterministic in `seed` and the number of
// training passes before (kernels::dropout_scale), the same on the CPU and the GPU.
class Dropout : public Layer {
 public:
  Dropout(std::string name, float rate, uint64_t seed);
  const char* kind() const override { return "dropout"; }
  Shape output_shape(const Shape& in) const override { return in; }
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  // The mask of the next training forward pass is that of pass `call` (the trainer passes the
  // step: a resumed run, and each micro-batch of an elastic gang, draw the masks of the
  // uninterrupted run).
  void set_call(uint64_t call) { calls_ = call; }

 private:
  float rate_;
  uint64_t seed_;
  uint64_t calls_ = 0;  // training forward passes so far
  Tensor mask_;         // scale per entry of the last training forward; empty in evaluation
};

// (N, ...) -> (N, prod(...)).
class Flatten : public Layer {
 public:
  explicit Flatten(std::string name) : Layer(std::move(name)) {}
  const char* kind() const override { return "flatten"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override { return dy.reshape(in_); }

 private:
  Shape in_;
};

// Concatenates a and b along the channel dimension (1); all other dimensions must agree.
Tensor concat_channels(const Tensor& a, const Tensor& b);
// Splits a gradient of concat_channels(a, b) back into the parts for a (first `channels_a`) and b.
void split_channels(const Tensor& dy, int64_t channels_a, Tensor& da, Tensor& db);

}  // namespace tessera
