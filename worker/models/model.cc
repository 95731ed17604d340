#include "worker/models/model.h"

#include <cmath>

#include "common/error.h"
#include "worker/nn/batchnorm.h"
#include "worker/nn/conv.h"
#include "worker/nn/elementwise.h"
#include "worker/nn/linear.h"
#include "worker/nn/pool.h"
#include "worker/nn/transformer.h"
#include "worker/spatial/layers.h"

namespace tessera {

LossResult Model::loss(const Tensor& out, const Tensor& target) const {
  return task() == Task::kRegression ? mse_loss(out, target) : softmax_cross_entropy(out, target, label_smoothing_);
}

double Model::metric(const Tensor& out, const Tensor& target) const {
  return task() == Task::kRegression ? mean_absolute_error(out, target) : accuracy(out, target);
}

const char* Model::metric_name() const { return task() == Task::kRegression ? "mae" : "accuracy"; }

double Model::forward_flops() const {
  double f = 0;
  for (const cost::LayerCost& c : cost_layers()) f += c.forward_flops;
  return f;
}

int64_t Model::num_params() {
  int64_t n = 0;
  for (Param* p : params()) n += p->value.numel();
  return n;
}

namespace {

bool power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

// The output layer's initialisation: the model's, but with He normal weights half as spread (the
// outputs start small against the targets).
ParamInit output_init(const ModelConfig& c) {
  ParamInit init = c.init;
  if (init.weights == ParamInit::Weights::kHeNormal) init.gain = 0.5f;
  return init;
}

// Fully connected layers fc1.. of the given widths after `features` inputs, each with its
// activation (LeakyReLU or ReLU) and optional dropout; returns the last width.
int add_hidden(Sequential& net, const ModelConfig& c, const std::vector<int>& widths, int features, bool leaky,
               uint64_t& seed) {
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] < 1) throw ConfigError(detail::concat("model.hidden[", i, "]"), "must be positive");
    const std::string f = "fc" + std::to_string(i + 1);
    net.add(std::make_unique<Linear>(f, features, widths[i], ++seed, c.init));
    if (leaky) {
      net.add(std::make_unique<LeakyReLU>(f + ".act", c.leaky_slope));
    } else {
      net.add(std::make_unique<ReLU>(f + ".act"));
    }
    if (c.dropout > 0) net.add(std::make_unique<Dropout>(f + ".dropout", c.dropout, ++seed));
    features = widths[i];
  }
  return features;
}

// A model that is one Sequential.
class SequentialModel : public Model {
 public:
  SequentialModel(std::string name, Task task, Shape sample, Shape target)
      : name_(std::move(name)), task_(task), sample_(std::move(sample)), target_(std::move(target)) {}
  const std::string& name() const override { return name_; }
  Task task() const override { return task_; }
  Shape sample_shape() const override { return sample_; }
  Shape target_shape() const override { return target_; }
  Tensor forward(const Tensor& x, bool training) override { return net_.forward(x, training); }
  Tensor backward(const Tensor& dy, const GradReady* ready) override { return net_.backward(dy, ready); }
  std::vector<Param*> params() override { return net_.params(); }
  std::vector<Layer*> layers() override {
    std::vector<Layer*> out;
    for (auto& l : net_.layers()) {
      out.push_back(l.get());
      for (Layer* inner : l->sublayers()) out.push_back(inner);
    }
    return out;
  }
  std::vector<cost::LayerCost> cost_layers() const override {
    Shape in = {1};
    in.insert(in.end(), sample_.begin(), sample_.end());
    if (partition_)
      for (int d = 0; d < 3; ++d) in[2 + d] = partition_->owned(d).size();  // this rank's block
    return net_.cost_layers(in);
  }
  Sequential& net() { return net_; }
  const Partition* input_partition() const override { return partition_.get(); }
  std::vector<int64_t> held_samples(int64_t n) const override {
    return shuffle_ ? shuffle_->held(n) : Model::held_samples(n);
  }
  void set_spatial(std::unique_ptr<Partition> p, const Shuffle* s) {
    partition_ = std::move(p);
    shuffle_ = s;
  }

