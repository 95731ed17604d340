// RendezvousService: the controller's gRPC service where a job's workers meet. Each job is added
// with its token and ring plan; workers register as (replica, slot) and get their rank from the
// plan (the same rank again after a restart), then use the job's key-value store (with waits) to
// bootstrap their communicators, and barriers. Pods' supervisors report failed ranks and wait for
// the gang's next round (a restart in place). Requests with a wrong token are refused
// (PERMISSION_DENIED, the token compared in constant time); unknown jobs are NOT_FOUND; every
// field is checked (ranks inside the world, a barrier's count the job's world size, steps and
// epochs not negative, finite numbers) and the store is bounded (RendezvousLimits).
// Thread-safe; serves on its own threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "controller/placement/ring_planner.h"
#include "controller/reconcile/progress.h"

namespace tessera {

// The controller's decisions for a job. switch_at_epoch >= 0: a hybrid job switches to its dense
// strategy at a step S chosen when the first rank comes within two steps of that epoch:
// S = max(switch_at_epoch * steps_per_epoch, furthest reported step + 2), so every rank, all
// within one step of each other, hears of S before reaching it.
struct RendezvousJobPolicy {
  int switch_at_epoch = -1;
  int64_t switch_step = -1;  // a switch step chosen before (a controller rebuilding a running job's state)
  // The gang's round: the same pods restarted in place start a new one. Supervisors wait for it
  // (AwaitRound); ranks' exits are reported for the current one.
  int64_t round = 0;
  // communication.strategy auto: the controller chooses the exchange from rank 0's calibration
  // (common/exchange_choice.h); a sparse phase may last until switch_at_epoch, of `epochs`, at one of
  // `densities`.
  bool auto_exchange = false;
  int epochs = 1;
  std::vector<double> densities = {0.01};
  double sparse_margin = 0.05;  // how much faster a sparse phase must be predicted (exchange_choice.h)
};
// What the workers last reported.
using RendezvousProgress = reconcile::Progress;

// Where a registered rank serves its metrics: the address the controller saw it connect from and
// the port it announced.
struct MetricsTarget {
  std::string job;  // the job's key
  int rank = 0;
  std::string node, address;  // address: "host:port"
};

// What the service has answered since it started.
struct RendezvousCounters {
  int64_t registrations = 0, heartbeats = 0;
};

// What one job may ask of the service. Requests beyond them are refused (INVALID_ARGUMENT naming
// the field, RESOURCE_EXHAUSTED for the store's totals); messages above message_bytes are refused by
// gRPC on either side.
struct RendezvousLimits {
  size_t key_bytes = 1024;                // a store key or barrier name; a heartbeat's slow_reason
  size_t value_bytes = size_t{1} << 20;   // one stored value
  size_t keys = 65536;                    // keys per job
  size_t store_bytes = size_t{64} << 20;  // keys and values per job
  size_t message_bytes = size_t{2} << 20;
  int64_t timeout_ms = 24 * 3600 * 1000;  // the longest wait a Get or Barrier may ask for
};

// A new random job token (128 bits, hex).
std::string new_job_token();
// The token of the job with this uid on a cluster: HMAC-SHA256 under the controller's key, cut to
// 128 bits (hex). A controller that restarts, or a standby that takes over, derives the same token
// again, so it never has to read the job's Secret back. Throws Error for an empty key.
std::string derive_job_token(const std::string& key, const std::string& job_uid);

class RendezvousService {
 public:
  // Listens on `address` ("127.0.0.1:0" picks a free port).
  explicit RendezvousService(const std::string& address = "127.0.0.1:0", RendezvousLimits limits = {});
  ~RendezvousService();
  int port() const;
  std::string target() const;  // "127.0.0.1:<port>"

  using JobPolicy = RendezvousJobPolicy;
  using Progress = RendezvousProgress;

  // Adds (or replaces, for a restarted gang: store and barriers start empty) a job.
  void add_job(const std::string& job, const std::string& token, std::vector<placement::RankAssignment> plan,
               JobPolicy policy = {});
  // Rank 0's last report, and the chosen switch step.
  Progress progress(const std::string& job) const;
  void remove_job(const std::string& job);
  bool has_job(const std::string& job) const;
  // The metrics endpoints of the registered ranks of every job, by job and rank.
  std::vector<MetricsTarget> metrics_targets() const;
  RendezvousCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
