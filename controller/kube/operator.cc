#include "controller/kube/operator.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "api/training_job.h"
#include "common/log.h"
#include "controller/kube/informer.h"
#include "controller/kube/work_queue.h"
#include "controller/metrics/controller_metrics.h"
#include "controller/reconcile/observe.h"
#include "controller/reconcile/reconciler.h"
#include "controller/rendezvous/rendezvous_service.h"

namespace tessera::kube {
namespace {

using reconcile::Action;
const char* kGroupVersion = "tessera.dev/v1alpha1";
constexpr size_t kReconcileSamples = 100000;

std::string job_of(const json& object) {
  const json labels = object["metadata"].value("labels", json::object());
  auto it = labels.find(reconcile::kJobLabel);
  if (it == labels.end() || !it->is_string()) return "";
  return object["metadata"].value("namespace", "") + "/" + it->get<std::string>();
}

// A write (the status, a ConfigMap) that met a newer version of its object.
struct WriteConflict {};
// The job was deleted while its decision was carried out: the rest of the decision is moot.
struct JobGone {};

}  // namespace

struct KubeOperator::Impl {
  const KubeClient& client;
  OperatorOptions opt;
  std::unique_ptr<RendezvousService> rendezvous;
  std::unique_ptr<Informer> jobs, pods, nodes, services, configmaps;
  WorkQueue queue;

  mutable std::mutex mu;
  std::mutex placement_mu;
  // What the rendezvous serves for each job: its token, the attempt (pods) and round of its gang.
  struct Served {
    std::string token;
    int attempt = 0;
    int64_t round = 0;
  };
  std::map<std::string, Served> served;  // by job key
  // Jobs whose token Secret this controller has written (it cannot read Secrets): after a restart the
  // first decision creates it again, meets 409 AlreadyExists and replaces it with the same content.
  std::set<std::string> secrets_made;  // GUARDED_BY(mu)
  OperatorStats stats;

  Impl(const KubeClient& c, OperatorOptions o) : client(c), opt(std::move(o)) {}

  std::string path(const std::string& resource, const std::string& ns, const std::string& name = "") const {
    if (resource == "trainingjobs") return group_path(kGroupVersion, ns, resource, name);
    return core_path(ns, resource, name);
  }
  Informer* informer_of(const std::string& resource) {
    if (resource == "pods") return pods.get();
    if (resource == "services") return services.get();
    if (resource == "configmaps") return configmaps.get();
    return nullptr;
  }

  // What each node's handler last saw of its readiness, cordon and taints.
  std::mutex node_states_mu;
  std::map<std::string, std::string> node_states;  // GUARDED_BY(node_states_mu)

  // Nodes with the requests of the pods bound to them, rebuilt only when nodes or pods changed.
  mutable std::mutex nodes_mu;
  mutable std::pair<uint64_t, uint64_t> nodes_seen{~uint64_t{0}, 0};
  mutable std::vector<placement::NodeInfo> node_cache;
  std::vector<placement::NodeInfo> node_infos() const {
    std::lock_guard<std::mutex> lock(nodes_mu);
    const std::pair<uint64_t, uint64_t> now{nodes->generation(), pods->generation()};
    if (now != nodes_seen) {
      // Read in place under the informers' locks: no copy of a thousand nodes per placement.
      std::map<std::string, placement::Resources> used;
      pods->for_each([&](const json& p) { reconcile::add_usage(p, &used); });
      node_cache.clear();
      nodes->for_each([&](const json& n) {
        node_cache.push_back(reconcile::node_info(n));
        auto it = used.find(node_cache.back().name);
        if (it != used.end()) node_cache.back().used = it->second;
      });
      nodes_seen = now;
    }
    std::vector<placement::NodeInfo> out = node_cache;
    if (!reserved.empty()) {
      std::map<std::string, placement::NodeInfo*> by_name;
      for (auto& n : out) by_name[n.name] = &n;
      for (const auto& [job, pods] : reserved)
        for (const auto& [node, r] : pods)
          if (auto it = by_name.find(node); it != by_name.end()) {
            it->second->used.gpu += r.gpu;
            it->second->used.cpu += r.cpu;
            it->second->used.memory += r.memory;
          }
    }
    return out;
  }

