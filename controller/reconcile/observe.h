// Reading Kubernetes objects into the reconcile's inputs: a Pod into PodInfo and its requests, a
// Node into NodeInfo, and the pods bound to a node into its used resources. Pure functions.
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

}  // namespace tessera::reconcile
