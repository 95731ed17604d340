// LocalPods: the virtual nodes of `tessera run` running the reconcile's pods, as kubelets would:
// each pod through the pod runner (controller/local/pod_runner.h) in its own directory,
// <workDir>/pods/<pod>/ (its volumes and termination message; its log is <workDir>/logs/<pod>.log), inside its
// node's network namespace when the network is emulated. It reports each pod as the reconcile
// observes one (phase, exit code, termination message), and the worker processes a pod's
// `tessera-worker --slots N` started, by slot. Thread-compatible.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "controller/local/pod_runner.h"
#include "controller/reconcile/reconciler.h"

namespace tessera::local {

struct LocalPodsOptions {
  std::string work_dir;         // absolute: pods/ goes here, and the workers' relative paths resolve here
  std::string worker_bin;       // the tessera-worker the pods' command names; other commands are looked
                                // up beside it, then on PATH
  std::string emulated_prefix;  // non-empty: pods of node local-K run in network namespace <prefix>K
};

class LocalPods {
 public:
  explicit LocalPods(LocalPodsOptions options) : o_(std::move(options)) {}
  ~LocalPods() { stop_all(); }

  // Starts `pod` (the reconcile's object) on its node. The ConfigMaps and Secrets its volumes and
  // environment name come from `data`. Throws PodStartError when it cannot start.
  void start(const nlohmann::json& pod,
             const std::function<std::optional<nlohmann::json>(const std::string&, const std::string&)>& data);
  // Every pod as the reconcile observes it; `now` marks when a pod is first seen ended.
  std::vector<reconcile::PodInfo> observe(reconcile::Time now);
  // SIGTERM to the named pods, then SIGKILL to what still runs after 3 s; they are forgotten.
  void stop(const std::vector<std::string>& names);
  void stop_all();
  // SIGKILL to the named pods' processes at once (their machine lost); they are forgotten.
  void kill(const std::vector<std::string>& names);
  int running();

  // A worker process of a running pod: the rank in `slot` of pod `pod` (replica `replica`).
  struct Worker {
    std::string pod, node, log;
    int replica = 0, slot = 0;
    pid_t pid = 0;
  };
  std::vector<Worker> workers() const;
  // The log of the pod's worker container.
  std::string log(const std::string& pod) const;

 private:
  struct Pod {
    std::string node;
    int replica = 0;
    int attempt = 0;
    std::vector<RunningContainer> containers;
    std::optional<int> exit;
    std::optional<reconcile::Time> finished;
  };
  LocalPodsOptions o_;
  std::map<std::string, Pod> pods_;
};

}  // namespace tessera::local