  // Resources of pods being created, by job: added to what the cache shows.
  std::map<std::string, std::vector<std::pair<std::string, placement::Resources>>> reserved;  // GUARDED_BY(nodes_mu)
  struct Reservation {
    Impl& m;
    std::string key;
    Reservation(Impl& impl, const std::string& job, const reconcile::Decision& d) : m(impl), key(job) {
      std::vector<std::pair<std::string, placement::Resources>> pods;
      for (const auto& a : d.actions)
        if (a.kind == Action::Kind::kCreate && a.resource == reconcile::Resource::kPod)
          pods.push_back({a.object["spec"].value("nodeName", ""), reconcile::pod_requests(a.object)});
      if (pods.empty()) return;
      std::lock_guard<std::mutex> lock(m.nodes_mu);
      m.reserved[key] = std::move(pods);
    }
    ~Reservation() {
      std::lock_guard<std::mutex> lock(m.nodes_mu);
      m.reserved.erase(key);
    }
  };

  // The job's observed state; the nodes (read only to place a gang) when with_nodes.
  reconcile::Observed observe(const json& job, bool with_nodes) const {
    reconcile::Observed o;
    o.job = job;
    o.now = std::chrono::system_clock::now();
    const std::string ns = job["metadata"].value("namespace", "");
    const std::string name = job["metadata"].value("name", "");
    const std::string key = ns + "/" + name;
    for (const auto& p : pods->indexed(key)) o.pods.push_back(reconcile::pod_info(p));
    o.token = derive_job_token(opt.token_key, job["metadata"].value("uid", ""));
    o.has_service = services->get(key).has_value();
    o.config_map = configmaps->get(key + "-config");
    if (with_nodes) {
      o.nodes = node_infos();
    } else if (const auto plan = o.config_map ? reconcile::plan_nodes(*o.config_map) : std::vector<std::string>{};
               !plan.empty()) {
      // A placed gang: the state of its nodes alone (one leaving or lost moves the gang).
      for (const auto& n : plan)
        if (const auto node = nodes->get(n)) o.nodes.push_back(reconcile::node_info(*node));
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      o.has_secret = secrets_made.count(key) > 0;
      auto it = served.find(key);
      if (it != served.end() && it->second.token == o.token) {
        o.served_attempt = it->second.attempt;
        o.served_round = it->second.round;
        const json status = job.contains("status") ? job["status"] : json::object();
        if (it->second.attempt == reconcile::attempt_of(status) &&
            it->second.round == status.value("restartsInPlace", int64_t{0}))
          o.progress = rendezvous->progress(key);
      }
    }
    return o;
  }
  static bool needs_placement(const reconcile::Observed& o) {
    if (reconcile::rendezvous_target(o)) return false;
    const std::string phase = o.job.contains("status") ? o.job["status"].value("phase", "") : "";
    return phase != "Succeeded" && phase != "Failed";
  }

  // The rendezvous serves `target` for the job from now on (a new gang), or nothing (none).
  void serve(const std::string& key, const std::optional<reconcile::RendezvousTarget>& target) {
    std::lock_guard<std::mutex> lock(mu);
    if (!target) {
      if (served.erase(key)) rendezvous->remove_job(key);
      return;
    }
    RendezvousJobPolicy policy;
    policy.switch_at_epoch = target->switch_at_epoch;
    policy.switch_step = target->switch_step;
    policy.round = target->round;
    policy.auto_exchange = target->auto_exchange;
    policy.epochs = target->epochs;
    policy.densities = {target->density};
    rendezvous->add_job(key, target->token, target->plan, policy);
    served[key] = {target->token, target->attempt, target->round};
  }

