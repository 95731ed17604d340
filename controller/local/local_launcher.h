// LocalLauncher: runs a TrainingJob on this machine with the controller's own logic: the same
// reconcile as on Kubernetes (controller/reconcile/), its actions carried out here. The job's
// virtual cluster (spec.local: nodes with GPU slots, one slot per rank) is placed by GangPlacer
// (all workers or none), ordered into rings by RingPlanner, and served by a RendezvousService; each
// pod the reconcile builds runs as on a cluster, `tessera-worker --slots N` with the pod's
// environment and its ConfigMap volume as a directory (LocalPods), inside its node's network
// namespace when spec.local.network emulates one (EmulatedNetwork). When a worker dies the whole
// gang is stopped and started again (the workers resume from the newest checkpoint every rank has),
// up to spec.runPolicy.backoffLimit times; a worker that exits with status 2 (a configuration error)
// fails the job at once. A progress line is printed as the job runs; the job's status (the
// TrainingJob status fields, plus the worker processes) is kept in <workDir>/status.json, each pod's
// log in <workDir>/logs/<pod>.log and its files in <workDir>/pods/<pod>/. The controller's and the workers' Prometheus
// metrics are served on loopback, and where is printed.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "api/training_job.h"

namespace tessera::local {

struct LocalOptions {
  std::string manifest;    // the manifest file, handed to every worker
  std::string worker_bin;  // the tessera-worker executable
  std::string netns_bin;   // the tessera-netns program (spec.local.network's emulated network)
  double progress_seconds = 5;
  std::FILE* out = stdout;  // progress and summary
  // The controller's /metrics and /targets (the workers' metrics endpoints, for Prometheus'
  // http_sd_configs) on loopback; port 0: a free one. The workers serve theirs on free ports.
  std::string metrics_addr = "127.0.0.1:0";
  // Non-empty: start Debian's Prometheus listening there, scraping the controller and the workers
  // every 2 s into <workDir>/prometheus, and stop it when the job ends (its data stays).
  std::string prometheus_addr;
  std::string prometheus_bin = "prometheus";
  // Start from scratch: the job's checkpoints are removed first (its SSD cache is kept).
  bool fresh = false;
  // Where the virtual cluster's size came from, for messages: spec.local, or the flags that set it.
  std::string cluster_from = "spec.local";
};

// One gang restart: the furthest step rank 0 reported before the failure, and where the new gang
// resumed (the checkpoint it restored; -1 when it failed before reporting).
struct RestartRecord {
  std::string reason;  // "worker replica 1 slot 0 (rank 2) was killed by signal 9 (Killed)"
  int64_t failed_at_step = -1;
  int64_t resumed_at_step = -1;
};

struct LocalResult {
  std::string phase;   // Succeeded | Failed | Suspended
  std::string reason;  // Failed: Unschedulable | InvalidConfiguration | BackoffLimitExceeded | DeadlineExceeded |
                       // Interrupted | StartFailed | NoSummary
  std::string message;
  double seconds = 0;
  int restarts = 0;
  std::vector<RestartRecord> restart_history;
  // From rank 0's summary (Succeeded).
  int64_t steps = 0;
  double samples_per_second = 0;
  int64_t switch_step = -1;
  bool validated = true;  // false: the job has no validation set
  double val_loss = 0, val_metric = 0, baseline_loss = 0, baseline_metric = 0;
  double val_top5 = -1;     // classifiers of more than 5 classes; -1: none
  std::vector<double> iou;  // segmentation: per class
  int exit_code() const { return phase == "Failed" ? 1 : 0; }
};

// The directory of <workDir> where `tessera node` leaves requests for a running `tessera run`.
inline constexpr const char* kNodeControlDir = "nodes";
// Asks the `tessera run` of work directory `work_dir` to remove virtual node `node` (verb "remove":
// a lost machine, its pods killed) or add it back ("add"). ConfigError naming the work directory
// when no job has run there.
void request_node_change(const std::string& work_dir, const std::string& verb, const std::string& node);

class LocalLauncher {
 public:
  LocalLauncher(api::TrainingJob job, LocalOptions options);
  LocalResult run();

  // Asks a running launcher to stop its workers and return (Failed, Interrupted); async-signal-safe.
  static void interrupt();

 private:
  api::TrainingJob job_;
  LocalOptions options_;
};

}  // namespace tessera::local
