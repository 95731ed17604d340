#include "worker/comm/topology.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace tessera {
namespace {

TEST(TopologyTest, GridIsNodeMajor) {
  auto t = Topology::grid(3, 2);
  EXPECT_EQ(t.world_size(), 6);
  EXPECT_EQ(t.num_nodes(), 3);
  EXPECT_EQ(t.node_index(3), 1);
  EXPECT_EQ(t.placement(3).local_rank, 1);
  EXPECT_EQ(t.node_ranks(2), (std::vector<int>{4, 5}));
  EXPECT_EQ(t.peers_with_local_rank(1), (std::vector<int>{1, 3, 5}));
  EXPECT_TRUE(t.uniform());
}

TEST(TopologyTest, InterleavedPlacementsOrderNodesByLowestRank) {
  Topology t({{"b", 0}, {"a", 0}, {"b", 1}, {"a", 1}});
  EXPECT_EQ(t.node_name(0), "b");
  EXPECT_EQ(t.node_ranks(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(t.node_ranks(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(t.peers_with_local_rank(0), (std::vector<int>{0, 1}));
}

TEST(TopologyTest, UnevenNodesAreRejectedWhereRequired) {
  Topology t({{"a", 0}, {"a", 1}, {"b", 0}});
  EXPECT_FALSE(t.uniform());
  EXPECT_EQ(t.peers_with_local_rank(1), (std::vector<int>{1}));
  try {
    t.require_uniform("communication.strategy", "'torus'");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "communication.strategy");
    std::string m = e.what();
    EXPECT_NE(m.find("'torus' needs the same number of ranks on every node"), std::string::npos) << m;
    EXPECT_NE(m.find("node 'b' has 1"), std::string::npos) << m;
  }
}

TEST(TopologyTest, BadLocalRanksNameTheRank) {
  try {
    Topology t({{"a", 0}, {"a", 0}});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "topology.rank[1].localRank");
    EXPECT_NE(std::string(e.what()).find("twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Topology({{"a", 1}}), ConfigError);
  EXPECT_THROW(Topology({{"", 0}}), ConfigError);
  EXPECT_THROW(Topology({}), ConfigError);
  EXPECT_THROW(Topology::grid(0, 2), ConfigError);
}

TEST(TopologyTest, DiscoverThroughStore) {
  MemoryStore store;
  std::vector<RankPlacement> mine = {{"x", 0}, {"y", 0}, {"x", 1}};
  for (int r = 1; r < 3; ++r)
    PrefixStore("topology", store).set(std::to_string(r), std::to_string(mine[r].local_rank) + " " + mine[r].node);
  auto t = Topology::discover(store, 0, 3, mine[0], Millis(1000));
  EXPECT_EQ(t.node_ranks(0), (std::vector<int>{0, 2}));
  try {
    Topology::discover(store, 0, 4, mine[0], Millis(50));
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 did not publish"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