  void record_event(const json& job, const Action& a) {
    const std::string ns = job["metadata"].value("namespace", "");
    const std::string now = reconcile::format_time(std::chrono::system_clock::now());
    json event = {{"apiVersion", "v1"},
                  {"kind", "Event"},
                  {"metadata", {{"generateName", job["metadata"].value("name", "") + "."}, {"namespace", ns}}},
                  {"involvedObject",
                   {{"apiVersion", kGroupVersion},
                    {"kind", api::kKind},
                    {"name", job["metadata"].value("name", "")},
                    {"namespace", ns},
                    {"uid", job["metadata"].value("uid", "")},
                    {"resourceVersion", job["metadata"].value("resourceVersion", "")}}},
                  {"reason", reconcile::name(a.reason)},
                  {"message", a.message.substr(0, 1024)},
                  {"type", a.warning ? "Warning" : "Normal"},
                  {"source", {{"component", "tessera-controller"}}},
                  {"firstTimestamp", now},
                  {"lastTimestamp", now},
                  {"count", 1}};
    try {
      client.create(core_path(ns, "events"), event);
    } catch (const ApiError& e) {
      log_warn("recording event ", reconcile::name(a.reason), " for ", job_of(job), ": ",
               e.what());  // an Event lost is not worth a retry
    }
  }

  void execute(const json& job, const reconcile::Decision& d) {
    const std::string ns = job["metadata"].value("namespace", "");
    const std::string name = job["metadata"].value("name", "");
    const std::string key = ns + "/" + name;
    const json status_before = job.contains("status") ? job["status"] : json();
    for (const Action& a : d.actions) {
      try {
        act(job, key, a);
      } catch (const JobGone&) {
        return;
      }
      if (opt.metrics) opt.metrics->observe_action(ns, name, status_before, a);
    }
  }

  void secret_made(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu);
    secrets_made.insert(key);
  }

  // Carries out one action of a decision for `job`; throws WriteConflict or ApiError.
  void act(const json& job, const std::string& key, const Action& a) {
    const std::string ns = job["metadata"].value("namespace", "");
    const std::string name = job["metadata"].value("name", "");
    {
      switch (a.kind) {
        case Action::Kind::kPatchStatus: {
          json updated = job;
          updated["status"] = reconcile::apply_status_patch(job.contains("status") ? job["status"] : json(), a.object);
          try {
            // A PUT with the resourceVersion the decision was made on: 409 when the job changed since.
            jobs->remember(client.replace(path("trainingjobs", ns, name) + "/status", updated));
          } catch (const ApiError& e) {
            if (e.conflict()) throw WriteConflict{};
            if (e.not_found()) throw JobGone{};
            throw;
          }
          break;
        }
        case Action::Kind::kCreate: {
          try {
            const json created = client.create(path(plural(a.resource), ns), a.object);
            if (Informer* i = informer_of(plural(a.resource))) i->remember(created);
            if (a.resource == reconcile::Resource::kPod) log_info(key, ": ", a.describe());
            if (a.resource == reconcile::Resource::kSecret) secret_made(key);
          } catch (const ApiError& e) {
            if (e.already_exists()) {
              if (a.resource == reconcile::Resource::kSecret) {
                // Written again, unread: after a restart it holds this token already, but a job deleted and
                // created again under its name may still find its predecessor's Secret.
                client.replace(path(plural(a.resource), ns, a.name), a.object);
                secret_made(key);
              }
              break;
            }
            if (!e.transient()) {
              Action failed;
              failed.kind = Action::Kind::kEvent;
              failed.warning = true;
              failed.reason = reconcile::Reason::kFailedCreate;
              failed.message = detail::concat("creating ", a.describe().substr(7), ": ", e.what());
              record_event(job, failed);
            }
            throw;
          }
          break;
        }
        case Action::Kind::kUpdate:
          try {
            informer_of(plural(a.resource))->remember(client.replace(path(plural(a.resource), ns, a.name), a.object));
          } catch (const ApiError& e) {
            if (!e.conflict()) throw;
            informer_of(plural(a.resource))->remember(client.get(path(plural(a.resource), ns, a.name)));
            throw WriteConflict{};
          }
          break;
        case Action::Kind::kDelete:
          client.remove(path(plural(a.resource), ns, a.name), a.object.is_object() ? a.object : json::object());
          log_info(key, ": ", a.describe());
          break;
        case Action::Kind::kEvent: record_event(job, a); break;
        case Action::Kind::kDeleteJob:
          client.remove(path("trainingjobs", ns, name), {{"propagationPolicy", "Background"}});
          log_info(key, ": deleted (ttlSecondsAfterFinished)");
          break;
        case Action::Kind::kServeRendezvous:
          serve(key, a.rendezvous);  // before the gang's pods are created: the workers must find their job
          break;
        case Action::Kind::kStopRendezvous: serve(key, std::nullopt); break;
      }
    }
  }

