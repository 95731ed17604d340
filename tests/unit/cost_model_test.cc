// The cost model (common/cost_model.h) against hand-computed cases. bench/cluster/cost_model.py
// calls the same code through its C interface, and tests/bench/cost_model_test.py checks it there.
#include "common/cost_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace tessera::cost {
namespace {

constexpr double kAi = 1e-4, kBi = 1e-8, kAl = 1e-5, kCl = 1e-9;

// Links as given, selection and passes free, nothing shared and nothing hidden: the times add up.
Machine machine() {
  Machine m;
  m.alpha_inter = kAi, m.wire_inter = kBi, m.alpha_intra = kAl, m.cpu_intra = kCl;
  m.selection = {{0.001, 0.0}};
  return m;
}

TEST(CostModelTest, DenseIsAWorldRing) {
  const double S = 1e6;
  EXPECT_DOUBLE_EQ(exchange_cost(Strategy::kDense, S, 1, 2, 1, machine()).seconds, 2 * (kAi + 4 * S / 2 * kBi));
  // 4 nodes x 2 ranks: 14 steps of S/8 across each node's link; the node's other rank sends through loopback
  EXPECT_NEAR(exchange_cost(Strategy::kDense, S, 1, 4, 2, machine()).seconds,
              14 * (kAi + 4 * S / 8 * kBi) + 14 * 4 * S / 8 * kCl / 2, 1e-12);
  EXPECT_NEAR(exchange_cost(Strategy::kDense, S, 1, 1, 2, machine()).seconds, 2 * (kAl + 4 * S / 2 * kCl), 1e-12);
}

// communication.gradientPrecision bf16: dense and torus move 2 bytes a value, the sparse pairs 6.
TEST(CostModelTest, Bf16GradientsCountTheirBytes) {
  const double S = 1e6;
  EXPECT_DOUBLE_EQ(exchange_cost(Strategy::kDense, S, 1, 2, 1, machine(), 2).seconds, 2 * (kAi + 2 * S / 2 * kBi));
  EXPECT_DOUBLE_EQ(exchange_cost(Strategy::kTorus, S, 1, 4, 1, machine(), 2).seconds,
                   exchange_cost(Strategy::kDense, S, 1, 4, 1, machine(), 2).seconds);
  // topk on 2 x 1 with no CPU costs: one step of k pairs across the link
  const double k = std::ceil(0.001 * S);
  EXPECT_NEAR(exchange_cost(Strategy::kTopk, S, 0.001, 2, 1, machine(), 2).seconds, kAi + 6 * k * kBi, 1e-12);
  EXPECT_NEAR(exchange_cost(Strategy::kTopk, S, 0.001, 2, 1, machine(), 4).seconds, kAi + 8 * k * kBi, 1e-12);
  EXPECT_THROW(exchange_cost(Strategy::kDense, S, 1, 2, 1, machine(), 3), std::logic_error);
}

TEST(CostModelTest, TorusRingsShareTheNodeLink) {
  const double S = 1e6;
  const int m = 2, n = 4;
  EXPECT_NEAR(exchange_cost(Strategy::kTorus, S, 1, m, n, machine()).seconds,
              2 * (n - 1) * (kAl + 4 * S / n * kCl) + 2 * (m - 1) * (kAi + 4 * S / m * kBi), 1e-12);
  // one rank per node: the ring across nodes alone, dense's world ring
  Machine mc = machine();
  mc.cpu_inter = 1e-9, mc.pass = 1e-9;
  EXPECT_NEAR(exchange_cost(Strategy::kTorus, S, 1, 4, 1, mc).seconds,
              exchange_cost(Strategy::kDense, S, 1, 4, 1, mc).seconds, 1e-12);
}

// Rings side by side that fill each other's gaps on the link: 4 rings at 0.9 take 3.6 times one
// ring's wire time per byte; never less than one ring's; one ring alone (4 x 1) is unchanged.
TEST(CostModelTest, RingsSharingALinkTakeItsSharingFactor) {
  const double S = 1e6;
  const int m = 2, n = 4;
  Machine mc = machine();
  mc.link_sharing = 0.9;
  EXPECT_NEAR(exchange_cost(Strategy::kTorus, S, 1, m, n, mc).seconds,
              2 * (n - 1) * (kAl + 4 * S / n * kCl) + 2 * (m - 1) * (kAi + 0.9 * 4 * S / m * kBi), 1e-12);
  const double ks = std::ceil(0.01 * S / n);
  EXPECT_NEAR(exchange_cost(Strategy::kHitopk, S, 0.01, m, n, mc).seconds,
              (n - 1) * (kAl + 4 * S / n * kCl) + (kAi + 0.9 * 8 * ks * n * kBi) + (n - 1) * (kAl + 8 * m * ks * kCl),
              1e-12);
  mc.link_sharing = 0.1;
  EXPECT_DOUBLE_EQ(mc.shared_wire(n), 1.0);
  EXPECT_DOUBLE_EQ(mc.shared_wire(1), 1.0);
  EXPECT_NEAR(exchange_cost(Strategy::kTorus, S, 1, 4, 1, mc).seconds,
              exchange_cost(Strategy::kTorus, S, 1, 4, 1, machine()).seconds, 1e-15);
}

// sparse_work scales the sparse strategies' CPU work besides the selection (loopback copies, the
// pairs' bytes, zeroing and the scatter-add), and nothing of the selection, the wire or the dense ones.
TEST(CostModelTest, SparseWorkScalesTheSparseExchangesWorkBesidesTheSelection) {
  const double S = 1e6, d = 0.01;
  Machine mc = machine();
  mc.pass = 1e-9, mc.add = 1e-8, mc.cpu_inter = 2e-9;
  mc.selection = {{d, 2e-9}};
  Machine more = mc;
  more.sparse_work = 1.5;
  for (Strategy s : {Strategy::kTopk, Strategy::kHitopk}) {
    const ExchangeCost base = exchange_cost(s, S, d, 2, 2, mc), scaled = exchange_cost(s, S, d, 2, 2, more);
    EXPECT_NEAR(scaled.select, base.select, 1e-15) << strategy_name(s);
    EXPECT_NEAR(scaled.busy - scaled.select, 1.5 * (base.busy - base.select), 1e-12) << strategy_name(s);
    EXPECT_GT(scaled.seconds, base.seconds) << strategy_name(s);
  }
  for (Strategy s : {Strategy::kDense, Strategy::kTorus})
    EXPECT_NEAR(exchange_cost(s, S, 1, 2, 2, more).seconds, exchange_cost(s, S, 1, 2, 2, mc).seconds, 1e-15)
        << strategy_name(s);
  // hitopk on 2 x 2: one loopback step of 4S/2 bytes, then after the selection zeroing the bucket
  // and scatter-adding every pair, all 1.5 times (nothing shared, nothing hidden: the times add up)
  const double ks = std::ceil(d * S / 2);
  const ExchangeCost h = exchange_cost(Strategy::kHitopk, S, d, 2, 2, more);
  EXPECT_NEAR(h.busy - h.select,
              1.5 * (4 * S / 2 * kCl + 8 * ks * mc.cpu_inter + 8 * 2 * ks * kCl + S * mc.pass + 4 * ks * mc.add),
              1e-12);
}

TEST(CostModelTest, HitopkSendsPairsAndTheSelectionComesFirst) {
  const double S = 1e6, d = 0.01;
  const int m = 2, n = 2;
  Machine mc = machine();
  const double ks = std::ceil(d * S / n);
  EXPECT_NEAR(exchange_cost(Strategy::kHitopk, S, d, m, n, mc).seconds,
              (kAl + 4 * S / n * kCl) + (kAi + 8 * ks * n * kBi) + (kAl + 8 * m * ks * kCl), 1e-12);
  // a selection of 1 ns a float on its shard: it adds to the time, and is reported as the selection
  mc.selection = {{d, 1e-9}};
  const ExchangeCost c = exchange_cost(Strategy::kHitopk, S, d, m, n, mc);
  EXPECT_NEAR(c.select, S / n * 1e-9, 1e-15);
  EXPECT_NEAR(c.seconds - exchange_cost(Strategy::kHitopk, S, d, m, n, machine()).seconds, S / n * 1e-9, 1e-12);
}

TEST(CostModelTest, SharedCoresSlowCpuWork) {
  Machine own = machine(), shared = machine();
  own.cores = 4, shared.cores = 2;
  own.selection = shared.selection = {{0.001, 1e-9}};
  own.cpu_intra = shared.cpu_intra = 0;
  EXPECT_NEAR(exchange_cost(Strategy::kTopk, 1e6, 0.001, 2, 2, own).select, 1e-3, 1e-12);
  EXPECT_NEAR(exchange_cost(Strategy::kTopk, 1e6, 0.001, 2, 2, shared).select, 2e-3, 1e-12);
}

TEST(CostModelTest, TheNearestCalibratedDensity) {
  Machine mc;
  mc.selection = {{0.001, 1.0}, {0.01, 2.0}};
  EXPECT_EQ(mc.selection_at(0.002), 1.0);
  EXPECT_EQ(mc.selection_at(0.005), 2.0);
  EXPECT_EQ(mc.selection_at(0.5), 2.0);
}

TEST(CostModelTest, BucketsHoldEveryParameterLastLayerFirst) {
  // three layers of 4M floats each (16 MB): the 25 MiB cap puts the last two apart from the first
  const std::vector<LayerCost> layers = {{4e6, 1e9}, {4e6, 1e9}, {4e6, 2e9}};
  const auto b = buckets(layers);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_DOUBLE_EQ(b[0].floats + b[1].floats + b[2].floats, 12e6);
  // backward FLOPs: 4e9 (last), 2e9, 1e9 (the first layer has no input gradient): 4/7, 6/7, 1
  EXPECT_NEAR(b[0].ready, 4.0 / 7, 1e-12);
  EXPECT_NEAR(b[1].ready, 6.0 / 7, 1e-12);
  EXPECT_NEAR(b[2].ready, 1.0, 1e-12);
  const auto one = buckets({{1e6, 1e9}, {1e6, 1e9}});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_DOUBLE_EQ(one[0].floats, 2e6);
}

TEST(CostModelTest, OverlapHidesAtMostTheBackwardPass) {
  const std::vector<LayerCost> layers = {{1e6, 1e9}, {8e6, 1e9}, {1e6, 1e8}};
  const Machine mc = machine();
  const StepCost seq = step_cost(layers, Strategy::kDense, 1, 2, 1, mc, 0.3, 0.01, false);
  const StepCost ovl = step_cost(layers, Strategy::kDense, 1, 2, 1, mc, 0.3, 0.01, true);
  EXPECT_NEAR(seq.seconds, 0.01 + 0.3 + seq.total, 1e-12);
  EXPECT_NEAR(seq.exposed, seq.total, 1e-12);
  EXPECT_LT(ovl.seconds, seq.seconds);
  EXPECT_GE(ovl.seconds, seq.seconds - 0.3 * 2 / 3 - 1e-12);
}

// A CPU-bound exchange on shared cores takes as long overlapped as after the backward pass, which
// shares the cores with all of its CPU work; with a busy share below 1 the pass shares them with that
// share of it, and a step without overlap is unchanged.
TEST(CostModelTest, AnOverlappedCpuBoundExchangeHoldsTheCoresForItsBusyShare) {
  const std::vector<LayerCost> layers = {{1e6, 1e9}, {8e6, 1e9}, {1e6, 1e8}};
  Machine mc = machine();
  mc.cores = 2, mc.cpu_inter = kBi, mc.hidden = 1;  // 4 processes on 2 cores: twice the wire time
  double busy = 0;
  for (const Bucket& b : buckets(layers)) busy += exchange_cost(Strategy::kDense, b.floats, 1, 4, 1, mc).busy;
  const double compute = 0.3, rest = 0.01;
  const StepCost seq = step_cost(layers, Strategy::kDense, 1, 4, 1, mc, compute, rest, false);
  EXPECT_NEAR(seq.total, busy, 1e-12);
  EXPECT_NEAR(step_cost(layers, Strategy::kDense, 1, 4, 1, mc, compute, rest, true).seconds, seq.seconds, 1e-12);
  mc.busy_share = 0.5;
  EXPECT_NEAR(step_cost(layers, Strategy::kDense, 1, 4, 1, mc, compute, rest, false).seconds, seq.seconds, 1e-12);
  const StepCost ovl = step_cost(layers, Strategy::kDense, 1, 4, 1, mc, compute, rest, true);
  EXPECT_NEAR(ovl.seconds, rest + std::max(compute + ovl.exposed, compute + 0.5 * busy), 1e-12);
  EXPECT_LT(ovl.seconds, seq.seconds - 0.9 * compute * 2 / 3);  // beside nearly all of the backward pass
}

TEST(CostModelTest, MomentumCorrectionAddsItsPassesOverEveryBucket) {
  const std::vector<LayerCost> layers = {{1e6, 1e9}, {8e6, 1e9}, {1e6, 1e8}};
  Machine mc = machine();
  mc.pass = 1e-10;
  for (Strategy s : {Strategy::kDense, Strategy::kHitopk}) {
    const StepCost plain = step_cost(layers, s, 0.01, 2, 1, mc, 0.3, 0.01, false);
    const StepCost corrected = step_cost(layers, s, 0.01, 2, 1, mc, 0.3, 0.01, false, kBucketBytes, true);
    // the velocity read and written as the bucket is filled (2 streams) over all 10M floats, after
    // a sparse exchange the mask (1 more); the update without a momentum buffer (2 fewer) and the
    // gradients started from the weight decay (1 more): 1 fewer in the compute
    const double streams = s == Strategy::kHitopk ? 3 : 2;
    EXPECT_NEAR(corrected.total - plain.total, streams * 10e6 * mc.pass, 1e-9) << strategy_name(s);
    EXPECT_NEAR(corrected.seconds - plain.seconds, (streams - 1) * 10e6 * mc.pass, 1e-9) << strategy_name(s);
  }
}

TEST(CostModelTest, AnUnknownStrategyIsNamed) {
  EXPECT_EQ(parse_strategy("hitopk"), Strategy::kHitopk);
  EXPECT_STREQ(strategy_name(Strategy::kTorus), "torus");
  try {
    parse_strategy("ring", "spec.communication.strategy");
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.problems().front().field, "spec.communication.strategy");
    EXPECT_NE(std::string(e.what()).find("'ring'"), std::string::npos);
  }
}

}  // namespace
}  // namespace tessera::cost
