// Every layer: forward against a naive reference on small odd shapes (conv, deconv, pooling), and
// backward against central finite differences of L = sum(forward(x) * r), accumulated in double.
// Tolerance: relative L2 error below 1e-3 for every layer's input and parameter gradients (the
// measured errors are printed per layer; they are 1e-6 to 3e-5). Max pooling and ReLU get inputs
// spaced 0.05 apart and away from 0, so the eps = 1e-2 perturbation never crosses a kink.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "common/error.h"
#include "worker/nn/batchnorm.h"
#include "worker/nn/conv.h"
#include "worker/nn/dnnl_util.h"
#include "worker/nn/elementwise.h"
#include "worker/nn/linear.h"
#include "worker/nn/loss.h"
#include "worker/nn/pool.h"
#include "worker/nn/transformer.h"

namespace tessera {
namespace {

Tensor random_tensor(Shape s, uint32_t seed, float scale = 1.0f) {
  Tensor t(std::move(s));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (auto& v : t.span()) v = u(rng);
  return t;
}

// Distinct values spaced 0.05 apart in random order, so small perturbations never change a max.
Tensor distinct_tensor(Shape s, uint32_t seed) {
  Tensor t(std::move(s));
  std::vector<int64_t> order(t.numel());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (int64_t i = 0; i < t.numel(); ++i)
    t[i] = 0.05f * static_cast<float>(order[i] - t.numel() / 2) + 0.025f;  // never 0 (ReLU kink)
  return t;
}

double weighted_sum(const Tensor& y, const Tensor& r) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += double(y[i]) * r[i];
  return s;
}

// Relative L2 error between the analytic gradient and central differences on up to 40 entries.
double fd_error(const std::function<double()>& loss, Tensor& v, const Tensor& analytic, float eps = 1e-2f) {
  std::mt19937 rng(3);
  double num = 0, den = 0;
  const int64_t samples = std::min<int64_t>(40, v.numel());
  for (int64_t s = 0; s < samples; ++s) {
    int64_t i = v.numel() <= 40 ? s : static_cast<int64_t>(rng() % v.numel());
    const float keep = v[i];
    v[i] = keep + eps;
    double lp = loss();
    v[i] = keep - eps;
    double lm = loss();
    v[i] = keep;
    double fd = (lp - lm) / (2 * eps);
    num += (fd - analytic[i]) * (fd - analytic[i]);
    den += fd * fd;
  }
  return std::sqrt(num / std::max(den, 1e-12));
}

// Checks dx and every parameter gradient of `layer` at input x (its output read as plain: a layer
// that takes either layout may answer channels-last).
void check_gradients(Layer& layer, Tensor x, double tol = 1e-3) {
  Tensor y = dnnl_util::to_layout(layer.forward(x, true), Layout::kPlain);
  Tensor r = random_tensor(y.shape(), 99);
  for (Param* p : layer.params()) p->grad.zero();
  Tensor dx = layer.backward(r);
  std::vector<Tensor> grads;
  for (Param* p : layer.params()) grads.push_back(p->grad.clone());
  auto loss = [&] { return weighted_sum(dnnl_util::to_layout(layer.forward(x, true), Layout::kPlain), r); };
  double ex = fd_error(loss, x, dx);
  std::printf("  %-12s dx rel. error %.2e", layer.name().c_str(), ex);
  EXPECT_LT(ex, tol) << layer.name() << " input gradient";
  auto ps = layer.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    double e = fd_error(loss, ps[i]->value, grads[i]);
    std::printf("  %s %.2e", ps[i]->name.c_str(), e);
    EXPECT_LT(e, tol) << ps[i]->name;
  }
  std::printf("\n");
}

// ---- naive references ----