 private:
  std::unique_ptr<Partition> partition_;
  const Shuffle* shuffle_ = nullptr;
  std::string name_;
  Task task_;
  Shape sample_, target_;
  Sequential net_;
};

// CosmoFlow: blocks of conv k3 (same padding) + LeakyReLU (+ BatchNorm) + max-pool 2 until the volume
// is 4^3, channels base * 2^i capped at max_channels; then FC layers to the regression targets.
std::unique_ptr<Model> cosmoflow(ModelConfig c, Communicator* spatial) {
  if (!power_of_two(c.input_size) || c.input_size < 8 || c.input_size > 1024)
    throw ConfigError("model.inputSize",
                      detail::concat(c.input_size, ": CosmoFlow needs a power of two from 8 to 1024"));
  const int in_ch = c.in_channels ? c.in_channels : 4, base = c.base_channels ? c.base_channels : 16;
  const int outputs = c.outputs ? c.outputs : 4;
  const int W = c.input_size;
  auto m = std::make_unique<SequentialModel>("cosmoflow", Task::kRegression, Shape{in_ch, W, W, W}, Shape{outputs});
  Sequential& net = m->net();
  const bool split = c.spatial.size() > 1;
  SpatialContext ctx{spatial, c.spatial};
  if (split && (!spatial || spatial->size() != c.spatial.size()))
    throw ConfigError("parallelism.spatial",
                      detail::concat("a grid of ", c.spatial.size(), " ranks needs a spatial group of that size"));
  std::array<int64_t, 3> extent = {W, W, W};
  int ch = in_ch, size = W, block = 0;
  uint64_t seed = c.seed * 1000;
  while (size > 4) {
    const int out = std::min(base << block, c.max_channels);
    const std::string b = "block" + std::to_string(block + 1);
    // Before BatchNorm a bias would be subtracted again with the mean: the convolution has none.
    ConvOptions conv{ch, out, 3, 1, 1, 3, !c.batchnorm, ++seed};
    conv.init = c.init;
    const PoolOptions pool{true, 2, 2, 0, 3};
    // Without batch norm between them, the activation runs inside the convolution (a post-op).
    const bool fuse = !split && !c.batchnorm;
    if (fuse) {
      conv.activation = true;
      conv.activation_slope = c.leaky_slope;
    }
    if (split) {
      net.add(std::make_unique<DistConv>(b + ".conv", conv, ctx, extent));
    } else {
      net.add(std::make_unique<Conv>(b + ".conv", conv));
    }
    if (c.batchnorm) {
      auto& bn = static_cast<BatchNorm&>(net.add(std::make_unique<BatchNorm>(b + ".bn", out)));
      if (split) bn.set_stats_reducer(spatial_batchnorm_reducer(*spatial));
    }
    if (!fuse) net.add(std::make_unique<LeakyReLU>(b + ".act", c.leaky_slope));
    if (split) {
      net.add(std::make_unique<DistPool>(b + ".pool", pool, ctx, extent));
    } else {
      net.add(std::make_unique<Pool>(b + ".pool", pool));
    }
    for (auto& e : extent) e /= 2;
    ch = out;
    size /= 2;
    ++block;
  }
  const Shuffle* shuffle = nullptr;
  if (split) shuffle = static_cast<const Shuffle*>(&net.add(std::make_unique<Shuffle>("shuffle", ctx, extent)));
  net.add(std::make_unique<Flatten>("flatten"));
  const int features = add_hidden(net, c, hidden_widths(c), ch * size * size * size,
                                  /*leaky=*/true, seed);
  net.add(std::make_unique<Linear>("output", features, outputs, ++seed, output_init(c)));
  net.layers().front()->set_input_grad(false);
  if (split)
    m->set_spatial(
        std::make_unique<Partition>(std::array<int64_t, 3>{W, W, W}, c.spatial, spatial->rank(), "parallelism.spatial"),
        shuffle);
  return m;
}

