#include "controller/metrics/controller_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <set>

#include <sstream>
#include "common/buckets.h"

namespace tessera {
namespace {

using nlohmann::json;

// 100 us .. ~100 s.
prometheus::Histogram::BucketBoundaries latency_buckets() { return doubling_buckets(0.0001, 120); }

const char* kPhases[] = {"Pending", "Placing", "Running", "Restarting", "Suspended", "Succeeded", "Failed"};

}  // namespace

ControllerMetrics::ControllerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(r);
  };
  created_ = counter("tessera_jobs_created_total", "TrainingJobs the controller took on (their first status write)");
  succeeded_ = counter("tessera_jobs_succeeded_total", "TrainingJobs that reached phase Succeeded");
  failed_ = counter("tessera_jobs_failed_total", "TrainingJobs that reached phase Failed");
  restarted_ =
      counter("tessera_jobs_restarted_total", "Gang restarts (each failed gang started again from its checkpoint)");
  pods_created_ = counter("tessera_pods_created_total", "Worker pods created");
  pods_deleted_ = counter("tessera_pods_deleted_total", "Worker pods deleted");
  by_phase_ = &prometheus::BuildGauge().Name("tessera_jobs").Help("TrainingJobs by phase").Register(r);
  job_restarts_ =
      &prometheus::BuildGauge().Name("tessera_job_restarts").Help("status.restarts of each TrainingJob").Register(r);
  reconcile_ = &prometheus::BuildHistogram()
                    .Name("tessera_reconcile_seconds")
                    .Help("Time of one reconcile of a job: observe, decide, act")
                    .Register(r)
                    .Add({}, latency_buckets());
  placement_ = &prometheus::BuildHistogram()
                    .Name("tessera_placement_seconds")
                    .Help("Time to decide a gang placement (waiting for the placement lock included)")
                    .Register(r)
                    .Add({}, latency_buckets());
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("tessera_workqueue_depth")
                      .Help("Jobs waiting in the work queue")
                      .Register(r)
                      .Add({});
  leader_ = &prometheus::BuildGauge()
                 .Name("tessera_controller_leader")
                 .Help("1 when this controller leads (acts on jobs)")
                 .Register(r)
                 .Add({});
  registrations_ = &prometheus::BuildCounter()
                        .Name("tessera_rendezvous_registrations_total")
                        .Help("Worker registrations at the rendezvous")
                        .Register(r)
                        .Add({});
  heartbeats_ = &prometheus::BuildCounter()
                     .Name("tessera_rendezvous_heartbeats_total")
                     .Help("Worker heartbeats at the rendezvous (one per rank per step)")
                     .Register(r)
                     .Add({});
}

ControllerMetrics::~ControllerMetrics() = default;

void ControllerMetrics::count(prometheus::Family<prometheus::Counter>* family, const std::string& ns) {
  family->Add({{"namespace", ns}}).Increment();
}

void ControllerMetrics::observe_action(const std::string& ns, const std::string& name, const json& status,
                                       const reconcile::Action& a) {
  using Kind = reconcile::Action::Kind;
  if (a.kind == Kind::kCreate && a.resource == reconcile::Resource::kPod) count(pods_created_, ns);
  if (a.kind == Kind::kDelete && a.resource == reconcile::Resource::kPod) count(pods_deleted_, ns);
  if (a.kind != Kind::kPatchStatus) return;
  const json before = status.is_object() ? status : json::object();
  const json after = reconcile::apply_status_patch(before, a.object);
  const std::string was = before.value("phase", ""), now = after.value("phase", "");
  if (was.empty() && !now.empty()) count(created_, ns);
  if (now != was && now == "Succeeded") count(succeeded_, ns);
  if (now != was && now == "Failed") count(failed_, ns);
  const int restarts_before = before.value("restarts", 0), restarts_after = after.value("restarts", 0);
  for (int i = restarts_before; i < restarts_after; ++i) count(restarted_, ns);
  observe_job(ns, name, after);
}

void ControllerMetrics::observe_job(const std::string& ns, const std::string& name, const json& status) {
  const std::string phase = status.is_object() ? status.value("phase", "") : "";
  const int restarts = status.is_object() ? status.value("restarts", 0) : 0;
  std::lock_guard<std::mutex> lock(mu_);
  jobs_[{ns, name}] = {phase.empty() ? "Pending" : phase, restarts};
  job_restarts_->Add({{"namespace", ns}, {"job", name}}).Set(restarts);
}

void ControllerMetrics::forget_job(const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (jobs_.erase({ns, name})) job_restarts_->Remove(&job_restarts_->Add({{"namespace", ns}, {"job", name}}));
}

void ControllerMetrics::observe_reconcile(double seconds) { reconcile_->Observe(seconds); }
void ControllerMetrics::observe_placement(double seconds) { placement_->Observe(seconds); }
void ControllerMetrics::set_leader(bool leading) { leader_->Set(leading ? 1 : 0); }
void ControllerMetrics::set_queue_depth(size_t depth) { queue_depth_->Set(static_cast<double>(depth)); }

void ControllerMetrics::set_rendezvous(const RendezvousCounters& c) {
  registrations_->Increment(std::max(0.0, static_cast<double>(c.registrations) - registrations_->Value()));
  heartbeats_->Increment(std::max(0.0, static_cast<double>(c.heartbeats) - heartbeats_->Value()));
}

void ControllerMetrics::on_scrape(std::function<void(ControllerMetrics&)> hook) {
  std::lock_guard<std::mutex> lock(hook_mu_);  // waits for a scrape that is running the old hook
  hook_ = std::move(hook);
}

std::string ControllerMetrics::text() {
  {
    std::lock_guard<std::mutex> lock(hook_mu_);
    if (hook_) hook_(*this);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Jobs by phase: every phase of every namespace that has a job (0 where none is in it).
    std::set<std::string> namespaces;
    std::map<std::pair<std::string, std::string>, int> n;
    for (const auto& [key, v] : jobs_) {
      namespaces.insert(key.first);
      ++n[{key.first, v.first}];
    }
    for (const auto& ns : namespaces)
      for (const char* p : kPhases) by_phase_->Add({{"namespace", ns}, {"phase", p}}).Set(n[{ns, p}]);
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

std::string http_sd_targets(const std::vector<MetricsTarget>& targets) {
  json groups = json::array();
  for (const auto& t : targets) {
    const auto slash = t.job.find('/');
    groups.push_back({{"targets", {t.address}},
                      {"labels",
                       {{"namespace", slash == std::string::npos ? "" : t.job.substr(0, slash)},
                        {"job", slash == std::string::npos ? t.job : t.job.substr(slash + 1)},
                        {"rank", std::to_string(t.rank)},
                        {"node", t.node}}}});
  }
  return groups.dump();
}

}  // namespace tessera