// 3D (or 2D with D = 1) convolution, all sides padded by p.
Tensor naive_conv(const Tensor& x, const Tensor& w, const Tensor& b, int s, int p, bool three_d) {
  const int64_t n = x.dim(0), ci = x.dim(1), co = w.dim(0), k = w.dim(2);
  const int64_t D = three_d ? x.dim(2) : 1, H = x.dim(three_d ? 3 : 2), W = x.dim(three_d ? 4 : 3);
  const int64_t kd = three_d ? k : 1, pd = three_d ? p : 0, sd = three_d ? s : 1;
  const int64_t OD = (D + 2 * pd - kd) / sd + 1, OH = (H + 2 * p - k) / s + 1, OW = (W + 2 * p - k) / s + 1;
  Shape os = three_d ? Shape{n, co, OD, OH, OW} : Shape{n, co, OH, OW};
  Tensor y = Tensor::zeros(os);
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t o = 0; o < co; ++o)
      for (int64_t od = 0; od < OD; ++od)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            double acc = b.empty() ? 0.0 : b[o];
            for (int64_t c = 0; c < ci; ++c)
              for (int64_t a = 0; a < kd; ++a)
                for (int64_t bb = 0; bb < k; ++bb)
                  for (int64_t cc = 0; cc < k; ++cc) {
                    int64_t id = od * sd - pd + a, ih = oh * s - p + bb, iw = ow * s - p + cc;
                    if (id < 0 || id >= D || ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                    acc += double(x[(((b0 * ci + c) * D + id) * H + ih) * W + iw]) *
                           w[(((o * ci + c) * kd + a) * k + bb) * k + cc];
                  }
            y[(((b0 * co + o) * OD + od) * OH + oh) * OW + ow] = static_cast<float>(acc);
          }
  return y;
}

// 3D transposed convolution: y[o][i*s - p + a] += x[c][i] * w[o][c][a].
Tensor naive_deconv(const Tensor& x, const Tensor& w, const Tensor& b, int s, int p) {
  const int64_t n = x.dim(0), ci = x.dim(1), co = w.dim(0), k = w.dim(2);
  const int64_t D = x.dim(2), H = x.dim(3), W = x.dim(4);
  const int64_t OD = (D - 1) * s - 2 * p + k, OH = (H - 1) * s - 2 * p + k, OW = (W - 1) * s - 2 * p + k;
  std::vector<double> acc(n * co * OD * OH * OW, 0.0);
  for (int64_t b0 = 0; b0 < n; ++b0)
    for (int64_t c = 0; c < ci; ++c)
      for (int64_t id = 0; id < D; ++id)
        for (int64_t ih = 0; ih < H; ++ih)
          for (int64_t iw = 0; iw < W; ++iw)
            for (int64_t o = 0; o < co; ++o)
              for (int64_t a = 0; a < k; ++a)
                for (int64_t bb = 0; bb < k; ++bb)
                  for (int64_t cc = 0; cc < k; ++cc) {
                    int64_t od = id * s - p + a, oh = ih * s - p + bb, ow = iw * s - p + cc;
                    if (od < 0 || od >= OD || oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                    acc[(((b0 * co + o) * OD + od) * OH + oh) * OW + ow] +=
                        double(x[(((b0 * ci + c) * D + id) * H + ih) * W + iw]) *
                        w[(((o * ci + c) * k + a) * k + bb) * k + cc];
                  }
  Tensor y({n, co, OD, OH, OW});
  for (int64_t i = 0; i < y.numel(); ++i) y[i] = static_cast<float>(acc[i] + b[(i / (OD * OH * OW)) % co]);
  return y;
}

Tensor naive_pool3d(const Tensor& x, int k, int s, int p, bool max) {
  const int64_t n = x.dim(0), c = x.dim(1), D = x.dim(2), H = x.dim(3), W = x.dim(4);
  const int64_t OD = (D + 2 * p - k) / s + 1, OH = (H + 2 * p - k) / s + 1, OW = (W + 2 * p - k) / s + 1;
  Tensor y({n, c, OD, OH, OW});
  int64_t out = 0;
  for (int64_t i = 0; i < n * c; ++i)
    for (int64_t od = 0; od < OD; ++od)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double best = -1e30, sum = 0;
          int cnt = 0;
          for (int a = 0; a < k; ++a)
            for (int b = 0; b < k; ++b)
              for (int e = 0; e < k; ++e) {
                int64_t id = od * s - p + a, ih = oh * s - p + b, iw = ow * s - p + e;
                if (id < 0 || id >= D || ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                float v = x[((i * D + id) * H + ih) * W + iw];
                best = std::max(best, double(v));
                sum += v;
                ++cnt;
              }
          y[out++] = static_cast<float>(max ? best : sum / cnt);
        }
  return y;
}

void expect_close(const Tensor& a, const Tensor& b, double tol) {
  ASSERT_EQ(a.shape(), b.shape());
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(b[i])));
  EXPECT_LT(worst, tol);
}

// ---- forward against references ----

