// Whole models: shapes, configuration errors, and gradients of the full network (loss included)
// against central finite differences on sampled parameters. The forward runs in float32 through
// every layer, so the loss differences carry rounding noise: measured errors are 2e-3 to 5e-3 and
// the tolerance is 1e-2 (the per-layer tests in nn_layers_test hold 1e-3).
#include "worker/models/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "common/error.h"
#include "worker/data/dataset.h"
#include "worker/nn/optim.h"

namespace tessera {
namespace {

double model_gradient_error(Model& m, const Tensor& x, const Tensor& y) {
  for (Param* p : m.params()) p->grad.zero();
  Tensor out = m.forward(x, true);
  m.backward(m.loss(out, y).grad);
  std::mt19937 rng(5);
  double num = 0, den = 0;
  const float eps = 2e-3f;
  for (Param* p : m.params()) {
    for (int s = 0; s < 3; ++s) {
      const int64_t i = static_cast<int64_t>(rng() % p->value.numel());
      const float keep = p->value[i];
      p->value[i] = keep + eps;
      const double lp = m.loss(m.forward(x, true), y).loss;
      p->value[i] = keep - eps;
      const double lm = m.loss(m.forward(x, true), y).loss;
      p->value[i] = keep;
      const double fd = (lp - lm) / (2 * eps);
      num += (fd - p->grad[i]) * (fd - p->grad[i]);
      den += fd * fd;
    }
  }
  return std::sqrt(num / den);
}

TEST(ModelsTest, CosmoFlowShapesAndGradients) {
  ModelConfig c;
  c.input_size = 16;
  c.base_channels = 4;
  c.hidden = {16, 8};
  auto m = make_model(c);
  EXPECT_EQ(m->sample_shape(), (Shape{4, 16, 16, 16}));
  EXPECT_EQ(m->target_shape(), (Shape{4}));
  EXPECT_EQ(m->task(), Task::kRegression);
  auto data = make_synthetic({"cosmo", 16, 4, 1});
  Batch b = stack(*data, {0, 1});
  EXPECT_EQ(m->forward(b.inputs, false).shape(), (Shape{2, 4}));
  const double e = model_gradient_error(*m, b.inputs, b.targets);
  std::printf("cosmoflow gradient rel. error %.2e\n", e);
  EXPECT_LT(e, 1e-2);
}

TEST(ModelsTest, UNet3DShapesAndGradients) {
  ModelConfig c;
  c.name = "unet3d";
  c.input_size = 8;
  c.base_channels = 2;
  auto m = make_model(c);
  EXPECT_EQ(m->sample_shape(), (Shape{1, 8, 8, 8}));
  auto data = make_synthetic({"shapes", 8, 4, 1});
  Batch b = stack(*data, {0, 1});
  Tensor out = m->forward(b.inputs, false);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 8, 8, 8}));
  EXPECT_GT(m->forward_flops(), 0);
  const double e = model_gradient_error(*m, b.inputs, b.targets);
  std::printf("unet3d gradient rel. error %.2e\n", e);
  EXPECT_LT(e, 1e-2);
}

// A small Transformer: its parameters are the embeddings, 12 D^2 + 13 D a block and the final
// LayerNorm (the output shares the token embedding); the whole network's gradients, loss included,
// match finite differences; and a position's logits depend on no later token.
TEST(ModelsTest, TransformerShapesParametersAndGradients) {
  ModelConfig c;
  c.name = "transformer";
  c.vocab_size = 11;
  c.context = 6;
  c.width = 8;
  c.depth = 2;
  c.heads = 2;
  auto m = make_model(c);
  EXPECT_EQ(m->sample_shape(), (Shape{6}));
  EXPECT_EQ(m->target_shape(), (Shape{6}));
  EXPECT_EQ(m->num_params(), 11 * 8 + 6 * 8 + 2 * (12 * 8 * 8 + 13 * 8) + 2 * 8);
  c.vocab_size = 256;
  c.context = 256;
  c.width = 512;
  c.depth = 8;
  c.heads = 8;
  EXPECT_EQ(make_model(c)->num_params(), 25482240);  // the "about 25M parameters at context 256"
  Tensor x({2, 6}), y({2, 6});
  for (int64_t i = 0; i < 12; ++i) {
    x[i] = static_cast<float>((i * 7 + 3) % 11);
    y[i] = static_cast<float>((i * 5 + 1) % 11);
  }
  const Tensor out = m->forward(x, false);
  EXPECT_EQ(out.shape(), (Shape{12, 11}));
  EXPECT_GT(m->forward_flops(), 0);
  Tensor later = x.clone();
  later[4] = static_cast<float>((static_cast<int>(later[4]) + 1) % 11);
  const Tensor out2 = m->forward(later, false);
  for (int64_t i = 0; i < 12 * 11; ++i)
    if (i / 11 < 4 || i / 11 >= 6) {
      EXPECT_EQ(out[i], out2[i]) << "row " << i / 11;
    }
  // Spread the initial weights so the gradients are not all tiny.
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (Param* p : m->params())
    if (p->decay)
      for (auto& v : p->value.span()) v = n(rng);
  const double e = model_gradient_error(*m, x, y);
  std::printf("transformer gradient rel. error %.2e\n", e);
  EXPECT_LT(e, 1e-2);
  for (const char* field : {"dataset.vocabSize", "model.heads"}) {
    ModelConfig bad = c;
    if (std::string(field) == "dataset.vocabSize") bad.vocab_size = 0;
    else bad.heads = 7;
    try {
      make_model(bad);
      ADD_FAILURE() << field;
    } catch (const ConfigError& err) {
      EXPECT_EQ(err.field(), field);
    }
  }
}

