// The layers on the GPU (cuDNN, cuBLAS and Tessera's kernels) against the same layers on the CPU
// (oneDNN and the host loops) on the same inputs and weights: forward, input gradient and parameter
// gradients within 1e-4 relative (TF32 off); one CosmoFlow training step likewise. Skipped, with the
// reason, where no CUDA device can be used.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "common/error.h"
#include "testing/rank_threads.h"
#include "testing/tensors.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/core/device.h"
#include "worker/data/loader.h"
#include "worker/data/sample_cache.h"
#include "worker/models/model.h"
#include "worker/nn/batchnorm.h"
#include "worker/nn/conv.h"
#include "worker/nn/elementwise.h"
#include "worker/nn/gpu/ops.h"
#include "worker/nn/linear.h"
#include "worker/nn/loss.h"
#include "worker/nn/optim.h"
#include "worker/nn/pool.h"
#include "worker/nn/transformer.h"
#include "worker/spatial/halo.h"

namespace tessera {
namespace {

class NnCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device (" << why << "); GPU layers not run";
    gpu::set_device(0);
    gpu::set_conv_tf32(false);
  }
};

using testing::random_tensor;

// Largest |a - b| relative to b's largest magnitude (b on the CPU).
double rel_error(const Tensor& a_any, const Tensor& b) {
  const Tensor a = a_any.to(Device::kCpu);
  EXPECT_EQ(a.numel(), b.numel());
  double diff = 0, mag = 1e-12;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    mag = std::max(mag, std::fabs(double(b[i])));
  }
  return diff / mag;
}

// Runs `make()`'s layer on the CPU and a second one on the GPU with the same parameters, and compares
// the output, the input gradient and every parameter gradient.
void compare_layer(const std::function<std::unique_ptr<Layer>()>& make, const Shape& in, const char* what) {
  SCOPED_TRACE(what);
  auto cpu = make(), dev = make();
  dev->to(Device::kCuda);
  const Tensor x = random_tensor(in, 11);
  const Tensor y = cpu->forward(x, true);
  const Tensor yd = dev->forward(x.to(Device::kCuda), true);
  EXPECT_EQ(yd.shape(), y.shape());
  EXPECT_LE(rel_error(yd, y), 1e-4) << "forward";
  const Tensor dy = random_tensor(y.shape(), 12);
  const Tensor dx = cpu->backward(dy);
  const Tensor dxd = dev->backward(dy.to(Device::kCuda));
  EXPECT_LE(rel_error(dxd, dx), 1e-4) << "backward-data";
  const auto pc = cpu->params(), pd = dev->params();
  ASSERT_EQ(pc.size(), pd.size());
  for (size_t i = 0; i < pc.size(); ++i)
    EXPECT_LE(rel_error(pd[i]->grad, pc[i]->grad), 1e-4) << "gradient of " << pc[i]->name;
}

TEST_F(NnCudaTest, ConvolutionsMatchOneDnn) {
  for (int k : {3, 2}) {
    ConvOptions o;
    o.in_channels = 4;
    o.out_channels = 8;
    o.kernel = k;
    o.stride = k == 3 ? 1 : 2;
    o.padding = k == 3 ? 1 : 0;
    compare_layer([&] { return std::make_unique<Conv>("conv", o); }, {2, 4, 8, 8, 8},
                  k == 3 ? "conv3d k3" : "conv3d k2 s2");
    o.activation = true;
    o.activation_slope = 0.3f;
    compare_layer([&] { return std::make_unique<Conv>("conv", o); }, {2, 4, 8, 8, 8}, "conv3d + leaky relu");
    compare_layer([&] { return std::make_unique<Deconv>("deconv", o); }, {2, 4, 4, 4, 4}, "deconv3d");
  }
  ConvOptions o2;
  o2.in_channels = 3;
  o2.out_channels = 5;
  o2.spatial_dims = 2;
  compare_layer([&] { return std::make_unique<Conv>("conv2d", o2); }, {2, 3, 9, 9}, "conv2d");
}