TEST(NnForward, Conv3dMatchesNaiveOnOddShapes) {
  for (int s : {1, 2})
    for (int p : {0, 1}) {
      SCOPED_TRACE("stride " + std::to_string(s) + " pad " + std::to_string(p));
      Conv conv("c", {3, 5, 3, s, p, 3, true, 7});
      conv.bias().value = random_tensor({5}, 5);
      Tensor x = random_tensor({2, 3, 7, 5, 9}, 1);
      expect_close(conv.forward(x, false), naive_conv(x, conv.weight().value, conv.bias().value, s, p, true), 1e-4);
    }
}

TEST(NnForward, Conv2dMatchesNaive) {
  Conv conv("c", {2, 4, 3, 1, 1, 2, true, 3});
  conv.bias().value = random_tensor({4}, 6);
  Tensor x = random_tensor({3, 2, 9, 7}, 2);
  expect_close(conv.forward(x, false), naive_conv(x, conv.weight().value, conv.bias().value, 1, 1, false), 1e-4);
}

TEST(NnForward, Deconv3dMatchesNaive) {
  for (int s : {1, 2}) {
    Deconv d("d", {4, 3, s == 2 ? 2 : 3, s, s == 2 ? 0 : 1, 3, true, 9});
    d.bias().value = random_tensor({3}, 8);
    Tensor x = random_tensor({2, 4, 3, 5, 3}, 3);
    expect_close(d.forward(x, false), naive_deconv(x, d.weight().value, d.bias().value, s, s == 2 ? 0 : 1), 1e-4);
  }
}

TEST(NnForward, Pool3dMatchesNaive) {
  Tensor x = random_tensor({2, 3, 7, 6, 5}, 4);
  for (bool max : {true, false})
    for (auto [k, s, p] : std::vector<std::tuple<int, int, int>>{{2, 2, 0}, {3, 2, 1}, {3, 1, 1}}) {
      SCOPED_TRACE(std::string(max ? "max" : "avg") + " k" + std::to_string(k));
      Pool pool("p", {max, k, s, p, 3});
      expect_close(pool.forward(x, false), naive_pool3d(x, k, s, p, max), 1e-6);
    }
}

// ---- backward against finite differences ----

TEST(NnBackward, Conv3d) {
  Conv c1("conv3d_s1", {2, 3, 3, 1, 1, 3, true, 1});
  check_gradients(c1, random_tensor({2, 2, 5, 4, 3}, 5));
  Conv c2("conv3d_s2", {2, 3, 3, 2, 1, 3, true, 2});
  check_gradients(c2, random_tensor({1, 2, 7, 5, 5}, 6));
}

// Few input channels, kernel 3, stride 1, padding 1 (a model's first layer): the weight gradient
// takes the direct kernel instead of oneDNN's, in either layout.
TEST(NnBackward, Conv3dDirectWeightGradient) {
  Conv c4("first", {4, 16, 3, 1, 1, 3, true, 3});
  check_gradients(c4, random_tensor({2, 4, 5, 6, 7}, 7));
  // Channels-last tensors give the same gradients as plain ones.
  const Tensor x = random_tensor({1, 4, 4, 3, 9}, 8);
  std::vector<Tensor> plain, last;
  for (bool cl : {false, true}) {
    for (Param* p : c4.params()) p->grad.zero();
    const Tensor y = c4.forward(cl ? dnnl_util::to_layout(x, Layout::kChannelsLast) : x, true);
    const Tensor dy = random_tensor(dnnl_util::to_layout(y, Layout::kPlain).shape(), 10);
    c4.backward(cl ? dnnl_util::to_layout(dy, Layout::kChannelsLast) : dy);
    for (Param* p : c4.params()) (cl ? last : plain).push_back(p->grad.clone());
  }
  for (size_t i = 0; i < plain.size(); ++i) expect_close(last[i], plain[i], 1e-5);
  Conv c1("first_1ch", {1, 8, 3, 1, 1, 3, true, 4});
  check_gradients(c1, random_tensor({2, 1, 6, 5, 4}, 9));
}

