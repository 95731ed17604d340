// Topology: which node each rank runs on and its local rank there, and the communicator groups built
// from it: world, intra-node (same node, ordered by local rank) and inter-node (same local rank,
// ordered by node). Nodes are ordered by their lowest world rank.
//
// Topology is an immutable value, checked at construction (ConfigError naming the problem).
// CommGroups owns the three communicators of one rank; it is used by one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"

namespace tessera {

struct RankPlacement {
  std::string node;    // node (host) name
  int local_rank = 0;  // index of the rank on its node, 0..ranks_on_node-1
};

// Bytes sent over links inside a node and between nodes.
struct LinkBytes {
  uint64_t intra = 0;
  uint64_t inter = 0;
  LinkBytes operator-(const LinkBytes& o) const { return {intra - o.intra, inter - o.inter}; }
  LinkBytes& operator+=(const LinkBytes& o) {
    intra += o.intra;
    inter += o.inter;
    return *this;
  }
};

class Topology {
 public:
  // placements[r] is world rank r's placement. Throws ConfigError when a node's local ranks are not
  // exactly 0..n-1.
  explicit Topology(std::vector<RankPlacement> placements);
  // `nodes` nodes named node0.. with `local` ranks each; world ranks are node-major.
  static Topology grid(int nodes, int local);
  // Every rank publishes its placement under "topology/<rank>" and reads everyone's.
  static Topology discover(Store& store, int rank, int world_size, const RankPlacement& mine, Millis timeout);

  int world_size() const { return static_cast<int>(placements_.size()); }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  const RankPlacement& placement(int rank) const { return placements_.at(rank); }
  int node_index(int rank) const { return node_of_rank_.at(rank); }
  const std::string& node_name(int node) const { return nodes_.at(node).name; }
  // World ranks on `node`, by local rank.
  const std::vector<int>& node_ranks(int node) const { return nodes_.at(node).ranks; }
  // World ranks sharing `rank`'s local rank, one per node that has it, in node order.
  std::vector<int> peers_with_local_rank(int local_rank) const;
  // True when every node has the same number of ranks.
  bool uniform() const;
  // Throws ConfigError on `field` when the nodes are uneven; `who` names what needs them even.
  void require_uniform(const std::string& field, const std::string& who) const;

  // Bytes `comm` (a group of this topology's world ranks) has sent, split by link kind for the
  // member `comm.rank()`.
  LinkBytes link_bytes(const Communicator& comm) const;

 private:
  struct Node {
    std::string name;
    std::vector<int> ranks;
  };
  std::vector<RankPlacement> placements_;
  std::vector<Node> nodes_;
  std::vector<int> node_of_rank_;
};

// Creates one communicator: members[i] is the world rank of member i, `rank` this process's index.
using CommFactory = std::function<std::unique_ptr<Communicator>(Store& store, const std::string& group, int rank,
                                                                std::vector<int> members)>;

// The communicators of one rank.
struct CommGroups {
  Topology topology;
  int rank = 0;                           // world rank
  std::unique_ptr<Communicator> world;    // all ranks
  std::unique_ptr<Communicator> intra;    // ranks of this node, by local rank
  std::unique_ptr<Communicator> inter;    // ranks with this local rank, by node
  std::unique_ptr<Communicator> spatial;  // ranks splitting the same samples (spatial parallelism), or null

  // Bytes sent by this rank through all groups, by link kind.
  LinkBytes link_bytes() const;
};

// Connects world, intra-node and inter-node groups for `rank` (every rank must call it); with
// spatial_size > 1 also the spatial group: world ranks [r - r % spatial_size, + spatial_size).
CommGroups connect_groups(Store& store, Topology topology, int rank, const CommFactory& factory, int spatial_size = 1);

}  // namespace tessera