// ResNet-50 v1.5: torchvision's resnet50 has 25,557,032 parameters and so must this one; a narrow
// one (base 4) at 64^2 gives one logit row per image and fits a batch.
TEST(ModelsTest, ResNet50ParametersShapesAndFit) {
  ModelConfig c;
  c.name = "resnet50";
  c.input_size = 224;
  {
    ShapeOnlyTensors shapes_only;
    EXPECT_EQ(make_model(c)->num_params(), 25557032);
  }
  c.input_size = 64;
  c.base_channels = 4;
  c.outputs = 5;
  auto m = make_model(c);
  EXPECT_EQ(m->sample_shape(), (Shape{3, 64, 64}));
  SyntheticConfig sc{"images", 64, 4, 1, 5};
  sc.channels = 3;
  auto data = make_synthetic(sc);
  Batch b = stack(*data, {0, 1, 2, 3});
  EXPECT_EQ(b.inputs.shape(), (Shape{4, 3, 64, 64}));
  EXPECT_EQ(m->forward(b.inputs, false).shape(), (Shape{4, 5}));
  EXPECT_GT(m->forward_flops(), 0);
  // Training steps on one batch lower its loss. (Whole-network finite differences are no test here:
  // with ReLU after BatchNorm over 4 samples, a perturbation moves activations across the kinks; the
  // layers, and a bottleneck block with a smooth activation, are checked in nn_layers_test.)
  auto opt = make_optimizer(OptimizerConfig{});
  double first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    for (Param* p : m->params()) p->grad.zero();
    const LossResult l = m->loss(m->forward(b.inputs, true), b.targets);
    m->backward(l.grad);
    opt->step(m->params(), 0.05);
    (step == 0 ? first : last) = l.loss;
  }
  std::printf("resnet50 (base 4): loss on one batch %.4f -> %.4f in 8 steps\n", first, last);
  EXPECT_LT(last, 0.5 * first);
  // Its convolutions start as torchvision's, N(0, 2 / fan-out), unless the manifest says otherwise;
  // the classifier as PyTorch's Linear, U(-1/sqrt(fan-in), 1/sqrt(fan-in)).
  auto spread = [](const Param& p) {
    double s = 0;
    for (float v : p.value.span()) s += double(v) * v;
    return std::sqrt(s / p.value.numel());
  };
  auto param = [](Model& model, const std::string& name) -> Param& {
    for (Param* p : model.params())
      if (p->name == name) return *p;
    throw std::runtime_error("no parameter " + name);
  };
  c.base_channels = 16;
  auto fresh = make_model(c);
  // layer1.0.conv3: 1x1 from 16 to 64 channels (fan-out 64); conv2: 3x3 of 16 (fan-out 144).
  EXPECT_NEAR(spread(param(*fresh, "layer1.0.conv3.weight")), std::sqrt(2.0 / 64), 0.05 * std::sqrt(2.0 / 64));
  EXPECT_NEAR(spread(param(*fresh, "layer1.0.conv2.weight")), std::sqrt(2.0 / 144), 0.05 * std::sqrt(2.0 / 144));
  const Param& fc = param(*fresh, "fc.weight");
  const double bound = 1.0 / std::sqrt(64.0 * 8);  // 8 x base x 4 = 512 inputs
  for (float v : fc.value.span()) EXPECT_LE(std::fabs(v), bound);
  EXPECT_NEAR(spread(fc), bound / std::sqrt(3.0), 0.1 * bound);
  ModelConfig uniform = c;
  uniform.init.weights = ParamInit::Weights::kUniform;
  auto u = make_model(uniform);
  for (float v : param(*u, "layer1.0.conv3.weight").value.span()) EXPECT_LE(std::fabs(v), 1.0 / std::sqrt(16.0));
  c.base_channels = 4;
  c.input_size = 48;
  try {
    make_model(c);
    ADD_FAILURE() << "48 is not a multiple of 32";
  } catch (const ConfigError& err) {
    EXPECT_EQ(err.field(), "model.inputSize");
  }
}

