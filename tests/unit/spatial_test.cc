// Spatial parallelism: every distributed layer equals the single-rank layer on the same input (forward,
// input gradient, summed weight gradients; relative error 1e-5) for splits of D into 2 and 4, D x H
// into 2 x 2, H x W, odd sizes and stride 2; whole CosmoFlow and UNet3D models give the same outputs,
// loss and gradients (1e-5 on outputs and loss, 1e-4 on gradients). One thread per rank over Gloo.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <numeric>
#include <random>

#include "common/error.h"
#include "testing/rank_threads.h"
#include "testing/tensors.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/models/model.h"
#include "worker/nn/dnnl_util.h"
#include "worker/spatial/layers.h"

namespace tessera {
namespace {

using testing::rethrow_first;
using testing::run_ranks;

Tensor random_tensor(Shape s, uint32_t seed) {
  Tensor t(std::move(s));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : t.span()) v = u(rng);
  return t;
}

Tensor crop(const Tensor& full, const Partition& p) {
  Tensor out({full.dim(0), full.dim(1), p.owned(0).size(), p.owned(1).size(), p.owned(2).size()});
  copy_box(full, {0, 0, p.owned(0).begin, p.owned(1).begin, p.owned(2).begin}, out, {0, 0, 0, 0, 0},
           {out.dim(0), out.dim(1), out.dim(2), out.dim(3), out.dim(4)}, false);
  return out;
}

double rel_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  return testing::relative_l2(a, b);
}

std::unique_ptr<Communicator> spatial_comm(MemoryStore& store, int rank, int size) {
  std::vector<int> members(size);
  for (int i = 0; i < size; ++i) members[i] = i;
  GlooCommunicator::Options o;
  o.group = "spatial";
  o.timeout = Millis(20000);
  return GlooCommunicator::connect(store, rank, members, o);
}

struct Case {
  SpatialGrid grid;
  std::array<int64_t, 3> extent;
};

const std::vector<Case> kCases = {
    {{2, 1, 1}, {8, 6, 5}},  {{4, 1, 1}, {16, 5, 4}}, {{2, 2, 1}, {8, 8, 3}}, {{2, 1, 1}, {9, 7, 5}},
    {{4, 1, 1}, {13, 6, 6}}, {{2, 2, 1}, {7, 9, 4}},  {{1, 2, 2}, {5, 8, 7}},
};