  void sync(const std::string& key) {
    const auto start = std::chrono::steady_clock::now();
    const auto slash = key.find('/');
    const std::string ns = key.substr(0, slash), name = key.substr(slash + 1);
    reconcile::ReconcileOptions ro;
    ro.rendezvous_address = opt.rendezvous_advertise;
    ro.worker_image = opt.worker_image;
    ro.status_interval = opt.status_interval;
    ro.spec_defaults = opt.spec_defaults;
    for (int attempt = 0;; ++attempt) {
      const auto job = jobs->get(key);
      if (!job) {
        serve(key, std::nullopt);
        queue.forget(key);
        {
          std::lock_guard<std::mutex> lock(mu);
          secrets_made.erase(key);  // a job created again under the name has a new uid, token and Secret
        }
        if (opt.metrics) opt.metrics->forget_job(ns, name);
        return;
      }
      reconcile::Observed o = observe(*job, false);
      // Placements are made one at a time, each on a snapshot that holds the pods of the last one.
      std::unique_lock<std::mutex> placing(placement_mu, std::defer_lock);
      const auto placement_start = std::chrono::steady_clock::now();
      if (needs_placement(o) || reconcile::needs_all_nodes(o.job)) {
        placing.lock();
        const auto fresh = jobs->get(key);
        if (!fresh) continue;
        o = observe(*fresh, true);
      }
      const reconcile::Decision d = reconcile::reconcile(o, ro);
      if (placing.owns_lock() && opt.metrics)
        opt.metrics->observe_placement(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - placement_start).count());
      // The pods this decision creates hold their nodes' resources from now on (a reservation until
      // the pods are in the cache), so the next placement can be decided while these are created.
      Reservation held(*this, key, d);
      if (placing.owns_lock()) placing.unlock();
      try {
        execute(o.job, d);
      } catch (const WriteConflict&) {
        // Someone wrote the job since the cache saw it: decide again on a fresh read.
        log_info(key, ": the write met a newer version (409 Conflict); reconciling again on a fresh read");
        {
          std::lock_guard<std::mutex> lock(mu);
          ++stats.status_conflicts;
        }
        try {
          jobs->remember(client.get(path("trainingjobs", ns, name)));
        } catch (const ApiError& e) {
          if (!e.not_found()) throw;  // gone: the next attempt finds no job
        }
        if (attempt < 5) continue;
        queue.add_rate_limited(key);
        return;
      }
      queue.forget(key);
      if (d.requeue_after.count() > 0) queue.add_after(key, d.requeue_after);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (opt.metrics) {
        opt.metrics->observe_reconcile(seconds);
        // A status write was observed with its action; otherwise the status is the one decided on.
        const bool patched = std::any_of(d.actions.begin(), d.actions.end(),
                                         [](const Action& a) { return a.kind == Action::Kind::kPatchStatus; });
        if (!patched) opt.metrics->observe_job(ns, name, o.job.contains("status") ? o.job["status"] : json());
      }
      std::lock_guard<std::mutex> lock(mu);
      // The newest kReconcileSamples durations, in a ring: a controller runs for months.
      if (stats.reconcile_seconds.size() < kReconcileSamples) stats.reconcile_seconds.push_back(seconds);
      else stats.reconcile_seconds[stats.reconciles % kReconcileSamples] = seconds;
      ++stats.reconciles;
      return;
    }
  }

  void worker_loop() {
    std::string key;
    while (queue.get(&key)) {
      try {
        sync(key);
      } catch (const std::exception& e) {
        const int n = queue.failures(key);
        if (n == 0 || n % 5 == 0) log_warn("reconciling ", key, ": ", e.what(), "; retrying with backoff");
        queue.add_rate_limited(key);
      }
      queue.done(key);
    }
  }

  void enqueue_unplaced() {
    jobs->for_each([&](const json& j) {
      const std::string phase = j.contains("status") ? j["status"].value("phase", "") : "";
      if (phase.empty() || phase == "Pending") queue.add(object_key(j));
    });
  }
};