TEST(ModelsTest, Cnn2dLearnsOrientedGratings) {
  ModelConfig c;
  c.name = "cnn2d";
  c.input_size = 16;
  c.outputs = 4;
  auto m = make_model(c);
  auto data = make_synthetic({"images", 16, 512, 1, 4});
  OptimizerConfig oc;
  oc.name = "adam";
  auto opt = make_optimizer(oc);
  auto params = m->params();
  for (int epoch = 0; epoch < 3; ++epoch) {
    auto order = epoch_order(data->size(), 1, epoch);
    for (int64_t s = 0; s < 32; ++s) {
      Batch b = stack(*data, shard_batch(order, s, 16, 0, 1));
      for (Param* p : params) p->grad.zero();
      m->backward(m->loss(m->forward(b.inputs, true), b.targets).grad);
      opt->step(params, 2e-3);
    }
  }
  auto val = make_synthetic({"images", 16, 128, 99, 4});
  std::vector<uint64_t> idx(128);
  std::iota(idx.begin(), idx.end(), 0);
  Batch v = stack(*val, idx);
  const double acc = m->metric(m->forward(v.inputs, false), v.targets);
  std::printf("cnn2d validation accuracy %.3f (chance 0.25)\n", acc);
  EXPECT_GT(acc, 0.6);
}

// The large-gradient model of the exchange benchmarks: cnn2d with wide hidden layers holds ResNet-50's
// gradient volume (PyTorch's copy in bench/torch/torch_ddp.py counts the same 25,201,546 parameters), and
// its default is still the small one.
TEST(ModelsTest, Cnn2dWithWideHiddenLayersIsTheLargeGradientModel) {
  ModelConfig c;
  c.name = "cnn2d";
  c.input_size = 64;
  c.base_channels = 32;
  c.hidden = {1536};
  auto m = make_model(c);
  EXPECT_EQ(m->num_params(), 25201546);
  ModelConfig small;
  small.name = "cnn2d";
  small.input_size = 64;
  small.base_channels = 32;
  EXPECT_EQ(make_model(small)->num_params(), 16384 * 128 + 128 + 128 * 10 + 10 + 32 * 9 + 32 + 64 * 32 * 9 + 64);
}

TEST(ModelsTest, ConfigurationErrors) {
  auto field = [](ModelConfig c) {
    try {
      make_model(c);
    } catch (const ConfigError& e) {
      return e.field();
    }
    return std::string("accepted");
  };
  ModelConfig c;
  c.input_size = 24;
  EXPECT_EQ(field(c), "model.inputSize");
  c = ModelConfig{};
  c.hidden = {0};
  EXPECT_EQ(field(c), "model.hidden[0]");
  c = ModelConfig{};
  c.name = "unet3d";
  c.input_size = 10;
  EXPECT_EQ(field(c), "model.inputSize");
  c.name = "vgg";
  EXPECT_EQ(field(c), "model.name");
}

TEST(ModelsTest, SpatialGridsAreCheckedWithoutBuildingTheModel) {
  auto problem = [](const std::string& name, int size, SpatialGrid grid) -> std::string {
    ModelConfig c;
    c.name = name;
    c.input_size = size;
    c.spatial = grid;
    try {
      check_spatial_grid(c);
    } catch (const ConfigError& e) {
      return e.problems().front().field + ": " + e.problems().front().reason;
    }
    return "fits";
  };
  EXPECT_EQ(problem("unet3d", 8, {2, 1, 1}), "fits");
  EXPECT_EQ(problem("unet3d", 8, {4, 1, 1}),
            "parallelism.spatial.d: 4 parts, but unet3d with inputSize 8 splits volumes down to 2^3 "
            "(model.layers.bottom.conv1): "
            "at most 2 parts in each dimension");
  EXPECT_EQ(problem("cosmoflow", 64, {2, 2, 4}), "fits");
  EXPECT_EQ(problem("cosmoflow", 64, {1, 1, 8}).substr(0, 24), "parallelism.spatial.w: 8");
}

}  // namespace
}  // namespace tessera
