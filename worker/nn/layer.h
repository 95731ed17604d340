// Layer: the single-rank building block of every model. forward() caches what backward() needs;
// backward() returns the input gradient and accumulates (+=) parameter gradients into Param::grad.
// A layer is used by one thread; forward/backward pairs run in order.
//
// Error policy: a shape a layer cannot take is a ConfigError naming the layer (model configuration
// is where such shapes come from); broken invariants throw std::logic_error.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/cost_model.h"
#include "worker/core/tensor.h"
#include "worker/nn/precision.h"

namespace tessera {

struct Param {
  std::string name;  // "conv1.weight"
  Tensor value;
  Tensor grad;        // same shape as value
  bool decay = true;  // weight decay applies (false for biases and normalisation parameters)
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  virtual const char* kind() const = 0;
  // The output shape for input shape `in`; throws ConfigError naming the layer when it cannot apply.
  virtual Shape output_shape(const Shape& in) const = 0;
  virtual Tensor forward(const Tensor& x, bool training) = 0;
  virtual Tensor backward(const Tensor& dy) = 0;
  virtual std::vector<Param*> params() { return {}; }
  // Moves the layer's parameters (values and gradients) and any other state to `device`.
  virtual void to(Device device);
  // Whether backward() must compute the input gradient. Off for a model's first layer, whose input
  // is data: backward() then returns an empty tensor (and skips that work).
  void set_input_grad(bool on) { input_grad_ = on; }
  bool input_grad() const { return input_grad_; }
  // The layouts forward() takes (see Tensor). A layer that takes both returns its output in its
  // input's layout; backward() takes dy in the output's layout and returns dx in the input's.
  // Sequential hands kChannelsLast layers channels-last activations, kPlain layers plain ones, and
  // kEither layers (entry by entry) whatever the layer before them gave.
  enum class Layouts { kPlain, kEither, kChannelsLast };
  virtual Layouts layouts() const { return Layouts::kPlain; }
  // Floating-point operations of one forward pass for input shape `in` (0 where negligible).
  virtual double forward_flops(const Shape& in) const {
    (void)in;
    return 0;
  }
  // The layers inside this one (a residual block's), nested ones included.
  virtual std::vector<Layer*> sublayers() { return {}; }
  // The arithmetic of the layer's products (nn/precision.h: convolutions and matrix products take
  // bf16 inputs under kBf16); a layer without products keeps it and computes in fp32.
  virtual void set_precision(Precision p) { precision_ = p; }
  Precision precision() const { return precision_; }

 protected:
  // Throws ConfigError("model.layers.<name>", reason).
  [[noreturn]] void shape_error(const std::string& reason) const;

 private:
  std::string name_;
  bool input_grad_ = true;
  Precision precision_ = Precision::kFp32;
};

// Called during a backward pass as soon as a layer's parameter gradients are final (each layer's
// backward() has run), so they can be sent while the pass goes on.
using GradReady = std::function<void(Layer&)>;

// While set (not null), every Sequential reports each layer's forward and backward wall time to it,
// a residual block's inner layers as well as the block (`tessera-bench train --layers`). One
// thread's training at a time: it is a process-wide setting.
using LayerTimer = std::function<void(const Layer&, bool backward, double seconds)>;
void set_layer_timer(LayerTimer timer);

// Layers applied in order. It takes and returns plain tensors; inside, activations stay
// channels-last from one layer that wants them to the next (no conversion between a convolution, its
// activation and its pooling), and are converted only where a layer needs plain ones. Activations on
// the GPU stay plain throughout (cuDNN takes them so). A Sequential inside a layer (a residual
// block's body) may keep its layouts: it returns its last layer's output as that layer made it, and
// the input gradient in the layout its input came in.
class Sequential {
 public:
  void keep_layouts() { keep_layouts_ = true; }
  Layer& add(std::unique_ptr<Layer> layer);
  Tensor forward(const Tensor& x, bool training);
  // `ready` (may be null) hears of each layer once its backward() has run.
  Tensor backward(const Tensor& dy, const GradReady* ready = nullptr);
  std::vector<Param*> params();
  void to(Device device);
  Shape output_shape(Shape in) const;
  double forward_flops(Shape in) const;
  // Each layer's parameters and forward FLOPs for input shape `in`, in order (the cost model's view).
  std::vector<cost::LayerCost> cost_layers(Shape in) const;
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

 private:
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Layout> out_layout_;  // of each layer's output in the last forward pass
  Layout in_layout_ = Layout::kPlain;
  bool keep_layouts_ = false;
};

// acc += x, entry by entry (same shape, device and layout): skip connections and residual sums.
void add_into(Tensor& acc, const Tensor& x);

// A residual block: y = body(x) + shortcut(x), the shortcut the identity when it has no layers (a
// Transformer block's, a ResNet bottleneck's when the shapes agree) or a projection. What follows
// the sum (a ResNet block's ReLU) is the next layer. The sum is in the body's output layout (a
// ResNet block's stays channels-last on the host from block to block).
class Residual : public Layer {
 public:
  explicit Residual(std::string name) : Layer(std::move(name)) {
    body_.keep_layouts();
    shortcut_.keep_layouts();
  }
  Layouts layouts() const override { return Layouts::kEither; }
  const char* kind() const override { return "residual"; }
  Sequential& body() { return body_; }
  Sequential& shortcut() { return shortcut_; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Param*> params() override;
  void to(Device device) override;
  double forward_flops(const Shape& in) const override;
  std::vector<Layer*> sublayers() override;

 private:
  Sequential body_, shortcut_;
};

// How a layer's weights and biases start (model.weightInit, model.biasInit).
struct ParamInit {
  // kUniform: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's default for its Conv and Linear layers;
  // kHeNormal: N(0, 2 / fan), which keeps the activations' scale through ReLU layers; kDefault: the
  // model's choice (make_model resolves it: resnet50's convolutions He normal over their fan-out,
  // as torchvision's; every other layer uniform).
  enum class Weights { kDefault, kUniform, kHeNormal };
  // The fan He normal divides by: the inputs a weight's output sums over, or (kOut, torchvision's
  // kaiming_normal_ with mode fan_out) the outputs one input reaches.
  enum class Fan { kIn, kOut };
  // kUniform: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), PyTorch's default; kZero: zero.
  enum class Biases { kUniform, kZero };
  Weights weights = Weights::kDefault;
  Fan fan = Fan::kIn;
  Biases biases = Biases::kUniform;
  float gain = 1.0f;  // scales the weights' spread (a model's output layer may start smaller)
};

// t's entries drawn from N(0, stddev), deterministic in `seed` (a Transformer's weights).
void init_normal(Tensor& t, float stddev, uint64_t seed);

// Draws a layer's weight (and bias, if not null) with `fan_in` inputs and `fan_out` outputs,
// deterministic in `seed`.
void init_params(Tensor& weight, Tensor* bias, int64_t fan_in, int64_t fan_out, uint64_t seed, const ParamInit& init);

}  // namespace tessera