KubeOperator::KubeOperator(const KubeClient& client, OperatorOptions options)
    : impl_(std::make_unique<Impl>(client, std::move(options))) {
  auto& o = impl_->opt;
  impl_->rendezvous = std::make_unique<RendezvousService>(o.rendezvous_listen);
  if (o.rendezvous_advertise.empty()) {
    const auto colon = o.rendezvous_listen.rfind(':');
    std::string host = o.rendezvous_listen.substr(0, colon);
    if (host == "0.0.0.0" || host == "[::]" || host.empty()) host = "127.0.0.1";
    o.rendezvous_advertise = host + ":" + std::to_string(impl_->rendezvous->port());
  }
  if (o.metrics) {
    o.metrics->on_scrape([m = impl_.get()](ControllerMetrics& cm) {
      cm.set_queue_depth(m->queue.depth());
      cm.set_rendezvous(m->rendezvous->counters());
    });
    o.metrics->set_leader(true);
  }
}

KubeOperator::~KubeOperator() {
  if (impl_->opt.metrics) {
    impl_->opt.metrics->on_scrape(nullptr);
    impl_->opt.metrics->set_leader(false);
  }
}

std::string KubeOperator::rendezvous_address() const { return impl_->opt.rendezvous_advertise; }

std::vector<MetricsTarget> KubeOperator::metrics_targets() const { return impl_->rendezvous->metrics_targets(); }

OperatorStats KubeOperator::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  OperatorStats s = impl_->stats;
  s.api_requests = impl_->client.requests();
  return s;
}

std::vector<Permission> required_permissions(bool leader_election) {
  std::vector<Permission> p;
  auto add = [&](const char* group, const char* resource, std::initializer_list<const char*> verbs,
                 bool namespaced = true, const char* subresource = "") {
    for (const char* v : verbs) p.push_back({v, group, resource, subresource, namespaced});
  };
  add("tessera.dev", "trainingjobs", {"get", "list", "watch", "delete"});  // get: a fresh read after a 409
  add("tessera.dev", "trainingjobs", {"update"}, true, "status");
  add("", "pods", {"list", "watch", "create", "delete"});
  add("", "secrets", {"create", "update"});  // the job's token Secret; never read (derive_job_token)
  add("", "services", {"list", "watch", "create"});
  add("", "configmaps", {"get", "list", "watch", "create", "update"});  // get: a fresh read after a 409
  add("", "events", {"create"});
  add("", "nodes", {"list", "watch"}, false);
  if (leader_election) add("coordination.k8s.io", "leases", {"get", "create", "update"});
  return p;
}

void KubeOperator::preflight(const std::atomic<bool>& stop) {
  const KubeClient& c = impl_->client;
  auto backoff = std::chrono::milliseconds(500);
  for (;;) {
    try {
      c.get("/version");
      break;
    } catch (const ApiError& e) {
      if (!e.transient()) throw;
      log_warn(e.what(), "; retrying in ", backoff.count(), " ms");
    }
    for (auto until = std::chrono::steady_clock::now() + backoff; std::chrono::steady_clock::now() < until;) {
      if (stop) throw Stopped("stopped before the API server " + c.config().server + " could be reached");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(10000));
  }
  Response crd = c.request("GET", "/apis/tessera.dev/v1alpha1");
  if (crd.code == 404)
    throw Error("the TrainingJob CRD (trainingjobs.tessera.dev) is not installed on " + c.config().server +
                ": kubectl apply -f crds/ (or helm install tessera charts/tessera)");
  // What the controller does, asked of the API server's authorizer (leases: by the elector, which
  // reports its own errors).
  std::string missing;
  const std::string& ns = impl_->opt.namespace_;
  for (const Permission& n : required_permissions(false)) {
    json attrs = {{"verb", n.verb}, {"group", n.group}, {"resource", n.resource}};
    if (!n.subresource.empty()) attrs["subresource"] = n.subresource;
    if (n.namespaced && !ns.empty()) attrs["namespace"] = ns;
    const json review =
        c.create("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {{"apiVersion", "authorization.k8s.io/v1"},
                                                                            {"kind", "SelfSubjectAccessReview"},
                                                                            {"spec", {{"resourceAttributes", attrs}}}});
    if (!review.value("status", json::object()).value("allowed", false))
      missing += detail::concat(missing.empty() ? "" : ", ", n.verb, " ", n.resource, n.subresource.empty() ? "" : "/",
                                n.subresource);
  }
  if (!missing.empty())
    throw Error(detail::concat("no permission to ", missing, ns.empty() ? " in all namespaces" : " in namespace " + ns,
                               " (RBAC of the identity in ", c.config().source, ")"));
}