// Checks one layer kind: forward blocks, input-gradient blocks and summed parameter gradients. The
// ranks of one group size connect once and run every case of that size.
void check_layer(const std::string& what, const std::function<std::unique_ptr<Layer>()>& single,
                 const std::function<std::unique_ptr<Layer>(const SpatialContext&, std::array<int64_t, 3>)>& dist,
                 int channels, bool distinct_inputs = false) {
  struct Reference {
    Tensor x, y, dy, dx;
    std::vector<Tensor> grads;
  };
  std::vector<Reference> refs;
  for (const Case& c : kCases) {
    Reference ref;
    ref.x = random_tensor({2, channels, c.extent[0], c.extent[1], c.extent[2]}, 1);
    if (distinct_inputs) {  // max pooling: no ties
      std::vector<int64_t> order(ref.x.numel());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(4));
      for (int64_t i = 0; i < ref.x.numel(); ++i) ref.x[i] = 0.01f * static_cast<float>(order[i]);
    }
    auto layer = single();
    ref.y = layer->forward(ref.x, true);
    ref.dy = random_tensor(ref.y.shape(), 2);
    for (Param* p : layer->params()) p->grad.zero();
    ref.dx = layer->backward(ref.dy);
    for (Param* p : layer->params()) ref.grads.push_back(p->grad.clone());
    refs.push_back(std::move(ref));
  }
  for (int size : {2, 4}) {
    MemoryStore store;
    auto errors = run_ranks(size, [&](int r) {
      auto comm = spatial_comm(store, r, size);
      for (size_t k = 0; k < 2 * kCases.size(); ++k) {  // each case with plain blocks, then channels-last ones
        const Case& c = kCases[k % kCases.size()];
        const Layout layout = k < kCases.size() ? Layout::kPlain : Layout::kChannelsLast;
        if (c.grid.size() != size) continue;
        SCOPED_TRACE(what + " grid " + std::to_string(c.grid.d) + "x" + std::to_string(c.grid.h) + "x" +
                     std::to_string(c.grid.w) + " extent " + std::to_string(c.extent[0]) + "x" +
                     std::to_string(c.extent[1]) + "x" + std::to_string(c.extent[2]) +
                     (layout == Layout::kPlain ? " plain" : " channels-last"));
        const Reference& ref = refs[k % kCases.size()];
        SpatialContext ctx{comm.get(), c.grid};
        auto layer = dist(ctx, c.extent);
        if (layout == Layout::kChannelsLast && layer->layouts() == Layer::Layouts::kPlain)
          continue;  // takes plain blocks only
        Partition in(c.extent, c.grid, r, "in");
        Partition out({ref.y.dim(2), ref.y.dim(3), ref.y.dim(4)}, c.grid, r, "out");
        Tensor yl = layer->forward(dnnl_util::to_layout(crop(ref.x, in), layout), true);
        EXPECT_EQ(yl.layout(), layout);
        EXPECT_LT(rel_error(dnnl_util::to_layout(yl, Layout::kPlain), crop(ref.y, out)), 1e-5) << "forward, rank " << r;
        for (Param* p : layer->params()) p->grad.zero();
        Tensor dxl = layer->backward(dnnl_util::to_layout(crop(ref.dy, out), layout));
        EXPECT_EQ(dxl.layout(), layout);
        EXPECT_LT(rel_error(dnnl_util::to_layout(dxl, Layout::kPlain), crop(ref.dx, in)), 1e-5)
            << "input gradient, rank " << r;
        auto ps = layer->params();
        ASSERT_EQ(ps.size(), ref.grads.size());
        for (size_t i = 0; i < ps.size(); ++i) {
          comm->allreduce(ps[i]->grad.span());
          EXPECT_LT(rel_error(ps[i]->grad, ref.grads[i]), 1e-5) << ps[i]->name << ", rank " << r;
        }
      }
    });
    for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(testing::message(errors[r]), "") << "rank " << r;
  }
}

TEST(SpatialLayers, ConvStride1) {
  ConvOptions o{3, 4, 3, 1, 1, 3, true, 7};
  check_layer(
      "conv k3 s1", [&] { return std::make_unique<Conv>("c", o); },
      [&](const SpatialContext& ctx, auto e) { return std::make_unique<DistConv>("c", o, ctx, e); }, 3);
}

TEST(SpatialLayers, ConvStride2AndWideKernel) {
  ConvOptions s2{2, 3, 3, 2, 1, 3, true, 8};
  check_layer(
      "conv k3 s2", [&] { return std::make_unique<Conv>("c", s2); },
      [&](const SpatialContext& ctx, auto e) { return std::make_unique<DistConv>("c", s2, ctx, e); }, 2);
  ConvOptions k5{2, 2, 5, 1, 2, 3, false, 9};
  check_layer(
      "conv k5", [&] { return std::make_unique<Conv>("c", k5); },
      [&](const SpatialContext& ctx, auto e) { return std::make_unique<DistConv>("c", k5, ctx, e); }, 2);
}

TEST(SpatialLayers, Pooling) {
  for (bool max : {true, false}) {
    PoolOptions p2{max, 2, 2, 0, 3};
    check_layer(
        max ? "maxpool k2" : "avgpool k2", [&] { return std::make_unique<Pool>("p", p2); },
        [&](const SpatialContext& ctx, auto e) { return std::make_unique<DistPool>("p", p2, ctx, e); }, 2, max);
    PoolOptions p3{max, 3, 2, 1, 3};
    check_layer(
        max ? "maxpool k3 s2" : "avgpool k3 s2", [&] { return std::make_unique<Pool>("p", p3); },
        [&](const SpatialContext& ctx, auto e) { return std::make_unique<DistPool>("p", p3, ctx, e); }, 2, max);
  }
}

