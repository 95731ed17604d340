#include "controller/placement/ring_planner.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace tessera::placement {

std::vector<RankAssignment> plan_ring(const std::vector<std::string>& pod_nodes, int ranks_per_replica,
                                      const std::vector<NodeInfo>& nodes,
                                      const std::vector<std::string>& topology_keys) {
  TESSERA_CHECK(ranks_per_replica > 0, "ranks per replica ", ranks_per_replica);
  std::map<std::string, const NodeInfo*> by_name;
  for (const NodeInfo& n : nodes) by_name[n.name] = &n;
  // Topology order of the nodes in use: (value of each key..., name).
  std::map<std::string, std::vector<int>> pods_on;
  for (size_t i = 0; i < pod_nodes.size(); ++i) pods_on[pod_nodes[i]].push_back(static_cast<int>(i));
  std::vector<std::pair<std::vector<std::string>, std::string>> order;
  for (const auto& [node, pods] : pods_on) {
    std::vector<std::string> key;
    auto it = by_name.find(node);
    TESSERA_CHECK(it != by_name.end(), "pod placed on unknown node ", node);
    for (const std::string& k : topology_keys) {
      auto l = it->second->labels.find(k);
      key.push_back(l == it->second->labels.end() ? "" : l->second);
    }
    order.emplace_back(std::move(key), node);
  }
  std::sort(order.begin(), order.end());
  std::vector<RankAssignment> plan;
  for (const auto& [key, node] : order) {
    int local = 0;
    for (int pod : pods_on[node])
      for (int s = 0; s < ranks_per_replica; ++s)
        plan.push_back({static_cast<int>(plan.size()), pod, s, node, local++});
  }
  return plan;
}

}  // namespace tessera::placement