TEST_F(NnCudaTest, PoolingBatchNormLinearAndActivationsMatchTheCpu) {
  for (bool max : {true, false}) {
    PoolOptions o;
    o.max = max;
    compare_layer([&] { return std::make_unique<Pool>("pool", o); }, {2, 3, 8, 8, 8}, max ? "maxpool" : "avgpool");
  }
  // Windows that tile the input (Tessera's kernel), with rows past the last window, in 3D and 2D;
  // and overlapping padded windows (cuDNN's), as ResNet-50's stem pools.
  PoolOptions tiles;
  compare_layer([&] { return std::make_unique<Pool>("pool", tiles); }, {2, 3, 9, 8, 7}, "maxpool, uneven");
  tiles.spatial_dims = 2;
  compare_layer([&] { return std::make_unique<Pool>("pool", tiles); }, {2, 3, 10, 9}, "maxpool 2d");
  const PoolOptions stem{true, 3, 2, 1, 2};
  compare_layer([&] { return std::make_unique<Pool>("pool", stem); }, {2, 3, 16, 16}, "maxpool 2d k3 s2 p1");
  compare_layer([] { return std::make_unique<BatchNorm>("bn", 3); }, {4, 3, 4, 5, 6}, "batchnorm");
  // Few channels over a large volume: each channel's sums split over many blocks.
  compare_layer([] { return std::make_unique<BatchNorm>("bn", 3); }, {2, 3, 32, 32, 32}, "batchnorm, large volume");
  compare_layer([] { return std::make_unique<Linear>("fc", 37, 19, 3); }, {5, 37}, "linear");
  compare_layer([] { return std::make_unique<LeakyReLU>("act", 0.3f); }, {3, 4, 5}, "leaky relu");
  compare_layer([] { return std::make_unique<Dropout>("drop", 0.25f, 9); }, {3, 400}, "dropout");
}