TEST(SpatialLayers, TransposedConvolution) {
  ConvOptions up{3, 2, 2, 2, 0, 3, true, 12};
  check_layer(
      "deconv k2 s2", [&] { return std::make_unique<Deconv>("d", up); },
      [&](const SpatialContext& ctx, auto e) { return std::make_unique<DistDeconv>("d", up, ctx, e); }, 3);
  ConvOptions k3{2, 2, 3, 1, 1, 3, true, 13};
  check_layer(
      "deconv k3 s1", [&] { return std::make_unique<Deconv>("d", k3); },
      [&](const SpatialContext& ctx, auto e) { return std::make_unique<DistDeconv>("d", k3, ctx, e); }, 2);
}

TEST(SpatialLayers, BatchNormWithGlobalStatistics) {
  // BatchNorm is pointwise given its statistics; the reducer makes them global.
  check_layer(
      "batchnorm", [&] { return std::make_unique<BatchNorm>("bn", 3); },
      [&](const SpatialContext& ctx, auto) {
        auto bn = std::make_unique<BatchNorm>("bn", 3);
        bn->set_stats_reducer(spatial_batchnorm_reducer(*ctx.comm));
        return bn;
      },
      3);
}

TEST(SpatialLayers, ImpossibleSplitsNameLayerAndDimension) {
  MemoryStore store;
  auto errors = run_ranks(4, [&](int r) {
    auto comm = spatial_comm(store, r, 4);
    SpatialContext ctx{comm.get(), {4, 1, 1}};
    try {
      DistConv("block3.conv", {2, 2, 5, 1, 2, 3, true, 1}, ctx, {6, 8, 8});  // halo 2 > neighbour block
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), "model.layers.block3.conv");
      EXPECT_NE(std::string(e.what()).find("dimension D"), std::string::npos) << e.what();
    }
    try {
      DistPool("pool", {true, 2, 2, 0, 3}, ctx, {3, 8, 8});  // 3 voxels over 4 ranks
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be split into 4"), std::string::npos) << e.what();
    }
  });
  rethrow_first(errors);
}

// Relative error below 1e-4 (float32 sums in another order through the whole network), measured
// against a hundredth of the whole gradient's norm where a parameter's own is smaller: a convolution
// bias in front of BatchNorm has a gradient that is zero up to rounding, and that rounding depends on
// the kernels oneDNN picks for the processor (on an AMD EPYC without AMX it is 1.4e-7 of the whole
// gradient's norm, so a bound of 1e-6 of it still leaves room).
void expect_same_gradients(const std::vector<std::vector<float>>& got, const std::vector<Param*>& want) {
  ASSERT_EQ(got.size(), want.size());
  double total = 0;
  for (Param* p : want)
    for (float v : p->grad.span()) total += double(v) * v;
  for (size_t i = 0; i < want.size(); ++i) {
    double num = 0, den = 0;
    for (int64_t k = 0; k < want[i]->grad.numel(); ++k) {
      num += (double(got[i][k]) - want[i]->grad[k]) * (double(got[i][k]) - want[i]->grad[k]);
      den += double(want[i]->grad[k]) * want[i]->grad[k];
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-4 * total)), 1e-4) << want[i]->name;
  }
}

