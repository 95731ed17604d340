// Gang placement: all or nothing, fragmentation, selectors, taints and tolerations, topology
// preference; ring plans: ranks consecutive per node, nodes in topology order.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "controller/placement/gang_placer.h"
#include "controller/placement/ring_planner.h"

namespace tessera::placement {
namespace {

NodeInfo node(const std::string& name, int gpus, int used = 0, const std::string& zone = "z1",
              const std::string& rack = "r1") {
  NodeInfo n;
  n.name = name;
  n.labels = {{"topology.kubernetes.io/zone", zone}, {"example.com/rack", rack}, {"kubernetes.io/hostname", name}};
  n.allocatable = {gpus, 64, int64_t{512} << 30};
  n.used = {used, 0, 0};
  return n;
}

GangRequest gang(int replicas, int gpus) {
  GangRequest r;
  r.replicas = replicas;
  r.per_pod = {gpus, 4, int64_t{16} << 30};
  r.topology_keys = {"topology.kubernetes.io/zone", "example.com/rack", "kubernetes.io/hostname"};
  return r;
}

std::map<std::string, int> count(const PlacementResult& r) {
  std::map<std::string, int> c;
  for (const auto& n : r.nodes) ++c[n];
  return c;
}

TEST(GangPlacerTest, AllOrNothing) {
  GangPlacer p;
  std::vector<NodeInfo> nodes = {node("a", 8), node("b", 8, 4)};
  auto fits = p.place(gang(3, 4), nodes);
  ASSERT_TRUE(fits.placed) << fits.reason;
  EXPECT_EQ(fits.nodes.size(), 3u);
  auto no = p.place(gang(4, 4), nodes);
  EXPECT_FALSE(no.placed);
  EXPECT_TRUE(no.nodes.empty());
  EXPECT_NE(
      no.reason.find("needs 16 GPUs (4 pods of 4) on nodes matching any labels; 12 free on 2 nodes, room for 3 pods"),
      std::string::npos)
      << no.reason;
}

TEST(GangPlacerTest, FragmentedGpusDoNotFit) {
  GangPlacer p;
  // 12 free GPUs in all, but no node has 4 free.
  std::vector<NodeInfo> nodes = {node("a", 8, 5), node("b", 8, 5), node("c", 8, 5), node("d", 8, 5)};
  auto r = p.place(gang(1, 4), nodes);
  EXPECT_FALSE(r.placed);
  EXPECT_NE(r.reason.find("4 without enough free resources"), std::string::npos) << r.reason;
  nodes[2].used.gpu = 4;
  EXPECT_EQ(p.place(gang(1, 4), nodes).nodes, (std::vector<std::string>{"c"}));
}

TEST(GangPlacerTest, SelectorsTaintsAndTolerations) {
  GangPlacer p;
  std::vector<NodeInfo> nodes = {node("cpu", 0), node("v100", 8), node("a100", 8)};
  nodes[1].labels["pool"] = "v100";
  nodes[2].labels["pool"] = "a100";
  nodes[2].taints = {{"nvidia.com/gpu", "present", "NoSchedule"}};
  GangRequest r = gang(2, 4);
  r.node_selector = {{"pool", "a100"}};
  auto no = p.place(r, nodes);
  EXPECT_FALSE(no.placed);
  EXPECT_NE(no.reason.find("1 with untolerated taints"), std::string::npos) << no.reason;
  EXPECT_NE(no.reason.find("2 not matching the node selector"), std::string::npos) << no.reason;
  r.tolerations = {{"nvidia.com/gpu", "Exists", "", "NoSchedule"}};
  auto yes = p.place(r, nodes);
  ASSERT_TRUE(yes.placed) << yes.reason;
  EXPECT_EQ(yes.nodes, (std::vector<std::string>{"a100", "a100"}));
  // PreferNoSchedule does not exclude; NoExecute does; an Equal toleration must match the value.
  nodes[2].taints = {{"maintenance", "soon", "PreferNoSchedule"}};
  r.tolerations.clear();
  EXPECT_TRUE(p.place(r, nodes).placed);
  nodes[2].taints = {{"maintenance", "now", "NoExecute"}};
  r.tolerations = {{"maintenance", "Equal", "later", ""}};
  EXPECT_FALSE(p.place(r, nodes).placed);
  r.tolerations = {{"maintenance", "Equal", "now", ""}};
  EXPECT_TRUE(p.place(r, nodes).placed);
  nodes[2].unschedulable = true;
  EXPECT_FALSE(p.place(r, nodes).placed);
}

TEST(GangPlacerTest, PrefersFewestNodesAndClosestTopology) {
  GangPlacer p;
  std::vector<NodeInfo> nodes = {
      node("z1-r1-a", 8, 4, "z1", "r1"), node("z1-r1-b", 8, 4, "z1", "r1"),  // 4 free each
      node("z1-r2-a", 8, 0, "z1", "r2"),                                     // 8 free
      node("z2-r1-a", 8, 0, "z2", "r1"), node("z2-r1-b", 8, 0, "z2", "r1"),  // 16 free in one rack
  };
  // 8 GPUs: one whole node beats two half nodes.
  auto one = p.place(gang(8, 1), nodes);
  ASSERT_TRUE(one.placed);
  EXPECT_EQ(count(one).size(), 1u);
  // 16 GPUs: one rack of zone z2 (2 nodes) rather than three nodes across z1's racks.
  auto rack = p.place(gang(16, 1), nodes);
  ASSERT_TRUE(rack.placed);
  EXPECT_EQ(count(rack), (std::map<std::string, int>{{"z2-r1-a", 8}, {"z2-r1-b", 8}}));
  // 24 GPUs: no zone holds them; spread, still all or nothing.
  auto spread = p.place(gang(24, 1), nodes);
  ASSERT_TRUE(spread.placed);
  EXPECT_EQ(spread.nodes.size(), 24u);
  EXPECT_FALSE(p.place(gang(33, 1), nodes).placed);
}

TEST(RingPlannerTest, RanksConsecutivePerNodeInTopologyOrder) {
  std::vector<NodeInfo> nodes = {node("b", 8, 0, "z2", "r1"), node("a", 8, 0, "z1", "r2"), node("c", 8, 0, "z1", "r1")};
  const std::vector<std::string> keys = {"topology.kubernetes.io/zone", "example.com/rack", "kubernetes.io/hostname"};
  // Pods 0 and 2 on node a, pod 1 on b, pod 3 on c; two ranks per pod.
  auto plan = plan_ring({"a", "b", "a", "c"}, 2, nodes, keys);
  ASSERT_EQ(plan.size(), 8u);
  // Order: z1/r1 (c), z1/r2 (a), z2/r1 (b).
  std::vector<std::string> node_of;
  for (const auto& a : plan) node_of.push_back(a.node);
  EXPECT_EQ(node_of, (std::vector<std::string>{"c", "c", "a", "a", "a", "a", "b", "b"}));
  EXPECT_EQ(plan[2].replica, 0);
  EXPECT_EQ(plan[4].replica, 2);
  EXPECT_EQ(plan[5].local_rank, 3);
  EXPECT_EQ(plan[5].slot, 1);
  for (size_t r = 0; r < plan.size(); ++r) EXPECT_EQ(plan[r].rank, static_cast<int>(r));
}

}  // namespace
}  // namespace tessera::placement