TEST(NnBackward, ConvWithFusedActivationIsConvThenActivation) {
  for (float slope : {0.0f, 0.3f}) {
    ConvOptions o{2, 3, 3, 1, 1, 3, true, 11};
    Conv plain("conv", o);
    LeakyReLU act("act", slope);
    o.activation = true;
    o.activation_slope = slope;
    Conv fused("conv_act", o);
    EXPECT_STREQ(fused.kind(), slope == 0.0f ? "conv+relu" : "conv+leaky_relu");
    Tensor x = random_tensor({2, 2, 4, 3, 5}, 40);
    Tensor y = act.forward(plain.forward(x, true), true), yf = fused.forward(x, true);
    Tensor dy = random_tensor(y.shape(), 41);
    Tensor dx = plain.backward(act.backward(dy)), dxf = fused.backward(dy);
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(yf[i], y[i], 1e-5f) << "slope " << slope;
    for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_NEAR(dxf[i], dx[i], 1e-5f) << "slope " << slope;
    for (size_t p = 0; p < 2; ++p)
      for (int64_t i = 0; i < plain.params()[p]->grad.numel(); ++i)
        ASSERT_NEAR(fused.params()[p]->grad[i], plain.params()[p]->grad[i], 1e-4f) << plain.params()[p]->name;
  }
  ConvOptions bad{2, 3, 3, 1, 1, 3, true, 1};
  bad.activation = true;
  bad.activation_slope = -0.5f;
  EXPECT_THROW(Conv("neg", bad), ConfigError);
}

TEST(NnBackward, Conv2d) {
  Conv c("conv2d", {3, 4, 3, 1, 1, 2, true, 3});
  check_gradients(c, random_tensor({2, 3, 7, 5}, 7));
}

TEST(NnBackward, Deconv3d) {
  Deconv d("deconv3d", {3, 2, 2, 2, 0, 3, true, 4});
  check_gradients(d, random_tensor({2, 3, 3, 2, 3}, 8));
}

TEST(NnBackward, Pooling) {
  Pool mx("maxpool3d", {true, 2, 2, 0, 3});
  check_gradients(mx, distinct_tensor({2, 2, 4, 6, 5}, 9));
  Pool av("avgpool3d", {false, 3, 2, 1, 3});
  check_gradients(av, random_tensor({2, 2, 5, 5, 4}, 10));
  Pool mx2("maxpool2d", {true, 2, 2, 0, 2});
  check_gradients(mx2, distinct_tensor({2, 3, 6, 4}, 11));
  Pool av2("avgpool2d", {false, 2, 2, 0, 2});
  check_gradients(av2, random_tensor({2, 3, 6, 5}, 12));
}

TEST(NnBackward, Linear) {
  Linear l("linear", 7, 5, 3);
  check_gradients(l, random_tensor({4, 7}, 13));
}

TEST(NnBackward, Activations) {
  ReLU relu("relu");
  check_gradients(relu, distinct_tensor({3, 17}, 14));
  LeakyReLU leaky("leaky_relu", 0.3f);
  check_gradients(leaky, distinct_tensor({3, 17}, 15));
  Dropout drop("dropout", 0.5f, 1);
  // Dropout's mask changes every training forward; with rate 0 the layer must be the identity.
  Dropout none("dropout0", 0.0f, 1);
  check_gradients(none, random_tensor({3, 5}, 16));
  Tensor x = random_tensor({1000}, 17);
  Tensor y = drop.forward(x, true);
  Tensor g = drop.backward(Tensor::filled({1000}, 1.0f));
  int zeros = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(y[i] == 0.0f || std::fabs(y[i] - 2 * x[i]) < 1e-6);
    ASSERT_EQ(g[i] == 0.0f, y[i] == 0.0f && x[i] != 0.0f);
    zeros += y[i] == 0.0f;
  }
  EXPECT_GT(zeros, 400);
  EXPECT_LT(zeros, 600);
  EXPECT_EQ(drop.forward(x, false).data(), x.data());
}

TEST(NnBackward, BatchNorm) {
  BatchNorm bn("batchnorm", 3);
  bn.params()[0]->value = random_tensor({3}, 3, 0.5f);
  check_gradients(bn, random_tensor({4, 3, 3, 2, 2}, 18));
}

TEST(NnBackward, FlattenAndConcat) {
  Flatten f("flatten");
  check_gradients(f, random_tensor({2, 3, 2, 2}, 19));
  Tensor a = random_tensor({2, 3, 4}, 20), b = random_tensor({2, 5, 4}, 21);
  Tensor c = concat_channels(a, b);
  EXPECT_EQ(c.shape(), (Shape{2, 8, 4}));
  EXPECT_EQ(c[1 * 32 + 3 * 4 + 1], b[1 * 20 + 0 * 4 + 1]);
  Tensor da, db;
  split_channels(c, 3, da, db);
  EXPECT_EQ(std::vector<float>(da.span().begin(), da.span().end()),
            std::vector<float>(a.span().begin(), a.span().end()));
  EXPECT_EQ(std::vector<float>(db.span().begin(), db.span().end()),
            std::vector<float>(b.span().begin(), b.span().end()));
}

