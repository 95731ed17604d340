// LeaderElector: leader election on a coordination.k8s.io/v1 Lease, as client-go's: a candidate
// takes the lease when it is absent, held by itself, or not renewed by its holder for
// leaseDurationSeconds (timed by this process's clock, from when it last saw the lease change);
// the leader renews it every retry period, and gives up leadership when it could not renew for
// the renew deadline. Writes carry the lease's resourceVersion, so two candidates never both win.
// run() blocks.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "controller/kube/client.h"

namespace tessera::kube {

struct LeaderElectionOptions {
  std::string lease_namespace = "default";
  std::string lease_name = "tessera-controller";
  std::string identity;  // this candidate (hostname_pid by default)
  std::chrono::milliseconds lease_duration{15000};
  std::chrono::milliseconds renew_deadline{10000};
  std::chrono::milliseconds retry_period{2000};
};

class LeaderElector {
 public:
  LeaderElector(const KubeClient& client, LeaderElectionOptions options);
  // Campaigns until it leads, calls on_started, then renews until *stop or until leadership is lost
  // (then on_stopped is called). Returns whether leadership ended by loss (true) or by stop (false).
  bool run(const std::function<void()>& on_started, const std::function<void()>& on_stopped,
           const std::atomic<bool>* stop);
  const LeaderElectionOptions& options() const { return options_; }

 private:
  // One attempt to acquire or renew; true when this candidate holds the lease afterwards.
  bool try_acquire_or_renew();
  const KubeClient& client_;
  LeaderElectionOptions options_;
  std::string observed_version_, observed_holder_;
  std::chrono::steady_clock::time_point observed_at_;
};

// RFC 3339 with microseconds, as Kubernetes MicroTime.
std::string micro_time_now();

}  // namespace tessera::kube