// A 2D CNN: two conv + ReLU + max-pool blocks, then fully connected layers (default one of 128) to
// the classes. Wide hidden layers make it a large-gradient model: 64^2 inputs, baseChannels 32 and
// hidden [1536] hold 25.2M parameters, ResNet-50's gradient volume.
std::unique_ptr<Model> cnn2d(ModelConfig c) {
  if (c.input_size < 8 || c.input_size % 4)
    throw ConfigError("model.inputSize", detail::concat(c.input_size, ": cnn2d needs a multiple of 4, at least 8"));
  const int in_ch = c.in_channels ? c.in_channels : 1, base = c.base_channels ? c.base_channels : 16;
  const int classes = c.outputs ? c.outputs : 10, W = c.input_size;
  auto m = std::make_unique<SequentialModel>("cnn2d", Task::kClassification, Shape{in_ch, W, W}, Shape{});
  Sequential& net = m->net();
  uint64_t seed = c.seed * 1000;
  auto conv_relu = [&](int in, int out) {  // ReLU fused into the convolution
    ConvOptions o{in, out, 3, 1, 1, 2, true, ++seed};
    o.activation = true;
    o.init = c.init;
    return o;
  };
  net.add(std::make_unique<Conv>("conv1", conv_relu(in_ch, base)));
  net.add(std::make_unique<Pool>("pool1", PoolOptions{true, 2, 2, 0, 2}));
  net.add(std::make_unique<Conv>("conv2", conv_relu(base, 2 * base)));
  net.add(std::make_unique<Pool>("pool2", PoolOptions{true, 2, 2, 0, 2}));
  net.add(std::make_unique<Flatten>("flatten"));
  const int features = add_hidden(net, c, hidden_widths(c), 2 * base * (W / 4) * (W / 4),
                                  /*leaky=*/false, seed);
  net.add(std::make_unique<Linear>("output", features, classes, ++seed, output_init(c)));
  net.layers().front()->set_input_grad(false);
  return m;
}

// A decoder-only Transformer (GPT-2's layout): token and position embeddings; `depth` pre-norm
// blocks, x + attention(ln1(x)) then x + mlp(ln2(x)) with a 4x GELU MLP; a final LayerNorm; logits
// from the token embedding (tied). Weights start N(0, 0.02), the projections back into the
// residual stream N(0, 0.02 / sqrt(2 depth)), biases 0; dropout (model.dropout) after the
// embeddings and each block's two branches.
std::unique_ptr<Model> transformer(const ModelConfig& c) {
  if (c.vocab_size < 1)
    throw ConfigError("dataset.vocabSize", "required for model transformer (the token ids' vocabulary)");
  if (c.context < 1) throw ConfigError("model.context", "must be positive");
  if (c.width < 1) throw ConfigError("model.width", "must be positive");
  if (c.depth < 1) throw ConfigError("model.depth", "must be positive");
  if (c.heads < 1 || c.width % c.heads != 0)
    throw ConfigError("model.heads", detail::concat(c.heads, " heads must divide model.width ", c.width));
  const int T = c.context, D = c.width;
  auto m = std::make_unique<SequentialModel>("transformer", Task::kClassification, Shape{T}, Shape{T});
  Sequential& net = m->net();
  uint64_t seed = c.seed * 1000;
  const float stddev = 0.02f, residual_stddev = static_cast<float>(0.02 / std::sqrt(2.0 * c.depth));
  auto linear = [&](Sequential& s, const std::string& name, int in, int out, float sd) {
    auto& l = static_cast<Linear&>(s.add(std::make_unique<Linear>(name, in, out, ++seed)));
    init_normal(l.weight().value, sd, ++seed);
    l.bias().value.zero();
  };
  auto dropout = [&](Sequential& s, const std::string& name) {
    if (c.dropout > 0) s.add(std::make_unique<Dropout>(name, c.dropout, ++seed));
  };
  auto& embed =
      static_cast<Embedding&>(net.add(std::make_unique<Embedding>("embed", c.vocab_size, T, D, ++seed, stddev)));
  ++seed;
  dropout(net, "embed.dropout");
  for (int b = 1; b <= c.depth; ++b) {
    const std::string n = "block" + std::to_string(b);
    auto& attn = static_cast<Residual&>(net.add(std::make_unique<Residual>(n + ".attention")));
    attn.body().add(std::make_unique<LayerNorm>(n + ".ln1", D));
    linear(attn.body(), n + ".qkv", D, 3 * D, stddev);
    attn.body().add(std::make_unique<CausalAttention>(n + ".attn", T, D, c.heads));
    linear(attn.body(), n + ".attn_proj", D, D, residual_stddev);
    dropout(attn.body(), n + ".attn_dropout");
    auto& mlp = static_cast<Residual&>(net.add(std::make_unique<Residual>(n + ".mlp")));
    mlp.body().add(std::make_unique<LayerNorm>(n + ".ln2", D));
    linear(mlp.body(), n + ".fc", D, 4 * D, stddev);
    mlp.body().add(std::make_unique<GELU>(n + ".gelu"));
    linear(mlp.body(), n + ".mlp_proj", 4 * D, D, residual_stddev);
    dropout(mlp.body(), n + ".mlp_dropout");
  }
  net.add(std::make_unique<LayerNorm>("ln_f", D));
  net.add(std::make_unique<TiedOutput>("output", embed.token()));
  net.layers().front()->set_input_grad(false);
  return m;
}

