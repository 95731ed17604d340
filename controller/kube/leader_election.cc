#include "controller/kube/leader_election.h"

#include <sys/time.h>
#include <unistd.h>

#include <ctime>
#include <thread>

#include "common/log.h"

namespace tessera::kube {

std::string micro_time_now() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  std::tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof(out), "%s.%06ldZ", buf, static_cast<long>(tv.tv_usec));
  return out;
}

LeaderElector::LeaderElector(const KubeClient& client, LeaderElectionOptions options)
    : client_(client), options_(std::move(options)) {
  if (options_.identity.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    options_.identity = std::string(host) + "_" + std::to_string(getpid());
  }
}

bool LeaderElector::try_acquire_or_renew() {
  const std::string path =
      group_path("coordination.k8s.io/v1", options_.lease_namespace, "leases", options_.lease_name);
  const int duration_s = static_cast<int>(std::max<int64_t>(1, options_.lease_duration.count() / 1000));
  const std::string now = micro_time_now();
  json lease;
  try {
    lease = client_.get(path);
  } catch (const ApiError& e) {
    if (!e.not_found()) throw;
    lease = {{"apiVersion", "coordination.k8s.io/v1"},
             {"kind", "Lease"},
             {"metadata", {{"name", options_.lease_name}, {"namespace", options_.lease_namespace}}},
             {"spec",
              {{"holderIdentity", options_.identity},
               {"leaseDurationSeconds", duration_s},
               {"acquireTime", now},
               {"renewTime", now},
               {"leaseTransitions", 0}}}};
    try {
      client_.create(group_path("coordination.k8s.io/v1", options_.lease_namespace, "leases"), lease);
      return true;
    } catch (const ApiError& c) {
      if (c.conflict()) return false;  // another candidate created it first
      throw;
    }
  }
  json& spec = lease["spec"];
  const std::string holder = spec.value("holderIdentity", "");
  const std::string version = lease["metadata"].value("resourceVersion", "");
  const auto t = std::chrono::steady_clock::now();
  if (version != observed_version_) {
    observed_version_ = version;
    observed_holder_ = holder;
    observed_at_ = t;
  }
  const auto held_for =
      std::chrono::milliseconds(static_cast<int64_t>(spec.value("leaseDurationSeconds", duration_s)) * 1000);
  if (!holder.empty() && holder != options_.identity && t - observed_at_ < held_for) return false;  // held by another
  if (holder != options_.identity) {
    spec["acquireTime"] = now;
    spec["leaseTransitions"] = spec.value("leaseTransitions", 0) + (holder.empty() ? 0 : 1);
  }
  spec["holderIdentity"] = options_.identity;
  spec["leaseDurationSeconds"] = duration_s;
  spec["renewTime"] = now;
  try {
    const json updated = client_.replace(path, lease);
    observed_version_ = updated["metadata"].value("resourceVersion", "");
    observed_holder_ = options_.identity;
    observed_at_ = std::chrono::steady_clock::now();
    return true;
  } catch (const ApiError& e) {
    if (e.conflict()) return false;  // someone else wrote it since our read
    throw;
  }
}

bool LeaderElector::run(const std::function<void()>& on_started, const std::function<void()>& on_stopped,
                        const std::atomic<bool>* stop) {
  auto sleep = [&](std::chrono::milliseconds d) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (!stop->load() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  bool waiting_said = false;
  while (!stop->load()) {
    bool got = false;
    try {
      got = try_acquire_or_renew();
    } catch (const ApiError& e) {
      log_warn("leader election: ", e.what());
    }
    if (got) break;
    if (!waiting_said)
      log_info("leader election: lease ", options_.lease_namespace, "/", options_.lease_name, " is held by ",
               observed_holder_.empty() ? "another candidate" : observed_holder_, "; waiting");
    waiting_said = true;
    sleep(options_.retry_period);
  }
  if (stop->load()) return false;
  log_info("leader election: ", options_.identity, " leads (lease ", options_.lease_namespace, "/", options_.lease_name,
           ")");
  on_started();
  auto last_renew = std::chrono::steady_clock::now();
  while (!stop->load()) {
    sleep(options_.retry_period);
    if (stop->load()) break;
    bool renewed = false;
    try {
      renewed = try_acquire_or_renew();
    } catch (const ApiError& e) {
      log_warn("leader election: renewing: ", e.what());
    }
    if (renewed) last_renew = std::chrono::steady_clock::now();
    else if (std::chrono::steady_clock::now() - last_renew > options_.renew_deadline) {
      log_warn("leader election: could not renew the lease for ", options_.renew_deadline.count(),
               " ms; leadership lost");
      on_stopped();
      return true;
    }
  }
  on_stopped();
  return false;
}

}  // namespace tessera::kube
