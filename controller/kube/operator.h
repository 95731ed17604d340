// KubeOperator: the Kubernetes backend of the TrainingJob reconcile. Informers keep caches of the
// TrainingJobs, their Secrets, Services and ConfigMaps, all pods and the nodes; a change to any of
// them queues the job's key; worker threads take keys from the work queue, build the Observed
// state from the caches and the rendezvous' progress, run reconcile() and carry out its actions as
// API calls, in order. A failed call puts the key back with per-key exponential backoff; a status
// write is a PUT with the job's resourceVersion, and a 409 Conflict reconciles again against a
// fresh read, so a decision is never made twice from a stale cache. The operator serves the gRPC
// rendezvous of its jobs, and rebuilds it for running jobs from their Secret, ConfigMap and status
// after a restart. Thread-safe; run() blocks until stop().
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "controller/kube/client.h"

namespace tessera::kube {

struct OperatorOptions {
  std::string namespace_;                    // empty: all namespaces
  std::string rendezvous_listen = "0.0.0.0:7070";
  std::string rendezvous_advertise;          // host:port in the pods' args; empty: the listen address
  std::string worker_image;                  // image of jobs that leave spec.image at its default
  std::chrono::milliseconds status_interval{5000};
  int workers = 4;                           // reconcile threads
};

// What the operator measured, for benchmarks.
struct OperatorStats {
  int64_t reconciles = 0, status_conflicts = 0, api_requests = 0;
  std::vector<double> reconcile_seconds;     // the newest 100,000 reconciles' durations (observe + decide + act)
};

class KubeOperator {
 public:
  KubeOperator(const KubeClient& client, OperatorOptions options);
  ~KubeOperator();

  // Checks that the API server is reachable (retrying with backoff, saying so), that the
  // TrainingJob CRD is installed and that this identity may list and watch what it needs; throws
  // Error with a clear message otherwise.
  void preflight(const std::atomic<bool>& stop);
  // Starts the informers and workers and blocks until stop() (or *stop).
  void run(const std::atomic<bool>& stop);
  bool ready() const { return ready_; }
  OperatorStats stats() const;
  std::string rendezvous_address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> ready_{false};
};

}  // namespace tessera::kube