// ResNet-50 v1.5 (torchvision's resnet50, the layer names its own): a 7x7 stride-2 convolution,
// BatchNorm, ReLU and 3x3 stride-2 max-pooling; four stages of 3, 4, 6 and 3 bottleneck blocks of
// widths base, 2 base, 4 base and 8 base (base 64), each block 1x1 -> 3x3 (the stage's stride 2 here,
// as v1.5 puts it) -> 1x1 to 4x the width with BatchNorm after every convolution, its shortcut a
// strided 1x1 projection with BatchNorm where the shape changes, ReLU after the sum; global average
// pooling and a fully connected layer to the classes. Convolutions have no bias (BatchNorm's beta
// takes its place). Inputs are C x W^2 with W a multiple of 32.
std::unique_ptr<Model> resnet50(const ModelConfig& c) {
  if (c.input_size < 32 || c.input_size % 32)
    throw ConfigError("model.inputSize",
                      detail::concat(c.input_size, ": resnet50 needs a multiple of 32 (its stride)"));
  const int in_ch = c.in_channels ? c.in_channels : 3, base = c.base_channels ? c.base_channels : 64;
  const int classes = c.outputs ? c.outputs : 1000, W = c.input_size;
  auto m = std::make_unique<SequentialModel>("resnet50", Task::kClassification, Shape{in_ch, W, W}, Shape{});
  Sequential& net = m->net();
  uint64_t seed = c.seed * 1000;
  // Unless the manifest says otherwise, convolutions start as torchvision's: He normal over the fan-out.
  ParamInit conv_init = c.init;
  if (conv_init.weights == ParamInit::Weights::kDefault) {
    conv_init.weights = ParamInit::Weights::kHeNormal;
    conv_init.fan = ParamInit::Fan::kOut;
  }
  auto conv = [&](Sequential& s, const std::string& name, int in, int out, int k, int stride) {
    ConvOptions o{in, out, k, stride, k / 2, 2, false, ++seed};
    o.init = conv_init;
    s.add(std::make_unique<Conv>(name, o));
  };
  auto bn = [&](Sequential& s, const std::string& name, int channels) {
    s.add(std::make_unique<BatchNorm>(name, channels));
  };
  conv(net, "conv1", in_ch, base, 7, 2);
  bn(net, "bn1", base);
  net.add(std::make_unique<ReLU>("relu"));
  net.add(std::make_unique<Pool>("maxpool", PoolOptions{true, 3, 2, 1, 2}));
  int in = base;
  const int blocks[4] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const int width = base << stage, out = 4 * width;
    for (int b = 0; b < blocks[stage]; ++b) {
      const int stride = b == 0 && stage > 0 ? 2 : 1;
      const std::string n = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      auto& block = static_cast<Residual&>(net.add(std::make_unique<Residual>(n)));
      conv(block.body(), n + ".conv1", in, width, 1, 1);
      bn(block.body(), n + ".bn1", width);
      block.body().add(std::make_unique<ReLU>(n + ".relu1"));
      conv(block.body(), n + ".conv2", width, width, 3, stride);
      bn(block.body(), n + ".bn2", width);
      block.body().add(std::make_unique<ReLU>(n + ".relu2"));
      conv(block.body(), n + ".conv3", width, out, 1, 1);
      bn(block.body(), n + ".bn3", out);
      if (stride != 1 || in != out) {
        conv(block.shortcut(), n + ".downsample.0", in, out, 1, stride);
        bn(block.shortcut(), n + ".downsample.1", out);
      }
      net.add(std::make_unique<ReLU>(n + ".relu"));
      in = out;
    }
  }
  net.add(std::make_unique<Pool>("avgpool", PoolOptions{false, W / 32, 1, 0, 2}));
  net.add(std::make_unique<Flatten>("flatten"));
  net.add(std::make_unique<Linear>("fc", in, classes, ++seed, c.init));
  net.layers().front()->set_input_grad(false);
  return m;
}