// ---- layouts: channels-last activations between layers that take them ----

// A Sequential seen as one layer, so check_gradients can run on it.
class SequentialLayer : public Layer {
 public:
  explicit SequentialLayer(Sequential& s) : Layer("sequential"), s_(s) {}
  const char* kind() const override { return "sequential"; }
  Shape output_shape(const Shape& in) const override { return s_.output_shape(in); }
  Tensor forward(const Tensor& x, bool training) override { return s_.forward(x, training); }
  Tensor backward(const Tensor& dy) override { return s_.backward(dy); }
  std::vector<Param*> params() override { return s_.params(); }

 private:
  Sequential& s_;
};

void expect_near_all(const Tensor& a, const Tensor& b, float tol, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.layout(), b.layout()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a[i], b[i], tol) << what << " entry " << i;
}

TEST(NnLayout, LayersGiveTheSameResultInEitherLayout) {
  Conv conv("conv", {3, 4, 3, 1, 1, 3, true, 5});
  Pool pool("pool", {true, 2, 2, 0, 3});
  LeakyReLU act("act", 0.3f);
  BatchNorm bn("bn", 3);
  bn.params()[0]->value = random_tensor({3}, 34, 0.5f);
  Residual res("res");  // its sum in the body's layout (channels-last after a convolution)
  res.body().add(std::make_unique<Conv>("res.conv", ConvOptions{3, 3, 3, 1, 1, 3, false, 6}));
  res.body().add(std::make_unique<BatchNorm>("res.bn", 3));
  Tensor x = distinct_tensor({2, 3, 4, 6, 4}, 30);
  for (Layer* l : std::vector<Layer*>{&conv, &act, &pool, &bn, &res}) {
    Tensor yp = l->forward(x, true);
    Tensor dyp = random_tensor(yp.shape(), 31);
    Tensor dxp = l->backward(dyp);
    const Tensor xc = dnnl_util::to_layout(x, Layout::kChannelsLast);
    Tensor yc = l->forward(xc, true);
    EXPECT_EQ(yc.layout(), Layout::kChannelsLast) << l->name();
    Tensor dxc = l->backward(dnnl_util::to_layout(dyp, Layout::kChannelsLast));
    EXPECT_EQ(dxc.layout(), Layout::kChannelsLast) << l->name();
    auto plain = [](const Tensor& t) { return dnnl_util::to_layout(t, Layout::kPlain); };
    expect_near_all(plain(yc), plain(yp), 1e-5f, l->name().c_str());
    expect_near_all(plain(dxc), plain(dxp), 1e-5f, l->name().c_str());
  }
}

TEST(NnLayout, SequentialKeepsChannelsLastInsideAndMatchesLayerByLayer) {
  auto build = [](Sequential& s) {
    s.add(std::make_unique<Conv>("conv1", ConvOptions{2, 4, 3, 1, 1, 3, true, 7}));
    s.add(std::make_unique<LeakyReLU>("act1", 0.3f));
    s.add(std::make_unique<Pool>("pool1", PoolOptions{true, 2, 2, 0, 3}));
    s.add(std::make_unique<Conv>("conv2", ConvOptions{4, 3, 3, 1, 1, 3, false, 8}));
    s.add(std::make_unique<BatchNorm>("bn2", 3));  // either layout: stays channels-last
    s.add(std::make_unique<ReLU>("relu2"));
    s.add(std::make_unique<Flatten>("flatten"));
    s.add(std::make_unique<Linear>("fc", 3 * 2 * 3 * 2, 5, 9));
  };
  Sequential seq;
  build(seq);
  Tensor x = random_tensor({2, 2, 4, 6, 4}, 32);
  Tensor y = seq.forward(x, true);
  EXPECT_EQ(y.layout(), Layout::kPlain);
  // The same layers one by one on plain tensors.
  Sequential ref;
  build(ref);
  Tensor h = x;
  for (auto& l : ref.layers()) h = l->forward(h, true);
  expect_near_all(y, h, 1e-5f, "forward");
  Tensor dy = random_tensor(y.shape(), 33);
  Tensor dx = seq.backward(dy);
  EXPECT_EQ(dx.layout(), Layout::kPlain);
  Tensor g = dy;
  for (auto it = ref.layers().rbegin(); it != ref.layers().rend(); ++it) g = (*it)->backward(g);
  expect_near_all(dx, g, 1e-5f, "input gradient");
  auto ps = seq.params(), rs = ref.params();
  for (size_t i = 0; i < ps.size(); ++i) expect_near_all(ps[i]->grad, rs[i]->grad, 1e-4f, ps[i]->name.c_str());
}

