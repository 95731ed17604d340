#include "controller/reconcile/observe.h"

#include <cmath>
#include <map>

namespace tessera::reconcile {
namespace {

std::string quantity(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) return v.dump();
  return "";
}

void add_requests(const json& container, placement::Resources* r) {
  if (!container.contains("resources")) return;
  const json& res = container["resources"];
  // A limit without a request requests the limit (the API server's defaulting).
  for (const char* kind : {"limits", "requests"}) {
    if (!res.contains(kind)) continue;
    const json& q = res[kind];
    if (kind == std::string("limits") && res.contains("requests")) continue;
    if (q.contains("nvidia.com/gpu")) r->gpu += static_cast<int>(parse_bytes(quantity(q["nvidia.com/gpu"])));
    if (q.contains("cpu")) r->cpu += parse_cpu(quantity(q["cpu"]));
    if (q.contains("memory")) r->memory += parse_bytes(quantity(q["memory"]));
  }
  if (res.contains("requests") && res.contains("limits") && !res["requests"].contains("nvidia.com/gpu") &&
      res["limits"].contains("nvidia.com/gpu"))
    r->gpu += static_cast<int>(parse_bytes(quantity(res["limits"]["nvidia.com/gpu"])));
}

}  // namespace

double parse_cpu(const std::string& q) {
  if (q.empty()) return 0;
  try {
    if (q.back() == 'm') return std::stod(q.substr(0, q.size() - 1)) / 1000.0;
    return std::stod(q);
  } catch (const std::exception&) {
    return 0;
  }
}

int64_t parse_bytes(const std::string& q) {
  static const std::map<std::string, double> units = {
      {"", 1},     {"k", 1e3},           {"M", 1e6},           {"G", 1e9},           {"T", 1e12},          {"P", 1e15},
      {"E", 1e18}, {"Ki", 1024.0},       {"Mi", 1048576.0},    {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
      {"Pi", 1125899906842624.0},        {"Ei", 1152921504606846976.0},          {"m", 1e-3}};
  size_t i = 0;
  while (i < q.size() && (std::isdigit(static_cast<unsigned char>(q[i])) || q[i] == '.' || q[i] == '-' || q[i] == '+')) ++i;
  auto it = units.find(q.substr(i));
  if (i == 0 || it == units.end()) return 0;
  try {
    return static_cast<int64_t>(std::llround(std::stod(q.substr(0, i)) * it->second));
  } catch (const std::exception&) {
    return 0;
  }
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
  for (const auto& cs : st.value("containerStatuses", json::array())) {
    if (!cs.contains("state") || !cs["state"].contains("terminated")) continue;
    const json& t = cs["state"]["terminated"];
    p.exit_code = t.value("exitCode", -1);
    if (p.reason.empty()) p.reason = t.value("reason", "");
    if (p.message.empty()) p.message = t.value("message", "");
    if (t.contains("finishedAt") && t["finishedAt"].is_string()) p.finished = parse_time(t["finishedAt"].get<std::string>());
    if (p.exit_code != 0) break;  // the failed container decides
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
      for (const auto& t : spec["taints"]) info.taints.push_back({t.value("key", ""), t.value("value", ""), t.value("effect", "")});
  }
  if (!n.contains("status")) {
    info.ready = false;
    return info;
  }
  const json& st = n["status"];
  const char* which = st.contains("allocatable") ? "allocatable" : "capacity";
  if (st.contains(which)) {
    const json& alloc = st[which];
    if (alloc.contains("nvidia.com/gpu")) info.allocatable.gpu = static_cast<int>(parse_bytes(quantity(alloc["nvidia.com/gpu"])));
    if (alloc.contains("cpu")) info.allocatable.cpu = parse_cpu(quantity(alloc["cpu"]));
    if (alloc.contains("memory")) info.allocatable.memory = parse_bytes(quantity(alloc["memory"]));
  }
  info.ready = false;
  if (st.contains("conditions"))
    for (const auto& c : st["conditions"])
      if (c.value("type", "") == "Ready") info.ready = c.value("status", "") == "True";
  return info;
}

std::vector<placement::NodeInfo> node_infos(const std::vector<json>& nodes, const std::vector<json>& pods) {
  std::map<std::string, placement::Resources> used;
  for (const auto& p : pods) add_usage(p, &used);
  std::vector<placement::NodeInfo> out;
  for (const auto& n : nodes) {
    out.push_back(node_info(n));
    auto it = used.find(out.back().name);
    if (it != used.end()) out.back().used = it->second;
  }
  return out;
}

}  // namespace tessera::reconcile
