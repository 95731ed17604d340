// GangPlacer: places every worker pod of a job or none. A node can take a pod when it is ready and
// schedulable, matches the node selector, every NoSchedule / NoExecute taint on it is tolerated by
// the pod, and it has the pod's GPUs, CPU and memory free (allocatable minus what running pods
// request). Among placements it prefers the fewest nodes and the closest topology: all
// pods in one domain of the most specific topology key that can hold them (host, then rack, then
// zone, in the order of topologyKeys), filling the nodes with the most free room first.
// Pure computation; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "api/training_job.h"

namespace tessera::placement {

struct Taint {
  std::string key, value, effect;  // effect: NoSchedule | PreferNoSchedule | NoExecute
};

using Toleration = api::Toleration;

struct Resources {
  int gpu = 0;
  double cpu = 0;      // cores
  int64_t memory = 0;  // bytes
};

struct NodeInfo {
  std::string name;
  std::map<std::string, std::string> labels;
  std::vector<Taint> taints;
  Resources allocatable, used;  // used: requests of the pods running there
  bool ready = true, unschedulable = false;
};

struct GangRequest {
  int replicas = 1;  // pods
  Resources per_pod;
  std::map<std::string, std::string> node_selector;
  std::vector<Toleration> tolerations;
  std::vector<std::string> topology_keys = {"topology.kubernetes.io/zone", "kubernetes.io/hostname"};
};

struct PlacementResult {
  bool placed = false;
  std::vector<std::string> nodes;  // node of each pod (replica order), when placed
  std::string reason;              // why not, when not placed: counts of nodes excluded and why
};

bool tolerates(const std::vector<Toleration>& tolerations, const Taint& taint);

class GangPlacer {
 public:
  PlacementResult place(const GangRequest& request, const std::vector<NodeInfo>& nodes) const;
};

}  // namespace tessera::placement
