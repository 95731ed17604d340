// Reading Kubernetes objects into the reconcile's inputs: a Pod into PodInfo, a Node and the pods
// bound to it into NodeInfo (allocatable minus the requests of pods that hold resources), and
// Kubernetes quantities. Pure functions.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/placement/gang_placer.h"
#include "controller/reconcile/reconciler.h"

namespace tessera::reconcile {

PodInfo pod_info(const json& pod);
// The resources a pod requests (the sum over its containers; init containers' maximum if larger).
placement::Resources pod_requests(const json& pod);
// Whether a pod holds its node's resources: bound, not finished.
bool holds_resources(const json& pod);
// One node as the placer sees it, `used` left empty.
placement::NodeInfo node_info(const json& node);
// Adds what a pod holds to the used resources of its node (used: by node name).
void add_usage(const json& pod, std::map<std::string, placement::Resources>* used);
// nodes with `used` summed from `pods` (all pods in the cluster, any namespace).
std::vector<placement::NodeInfo> node_infos(const std::vector<json>& nodes, const std::vector<json>& pods);

// "2", "500m", "1.5" cores; "64Mi", "1G", "123" bytes. Unparsable values count as 0.
double parse_cpu(const std::string& q);
int64_t parse_bytes(const std::string& q);

}  // namespace tessera::reconcile
