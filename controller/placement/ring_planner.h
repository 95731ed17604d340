// RingPlanner: turns a placement into world ranks so that rings go GPU by GPU inside a node and
// node by node in topology order (the topology keys' values, then the node name): the ranks of one
// node are consecutive, with local ranks 0..n-1 over all pods on that node, and nodes of one zone
// and rack are neighbours in the ring. Pure computation.
#pragma once

#include <string>
#include <vector>

#include "controller/placement/gang_placer.h"

namespace tessera::placement {

struct RankAssignment {
  int rank = 0;     // world rank
  int replica = 0;  // the pod (index in the placement)
  int slot = 0;     // the process within its pod: 0..ranksPerReplica-1
  std::string node;
  int local_rank = 0;  // index on the node over all of its ranks
};

// pod_nodes[i]: the node of pod i; nodes: for their labels. Returns one entry per rank, by rank.
std::vector<RankAssignment> plan_ring(const std::vector<std::string>& pod_nodes, int ranks_per_replica,
                                      const std::vector<NodeInfo>& nodes,
                                      const std::vector<std::string>& topology_keys);

}  // namespace tessera::placement