TEST(NnLayout, GradientsThroughTheConversionsMatchFiniteDifferences) {
  // Smooth layers only (no kink a perturbation could cross): channels-last from conv1 to conv2,
  // plain from the flatten on.
  Sequential seq;
  seq.add(std::make_unique<Conv>("conv1", ConvOptions{2, 4, 3, 1, 1, 3, true, 7}));
  seq.add(std::make_unique<Pool>("pool1", PoolOptions{false, 2, 2, 0, 3}));
  seq.add(std::make_unique<Conv>("conv2", ConvOptions{4, 3, 3, 1, 1, 3, true, 8}));
  seq.add(std::make_unique<Flatten>("flatten"));
  seq.add(std::make_unique<Linear>("fc", 3 * 2 * 3 * 2, 5, 9));
  SequentialLayer whole(seq);
  check_gradients(whole, random_tensor({2, 2, 4, 6, 4}, 34));
}

TEST(NnLoss, GradientsMatchFiniteDifferences) {
  Tensor y = random_tensor({4, 3}, 22), t = random_tensor({4, 3}, 23);
  auto r = mse_loss(y, t);
  EXPECT_LT(fd_error([&] { return mse_loss(y, t).loss; }, y, r.grad), 1e-2);
  Tensor logits = random_tensor({2, 4, 3, 3}, 24, 2.0f);
  Tensor labels({2, 3, 3});
  for (int64_t i = 0; i < labels.numel(); ++i) labels[i] = static_cast<float>(i % 4);
  auto ce = softmax_cross_entropy(logits, labels);
  EXPECT_LT(fd_error([&] { return softmax_cross_entropy(logits, labels).loss; }, logits, ce.grad), 1e-2);
  EXPECT_NEAR(mean_absolute_error(Tensor::filled({4}, 1.0f), Tensor::filled({4}, 3.0f)), 2.0, 1e-12);
  Tensor perfect = Tensor::zeros({1, 2, 2});
  perfect[1] = 5;  // position 1 -> class 0; position 0 -> class 1
  perfect[2] = 5;
  Tensor lab({1, 2});
  lab[0] = 1;
  lab[1] = 0;
  EXPECT_EQ(accuracy(perfect, lab), 1.0);
  // Label smoothing: the loss against (1 - eps) one-hot + eps / C, and its gradient.
  const double eps = 0.1;
  auto sm = softmax_cross_entropy(logits, labels, eps);
  EXPECT_LT(fd_error([&] { return softmax_cross_entropy(logits, labels, eps).loss; }, logits, sm.grad), 1e-2);
  Tensor row({1, 4});
  for (int k = 0; k < 4; ++k) row[k] = 0.5f * k;
  Tensor one({1});
  one[0] = 2;
  double z = 0;
  for (int k = 0; k < 4; ++k) z += std::exp(0.5 * k);
  double want = 0;
  for (int k = 0; k < 4; ++k) want -= ((k == 2 ? 1 - eps : 0) + eps / 4) * (0.5 * k - std::log(z));
  EXPECT_NEAR(softmax_cross_entropy(row, one, eps).loss, want, 1e-6);
  // Top-k accuracy: the label among the k highest logits (ties go to the lower class, as the arg-max).
  Tensor scores({2, 5});
  for (int k = 0; k < 5; ++k) {
    scores[k] = static_cast<float>(k);  // ranks 4 3 2 1 0
    scores[5 + k] = 1.0f;               // all tied: class 0 first
  }
  Tensor truth({2});
  truth[0] = 2;  // third highest
  truth[1] = 3;  // fourth in the tie's order
  EXPECT_EQ(accuracy(scores, truth, 1), 0.0);
  EXPECT_EQ(accuracy(scores, truth, 3), 0.5);
  EXPECT_EQ(accuracy(scores, truth, 4), 1.0);
}