// The whole model: same loss, and the same gradients once summed over the spatial group.
TEST(SpatialModel, CosmoFlowEqualsSingleRank) {
  for (SpatialGrid grid : {SpatialGrid{2, 1, 1}, SpatialGrid{4, 1, 1}, SpatialGrid{2, 2, 1}}) {
    SCOPED_TRACE("grid " + std::to_string(grid.d) + "x" + std::to_string(grid.h));
    ModelConfig c;
    c.input_size = 16;
    c.base_channels = 4;
    c.hidden = {16};
    c.batchnorm = true;
    auto ref = make_model(c);
    Tensor x = random_tensor({3, 4, 16, 16, 16}, 5), t = random_tensor({3, 4}, 6);
    Tensor out = ref->forward(x, true);
    LossResult l = ref->loss(out, t);
    for (Param* p : ref->params()) p->grad.zero();
    ref->backward(l.grad);
    MemoryStore store;
    std::mutex mu;
    std::vector<std::vector<float>> grads;
    double dist_loss = 0;
    auto errors = run_ranks(grid.size(), [&](int r) {
      auto comm = spatial_comm(store, r, grid.size());
      ModelConfig sc = c;
      sc.spatial = grid;
      auto m = make_model(sc, comm.get());
      Tensor o = m->forward(crop(x, *m->input_partition()), true);
      auto held = m->held_samples(3);
      ASSERT_EQ(o.dim(0), static_cast<int64_t>(held.size()));
      Tensor th({o.dim(0), 4});
      for (size_t i = 0; i < held.size(); ++i)
        for (int k = 0; k < 4; ++k) {
          th[i * 4 + k] = t[held[i] * 4 + k];
          EXPECT_NEAR(o[i * 4 + k], out[held[i] * 4 + k], 1e-5 * (1 + std::fabs(out[held[i] * 4 + k])));
        }
      LossResult lr = m->loss(o, th);
      // Normalised by the replica's batch, as the trainer does.
      const float scale = static_cast<float>(o.dim(0)) / 3.0f;
      for (auto& g : lr.grad.span()) g *= scale;
      double part[1] = {o.dim(0) ? lr.loss * scale : 0.0};
      for (Param* p : m->params()) p->grad.zero();
      m->backward(lr.grad);
      comm->allreduce(std::span<double>(part, 1));
      for (Param* p : m->params()) comm->allreduce(p->grad.span());
      std::lock_guard<std::mutex> lock(mu);
      if (r == 0) {
        dist_loss = part[0];
        for (Param* p : m->params()) grads.emplace_back(p->grad.span().begin(), p->grad.span().end());
      }
    });
    for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(testing::message(errors[r]), "") << "rank " << r;
    EXPECT_NEAR(dist_loss, l.loss, 1e-5 * l.loss);
    expect_same_gradients(grads, ref->params());
  }
}

TEST(SpatialModel, UNet3DEqualsSingleRank) {
  for (SpatialGrid grid : {SpatialGrid{2, 1, 1}, SpatialGrid{2, 2, 1}}) {
    SCOPED_TRACE("grid " + std::to_string(grid.d) + "x" + std::to_string(grid.h));
    ModelConfig c;
    c.name = "unet3d";
    c.input_size = 8;
    c.base_channels = 2;
    auto ref = make_model(c);
    Tensor x = random_tensor({2, 1, 8, 8, 8}, 7);
    Tensor labels({2, 8, 8, 8});
    for (int64_t i = 0; i < labels.numel(); ++i) labels[i] = static_cast<float>((i * 7 + i / 13) % 3);
    Tensor out = ref->forward(x, true);
    LossResult l = ref->loss(out, labels);
    for (Param* p : ref->params()) p->grad.zero();
    ref->backward(l.grad);
    MemoryStore store;
    std::mutex mu;
    std::vector<std::vector<float>> grads;
    double dist_loss = 0;
    auto errors = run_ranks(grid.size(), [&](int r) {
      auto comm = spatial_comm(store, r, grid.size());
      ModelConfig sc = c;
      sc.spatial = grid;
      auto m = make_model(sc, comm.get());
      const Partition& p = *m->input_partition();
      // This rank's share of the work: its block's outputs, an even share of the volume here.
      EXPECT_DOUBLE_EQ(m->forward_flops() * grid.size(), ref->forward_flops()) << "rank " << r;
      Tensor o = m->forward(crop(x, p), true);
      EXPECT_LT(rel_error(o, crop(out, p)), 1e-5) << "logits, rank " << r;
      Tensor lab = crop(labels.reshape({2, 1, 8, 8, 8}), p);
      lab = lab.reshape({2, lab.dim(2), lab.dim(3), lab.dim(4)});
      LossResult lr = m->loss(o, lab);
      const double share = m->loss_share(2);
      for (auto& g : lr.grad.span()) g *= static_cast<float>(share);
      double part[1] = {lr.loss * share};
      for (Param* q : m->params()) q->grad.zero();
      m->backward(lr.grad);
      comm->allreduce(std::span<double>(part, 1));
      for (Param* q : m->params()) comm->allreduce(q->grad.span());
      std::lock_guard<std::mutex> lock(mu);
      if (r == 0) {
        dist_loss = part[0];
        for (Param* q : m->params()) grads.emplace_back(q->grad.span().begin(), q->grad.span().end());
      }
    });
    for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(testing::message(errors[r]), "") << "rank " << r;
    EXPECT_NEAR(dist_loss, l.loss, 1e-5 * l.loss);
    expect_same_gradients(grads, ref->params());
  }
}

}  // namespace
}  // namespace tessera
