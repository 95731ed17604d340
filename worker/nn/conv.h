// Convolution (2D and 3D) and transposed convolution (Deconv, 2D and 3D) on oneDNN. Weights are kept
// plain (O, I, k...) in their Param so optimisers, checkpoints and gradient exchange see flat
// arrays, and reach each primitive in the layout it chose through cached reorders. Activations are
// computed channels-last: a channels-last input needs no reorder, a plain one is reordered (and the
// output returned plain). Primitives are built once per input shape.
// On the GPU (an input on the device) the layer runs cuDNN (gpu::Conv) on plain activations, with
// the bias and the fused activation as kernels after it; uneven padding (a spatial block at the
// volume's edge) is done by explicit padding or cropping around it.
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "worker/nn/layer.h"

namespace tessera {

struct ConvOptions {
  int in_channels = 0;
  int out_channels = 0;
  int kernel = 3;
  int stride = 1;
  int padding = 1;       // on every side of every spatial dimension, unless pad_l / pad_r are given
  int spatial_dims = 3;  // 2 (N, C, H, W) or 3 (N, C, D, H, W)
  bool bias = true;
  uint64_t seed = 1;  // of the weight and bias initialisation
  // Per spatial dimension, before and after; override `padding` when given (spatial parallelism pads
  // blocks unevenly at the volume's edge).
  std::vector<int> pad_l{}, pad_r{};
  // An activation fused into the convolution as a oneDNN post-op, in place of a separate LeakyReLU
  // layer: y = z for z > 0, activation_slope * z otherwise (slope 0: ReLU; slopes in [0, 1]).
  bool activation = false;
  float activation_slope = 0.0f;
  ParamInit init{};
};

// Padding of spatial dimension i before (pad_before) and after (pad_after) the input.
int pad_before(const ConvOptions& o, int i);
int pad_after(const ConvOptions& o, int i);

namespace gpu {
class Conv;
}  // namespace gpu

namespace detail {
struct ConvTraits;
struct DeconvTraits;
template <class Traits>
struct ConvPlan;
}  // namespace detail

template <class Traits>
class ConvLayer : public Layer {
 public:
  ConvLayer(std::string name, ConvOptions options);
  ~ConvLayer() override;
  const char* kind() const override;  // conv, deconv; with a fused activation conv+relu, conv+leaky_relu
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  Layouts layouts() const override { return Layouts::kChannelsLast; }
  std::vector<Param*> params() override;
  // kBf16: oneDNN's bf16 primitives (inputs, weights and output gradients rounded to bf16; outputs,
  // input and weight gradients fp32).
  void set_precision(Precision p) override;
  double forward_flops(const Shape& in) const override;
  const ConvOptions& options() const { return options_; }
  Param& weight() { return weight_; }
  Param& bias() { return bias_; }

 private:
  detail::ConvPlan<Traits>& plan_for(const Shape& in);
  gpu::Conv& device_plan_for(const Shape& in);
  Tensor forward_device(const Tensor& x, bool training);
  Tensor backward_device(const Tensor& dy);
  // Where the explicitly padded (or uncropped) block starts: (0, 0, pad before each dimension).
  std::array<int64_t, 5> device_pad_lo() const;
  ConvOptions options_;
  Param weight_, bias_;
  std::unique_ptr<detail::ConvPlan<Traits>> plan_;
  std::unique_ptr<gpu::Conv> device_plan_;
  Shape device_in_;                   // the input shape device_plan_ is for
  bool device_explicit_pad_ = false;  // uneven padding, done by copies around cuDNN
  Tensor x_;                          // the last training input, for backward-weights
  Tensor y_;                          // the last training output, for the fused activation's gradient
};

using Conv = ConvLayer<detail::ConvTraits>;
using Deconv = ConvLayer<detail::DeconvTraits>;

}  // namespace tessera
