// choose_exchange (common/exchange_choice.h) over a table of links and compute figures, with the
// boundary cases: one rank, a single node, one rank per node, equal links inside and between nodes,
// no sparse epochs left, and a sparse gain inside the margin.
#include "common/exchange_choice.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace tessera::cost {
namespace {

// A GPU cluster's costs (the seed setting of bench/cluster/cost_model.py) with links of `bits` a
// second between nodes: NVLink inside, GPU kernels for selection and passes, nothing shared.
Machine gpu_machine(double bits) {
  Machine m;
  m.alpha_inter = 10e-6, m.wire_inter = 8 / (0.9 * bits);
  m.alpha_intra = 5e-6, m.cpu_intra = 1 / 130e9;
  m.selection = {{0.001, 0.02e-9}, {0.01, 0.02e-9}};
  m.pass = 0.005e-9, m.add = 0.02e-9, m.hidden = 1.0;
  return m;
}

// ResNet-50's 25.6M parameters in four buckets, the last ready when the backward pass ends.
std::vector<Bucket> resnet_buckets() { return {{2.05e6 + 4.5e6, 0.1}, {6.5e6, 0.3}, {6.5e6, 0.6}, {6.05e6, 1.0}}; }

ChoiceInput input(double bits, int nodes, int local, double compute_s) {
  ChoiceInput in;
  in.buckets = resnet_buckets();
  in.nodes = nodes, in.local = local;
  in.machine = gpu_machine(bits);
  in.compute_s = compute_s;
  in.sparse_share = 0.5;
  in.densities = {0.01, 0.001};
  return in;
}

// The call throws a ConfigError whose message names `field`.
void expect_named(const ChoiceInput& in, const std::string& field) {
  try {
    choose_exchange(in);
    ADD_FAILURE() << "no error for " << field;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

struct Row {
  double bits;
  int nodes, local;
  double compute_s;
  std::string chosen;
};

TEST(ExchangeChoiceTest, ChoosesTheFastestOverATableOfLinksAndCompute) {
  const std::vector<Row> table = {
      // slow links between nodes: a sparse phase at the lower density, hierarchical with 8 GPUs a node
      {100e6, 4, 8, 0.1, "hitopk at density 0.001, then torus"},
      {1e9, 16, 8, 0.1, "hitopk at density 0.001, then torus"},
      // the seed's 25 GbE and a small step: communication is exposed and hitopk still gains
      {25e9, 16, 8, 0.09, "hitopk at density 0.001, then torus"},
      // fast links and a long step: the dense exchange hides behind the backward pass
      {100e9, 16, 8, 1.0, "torus"},
      {25e9, 16, 8, 5.0, "torus"},
      // one rank per node: torus is the ring across nodes, as dense; a tie goes to dense
      {100e9, 4, 1, 1.0, "dense"},
      // ... and hitopk's reduce-scatter inside the node a copy: topk is the sparse phase
      {100e6, 4, 1, 0.1, "topk at density 0.001, then dense"},
  };
  for (const Row& r : table) {
    const ExchangeChoice c = choose_exchange(input(r.bits, r.nodes, r.local, r.compute_s));
    EXPECT_EQ(c.chosen.name(), r.chosen) << r.bits << " bit/s, " << r.nodes << " x " << r.local << ", compute "
                                         << r.compute_s << " s: " << c.reason;
    // every candidate, fastest first, and the chosen one among the fastest (the margin aside)
    ASSERT_EQ(c.options.size(), 6u);
    for (size_t i = 1; i < c.options.size(); ++i) EXPECT_LE(c.options[i - 1].mean_step, c.options[i].mean_step);
    EXPECT_LE(c.chosen.mean_step, c.options.front().mean_step / 0.95 + 1e-12);
  }
}

TEST(ExchangeChoiceTest, TheReasonGivesTheLinksAndThePredictedSteps) {
  const ExchangeChoice c = choose_exchange(input(1e9, 16, 8, 0.1));
  EXPECT_NE(c.reason.find("inter-node links measured at 900 Mbit/s"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("hitopk at density 0.001 predicted "), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find(" a step against torus "), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("sparse for 50% of the remaining steps"), std::string::npos) << c.reason;
  // the hybrid's mean: half its steps sparse
  EXPECT_NEAR(c.chosen.mean_step, 0.5 * c.chosen.sparse_step + 0.5 * c.chosen.dense_step, 1e-12);
  EXPECT_LT(c.chosen.sparse_step, c.chosen.dense_step);
}

TEST(ExchangeChoiceTest, OneRankHasNothingToExchange) {
  const ExchangeChoice c = choose_exchange(input(100e6, 1, 1, 0.1));
  EXPECT_EQ(c.chosen.name(), "dense");
  EXPECT_EQ(c.reason, "one rank: nothing to exchange");
  for (const ExchangeOption& o : c.options) EXPECT_FALSE(o.hybrid);
}

TEST(ExchangeChoiceTest, ASingleNodeExchangesThroughItsOwnLinks) {
  // 8 GPUs on NVLink: no link between nodes to spare, and a sparse phase's selection costs more
  // than the dense ring saves
  const ExchangeChoice c = choose_exchange(input(100e6, 1, 8, 0.1));
  EXPECT_FALSE(c.chosen.hybrid) << c.reason;
  EXPECT_NE(c.reason.find("one node (no links between nodes)"), std::string::npos) << c.reason;
  // the link rate between nodes plays no part
  EXPECT_DOUBLE_EQ(choose_exchange(input(100e9, 1, 8, 0.1)).chosen.mean_step, c.chosen.mean_step);
}

TEST(ExchangeChoiceTest, EqualLinksInsideAndBetweenNodesMakeTorusNoFasterThanDense) {
  // every link the same (a node's ranks talk through the same network): torus's n rings share the
  // node's link, so it gains nothing over the world ring
  ChoiceInput in = input(10e9, 4, 4, 0.5);
  in.machine.alpha_intra = in.machine.alpha_inter;
  in.machine.cpu_intra = in.machine.wire_inter;
  in.sparse_share = 0;
  const ExchangeChoice c = choose_exchange(in);
  EXPECT_EQ(c.chosen.name(), "dense") << c.reason;
  EXPECT_NEAR(c.options[0].mean_step, c.options[1].mean_step, 0.05 * c.options[0].mean_step);
}

TEST(ExchangeChoiceTest, NoSparsePhaseOnceTheDenseEpochsHaveBegun) {
  ChoiceInput in = input(100e6, 4, 8, 0.1);
  in.sparse_share = 0;
  const ExchangeChoice c = choose_exchange(in);
  EXPECT_EQ(c.chosen.name(), "torus");
  EXPECT_EQ(c.options.size(), 2u);
  EXPECT_NE(c.reason.find("no sparse phase is left"), std::string::npos) << c.reason;
  // a job whose switch epoch is 0 (auto's default under LARS momentum) allows none from the start
  Calibration cal;
  cal.nodes = 16, cal.local = 8, cal.machine = gpu_machine(1e9), cal.compute_s = 0.1, cal.buckets = resnet_buckets();
  const ExchangeChoice none = choose_for(cal, 0, 0, 1000, {0.01});
  EXPECT_FALSE(none.chosen.hybrid);
  EXPECT_NE(none.reason.find("the job allows no sparse phase"), std::string::npos) << none.reason;
  EXPECT_TRUE(choose_for(cal, 0, 500, 1000, {0.01}).chosen.hybrid);  // at 1 Gbit/s, when allowed
}

TEST(ExchangeChoiceTest, ASparseGainInsideTheMarginKeepsTheDenseExchange) {
  ChoiceInput in = input(25e9, 16, 8, 0.09);
  const ExchangeChoice sparse = choose_exchange(in);
  ASSERT_TRUE(sparse.chosen.hybrid);
  // a margin just above the chosen option's gain over the best dense one keeps the dense exchange
  double best_dense = 1e30;
  for (const ExchangeOption& o : sparse.options)
    if (!o.hybrid) best_dense = std::min(best_dense, o.mean_step);
  in.sparse_margin = 1 - sparse.chosen.mean_step / best_dense + 0.01;
  const ExchangeChoice kept = choose_exchange(in);
  EXPECT_FALSE(kept.chosen.hybrid) << kept.reason;
  EXPECT_NE(kept.reason.find("a sparse phase would not gain"), std::string::npos) << kept.reason;
}

// A new choice is made for links that changed by more than a factor of 2.
TEST(ExchangeChoiceTest, LinksHaveChangedByMoreThanAFactorOfTwo) {
  Calibration a, b;
  a.machine = gpu_machine(10e9);
  b.machine = gpu_machine(1e9);
  EXPECT_TRUE(links_changed(a, b));  // cut to a tenth
  EXPECT_TRUE(links_changed(b, a));  // and back
  b.machine = gpu_machine(6e9);
  EXPECT_FALSE(links_changed(a, b));  // within a factor of 2
  b.machine = gpu_machine(4.9e9);
  EXPECT_TRUE(links_changed(a, b));
  b.machine.wire_inter = 0;  // one node: no link between nodes
  EXPECT_TRUE(links_changed(a, b));
  a.machine.wire_inter = 0;
  EXPECT_FALSE(links_changed(a, b));
}

TEST(ExchangeChoiceTest, BadInputIsNamed) {
  ChoiceInput in = input(1e9, 2, 2, 0.1);
  in.buckets.clear();
  expect_named(in, "buckets");
  in = input(1e9, 2, 2, 0.1);
  in.densities = {0};
  expect_named(in, "densities");
  in = input(1e9, 2, 2, 0.1);
  in.sparse_share = 1.5;
  expect_named(in, "sparse_share");
  in = input(1e9, 0, 2, 0.1);
  expect_named(in, "ranks");
}

}  // namespace
}  // namespace tessera::cost
