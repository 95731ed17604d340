// KubeOperator: the Kubernetes backend of the TrainingJob reconcile. Informers keep caches of the
// TrainingJobs, their Services and ConfigMaps, all pods and the nodes; a change to any of
// them queues the job's key; worker threads take keys from the work queue, build the Observed
// state from the caches and the rendezvous' progress, run reconcile() and carry out its actions as
// API calls, in order. A failed call puts the key back with per-key exponential backoff; a status
// write is a PUT with the job's resourceVersion, and a 409 Conflict reconciles again against a
// fresh read, so a decision is never made twice from a stale cache. The operator serves the gRPC
// rendezvous of its jobs, and rebuilds it for running jobs from their ConfigMap and status after a
// restart. A job's token is derived from its uid under the controller's key (derive_job_token), so
// the controller creates the job's token Secret but never reads a Secret: it needs no permission to.
// Thread-safe; run() blocks until stop().
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "controller/kube/client.h"
#include "controller/rendezvous/rendezvous_service.h"

namespace tessera {
class ControllerMetrics;
}

namespace tessera::kube {

struct OperatorOptions {
  std::string namespace_;  // empty: all namespaces
  std::string rendezvous_listen = "0.0.0.0:7070";
  std::string rendezvous_advertise;  // host:port in the pods' args; empty: the listen address
  std::string worker_image;          // image of jobs that leave spec.image at its default
  std::chrono::milliseconds status_interval{5000};
  int workers = 4;                                          // reconcile threads
  ControllerMetrics* metrics = nullptr;                     // not owned; null: none kept
  nlohmann::json spec_defaults = nlohmann::json::object();  // spec fields of jobs that leave them unset
  std::string token_key;  // the key jobs' tokens are derived under (every replica the same)
};

// What the operator measured, for benchmarks.
struct OperatorStats {
  int64_t reconciles = 0, status_conflicts = 0, api_requests = 0;
  std::vector<double> reconcile_seconds;  // the newest 100,000 reconciles' durations (observe + decide + act)
};

// The operator was asked to stop before it could start (preflight still waiting for the API server).
class Stopped : public Error {
 public:
  using Error::Error;
};

// One RBAC grant the controller needs: `verb` on `resource` (with its subresource) of API group
// `group` ("" for core). namespaced: in the namespaces it watches; else cluster-wide.
struct Permission {
  std::string verb, group, resource, subresource;
  bool namespaced = true;
};
// Exactly what the controller does against the API server (the Helm chart's RBAC is checked
// against this list): with leader election, the Lease verbs in its lease namespace too.
std::vector<Permission> required_permissions(bool leader_election);

class KubeOperator {
 public:
  KubeOperator(const KubeClient& client, OperatorOptions options);
  ~KubeOperator();  // clears its scrape hook and leadership in the metrics

  // Checks that the API server is reachable (retrying with backoff, saying so), that the
  // TrainingJob CRD is installed and that this identity may list and watch what it needs; throws
  // Error with a clear message otherwise, and Stopped when *stop is set while it waits.
  void preflight(const std::atomic<bool>& stop);
  // Starts the informers and workers and blocks until stop() (or *stop).
  void run(const std::atomic<bool>& stop);
  bool ready() const { return ready_; }
  OperatorStats stats() const;
  std::string rendezvous_address() const;
  // The workers' metrics endpoints, for Prometheus' service discovery.
  std::vector<MetricsTarget> metrics_targets() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> ready_{false};
};

}  // namespace tessera::kube