TEST_F(NnCudaTest, TransformerLayersMatchTheCpu) {
  compare_layer([] { return std::make_unique<GELU>("gelu"); }, {3, 400}, "gelu");
  compare_layer([] { return std::make_unique<LayerNorm>("ln", 48); }, {37, 48}, "layer norm");
  compare_layer([] { return std::make_unique<CausalAttention>("attn", 16, 48, 4); }, {3 * 16, 144}, "causal attention");
  compare_layer(
      [] {
        auto r = std::make_unique<Residual>("res");
        r->body().add(std::make_unique<LayerNorm>("res.ln", 24));
        r->body().add(std::make_unique<Linear>("res.fc", 24, 24, 3));
        return r;
      },
      {10, 24}, "residual");
  // The embedding and the tied output share the token table; ids are whole numbers below the vocabulary.
  Embedding cpu("emb", 50, 8, 16, 3), gpu_emb("emb", 50, 8, 16, 3);
  gpu_emb.to(Device::kCuda);
  TiedOutput head_c("out", cpu.token()), head_d("out", gpu_emb.token());
  Tensor ids({4, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) ids[i] = static_cast<float>((i * 7) % 50);
  const Tensor y = head_c.forward(cpu.forward(ids, true), true);
  const Tensor yd = head_d.forward(gpu_emb.forward(ids.to(Device::kCuda), true), true);
  EXPECT_LE(rel_error(yd, y), 1e-4) << "embedding and tied output forward";
  const Tensor dy = random_tensor(y.shape(), 13);
  cpu.backward(head_c.backward(dy));
  gpu_emb.backward(head_d.backward(dy.to(Device::kCuda)));
  EXPECT_LE(rel_error(gpu_emb.token().grad, cpu.token().grad), 1e-4) << "token table gradient";
  EXPECT_LE(rel_error(gpu_emb.params()[1]->grad, cpu.params()[1]->grad), 1e-4) << "position table gradient";
}

TEST_F(NnCudaTest, LossesAndOptimisersMatchTheCpu) {
  const Tensor y = random_tensor({8, 4}, 1), t = random_tensor({8, 4}, 2);
  const LossResult m = mse_loss(y, t), md = mse_loss(y.to(Device::kCuda), t.to(Device::kCuda));
  EXPECT_NEAR(md.loss, m.loss, 1e-6 * m.loss);
  EXPECT_LE(rel_error(md.grad, m.grad), 1e-6);
  const Tensor logits = random_tensor({4, 5, 6}, 3);
  Tensor labels({4, 6});
  for (int64_t i = 0; i < labels.numel(); ++i) labels[i] = static_cast<float>(i % 5);
  const LossResult c = softmax_cross_entropy(logits, labels);
  const LossResult cd = softmax_cross_entropy(logits.to(Device::kCuda), labels.to(Device::kCuda));
  EXPECT_NEAR(cd.loss, c.loss, 1e-6 * c.loss);
  EXPECT_LE(rel_error(cd.grad, c.grad), 1e-6);
  labels[3] = 9;
  EXPECT_THROW(softmax_cross_entropy(logits.to(Device::kCuda), labels.to(Device::kCuda)), Error);
  for (const char* name : {"sgd", "adam", "adamw", "lars"}) {
    SCOPED_TRACE(name);
    OptimizerConfig oc;
    oc.name = name;
    oc.weight_decay = 0.001;
    Param p{"w", random_tensor({1000}, 4), random_tensor({1000}, 5), true};
    Param pd{"w", p.value.to(Device::kCuda), p.grad.to(Device::kCuda), true};
    auto a = make_optimizer(oc), b = make_optimizer(oc);
    for (int s = 0; s < 3; ++s) {
      a->step({&p}, 0.01);
      b->step({&pd}, 0.01);
    }
    EXPECT_LE(rel_error(pd.value, p.value), 1e-6);
  }
}

// One training step of CosmoFlow (with batch normalisation and dropout) and of UNet3D (skip
// connections, transposed convolutions, per-voxel cross-entropy): the same loss, gradients and
// updated weights on the GPU as on the CPU.
TEST_F(NnCudaTest, TrainingStepsMatchTheCpu) {
  for (const char* name : {"cosmoflow", "unet3d"}) {
    SCOPED_TRACE(name);
    const bool cosmo = std::string(name) == "cosmoflow";
    ModelConfig mc;
    mc.name = name;
    mc.input_size = cosmo ? 32 : 16;
    mc.batchnorm = cosmo;
    mc.dropout = cosmo ? 0.2f : 0.0f;
    auto cpu = make_model(mc), dev = make_model(mc);
    dev->to(Device::kCuda);
    Shape xs = {4};
    for (int64_t d : cpu->sample_shape()) xs.push_back(d);
    Shape ts = {4};
    for (int64_t d : cpu->target_shape()) ts.push_back(d);
    const Tensor x = random_tensor(xs, 21);
    Tensor t = random_tensor(ts, 22);
    if (!cosmo)
      for (int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(i % 3);  // class labels
    const Tensor out = cpu->forward(x, true), outd = dev->forward(x.to(Device::kCuda), true);
    EXPECT_LE(rel_error(outd, out), 1e-4);
    const LossResult l = cpu->loss(out, t), ld = dev->loss(outd, t.to(Device::kCuda));
    EXPECT_NEAR(ld.loss, l.loss, 1e-4 * std::fabs(l.loss));
    cpu->backward(l.grad);
    dev->backward(ld.grad);
    const auto pc = cpu->params(), pd = dev->params();
    for (size_t i = 0; i < pc.size(); ++i) EXPECT_LE(rel_error(pd[i]->grad, pc[i]->grad), 1e-4) << pc[i]->name;
    // The update by SGD with momentum, linear in the gradient: Adam's first step, lr * g / (|g| + eps),
    // turns the rounding of gradients near zero into whole steps of either sign (its arithmetic on
    // the device is LossesAndOptimisersMatchTheCpu's).
    OptimizerConfig oc;
    oc.name = "sgd";
    oc.momentum = 0.9;
    auto a = make_optimizer(oc), b = make_optimizer(oc);
    a->step(pc, 1e-2);
    b->step(pd, 1e-2);
    for (size_t i = 0; i < pc.size(); ++i) EXPECT_LE(rel_error(pd[i]->value, pc[i]->value), 1e-4) << pc[i]->name;
  }
}

// Batches the loader moves to the GPU (through pinned memory, and the device cache on the second
// pass) hold the same values as the batches it stacks on the host.
TEST_F(NnCudaTest, LoaderBatchesOnTheDeviceEqualTheHostsAndTheCacheServesTheSecondPass) {
  SyntheticConfig sc;
  sc.size = 16;
  sc.samples = 8;
  const auto data = make_synthetic(sc);
  const std::vector<std::vector<uint64_t>> schedule = {{0, 1, 2, 3}, {4, 5, 6, 7}, {3, 2, 1, 0}};
  SampleCache cache(int64_t{1} << 30, Device::kCuda);
  PrefetchLoader host(*data, 2, 2), device(*data, 2, 2, {}, Device::kCuda, 0, &cache);
  host.start(schedule);
  device.start(schedule);
  for (size_t b = 0; b < schedule.size(); ++b) {
    const Batch h = host.next(), d = device.next();
    ASSERT_TRUE(d.inputs.on_device());
    EXPECT_EQ(rel_error(d.inputs, h.inputs), 0.0);
    EXPECT_EQ(rel_error(d.targets, h.targets), 0.0);
  }
  EXPECT_EQ(cache.counters().hits, 4u) << "the third batch's samples were all held on the device";
  EXPECT_EQ(cache.counters().misses, 8u);
}

// Spatial parallelism on the GPU (halo faces through pinned host buffers, one-sided padding around
// cuDNN, batch-normalisation sums through the host): CosmoFlow split 2 and 2 x 2 ways, one thread
// per rank on this GPU, gives the single-rank CPU model's outputs and, summed over the group, its
// gradients.
TEST_F(NnCudaTest, SpatialCosmoFlowOnTheGpuEqualsTheCpu) {
  for (SpatialGrid grid : {SpatialGrid{2, 1, 1}, SpatialGrid{2, 2, 1}}) {
    SCOPED_TRACE("grid " + std::to_string(grid.d) + "x" + std::to_string(grid.h));
    ModelConfig c;
    c.input_size = 16;
    c.base_channels = 4;
    c.hidden = {16};
    c.batchnorm = true;
    auto ref = make_model(c);
    const Tensor x = random_tensor({2, 4, 16, 16, 16}, 5);
    const Tensor out = ref->forward(x, true);
    const Tensor dout = random_tensor(out.shape(), 6);
    for (Param* p : ref->params()) p->grad.zero();
    ref->backward(dout);
    MemoryStore store;
    std::mutex mu;
    std::vector<Tensor> grads;
    const auto errors = testing::run_ranks(grid.size(), [&](int r) {
      gpu::set_device(0);
      std::vector<int> members(grid.size());
      for (int i = 0; i < grid.size(); ++i) members[i] = i;
      GlooCommunicator::Options o;
      o.group = "spatial";
      auto comm = GlooCommunicator::connect(store, r, members, o);
      ModelConfig sc = c;
      sc.spatial = grid;
      auto m = make_model(sc, comm.get());
      m->to(Device::kCuda);
      const Partition& p = *m->input_partition();
      Tensor block({2, 4, p.owned(0).size(), p.owned(1).size(), p.owned(2).size()});
      copy_box(x, {0, 0, p.owned(0).begin, p.owned(1).begin, p.owned(2).begin}, block, {0, 0, 0, 0, 0},
               {2, 4, block.dim(2), block.dim(3), block.dim(4)}, false);
      const Tensor o_dev = m->forward(block.to(Device::kCuda), true);
      const Tensor o_host = o_dev.to(Device::kCpu);
      const auto held = m->held_samples(2);
      Tensor d({o_dev.dim(0), out.dim(1)});
      for (size_t i = 0; i < held.size(); ++i)
        for (int64_t k = 0; k < out.dim(1); ++k) {
          EXPECT_NEAR(o_host[i * out.dim(1) + k], out[held[i] * out.dim(1) + k],
                      1e-4 * (1 + std::fabs(out[held[i] * out.dim(1) + k])));
          d[i * out.dim(1) + k] = dout[held[i] * out.dim(1) + k];
        }
      for (Param* q : m->params()) q->grad.zero();
      m->backward(d.to(Device::kCuda));
      std::vector<Tensor> mine;
      for (Param* q : m->params()) {
        Tensor g = q->grad.to(Device::kCpu);
        comm->allreduce(g.span());
        mine.push_back(g);
      }
      std::lock_guard<std::mutex> lock(mu);
      if (r == 0) grads = mine;
    });
    for (size_t r = 0; r < errors.size(); ++r)
      if (errors[r]) ADD_FAILURE() << "rank " << r << " failed";
    const auto want = ref->params();
    ASSERT_EQ(grads.size(), want.size());
    // Against the largest gradient entry of the model where a parameter's own are smaller: a
    // convolution bias in front of batch normalisation has a gradient that is zero up to rounding.
    double largest = 0;
    for (Param* p : want)
      for (float v : p->grad.span()) largest = std::max(largest, std::fabs(double(v)));
    for (size_t i = 0; i < want.size(); ++i) {
      double diff = 0, own = 0;
      for (int64_t k = 0; k < want[i]->grad.numel(); ++k) {
        diff = std::max(diff, std::fabs(double(grads[i][k]) - want[i]->grad[k]));
        own = std::max(own, std::fabs(double(want[i]->grad[k])));
      }
      EXPECT_LE(diff / std::max(own, 1e-2 * largest), 1e-3) << want[i]->name;
    }
  }
}

}  // namespace
}  // namespace tessera