// 3D U-Net with three levels: (conv k3 + BN + ReLU) x 2 per level, max-pool 2 down, deconv k2 s2 up,
// skip connections concatenated on channels, a 1x1x1 conv to the class logits.
class UNet3D final : public Model {
 public:
  UNet3D(const ModelConfig& c, Communicator* spatial) {
    if (c.input_size < 4 || c.input_size % 4)
      throw ConfigError("model.inputSize", detail::concat(c.input_size, ": unet3d needs a multiple of 4"));
    in_ch_ = c.in_channels ? c.in_channels : 1;
    const int b = c.base_channels ? c.base_channels : 8;
    classes_ = c.outputs ? c.outputs : 3;
    W_ = c.input_size;
    const bool split = c.spatial.size() > 1;
    if (split && (!spatial || spatial->size() != c.spatial.size()))
      throw ConfigError("parallelism.spatial",
                        detail::concat("a grid of ", c.spatial.size(), " ranks needs a spatial group of that size"));
    SpatialContext ctx{spatial, c.spatial};
    uint64_t seed = c.seed * 1000;
    using Extent = std::array<int64_t, 3>;
    const Extent e1 = {W_, W_, W_}, e2 = {W_ / 2, W_ / 2, W_ / 2}, e3 = {W_ / 4, W_ / 4, W_ / 4};
    auto conv = [&](const std::string& n, ConvOptions o, Extent e) -> std::unique_ptr<Layer> {
      o.init = c.init;
      if (split) return std::make_unique<DistConv>(n, o, ctx, e);
      return std::make_unique<Conv>(n, o);
    };
    auto double_conv = [&](Sequential& s, const std::string& name, int in, int out, Extent e) {
      for (int i = 0; i < 2; ++i) {
        const std::string n = name + ".conv" + std::to_string(i + 1);
        s.add(conv(n, ConvOptions{i ? out : in, out, 3, 1, 1, 3, false, ++seed}, e));
        auto& bn = static_cast<BatchNorm&>(s.add(std::make_unique<BatchNorm>(n + ".bn", out)));
        if (split) bn.set_stats_reducer(spatial_batchnorm_reducer(*spatial));
        s.add(std::make_unique<ReLU>(n + ".relu"));
      }
    };
    auto pool = [&](Sequential& s, const std::string& n, Extent e) {
      const PoolOptions o{true, 2, 2, 0, 3};
      if (split) {
        s.add(std::make_unique<DistPool>(n, o, ctx, e));
      } else {
        s.add(std::make_unique<Pool>(n, o));
      }
    };
    auto up = [&](Sequential& s, const std::string& n, int in, int out, Extent e) {
      ConvOptions o{in, out, 2, 2, 0, 3, true, ++seed};
      o.init = c.init;
      if (split) {
        s.add(std::make_unique<DistDeconv>(n, o, ctx, e));
      } else {
        s.add(std::make_unique<Deconv>(n, o));
      }
    };
    double_conv(enc1_, "enc1", in_ch_, b, e1);
    pool(pool1_, "pool1", e1);
    double_conv(enc2_, "enc2", b, 2 * b, e2);
    pool(pool2_, "pool2", e2);
    double_conv(bottom_, "bottom", 2 * b, 4 * b, e3);
    up(up2_, "up2", 4 * b, 2 * b, e3);
    double_conv(dec2_, "dec2", 4 * b, 2 * b, e2);
    up(up1_, "up1", 2 * b, b, e2);
    double_conv(dec1_, "dec1", 2 * b, b, e1);
    head_.add(conv("head", ConvOptions{b, classes_, 1, 1, 0, 3, true, ++seed}, e1));
    enc1_.layers().front()->set_input_grad(false);
    skip1_ = b;
    skip2_ = 2 * b;
    if (split) partition_ = std::make_unique<Partition>(e1, c.spatial, spatial->rank(), "parallelism.spatial");
  }
  const Partition* input_partition() const override { return partition_.get(); }
  double loss_share(int64_t n) const override {
    if (!partition_) return Model::loss_share(n);
    double share = 1;
    for (int d = 0; d < 3; ++d) share *= static_cast<double>(partition_->owned(d).size()) / partition_->extent()[d];
    return share;
  }
  const std::string& name() const override { return name_; }
  Task task() const override { return Task::kSegmentation; }
  Shape sample_shape() const override { return {in_ch_, W_, W_, W_}; }
  Shape target_shape() const override { return {W_, W_, W_}; }