void KubeOperator::run(const std::atomic<bool>& stop) {
  Impl& m = *impl_;
  const std::string& ns = m.opt.namespace_;
  const std::string selector = reconcile::kJobLabel;
  m.jobs = std::make_unique<Informer>(m.client, group_path(kGroupVersion, ns, "trainingjobs"));
  m.pods = std::make_unique<Informer>(m.client, core_path(ns, "pods"));
  m.pods->set_index(job_of);
  m.nodes = std::make_unique<Informer>(m.client, core_path("", "nodes"));
  m.services = std::make_unique<Informer>(m.client, core_path(ns, "services"), selector);
  m.configmaps = std::make_unique<Informer>(m.client, core_path(ns, "configmaps"), selector);
  m.jobs->set_handler([&m](const std::string&, const json& j) { m.queue.add(object_key(j)); });
  auto child = [&m](const std::string&, const json& o) {
    const std::string key = job_of(o);
    if (!key.empty()) m.queue.add(key);
  };
  m.pods->set_handler([&m, child](const std::string& type, const json& p) {
    child(type, p);
    // A pod that ends or goes away frees its node's GPUs for a gang that is waiting.
    if (type == "DELETED" ||
        (p.contains("status") && !reconcile::holds_resources(p) && !p["spec"].value("nodeName", "").empty()))
      if (job_of(p).empty()) m.enqueue_unplaced();
  });
  m.services->set_handler(child);
  m.configmaps->set_handler(child);
  m.nodes->set_handler([&m](const std::string& type, const json& n) {
    if (type != "MODIFIED") m.enqueue_unplaced();
    // A node that becomes ready, not ready, cordoned or tainted: the gangs placed there may have to
    // move, and waiting ones may fit. Its other changes (a status heartbeat) wake nothing.
    const placement::NodeInfo info = reconcile::node_info(n);
    std::string state = detail::concat(info.ready, info.unschedulable);
    for (const auto& t : info.taints) state += t.key + "=" + t.value + ":" + t.effect + ";";
    std::lock_guard<std::mutex> lock(m.node_states_mu);
    std::string& seen = m.node_states[info.name];
    if (type == "DELETED") m.node_states.erase(info.name);
    else if (seen == state) return;
    else seen = state;
    m.jobs->for_each([&](const json& j) {
      const std::string phase = j.contains("status") ? j["status"].value("phase", "") : "";
      if (phase != "Succeeded" && phase != "Failed") m.queue.add(object_key(j));
    });
  });
  for (Informer* i : {m.nodes.get(), m.pods.get(), m.services.get(), m.configmaps.get(), m.jobs.get()}) i->start();
  for (Informer* i : {m.nodes.get(), m.pods.get(), m.services.get(), m.configmaps.get(), m.jobs.get()})
    while (!i->wait_synced(std::chrono::milliseconds(200)))
      if (stop) break;
  log_info("caches synced: ", m.jobs->list().size(), " training job(s), ", m.nodes->list().size(),
           " node(s); rendezvous at ", m.opt.rendezvous_advertise);
  for (const auto& j : m.jobs->list()) m.queue.add(object_key(j));
  std::vector<std::thread> workers;
  for (int i = 0; i < std::max(1, m.opt.workers); ++i) workers.emplace_back([&m] { m.worker_loop(); });
  ready_ = true;
  while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ready_ = false;
  m.queue.shutdown();
  for (auto& t : workers) t.join();
  for (Informer* i : {m.jobs.get(), m.pods.get(), m.nodes.get(), m.services.get(), m.configmaps.get()}) i->stop();
}

}  // namespace tessera::kube
