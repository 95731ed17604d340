#include "worker/comm/topology.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace tessera {

Topology::Topology(std::vector<RankPlacement> placements) : placements_(std::move(placements)) {
  if (placements_.empty()) throw ConfigError("topology", "no ranks");
  std::map<std::string, int> index;
  node_of_rank_.resize(placements_.size());
  for (int r = 0; r < world_size(); ++r) {
    const auto& p = placements_[r];
    if (p.node.empty()) throw ConfigError(detail::concat("topology.rank[", r, "].node"), "empty node name");
    auto [it, inserted] = index.emplace(p.node, num_nodes());
    if (inserted) nodes_.push_back(Node{p.node, {}});
    node_of_rank_[r] = it->second;
  }
  for (auto& n : nodes_) {
    std::vector<std::pair<int, int>> by_local;
    for (int r = 0; r < world_size(); ++r)
      if (placements_[r].node == n.name) by_local.emplace_back(placements_[r].local_rank, r);
    std::sort(by_local.begin(), by_local.end());
    for (size_t i = 0; i < by_local.size(); ++i) {
      if (by_local[i].first != static_cast<int>(i))
        throw ConfigError(
            detail::concat("topology.rank[", by_local[i].second, "].localRank"),
            detail::concat("node '", n.name, "' has ", by_local.size(), " ranks, so local ranks must be 0..",
                           by_local.size() - 1, " each once; got ", by_local[i].first,
                           i > 0 && by_local[i].first == by_local[i - 1].first ? " twice" : ""));
      n.ranks.push_back(by_local[i].second);
    }
  }
}

Topology Topology::grid(int nodes, int local) {
  if (nodes < 1 || local < 1)
    throw ConfigError("topology",
                      detail::concat("need at least one node and one rank per node, got ", nodes, " x ", local));
  std::vector<RankPlacement> p;
  for (int n = 0; n < nodes; ++n)
    for (int l = 0; l < local; ++l) p.push_back({"node" + std::to_string(n), l});
  return Topology(std::move(p));
}

Topology Topology::discover(Store& store, int rank, int world_size, const RankPlacement& mine, Millis timeout) {
  PrefixStore ns("topology", store);
  ns.set(std::to_string(rank), std::to_string(mine.local_rank) + " " + mine.node);
  std::vector<RankPlacement> all(world_size);
  for (int r = 0; r < world_size; ++r) {
    std::string v;
    try {
      v = ns.get(std::to_string(r), timeout);
    } catch (const StoreTimeout&) {
      throw CommError(detail::concat("topology discovery (rank ", rank, " of ", world_size, "): rank ", r,
                                     " did not publish its placement within ", timeout.count(), " ms"));
    }
    auto sp = v.find(' ');
    all[r] = RankPlacement{v.substr(sp + 1), std::stoi(v.substr(0, sp))};
  }
  return Topology(std::move(all));
}

std::vector<int> Topology::peers_with_local_rank(int local_rank) const {
  std::vector<int> out;
  for (const auto& n : nodes_)
    if (local_rank < static_cast<int>(n.ranks.size())) out.push_back(n.ranks[local_rank]);
  return out;
}

bool Topology::uniform() const {
  for (const auto& n : nodes_)
    if (n.ranks.size() != nodes_[0].ranks.size()) return false;
  return true;
}

void Topology::require_uniform(const std::string& field, const std::string& who) const {
  for (const auto& n : nodes_) {
    if (n.ranks.size() != nodes_[0].ranks.size())
      throw ConfigError(
          field, detail::concat(who, " needs the same number of ranks on every node; node '", nodes_[0].name, "' has ",
                                nodes_[0].ranks.size(), ", node '", n.name, "' has ", n.ranks.size()));
  }
}

LinkBytes Topology::link_bytes(const Communicator& comm) const {
  LinkBytes out;
  const auto sent = comm.bytes_sent();
  const int me = node_index(comm.global_ranks()[comm.rank()]);
  for (int i = 0; i < comm.size(); ++i) {
    if (node_index(comm.global_ranks()[i]) == me) {
      out.intra += sent[i];
    } else {
      out.inter += sent[i];
    }
  }
  return out;
}

LinkBytes CommGroups::link_bytes() const {
  LinkBytes out;
  for (const auto* c : {world.get(), intra.get(), inter.get(), spatial.get()})
    if (c) out += topology.link_bytes(*c);
  return out;
}

CommGroups connect_groups(Store& store, Topology topology, int rank, const CommFactory& factory, int spatial_size) {
  if (rank < 0 || rank >= topology.world_size())
    throw ConfigError("rank", detail::concat(rank, " is outside the world of ", topology.world_size(), " ranks"));
  if (spatial_size < 1 || topology.world_size() % spatial_size != 0)
    throw ConfigError("parallelism.spatial",
                      detail::concat("a spatial group of ", spatial_size, " ranks does not divide the world of ",
                                     topology.world_size()));
  CommGroups g{std::move(topology), rank, nullptr, nullptr, nullptr, nullptr};
  const Topology& t = g.topology;
  std::vector<int> all(t.world_size());
  for (int r = 0; r < t.world_size(); ++r) all[r] = r;
  g.world = factory(store, "world", rank, all);

  const int node = t.node_index(rank);
  const int local = t.placement(rank).local_rank;
  g.intra = factory(store, "intra/" + t.node_name(node), local, t.node_ranks(node));

  auto peers = t.peers_with_local_rank(local);
  int inter_rank = static_cast<int>(std::find(peers.begin(), peers.end(), rank) - peers.begin());
  g.inter = factory(store, "inter/local" + std::to_string(local), inter_rank, peers);
  if (spatial_size > 1) {
    const int first = rank - rank % spatial_size;
    std::vector<int> members(spatial_size);
    for (int i = 0; i < spatial_size; ++i) members[i] = first + i;
    g.spatial = factory(store, "spatial/" + std::to_string(first / spatial_size), rank - first, members);
  }
  return g;
}

}  // namespace tessera