  Tensor forward(const Tensor& x, bool training) override {
    Tensor s1 = enc1_.forward(x, training);
    Tensor s2 = enc2_.forward(pool1_.forward(s1, training), training);
    Tensor h = bottom_.forward(pool2_.forward(s2, training), training);
    h = dec2_.forward(concat_channels(s2, up2_.forward(h, training)), training);
    h = dec1_.forward(concat_channels(s1, up1_.forward(h, training)), training);
    return head_.forward(h, training);
  }

  Tensor backward(const Tensor& dy, const GradReady* r) override {
    Tensor ds1, du1, ds2, du2;
    split_channels(dec1_.backward(head_.backward(dy, r), r), skip1_, ds1, du1);
    split_channels(dec2_.backward(up1_.backward(du1, r), r), skip2_, ds2, du2);
    Tensor g = pool2_.backward(bottom_.backward(up2_.backward(du2, r), r), r);
    add_into(g, ds2);
    g = pool1_.backward(enc2_.backward(g, r), r);
    add_into(g, ds1);
    return enc1_.backward(g, r);
  }

  std::vector<Param*> params() override {
    std::vector<Param*> out;
    for (Sequential* s : parts())
      for (Param* p : s->params()) out.push_back(p);
    return out;
  }
  std::vector<Layer*> layers() override {
    std::vector<Layer*> out;
    for (Sequential* s : parts())
      for (auto& l : s->layers()) out.push_back(l.get());
    return out;
  }
  std::vector<cost::LayerCost> cost_layers() const override {
    Shape in = {1, in_ch_, W_, W_, W_};
    if (partition_)
      for (int d = 0; d < 3; ++d)
        in[2 + d] = partition_->owned(d).size();  // this rank's block (with halos in the layers)
    std::vector<cost::LayerCost> out;
    auto add = [&](const Sequential& part, const Shape& x) {  // returns the part's output shape
      for (const cost::LayerCost& c : part.cost_layers(x)) out.push_back(c);
      return part.output_shape(x);
    };
    const int b = skip1_;
    const Shape p1 = add(pool1_, add(enc1_, in));
    const Shape p2 = add(pool2_, add(enc2_, p1));
    Shape u2 = add(up2_, add(bottom_, p2));
    u2[1] = 4 * b;  // the skip connection's channels joined
    Shape u1 = add(up1_, add(dec2_, u2));
    u1[1] = 2 * b;
    add(head_, add(dec1_, u1));
    return out;
  }

