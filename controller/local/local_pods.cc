#include "controller/local/local_pods.h"

#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/flags.h"

namespace tessera::local {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The slot a worker process serves: its "--slot S" argument; -1 when it has none.
int slot_of(pid_t pid) {
  std::ifstream in(detail::concat("/proc/", pid, "/cmdline"), std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--slot") return static_cast<int>(parse_int(args[i + 1]).value_or(-1));
  return -1;
}

// The child processes of pid (every thread's).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  const std::string tasks = detail::concat("/proc/", pid, "/task");
  std::error_code ec;
  for (const auto& t : fs::directory_iterator(tasks, ec)) {
    std::ifstream in(t.path() / "children");
    pid_t child = 0;
    while (in >> child) out.push_back(child);
  }
  return out;
}

}  // namespace

void LocalPods::start(const json& pod,
                      const std::function<std::optional<json>(const std::string&, const std::string&)>& data) {
  const std::string name = pod["metadata"].value("name", "");
  Pod p;
  p.node = pod["spec"].value("nodeName", "");
  const json& labels = pod["metadata"]["labels"];
  p.replica = static_cast<int>(parse_int(labels.value(reconcile::kReplicaLabel, "")).value_or(0));
  p.attempt = static_cast<int>(parse_int(labels.value(reconcile::kAttemptLabel, "")).value_or(0));
  PodHost host;
  host.pod_dir = (fs::path(o_.work_dir) / "pods" / name).string();
  fs::remove_all(host.pod_dir);  // a pod of an earlier run of the job under the same name
  // The pods' logs side by side, as `kubectl logs` would show them: <workDir>/logs/<pod>.log.
  host.log_file = [this, name](const std::string&) {
    return (fs::path(o_.work_dir) / "logs" / (name + ".log")).string();
  };
  host.resolve_command = [this](const std::string& cmd) {
    return cmd == "tessera-worker" ? o_.worker_bin
                                   : find_command(cmd, {fs::path(o_.worker_bin).parent_path().string()});
  };
  host.data = data;
  // Every pod shares this machine (or its node's namespace): the metrics port is a free one.
  host.env_override["TESSERA_METRICS_ADDR"] = o_.emulated_prefix.empty() ? "127.0.0.1:0" : "0.0.0.0:0";
  // Relative checkpoint and cache paths of a job on this machine live in its work directory.
  host.extra_env.push_back("TESSERA_WORK_DIR=" + o_.work_dir);
  if (!o_.emulated_prefix.empty()) {
    // In the node's namespace; Gloo binds the node's link, so ranks of other nodes come over it.
    host.command_prefix = {"ip", "netns", "exec", o_.emulated_prefix + p.node.substr(p.node.rfind('-') + 1)};
    host.extra_env.push_back("TESSERA_GLOO_IFACE=eth0");
  }
  p.containers = start_pod(pod, host);
  pods_[name] = std::move(p);
}

std::vector<reconcile::PodInfo> LocalPods::observe(reconcile::Time now) {
  std::vector<reconcile::PodInfo> out;
  for (auto& [name, p] : pods_) {
    reconcile::PodInfo info;
    info.name = name;
    info.node = p.node;
    info.replica = p.replica;
    info.attempt = p.attempt;
    // A pod has one container, the worker: its exit is the pod's.
    RunningContainer& c = p.containers.front();
    if (!p.exit) p.exit = c.process->poll();
    if (!p.exit) {
      info.phase = "Running";
    } else {
      if (!p.finished) p.finished = now;
      info.phase = *p.exit == 0 ? "Succeeded" : "Failed";
      info.exit_code = *p.exit;
      info.finished = p.finished;
      info.message = termination_message(c, true, *p.exit != 0);
      if (*p.exit != 0) info.message += (info.message.empty() ? "see " : "; see ") + c.log;
    }
    out.push_back(info);
  }
  return out;
}

void LocalPods::stop(const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (auto it = pods_.find(n); it != pods_.end())
      for (auto& c : it->second.containers) c.process->terminate();
  for (const auto& n : names)
    if (auto it = pods_.find(n); it != pods_.end()) {
      for (auto& c : it->second.containers) c.process->stop(std::chrono::milliseconds(3000));
      pods_.erase(it);
    }
}

void LocalPods::kill(const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (auto it = pods_.find(n); it != pods_.end()) {
      for (auto& c : it->second.containers) c.process->stop(std::chrono::milliseconds(0));
      pods_.erase(it);
    }
}

void LocalPods::stop_all() {
  std::vector<std::string> names;
  for (const auto& [n, p] : pods_) names.push_back(n);
  stop(names);
}

int LocalPods::running() {
  int n = 0;
  for (auto& [name, p] : pods_) {
    if (!p.exit) p.exit = p.containers.front().process->poll();
    n += !p.exit;
  }
  return n;
}

std::vector<LocalPods::Worker> LocalPods::workers() const {
  std::vector<Worker> out;
  for (const auto& [name, p] : pods_) {
    if (p.exit) continue;
    for (pid_t child : children_of(p.containers.front().process->pid())) {
      const int slot = slot_of(child);
      if (slot >= 0) out.push_back({name, p.node, p.containers.front().log, p.replica, slot, child});
    }
  }
  return out;
}

std::string LocalPods::log(const std::string& pod) const {
  auto it = pods_.find(pod);
  return it == pods_.end() ? (fs::path(o_.work_dir) / "logs" / (pod + ".log")).string()
                           : it->second.containers.front().log;
}

}  // namespace tessera::local
