// ControllerMetrics: what the controller exports to Prometheus (prometheus-cpp), the same for both
// backends of the reconcile (the operator and `tessera run`). Counters follow the job lifecycle as
// the status writes that carry it succeed (a job is counted created at its first status write,
// restarted each time status.restarts grows, succeeded or failed when its phase becomes that), so
// a retried reconcile never counts twice; gauges give jobs by phase, each job's restarts, the work
// queue's depth, leadership and the rendezvous' traffic. Labels: namespace, phase, job: bounded by
// the jobs that exist (a deleted job's series are removed). Thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "controller/reconcile/reconciler.h"
#include "controller/rendezvous/rendezvous_service.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace tessera {

class ControllerMetrics {
 public:
  ControllerMetrics();
  ~ControllerMetrics();

  // An action the backend carried out for job `ns`/`name` whose status was `status` before it.
  void observe_action(const std::string& ns, const std::string& name, const nlohmann::json& status,
                      const reconcile::Action& action);
  // The job's stored status (after a reconcile, or as the cache sees it); forget() when it is gone.
  void observe_job(const std::string& ns, const std::string& name, const nlohmann::json& status);
  void forget_job(const std::string& ns, const std::string& name);
  void observe_reconcile(double seconds);
  void observe_placement(double seconds);
  void set_leader(bool leading);
  // Called before each scrape: the backend sets the queue depth and rendezvous counters here.
  // Returns once no scrape runs the previous hook (a backend going away clears its hook).
  void on_scrape(std::function<void(ControllerMetrics&)> hook);
  void set_queue_depth(size_t depth);
  void set_rendezvous(const RendezvousCounters& counters);

  // The Prometheus text exposition of every series.
  std::string text();

 private:
  void count(prometheus::Family<prometheus::Counter>* family, const std::string& ns);
  std::shared_ptr<prometheus::Registry> registry_;
  using Counters = prometheus::Family<prometheus::Counter>;
  using Gauges = prometheus::Family<prometheus::Gauge>;
  Counters* created_ = nullptr;
  Counters* succeeded_ = nullptr;
  Counters* failed_ = nullptr;
  Counters* restarted_ = nullptr;
  Counters* pods_created_ = nullptr;
  Counters* pods_deleted_ = nullptr;
  Gauges* by_phase_ = nullptr;
  Gauges* job_restarts_ = nullptr;
  prometheus::Histogram *reconcile_, *placement_;
  prometheus::Gauge *queue_depth_, *leader_;
  prometheus::Counter *registrations_, *heartbeats_;
  std::mutex mu_, hook_mu_;
  std::map<std::pair<std::string, std::string>, std::pair<std::string, int>> jobs_;  // (ns, name) -> (phase, restarts)
  std::function<void(ControllerMetrics&)> hook_;
};

// Prometheus' HTTP service discovery document (http_sd_configs) for the workers' metrics endpoints:
// one target group per rank, labelled namespace, job, rank and node.
std::string http_sd_targets(const std::vector<MetricsTarget>& targets);

}  // namespace tessera