// ---- the Transformer's layers ----

// Causal attention by its definition, in double: per sequence and head, softmax over the positions
// up to the query's of q.k / sqrt(dh), then the weighted sum of the values.
Tensor naive_attention(const Tensor& qkv, int64_t t, int64_t d, int64_t heads) {
  const int64_t n = qkv.dim(0) / t, dh = d / heads;
  Tensor y({n * t, d});
  for (int64_t b = 0; b < n; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> w(i + 1);
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t k = 0; k < dh; ++k)
            dot += double(qkv[(b * t + i) * 3 * d + h * dh + k]) * qkv[(b * t + j) * 3 * d + d + h * dh + k];
          w[j] = dot / std::sqrt(double(dh));
          mx = std::max(mx, w[j]);
        }
        for (auto& v : w) z += (v = std::exp(v - mx));
        for (int64_t k = 0; k < dh; ++k) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += w[j] / z * qkv[(b * t + j) * 3 * d + 2 * d + h * dh + k];
          y[(b * t + i) * d + h * dh + k] = static_cast<float>(acc);
        }
      }
  return y;
}

TEST(NnForward, CausalAttentionMatchesItsDefinitionAndSeesNoLaterPosition) {
  CausalAttention attn("attn", 5, 6, 3);
  Tensor qkv = random_tensor({2 * 5, 18}, 40, 2.0f);
  const Tensor y = attn.forward(qkv, false);
  expect_close(y, naive_attention(qkv, 5, 6, 3), 1e-5);
  // A change at position 3 of the first sequence leaves its positions 0-2 and the other sequence alone.
  Tensor changed = qkv.clone();
  for (int64_t k = 0; k < 18; ++k) changed[3 * 18 + k] += 1.0f;
  const Tensor y2 = attn.forward(changed, false);
  for (int64_t r = 0; r < 10; ++r)
    for (int64_t k = 0; k < 6; ++k) {
      const bool may_change = r == 3 || r == 4;
      if (!may_change) {
        EXPECT_EQ(y[r * 6 + k], y2[r * 6 + k]) << "row " << r;
      }
    }
  EXPECT_NE(y[4 * 6], y2[4 * 6]);
  EXPECT_THROW(attn.output_shape({7, 18}), ConfigError);     // not whole sequences of 5
  EXPECT_THROW(CausalAttention("a", 4, 6, 4), ConfigError);  // 4 heads do not divide 6
}

TEST(NnForward, LayerNormAndGeluValues) {
  GELU gelu("gelu");
  Tensor x({3});
  x[0] = -1.0f;
  x[1] = 0.0f;
  x[2] = 1.0f;
  const Tensor g = gelu.forward(x, false);
  EXPECT_NEAR(g[0], -0.158655254, 1e-6);  // x * Phi(x), Phi(-1) = 0.158655254
  EXPECT_EQ(g[1], 0.0f);
  EXPECT_NEAR(g[2], 0.841344746, 1e-6);
  LayerNorm ln("ln", 8);
  const Tensor y = ln.forward(random_tensor({3, 8}, 41, 5.0f), false);
  for (int64_t r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < 8; ++j) m += y[r * 8 + j] / 8.0;
    for (int64_t j = 0; j < 8; ++j) v += (y[r * 8 + j] - m) * (y[r * 8 + j] - m) / 8.0;
    EXPECT_NEAR(m, 0, 1e-6);
    EXPECT_NEAR(v, 1, 1e-4);  // eps 1e-5 against a variance of about 8
  }
}

