// bf16 (spec.training.precision: bf16): the rounding (ties to even, as oneDNN and PyTorch round), the
// bf16 matrix product against a double-precision product of the rounded inputs, and each layer with
// products (convolution, transposed convolution, fully connected, attention) and whole models in
// bf16 against the same in fp32. Tolerance: bf16 keeps 8 significant bits, so a rounded input is
// within 2^-9 (0.2%) of its value; the layers' outputs and gradients, sums of such products kept in
// fp32, are within 2% (relative L2) of fp32's. On a CPU without AVX-512 the layer cases skip (and
// `precision_isa_cap` checks the refusal there).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "common/error.h"
#include "testing/tensors.h"
#include "worker/data/dataset.h"
#include "worker/models/model.h"
#include "worker/nn/conv.h"
#include "worker/nn/dnnl_util.h"
#include "worker/nn/kernels.h"
#include "worker/nn/linear.h"
#include "worker/nn/optim.h"
#include "worker/nn/precision.h"
#include "worker/nn/transformer.h"

namespace tessera {
namespace {

bool has_bf16_cpu() {
  try {
    require_bf16_cpu();
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

#define SKIP_WITHOUT_BF16() \
  if (!has_bf16_cpu()) GTEST_SKIP() << "this CPU has no AVX-512: no bf16 path (precision_isa_cap tests the refusal)"

using testing::random_tensor;

double rel_l2(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  return testing::relative_l2(a, b);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(kernels::round_bf16(1.0f), 1.0f);
  const float ulp = std::ldexp(1.0f, -7);                                // bf16's spacing in [1, 2)
  EXPECT_EQ(kernels::round_bf16(1.0f + ulp / 2), 1.0f);                  // a tie: to the even 1.0
  EXPECT_EQ(kernels::round_bf16(1.0f + 3 * ulp / 2), 1.0f + 2 * ulp);    // a tie: to the even 1 + 2 ulp
  EXPECT_EQ(kernels::round_bf16(1.0f + ulp / 2 + ulp / 8), 1.0f + ulp);  // above the tie: up
  EXPECT_EQ(kernels::round_bf16(-1.0f - ulp / 4), -1.0f);
  EXPECT_EQ(kernels::bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(kernels::round_bf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(kernels::round_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(kernels::round_bf16(std::nanf("0x1"))));  // a NaN whose payload rounding would clear
  // The largest float rounds past bf16's largest finite value: to infinity, as oneDNN's conversion does.
  EXPECT_EQ(kernels::round_bf16(std::numeric_limits<float>::max()), std::numeric_limits<float>::infinity());
  for (float x : {0.1f, -3.14159f, 1e-20f, 6.5e4f}) EXPECT_NEAR(kernels::round_bf16(x), x, std::fabs(x) / 256);
}

TEST(Bf16, Parsing) {
  EXPECT_EQ(parse_precision("fp32"), Precision::kFp32);
  EXPECT_EQ(parse_precision("bf16"), Precision::kBf16);
  try {
    parse_precision("fp16");
    FAIL() << "fp16 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("spec.training.precision"), std::string::npos) << e.what();
  }
}

// C = alpha op(A) op(B) + beta C in bf16 against the same product of the rounded inputs in double.
TEST(Bf16, GemmIsTheProductOfTheRoundedInputs) {
  SKIP_WITHOUT_BF16();
  const int64_t m = 37, n = 19, k = 53;
  for (char ta : {'N', 'T'})
    for (char tb : {'N', 'T'})
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(std::string(1, ta) + tb + " beta " + std::to_string(beta));
        const int64_t lda = (ta == 'N' ? k : m) + 3, ldb = (tb == 'N' ? n : k) + 2, ldc = n + 5;
        Tensor a = random_tensor({ta == 'N' ? m : k, lda}, 1), b = random_tensor({tb == 'N' ? k : n, ldb}, 2);
        Tensor c = random_tensor({m, ldc}, 3);
        Tensor want(c.shape());
        for (int64_t i = 0; i < c.numel(); ++i) want[i] = c[i];
        const float alpha = 0.75f;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t p = 0; p < k; ++p) {
              const float av = ta == 'N' ? a[i * lda + p] : a[p * lda + i];
              const float bv = tb == 'N' ? b[p * ldb + j] : b[j * ldb + p];
              s += double(kernels::round_bf16(av)) * kernels::round_bf16(bv);
            }
            want[i * ldc + j] = static_cast<float>(alpha * s + beta * c[i * ldc + j]);
          }
        gemm(Precision::kBf16, ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        double worst = 0;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j)
            worst = std::max(worst, std::fabs(double(c[i * ldc + j]) - want[i * ldc + j]));
        EXPECT_LT(worst, 1e-4);  // fp32 accumulation of 53 exact products
      }
}

// One layer's forward output and input and parameter gradients in bf16 against fp32, same weights.
template <class L>
void expect_bf16_near_fp32(L& fp32, L& bf16, const Tensor& x, const char* what) {
  SCOPED_TRACE(what);
  bf16.set_precision(Precision::kBf16);
  const Tensor y32 = fp32.forward(x, true), y16 = bf16.forward(x, true);
  const Tensor r = dnnl_util::to_layout(random_tensor(y32.shape(), 9), y32.layout());
  const Tensor dx32 = fp32.backward(r), dx16 = bf16.backward(r);
  const double ey = rel_l2(y16, y32), edx = rel_l2(dx16, dx32);
  std::printf("%s: output %.2e, input gradient %.2e", what, ey, edx);
  EXPECT_LT(ey, 2e-2);
  EXPECT_GT(ey, 0);  // the inputs were rounded: bf16 ran
  EXPECT_LT(edx, 2e-2);
  for (size_t i = 0; i < fp32.params().size(); ++i) {
    const double e = rel_l2(bf16.params()[i]->grad, fp32.params()[i]->grad);
    std::printf(", %s %.2e", fp32.params()[i]->name.c_str(), e);
    EXPECT_LT(e, 2e-2) << fp32.params()[i]->name;
  }
  std::printf("\n");
}

TEST(Bf16, ConvolutionsAndDeconvolutionsNearFp32) {
  SKIP_WITHOUT_BF16();
  ConvOptions o;
  o.in_channels = 4;
  o.out_channels = 16;
  {
    ConvOptions o8 = o;
    o8.in_channels = 8;  // above the direct weight gradient's 4 (fp32 under bf16 too): oneDNN's bf16 one
    Conv a("conv3d", o8), b("conv3d", o8);
    expect_bf16_near_fp32(a, b, dnnl_util::to_layout(random_tensor({2, 8, 8, 8, 8}, 4), Layout::kChannelsLast),
                          "conv3d");
  }
  {
    ConvOptions o2 = o;
    o2.spatial_dims = 2;
    o2.stride = 2;
    Conv a("conv2d", o2), b("conv2d", o2);
    const Tensor x = dnnl_util::to_layout(random_tensor({2, 4, 9, 9}, 5), Layout::kChannelsLast);
    expect_bf16_near_fp32(a, b, x, "conv2d, stride 2");
    // With the activation fused, the forward pass only: where rounding moves an output across zero
    // the two gradients take different sides of the kink, which says nothing of bf16's arithmetic.
    o2.activation = true;
    o2.activation_slope = 0.1f;
    Conv c("conv2d+leaky", o2), d("conv2d+leaky", o2);
    d.set_precision(Precision::kBf16);
    EXPECT_LT(rel_l2(d.forward(x, false), c.forward(x, false)), 2e-2);
  }
  {
    ConvOptions o3 = o;
    o3.kernel = 2;
    o3.stride = 2;
    o3.padding = 0;
    Deconv a("deconv3d", o3), b("deconv3d", o3);
    expect_bf16_near_fp32(a, b, dnnl_util::to_layout(random_tensor({2, 4, 4, 4, 4}, 6), Layout::kChannelsLast),
                          "deconv3d");
  }
}

TEST(Bf16, FullyConnectedAndAttentionNearFp32) {
  SKIP_WITHOUT_BF16();
  Linear a("fc", 48, 20, 1), b("fc", 48, 20, 1);
  expect_bf16_near_fp32(a, b, random_tensor({6, 48}, 7), "linear");
  CausalAttention c("attention", 8, 32, 4), d("attention", 8, 32, 4);
  expect_bf16_near_fp32(c, d, random_tensor({2 * 8, 3 * 32}, 8), "attention");
}

// A whole model trains in bf16 as in fp32: the same weights, the same batch, 8 steps of Adam.
TEST(Bf16, ModelsTrainAsInFp32) {
  SKIP_WITHOUT_BF16();
  ModelConfig c;
  c.input_size = 16;
  c.base_channels = 4;
  c.hidden = {16, 8};
  auto data = make_synthetic({"cosmo", 16, 4, 1});
  Batch batch = stack(*data, {0, 1, 2, 3});
  std::vector<double> last;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    c.precision = p;
    auto m = make_model(c);
    auto opt = make_optimizer(OptimizerConfig{"adam"});
    double first = 0, end = 0;
    for (int step = 0; step < 8; ++step) {
      for (Param* q : m->params()) q->grad.zero();
      const LossResult l = m->loss(m->forward(batch.inputs, true), batch.targets);
      m->backward(l.grad);
      opt->step(m->params(), 1e-3);
      (step == 0 ? first : end) = l.loss;
    }
    std::printf("cosmoflow in %s: loss %.5f -> %.5f in 8 steps\n", precision_name(p), first, end);
    EXPECT_LT(end, first);
    last.push_back(end);
  }
  EXPECT_NEAR(last[1], last[0], 0.05 * last[0]);
}

// Run under ONEDNN_MAX_CPU_ISA=AVX2 (ctest precision_isa_cap): bf16 is refused naming the field.
TEST(Bf16IsaCap, RefusedWithoutAvx512) {
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!cap) GTEST_SKIP() << "runs under ONEDNN_MAX_CPU_ISA (ctest precision_isa_cap)";
  ModelConfig c;
  c.input_size = 16;
  c.base_channels = 4;
  c.precision = Precision::kBf16;
  try {
    make_model(c);
    FAIL() << "bf16 accepted with oneDNN capped at " << cap;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("spec.training.precision"), std::string::npos) << what;
    EXPECT_NE(what.find("AVX-512"), std::string::npos) << what;
    std::printf("refused: %s\n", what.c_str());
  }
  c.precision = Precision::kFp32;
  EXPECT_NO_THROW(make_model(c));
}

}  // namespace
}  // namespace tessera