 private:
  std::vector<Sequential*> parts() {
    return {&enc1_, &pool1_, &enc2_, &pool2_, &bottom_, &up2_, &dec2_, &up1_, &dec1_, &head_};
  }

  std::string name_ = "unet3d";
  int in_ch_ = 1, classes_ = 3, W_ = 32, skip1_ = 8, skip2_ = 16;
  std::unique_ptr<Partition> partition_;
  Sequential enc1_, pool1_, enc2_, pool2_, bottom_, up2_, dec2_, up1_, dec1_, head_;
};

}  // namespace

void check_spatial_grid(const ModelConfig& c) {
  if (c.spatial.size() <= 1 || !supports_spatial(c.name)) return;
  const bool cosmo = c.name == "cosmoflow";
  const int64_t smallest = cosmo ? std::min<int64_t>(4, c.input_size) : c.input_size / 4;
  const char* layer = cosmo ? "shuffle" : "bottom.conv1";
  static const char* kDim[] = {"d", "h", "w"};
  for (int d = 0; d < 3; ++d)
    if (c.spatial[d] > smallest)
      throw ConfigError(detail::concat("parallelism.spatial.", kDim[d]),
                        detail::concat(c.spatial[d], " parts, but ", c.name, " with inputSize ", c.input_size,
                                       " splits volumes down to ", smallest, "^3 (model.layers.", layer, "): at most ",
                                       smallest, " parts in each dimension"));
}

std::vector<int> hidden_widths(const ModelConfig& c) {
  if (!c.hidden.empty()) return c.hidden;
  if (c.name == "cosmoflow") return {2048, 256};
  if (c.name == "cnn2d") return {128};
  return {};
}

std::unique_ptr<Model> make_model(const ModelConfig& c, Communicator* spatial) {
  if (c.in_channels < 0) throw ConfigError("model.inChannels", "must not be negative");
  if (c.base_channels < 0) throw ConfigError("model.baseChannels", "must not be negative");
  if (c.outputs < 0) throw ConfigError("model.outputs", "must not be negative");
  if (c.spatial.size() > 1 && !supports_spatial(c.name))
    throw ConfigError("parallelism.spatial", "spatial parallelism splits 3D volumes (cosmoflow and unet3d); '" +
                                                 c.name + "' runs data-parallel");
  if (c.label_smoothing < 0 || c.label_smoothing >= 1)
    throw ConfigError("training.labelSmoothing", detail::concat(c.label_smoothing, " is outside [0, 1)"));
  std::unique_ptr<Model> m;
  if (c.name == "cosmoflow") m = cosmoflow(c, spatial);
  else if (c.name == "cnn2d") m = cnn2d(c);
  else if (c.name == "unet3d") m = std::make_unique<UNet3D>(c, spatial);
  else if (c.name == "transformer") m = transformer(c);
  else if (c.name == "resnet50") m = resnet50(c);
  else
    throw ConfigError("model.name",
                      "unknown model '" + c.name + "' (expected cosmoflow, unet3d, cnn2d, resnet50 or transformer)");
  if (c.label_smoothing > 0 && m->task() == Task::kRegression)
    throw ConfigError("training.labelSmoothing",
                      "applies to classifiers' cross-entropy; " + c.name + " is a regression");
  m->set_label_smoothing(c.label_smoothing);
  if (c.precision == Precision::kBf16) require_bf16_cpu();
  for (Layer* l : m->layers()) l->set_precision(c.precision);
  return m;
}

}  // namespace tessera
