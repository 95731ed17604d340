// Running a Pod object as processes on this machine, as a kubelet runs its containers: each
// container's command and args; its environment with valueFrom resolved (fieldRef, secretKeyRef,
// configMapKeyRef); its volumes as directories (hostPath: the path itself, created for
// DirectoryOrCreate; emptyDir, configMap and secret: a directory of the pod's with the items
// written); a command argument or environment value under a volume's mountPath rewritten to the
// volume's directory; the container's terminationMessagePath a file of the pod's. The local backend
// of `tessera run` runs the reconcile's pods this way: one way to run a pod without a container
// runtime. Images, users and security contexts are not
// applied (a test cluster with real kubelets and containerd does that). Thread-compatible.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/process.h"

namespace tessera::local {

// The pod could not be started: reason as a kubelet reports it (FailedMount,
// CreateContainerConfigError, CreateContainerError) and why.
class PodStartError : public Error {
 public:
  PodStartError(std::string reason, const std::string& message) : Error(message), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

// What the node gives the pods it runs.
struct PodHost {
  std::string pod_dir;  // the pod's own directory: volumes, termination messages, logs (created)
  // Where a container's stdout and stderr go; empty: <pod_dir>/<container>.log.
  std::function<std::string(const std::string& container)> log_file;
  // A container's command as an executable path; empty when there is none.
  std::function<std::string(const std::string& command)> resolve_command;
  // The data of a ConfigMap or Secret ("configmaps" | "secrets") of the pod's namespace; nothing when
  // it does not exist. May throw to have the start retried.
  std::function<std::optional<nlohmann::json>(const std::string& resource, const std::string& name)> data;
  std::string pod_ip = "127.0.0.1";                 // status.podIP and status.hostIP
  std::vector<std::string> command_prefix;          // run inside this ("ip netns exec NODE"); empty: none
  std::map<std::string, std::string> env_override;  // variables the node sets whatever the pod says
  std::vector<std::string> extra_env;               // "K=V" the node adds
};

struct RunningContainer {
  std::string name;
  std::string log;           // its stdout and stderr
  std::string message_file;  // where its terminationMessagePath is
  std::unique_ptr<Process> process;
};

// Starts every container of `pod` (a Pod object as JSON). Throws PodStartError when one cannot be.
std::vector<RunningContainer> start_pod(const nlohmann::json& pod, const PodHost& host);

// A container's termination message: its message file, or (policy FallbackToLogsOnError, when the
// file is empty and the container failed) the last lines of its log, at most 4 KiB as a kubelet keeps.
std::string termination_message(const RunningContainer& c, bool fallback_to_logs, bool failed);

// The executable `command` names: itself when it holds a '/', else the first match in `dirs`
// followed by PATH's directories; empty when there is none.
std::string find_command(const std::string& command, const std::vector<std::string>& dirs);

}  // namespace tessera::local
