#include "controller/placement/gang_placer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/error.h"

namespace tessera::placement {
namespace {

// Pods of `per_pod` that fit in the node's free resources.
int capacity(const NodeInfo& n, const Resources& per_pod) {
  int64_t fit = std::numeric_limits<int>::max();
  if (per_pod.gpu > 0) fit = std::min<int64_t>(fit, (n.allocatable.gpu - n.used.gpu) / per_pod.gpu);
  if (per_pod.cpu > 0)
    fit =
        std::min<int64_t>(fit, static_cast<int64_t>(std::floor((n.allocatable.cpu - n.used.cpu) / per_pod.cpu + 1e-9)));
  if (per_pod.memory > 0) fit = std::min<int64_t>(fit, (n.allocatable.memory - n.used.memory) / per_pod.memory);
  if (fit == std::numeric_limits<int>::max()) fit = 1 << 20;  // a pod that requests nothing
  return static_cast<int>(std::max<int64_t>(0, fit));
}

struct Candidate {
  const NodeInfo* node;
  int capacity;
};

// Fills `want` pods into `nodes`, most free room first (fewest nodes), name order on ties.
void fill(std::vector<Candidate> nodes, int want, std::vector<std::string>& out) {
  std::sort(nodes.begin(), nodes.end(), [](const Candidate& a, const Candidate& b) {
    return a.capacity != b.capacity ? a.capacity > b.capacity : a.node->name < b.node->name;
  });
  for (const Candidate& c : nodes) {
    for (int i = 0; i < c.capacity && want > 0; ++i, --want) out.push_back(c.node->name);
    if (want == 0) return;
  }
}

int total(const std::vector<Candidate>& v) {
  int64_t t = 0;
  for (const auto& c : v) t += c.capacity;
  return static_cast<int>(std::min<int64_t>(t, std::numeric_limits<int>::max()));
}

// Nodes the fill would use for `want` pods.
int nodes_needed(std::vector<Candidate> v, int want) {
  std::sort(v.begin(), v.end(), [](const Candidate& a, const Candidate& b) { return a.capacity > b.capacity; });
  int used = 0;
  for (const auto& c : v) {
    if (want <= 0) break;
    want -= c.capacity;
    ++used;
  }
  return used;
}

// Places `want` pods into `nodes` following topology keys from `level` on.
void pack(const std::vector<Candidate>& nodes, int want, const std::vector<std::string>& keys, size_t level,
          std::vector<std::string>& out) {
  if (want <= 0) return;
  if (level >= keys.size()) return fill(nodes, want, out);
  std::map<std::string, std::vector<Candidate>> groups;
  for (const Candidate& c : nodes) {
    auto it = c.node->labels.find(keys[level]);
    groups[it == c.node->labels.end() ? std::string() : it->second].push_back(c);
  }
  // One domain that holds everything: the one needing the fewest nodes, then the tightest fit.
  const std::vector<Candidate>* best = nullptr;
  int best_nodes = 0, best_spare = 0;
  for (const auto& [name, g] : groups) {
    const int cap = total(g);
    if (cap < want) continue;
    const int n = nodes_needed(g, want), spare = cap - want;
    if (!best || n < best_nodes || (n == best_nodes && spare < best_spare)) {
      best = &g;
      best_nodes = n;
      best_spare = spare;
    }
  }
  if (best) return pack(*best, want, keys, level + 1, out);
  // Spread over domains, the largest first, each packed as closely as possible.
  std::vector<const std::vector<Candidate>*> order;
  for (const auto& [name, g] : groups) order.push_back(&g);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return total(*a) > total(*b); });
  for (auto* g : order) {
    const int take = std::min(want, total(*g));
    pack(*g, take, keys, level + 1, out);
    want -= take;
    if (want == 0) return;
  }
}

}  // namespace

bool tolerates(const std::vector<Toleration>& tolerations, const Taint& taint) {
  for (const Toleration& t : tolerations) {
    if (!t.effect.empty() && t.effect != taint.effect) continue;
    if (t.op == "Exists" && (t.key.empty() || t.key == taint.key)) return true;
    if (t.op == "Equal" && t.key == taint.key && t.value == taint.value) return true;
  }
  return false;
}

PlacementResult GangPlacer::place(const GangRequest& req, const std::vector<NodeInfo>& nodes) const {
  PlacementResult r;
  if (req.replicas < 1) {
    r.reason = "no pods to place";
    return r;
  }
  int not_ready = 0, selector = 0, tainted = 0, full = 0;
  std::vector<Candidate> candidates;
  for (const NodeInfo& n : nodes) {
    if (!n.ready || n.unschedulable) {
      ++not_ready;
      continue;
    }
    bool match = true;
    for (const auto& [k, v] : req.node_selector) {
      auto it = n.labels.find(k);
      if (it == n.labels.end() || it->second != v) match = false;
    }
    if (!match) {
      ++selector;
      continue;
    }
    bool ok = true;
    for (const Taint& t : n.taints)
      if ((t.effect == "NoSchedule" || t.effect == "NoExecute") && !tolerates(req.tolerations, t)) ok = false;
    if (!ok) {
      ++tainted;
      continue;
    }
    const int cap = capacity(n, req.per_pod);
    if (cap == 0) {
      ++full;
      continue;
    }
    candidates.push_back({&n, cap});
  }
  const int cap = total(candidates);
  if (cap < req.replicas) {
    // What is free on the nodes that could take a pod but for their load: "6 GPUs free on 3 nodes".
    int free_gpus = 0, with_free = 0;
    for (const NodeInfo& n : nodes) {
      bool match = n.ready && !n.unschedulable;
      for (const auto& [k, v] : req.node_selector) {
        auto it = n.labels.find(k);
        if (it == n.labels.end() || it->second != v) match = false;
      }
      const int free = n.allocatable.gpu - n.used.gpu;
      if (match && free > 0) free_gpus += free, ++with_free;
    }
    std::string selector_text;
    for (const auto& [k, v] : req.node_selector) selector_text += (selector_text.empty() ? "" : ",") + k + "=" + v;
    r.reason =
        detail::concat("needs ", req.replicas * req.per_pod.gpu, " GPUs (", req.replicas, " pods of ", req.per_pod.gpu,
                       ") on nodes matching ", selector_text.empty() ? std::string("any labels") : selector_text, "; ",
                       free_gpus, " free on ", with_free, " nodes, room for ", cap, " pods on ", candidates.size(),
                       " (excluded: ", not_ready, " not ready, ", selector, " not matching the node selector, ",
                       tainted, " with untolerated taints, ", full, " without enough free resources)");
    return r;
  }
  pack(candidates, req.replicas, req.topology_keys, 0, r.nodes);
  TESSERA_CHECK_EQ(static_cast<int>(r.nodes.size()), req.replicas, "gang placement");
  r.placed = true;
  return r;
}

}  // namespace tessera::placement
