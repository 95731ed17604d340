#include "controller/reconcile/observe.h"

#include <cmath>
#include <map>
#include <set>

#include "common/config_node.h"

namespace tessera::reconcile {
namespace {

// A quantity of an API object (a string, or a bare number); unparsable values count as 0.
double quantity(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (!v.is_string()) return 0;
  return parse_quantity(v.get<std::string>()).value_or(0);
}

// The container's requests; a resource with a limit but no request requests its limit, as the API
// server defaults it.
void add_requests(const json& container, placement::Resources* r) {
  if (!container.contains("resources")) return;
  const json& res = container["resources"];
  auto amount = [&](const char* name) {
    for (const char* kind : {"requests", "limits"})
      if (res.contains(kind) && res[kind].contains(name)) return quantity(res[kind][name]);
    return 0.0;
  };
  r->gpu += static_cast<int>(std::llround(amount("nvidia.com/gpu")));
  r->cpu += amount("cpu");
  r->memory += std::llround(amount("memory"));
}

}  // namespace

// The kubelet's waiting reasons of a container it cannot start: its image cannot be had, or the
// container cannot be made. (ContainerCreating and PodInitializing are a start under way.)
static bool cannot_start(const std::string& reason) {
  static const std::set<std::string> reasons = {
      "ErrImagePull",         "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
      "CreateContainerError", "RunContainerError"};
  return reasons.count(reason) > 0;
}

PodInfo pod_info(const json& pod) {
  PodInfo p;
  const json& m = pod["metadata"];
  p.name = m.value("name", "");
  p.terminating = m.contains("deletionTimestamp") && !m["deletionTimestamp"].is_null();
  const json labels = m.value("labels", json::object());
  try {
    p.replica = std::stoi(labels.value(kReplicaLabel, "-1"));
    p.attempt = std::stoi(labels.value(kAttemptLabel, "-1"));
  } catch (const std::exception&) {
  }
  p.node = pod.contains("spec") ? pod["spec"].value("nodeName", "") : "";
  const json st = pod.value("status", json::object());
  p.phase = st.value("phase", "Pending");
  p.reason = st.value("reason", "");
  p.message = st.value("message", "");
  if (m.contains("creationTimestamp") && m["creationTimestamp"].is_string())
    p.created = parse_time(m["creationTimestamp"].get<std::string>());
  for (const char* statuses : {"initContainerStatuses", "containerStatuses"})
    for (const auto& cs : st.value(statuses, json::array())) {
      if (!p.waiting_reason.empty() || !cs.contains("state") || !cs["state"].contains("waiting")) continue;
      const json& w = cs["state"]["waiting"];
      const std::string reason = w.value("reason", "");
      if (cannot_start(reason))
        p.waiting_reason = reason, p.waiting_message = w.value("message", ""), p.waiting_image = cs.value("image", "");
    }
  // The failed container decides: an init container that failed (its containers never ran), else
  // the first container that failed, else the last one that ended.
  bool decided = false;
  const std::string pod_reason = p.reason, pod_message = p.message;  // the pod's own (Evicted, ...) win
  for (const char* statuses : {"initContainerStatuses", "containerStatuses"})
    for (const auto& cs : st.value(statuses, json::array())) {
      if (decided || !cs.contains("state") || !cs["state"].contains("terminated")) continue;
      const json& t = cs["state"]["terminated"];
      const int code = t.value("exitCode", -1);
      if (std::string(statuses) == "initContainerStatuses" && code == 0) continue;
      p.exit_code = code;
      p.reason = pod_reason.empty() ? t.value("reason", "") : pod_reason;
      p.message = pod_message.empty() ? t.value("message", "") : pod_message;
      if (t.contains("finishedAt") && t["finishedAt"].is_string())
        p.finished = parse_time(t["finishedAt"].get<std::string>());
      decided = code != 0;
    }
  while (!p.message.empty() && (p.message.back() == '\n' || p.message.back() == ' ')) p.message.pop_back();
  // A termination message from the log: its last line says why.
  if (const auto nl = p.message.rfind('\n'); nl != std::string::npos) p.message = p.message.substr(nl + 1);
  return p;
}

placement::Resources pod_requests(const json& pod) {
  placement::Resources r;
  if (!pod.contains("spec")) return r;
  for (const auto& c : pod["spec"].value("containers", json::array())) add_requests(c, &r);
  placement::Resources init;
  for (const auto& c : pod["spec"].value("initContainers", json::array())) {
    placement::Resources one;
    add_requests(c, &one);
    init.gpu = std::max(init.gpu, one.gpu);
    init.cpu = std::max(init.cpu, one.cpu);
    init.memory = std::max(init.memory, one.memory);
  }
  r.gpu = std::max(r.gpu, init.gpu);
  r.cpu = std::max(r.cpu, init.cpu);
  r.memory = std::max(r.memory, init.memory);
  return r;
}

bool holds_resources(const json& pod) {
  if (!pod.contains("spec") || pod["spec"].value("nodeName", "").empty()) return false;
  const std::string phase = pod.contains("status") ? pod["status"].value("phase", "Pending") : "Pending";
  return phase != "Succeeded" && phase != "Failed";
}

void add_usage(const json& pod, std::map<std::string, placement::Resources>* used) {
  if (!holds_resources(pod)) return;
  const auto r = pod_requests(pod);
  auto& u = (*used)[pod["spec"]["nodeName"].get<std::string>()];
  u.gpu += r.gpu;
  u.cpu += r.cpu;
  u.memory += r.memory;
}

placement::NodeInfo node_info(const json& n) {
  placement::NodeInfo info;
  info.name = n["metadata"].value("name", "");
  if (n["metadata"].contains("labels"))
    for (auto it = n["metadata"]["labels"].begin(); it != n["metadata"]["labels"].end(); ++it)
      if (it.value().is_string()) info.labels[it.key()] = it.value().get<std::string>();
  if (n.contains("spec")) {
    const json& spec = n["spec"];
    info.unschedulable = spec.value("unschedulable", false);
    if (spec.contains("taints"))
      for (const auto& t : spec["taints"])
        info.taints.push_back({t.value("key", ""), t.value("value", ""), t.value("effect", "")});
  }
  if (!n.contains("status")) {
    info.ready = false;
    return info;
  }
  const json& st = n["status"];
  const char* which = st.contains("allocatable") ? "allocatable" : "capacity";
  if (st.contains(which)) {
    const json& alloc = st[which];
    if (alloc.contains("nvidia.com/gpu"))
      info.allocatable.gpu = static_cast<int>(std::llround(quantity(alloc["nvidia.com/gpu"])));
    if (alloc.contains("cpu")) info.allocatable.cpu = quantity(alloc["cpu"]);
    if (alloc.contains("memory")) info.allocatable.memory = std::llround(quantity(alloc["memory"]));
  }
  info.ready = false;
  if (st.contains("conditions"))
    for (const auto& c : st["conditions"])
      if (c.value("type", "") == "Ready") info.ready = c.value("status", "") == "True";
  return info;
}

}  // namespace tessera::reconcile