TEST(NnBackward, TransformerLayers) {
  GELU gelu("gelu");
  check_gradients(gelu, random_tensor({3, 17}, 42, 3.0f));
  LayerNorm ln("layer_norm", 6);
  ln.params()[0]->value = random_tensor({6}, 43);
  ln.params()[1]->value = random_tensor({6}, 44);
  check_gradients(ln, random_tensor({5, 6}, 45));
  CausalAttention attn("attention", 4, 6, 2);
  check_gradients(attn, random_tensor({2 * 4, 18}, 46));
  Residual res("residual");
  res.body().add(std::make_unique<LayerNorm>("residual.ln", 5));
  res.body().add(std::make_unique<Linear>("residual.fc", 5, 5, 7));
  res.body().add(std::make_unique<GELU>("residual.gelu"));
  check_gradients(res, random_tensor({4, 5}, 47));
  EXPECT_EQ(res.params().size(), 4u);
  EXPECT_EQ(res.sublayers().size(), 3u);
  // A ResNet bottleneck's shape: convolutions and BatchNorm in the body, a strided projection in the shortcut.
  Residual bottleneck("bottleneck");
  ConvOptions c1{3, 4, 1, 1, 0, 2, false, 11}, c2{4, 4, 3, 2, 1, 2, false, 12}, cs{3, 4, 1, 2, 0, 2, false, 13};
  bottleneck.body().add(std::make_unique<Conv>("bottleneck.conv1", c1));
  bottleneck.body().add(std::make_unique<BatchNorm>("bottleneck.bn1", 4));
  bottleneck.body().add(
      std::make_unique<GELU>("bottleneck.act"));  // smooth: a ReLU kink would make the differences noisy
  bottleneck.body().add(std::make_unique<Conv>("bottleneck.conv2", c2));
  bottleneck.body().add(std::make_unique<BatchNorm>("bottleneck.bn2", 4));
  bottleneck.shortcut().add(std::make_unique<Conv>("bottleneck.downsample.0", cs));
  bottleneck.shortcut().add(std::make_unique<BatchNorm>("bottleneck.downsample.1", 4));
  check_gradients(bottleneck, random_tensor({3, 3, 6, 6}, 52), 3e-3);

  // The embedding's tables (its input, token ids, has no gradient); the tied output's input and,
  // through the table it shares, the embedding's token gradient.
  Embedding emb("embedding", 7, 3, 4, 5, 0.5f);
  Tensor ids({2, 3});
  for (int64_t i = 0; i < 6; ++i) ids[i] = static_cast<float>((i * 5) % 7);
  ids[5] = ids[0];  // a token twice: its rows add up
  Tensor out = emb.forward(ids, true);
  ASSERT_EQ(out.shape(), (Shape{6, 4}));
  Tensor r = random_tensor(out.shape(), 48);
  for (Param* p : emb.params()) p->grad.zero();
  EXPECT_TRUE(emb.backward(r).empty());
  auto emb_loss = [&] { return weighted_sum(emb.forward(ids, true), r); };
  for (Param* p : emb.params()) {
    const Tensor analytic = p->grad.clone();
    const double e = fd_error(emb_loss, p->value, analytic);
    std::printf("  embedding %s %.2e\n", p->name.c_str(), e);
    EXPECT_LT(e, 1e-3) << p->name;
  }
  TiedOutput head("tied_output", emb.token());
  check_gradients(head, random_tensor({6, 4}, 49));
  Tensor h = random_tensor({6, 4}, 50);
  Tensor rh = random_tensor({6, 7}, 51);
  emb.token().grad.zero();
  head.forward(h, true);
  head.backward(rh);
  const Tensor analytic = emb.token().grad.clone();
  const double e = fd_error([&] { return weighted_sum(head.forward(h, true), rh); }, emb.token().value, analytic);
  std::printf("  tied_output embedding.token %.2e\n", e);
  EXPECT_LT(e, 1e-3);

  Tensor bad = ids.clone();
  bad[4] = 7.0f;
  try {
    emb.forward(bad, false);
    FAIL() << "an id outside the vocabulary was taken";
  } catch (const ConfigError& err) {
    EXPECT_EQ(err.field(), "dataset.vocabSize");
    EXPECT_NE(std::string(err.what()).find("token id 7 at position 1 of sequence 1 is not below the vocabulary size 7"),
              std::string::npos)
        << err.what();
  }
}

TEST(NnConfig, ImpossibleShapesNameTheLayer) {
  Conv c("block2.conv", {4, 8, 3, 1, 0, 3, true, 1});
  try {
    c.forward(Tensor::zeros({1, 3, 8, 8, 8}), false);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "model.layers.block2.conv");
    EXPECT_NE(std::string(e.what()).find("expects 4 input channels, got 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.output_shape({1, 4, 2, 8, 8}), ConfigError);
  EXPECT_THROW(Pool("p", {true, 2, 2, 0, 3}).output_shape({1, 1, 1, 4, 4}), ConfigError);
  EXPECT_THROW(Linear("fc", 0, 3), ConfigError);
  EXPECT_THROW(Dropout("d", 1.0f, 1), ConfigError);
}

}  // namespace
}  // namespace tessera
