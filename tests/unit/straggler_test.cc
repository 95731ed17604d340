// Stragglers: the round-robin probe schedule meets every pair of nodes once; the verdict names a
// node whose links are all slow (and nobody on two nodes, where one link has none to compare with),
// a rank whose compute is slow, and no one on even figures; the probe over real Gloo connections
// gives every rank the same symmetric matrix; the watch reports only what two rounds agree on.
#include "worker/train/straggler.h"

#include <gtest/gtest.h>

#include <mutex>
#include <set>

#include "testing/rank_threads.h"
#include "worker/comm/gloo/gloo_communicator.h"

namespace tessera {
namespace {

using testing::rethrow_first;
using testing::run_ranks;

TEST(StragglerTest, TheTournamentMeetsEveryPairOnce) {
  for (int m = 1; m <= 9; ++m) {
    std::set<std::pair<int, int>> met;
    for (int r = 0; r < tournament_rounds(m); ++r) {
      std::set<int> busy;
      for (int i = 0; i < m; ++i) {
        const int p = tournament_partner(m, r, i);
        if (p < 0) continue;
        ASSERT_NE(p, i) << m << " members, round " << r;
        ASSERT_EQ(tournament_partner(m, r, p), i) << "pairs are mutual: " << m << " members, round " << r;
        ASSERT_TRUE(busy.insert(i).second);
        met.insert({std::min(i, p), std::max(i, p)});
      }
      EXPECT_GE(static_cast<int>(busy.size()), m - 1) << "at most one member sits a round out";
    }
    EXPECT_EQ(static_cast<int>(met.size()), m * (m - 1) / 2) << m << " members";
  }
}

// Seconds of one probe between nodes, every link at `fast` except those of node `slow` (-1: none).
std::vector<double> links(int m, int slow, double fast, double slow_s) {
  std::vector<double> s(m * m, 0.0);
  for (int a = 0; a < m; ++a)
    for (int b = 0; b < m; ++b)
      if (a != b) s[a * m + b] = (a == slow || b == slow) ? slow_s : fast * (1 + 0.1 * ((a + b) % 3));
  return s;
}

TEST(StragglerTest, ANodeWhoseLinksAreAllSlowIsNamed) {
  const Topology t = Topology::grid(3, 2);
  const size_t bytes = 1 << 20;
  const std::vector<double> even(6, 0.1);
  const StragglerReport r = judge_stragglers(t, links(3, 2, 0.01, 0.1), bytes, even);
  EXPECT_EQ(r.ranks, (std::vector<int>{4, 5}));
  EXPECT_NE(r.message.find("node node2 (ranks 4, 5) has a slow network"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("10.5 MB/s, the links between the other nodes 95.3 MB/s"), std::string::npos) << r.message;
  // Even links, even compute: no one.
  EXPECT_EQ(judge_stragglers(t, links(3, -1, 0.01, 0), bytes, even), StragglerReport{});
  // Twice as slow is within what shared machines do, and so is any link under a millisecond.
  EXPECT_TRUE(judge_stragglers(t, links(3, 1, 0.01, 0.02), bytes, even).ranks.empty());
  EXPECT_TRUE(judge_stragglers(t, links(3, 1, 0.0001, 0.0009), bytes, even).ranks.empty());
  // Four nodes, the second slow.
  EXPECT_EQ(judge_stragglers(Topology::grid(4, 1), links(4, 1, 0.01, 0.2), bytes, std::vector<double>(4, 0.1)).ranks,
            (std::vector<int>{1}));
  // Two nodes: one link, nothing to compare it with.
  EXPECT_TRUE(
      judge_stragglers(Topology::grid(2, 2), links(2, 1, 0.01, 1.0), bytes, std::vector<double>(4, 0.1)).ranks.empty());
}

TEST(StragglerTest, ARankWhoseComputeIsSlowIsNamed) {
  const Topology t = Topology::grid(2, 2);
  const StragglerReport r = judge_stragglers(t, {}, 0, {0.30, 0.31, 0.95, 0.29});
  EXPECT_EQ(r.ranks, (std::vector<int>{2}));
  EXPECT_EQ(r.message, "rank 2 (node node1) computes slowly: 950 ms per step, the other ranks 300 ms");
  EXPECT_TRUE(judge_stragglers(t, {}, 0, {0.30, 0.45, 0.5, 0.29}).ranks.empty());
  EXPECT_TRUE(judge_stragglers(Topology::grid(1, 1), {}, 0, {5.0}).ranks.empty());
}

TEST(StragglerTest, TheProbeGivesEveryRankTheSameSymmetricMatrix) {
  const int nodes = 3, local = 2, world = nodes * local;
  MemoryStore store;
  std::mutex mu;
  std::vector<std::vector<double>> seen(world);
  rethrow_first(run_ranks(world, [&](int r) {
    CommGroups g = connect_groups(store, Topology::grid(nodes, local), r, gloo_factory(Millis(20000)));
    const auto s = probe_node_links(g, 64 << 10, 2);
    std::lock_guard<std::mutex> lock(mu);
    seen[r] = s;
  }));
  for (int r = 1; r < world; ++r) EXPECT_EQ(seen[r], seen[0]) << "rank " << r;
  for (int a = 0; a < nodes; ++a)
    for (int b = 0; b < nodes; ++b) {
      if (a == b) {
        EXPECT_EQ(seen[0][a * nodes + b], 0.0);
        continue;
      }
      EXPECT_GT(seen[0][a * nodes + b], 0.0) << a << " - " << b;
      EXPECT_EQ(seen[0][a * nodes + b], seen[0][b * nodes + a]);
    }
}

// strategy auto chooses again when a link changes: twice as slow, or twice as fast, and above the
// 1 ms noise floor of shared cores.
TEST(StragglerTest, ALinkHasChangedByAFactorOfTwoAboveTheNoise) {
  EXPECT_TRUE(link_changed(0.0003, 0.0021));  // 10 Gbit/s cut to 1 Gbit/s: a 256 KiB probe
  EXPECT_TRUE(link_changed(0.0021, 0.0003));  // and back
  EXPECT_TRUE(link_changed(0.002, 0.0041));
  EXPECT_FALSE(link_changed(0.002, 0.0039));   // less than twice
  EXPECT_FALSE(link_changed(0.002, 0.0011));   // more than half
  EXPECT_FALSE(link_changed(0.0001, 0.0009));  // 9x, but both within the noise
  EXPECT_FALSE(link_changed(0, 0.5));          // no baseline yet
}

// The watch's probe takes about 5 ms of the link as last measured, in steps of 64 KiB, between its
// least size and 16 MiB.
TEST(StragglerTest, TheProbeTakesAboutFiveMillisecondsOfTheLink) {
  const size_t least = size_t{256} << 10, grain = size_t{64} << 10;
  EXPECT_EQ(next_probe_bytes(8 / 10e9, least), 6250000 / grain * grain);  // 10 Gbit/s: 6.25 MB
  EXPECT_EQ(next_probe_bytes(8 / 1e9, least), 625000 / grain * grain);    // 1 Gbit/s: 625 KB
  EXPECT_EQ(next_probe_bytes(8 / 100e6, least), least);                   // 100 Mbit/s: 62.5 KB, raised to the least
  EXPECT_EQ(next_probe_bytes(8 / 100e9, least), size_t{16} << 20);        // 100 Gbit/s: at most 16 MiB
  EXPECT_EQ(next_probe_bytes(0, least), size_t{16} << 20);                // nothing measured yet: no division by 0
}

// Two nodes: their one link is watched (not judged: no other link to compare it with), and whatever
// the rounds find (on loopback between threads, timing noise that may cross the noise floor on a
// loaded machine), every rank hears it at the same step, and no rank is named a straggler.
TEST(StragglerTest, EveryRankHearsOfALinkChangeAtTheSameStep) {
  const int world = 2;
  MemoryStore store;
  std::mutex mu;
  std::vector<std::vector<bool>> changes(world);
  std::vector<size_t> probe_bytes(world);
  rethrow_first(run_ranks(world, [&](int r) {
    CommGroups g = connect_groups(store, Topology::grid(2, 1), r, gloo_factory(Millis(20000)));
    StragglerWatch watch(g, 1e-9, 64 << 10);
    for (int step = 0; step < 8; ++step) {
      watch.after_step(0.1, 1.0);
      const bool changed = watch.take_link_change();
      std::lock_guard<std::mutex> lock(mu);
      changes[r].push_back(changed);
    }
    probe_bytes[r] = watch.link_probe_bytes();
    EXPECT_TRUE(watch.report().ranks.empty());
  }));
  EXPECT_EQ(changes[1], changes[0]);
  // the probe is sized from the same all-reduced figures on both ranks
  EXPECT_EQ(probe_bytes[1], probe_bytes[0]);
  EXPECT_GE(probe_bytes[0], size_t{64} << 10);
  // a change is said once for the rounds that found it: never two steps in a row (the next rounds
  // compare with the new figure, and need two rounds again)
  for (size_t i = 1; i < changes[0].size(); ++i) EXPECT_FALSE(changes[0][i] && changes[0][i - 1]) << "step " << i;
}

TEST(StragglerTest, TheWatchReportsWhatTwoRoundsInARowFind) {
  const int world = 3;
  MemoryStore store;
  std::mutex mu;
  std::vector<std::vector<std::vector<int>>> reports(world);  // each rank's report after each step
  rethrow_first(run_ranks(world, [&](int r) {
    // One node: no link is probed, so only the compute figures below decide (probes between
    // threads of one process are scheduling noise).
    CommGroups g = connect_groups(store, Topology::grid(1, world), r, gloo_factory(Millis(20000)));
    // A round every step (a tiny interval); rank 1 computes slowly from the third step on, and
    // evenly again from the seventh.
    StragglerWatch watch(g, 1e-9, 4096);
    for (int step = 0; step < 10; ++step) {
      const bool slow = r == 1 && step >= 2 && step < 6;
      watch.after_step(slow ? 1.0 : 0.1, 1.0);
      std::lock_guard<std::mutex> lock(mu);
      reports[r].push_back(watch.report().ranks);
    }
  }));
  const std::vector<int> none, one = {1};
  // The first round ends the fourth step (a round every 4 steps until the pace is known), then one
  // ends every step: rank 1 is found slow there and confirmed a step later, found even again after
  // the seventh step and cleared a step later.
  const std::vector<std::vector<int>> want = {none, none, none, none, one, one, one, none, none, none};
  for (int r = 0; r < world; ++r) EXPECT_EQ(reports[r], want) << "rank " << r;
}

}  // namespace
}  // namespace tessera
