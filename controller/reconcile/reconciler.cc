#include "controller/reconcile/reconciler.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include "api/training_job.h"
#include "controller/reconcile/children.h"
#include "controller/reconcile/manifest.h"

namespace tessera::reconcile {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::seconds;

// The working copy of the job's status, with the helpers that keep its conditions.
struct Status {
  json s;
  int64_t generation = 0;
  Time now;

  void condition(const std::string& type, bool value, const std::string& reason, const std::string& message) {
    if (!s.contains("conditions") || !s["conditions"].is_array()) s["conditions"] = json::array();
    json* c = nullptr;
    for (auto& e : s["conditions"])
      if (e.value("type", "") == type) c = &e;
    if (!c) {
      s["conditions"].push_back({{"type", type}});
      c = &s["conditions"].back();
    }
    const std::string v = value ? "True" : "False";
    if (c->value("status", "") != v) (*c)["lastTransitionTime"] = format_time(now);
    (*c)["status"] = v;
    (*c)["reason"] = reason;
    // Empty strings are left out, as Kubernetes objects do.
    if (message.empty()) c->erase("message");
    else (*c)["message"] = message;
    (*c)["observedGeneration"] = generation;
  }
  // The condition's status ("" when absent), reason and message.
  const json* find(const std::string& type) const {
    if (!s.contains("conditions")) return nullptr;
    for (const auto& e : s["conditions"])
      if (e.value("type", "") == type) return &e;
    return nullptr;
  }
  bool is(const std::string& type) const {
    const json* c = find(type);
    return c && c->value("status", "") == "True";
  }
  std::string phase() const { return s.value("phase", ""); }
  void set(const std::string& key, json value) { s[key] = std::move(value); }
  void erase(const std::string& key) { s.erase(key); }
};

// The top-level merge patch that turns `from` into `to` (keys gone from `to` become null).
json status_patch(const json& from, const json& to) {
  json patch = json::object();
  for (auto it = to.begin(); it != to.end(); ++it)
    if (!from.is_object() || !from.contains(it.key()) || from[it.key()] != it.value()) patch[it.key()] = it.value();
  if (from.is_object())
    for (auto it = from.begin(); it != from.end(); ++it)
      if (!to.contains(it.key())) patch[it.key()] = nullptr;
  return patch;
}

// auto: `exchange` is the controller's choice (none: the gang exchanges densely until it comes).
std::string training_phase(const api::CommunicationSpec& c, int64_t step, int64_t switch_step,
                           const ExchangeDecision* exchange = nullptr) {
  if (c.strategy == "hybrid") return switch_step >= 0 && step >= switch_step ? "dense" : "sparse";
  if (c.strategy == "auto")
    return exchange && !exchange->sparse.empty() && exchange->from_step >= 0 && step >= exchange->from_step &&
                   !(switch_step >= 0 && step >= switch_step)
               ? "sparse"
               : "dense";
  return c.strategy == "topk" || c.strategy == "hitopk" ? "sparse" : "dense";
}

// A pod the node refused before it ran (kubelet admission), or lost with its node: placing the gang
// again is not a restart.
bool admission_rejected(const PodInfo& p) {
  return p.phase == "Failed" && p.exit_code < 0 &&
         (p.reason.rfind("OutOf", 0) == 0 || p.reason == "UnexpectedAdmissionError" || p.reason == "NodeAffinity" ||
          p.reason == "NodeLost" || p.reason == "NodeSelectorMismatching");
}

std::optional<std::pair<int, std::vector<placement::RankAssignment>>> read_plan(const std::optional<json>& cm) {
  if (!cm || !cm->contains("data") || !(*cm)["data"].contains(kPlanFile)) return std::nullopt;
  const json p = json::parse((*cm)["data"][kPlanFile].get<std::string>(), nullptr, false);
  if (p.is_discarded() || !p.contains("attempt")) return std::nullopt;
  std::vector<placement::RankAssignment> plan;
  for (const auto& r : p["ranks"])
    plan.push_back(
        {r.value("rank", 0), r.value("replica", 0), r.value("slot", 0), r.value("node", ""), r.value("localRank", 0)});
  return std::make_pair(p["attempt"].get<int>(), plan);
}

// The spec the job started with (the ConfigMap's manifest), if it started.
std::optional<json> frozen_spec(const std::optional<json>& cm) {
  if (!cm || !cm->contains("data") || !(*cm)["data"].contains(kConfigFile)) return std::nullopt;
  const json m = json::parse((*cm)["data"][kConfigFile].get<std::string>(), nullptr, false);
  if (m.is_discarded() || !m.contains("spec")) return std::nullopt;
  return m["spec"];
}

json without_run_policy(json spec) {
  spec.erase("runPolicy");
  return spec;
}

// Fields that differ between two specs, as paths ("spec.model.hidden").
void differing(const json& a, const json& b, const std::string& path, std::vector<std::string>* out) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (auto it = a.begin(); it != a.end(); ++it) keys.insert(it.key());
    for (auto it = b.begin(); it != b.end(); ++it) keys.insert(it.key());
    for (const auto& k : keys)
      differing(a.contains(k) ? a[k] : json(), b.contains(k) ? b[k] : json(), path + "." + k, out);
  } else if (a != b) {
    out->push_back(path);
  }
}

// The most of a worker's message that goes into the job's status and Events.
constexpr size_t kMessageChars = 1024;
// The largest spec a job may have: the job's ConfigMap carries it, and a ConfigMap holds at most 1 MiB.
constexpr size_t kMaxSpecBytes = size_t{512} << 10;
// The problems of an invalid spec named in its status, and the gang restarts kept in restartHistory
// (status.restarts counts them all): the status stays small whatever the spec or the run.
constexpr size_t kMaxProblems = 10;
constexpr size_t kRestartHistory = 20;
// How long a gang restart waits for a pod that is still Running after its peers failed: long enough
// for the node monitor to call a lost node NotReady (40 s by default). The virtual nodes of `tessera
// run` are never lost that way: there the wait is the moment a killed rank's report takes.
constexpr std::chrono::seconds kLostNodeWait{60};
constexpr std::chrono::seconds kKilledRankWait{3};

// The last n characters of s (its end says why), marked when cut; never splits a UTF-8 character.
std::string last_chars(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  size_t from = s.size() - n;
  while (from < s.size() && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) ++from;
  return "..." + s.substr(from);
}
// What the rendezvous needs of the spec's exchange, as the workers parse it (api/): a hybrid job's
// switch epoch; for auto, the latest epoch a sparse phase may reach, the epochs and the density.
void exchange_policy(const api::TrainingJobSpec& s, RendezvousTarget& t) {
  t.epochs = s.training.epochs;
  if (s.communication.strategy == "hybrid") t.switch_at_epoch = s.communication.switch_at_epoch;
  if (s.communication.strategy == "auto") {
    t.auto_exchange = true;
    t.switch_at_epoch = s.communication.switch_at_epoch;
    t.density = s.communication.density;
  }
}

// The gang to serve: none when the job has ended, is suspended, or its plan is not the current attempt's.
std::optional<RendezvousTarget> target_of(
    const std::string& token, const json& status, const api::TrainingJobSpec* spec,
    const std::optional<std::pair<int, std::vector<placement::RankAssignment>>>& plan) {
  const std::string phase = status.is_object() ? status.value("phase", "") : "";
  if (token.empty() || phase == "Succeeded" || phase == "Failed" || phase == "Suspended") return std::nullopt;
  if (!plan || plan->first != attempt_of(status)) return std::nullopt;
  RendezvousTarget t;
  t.token = token;
  t.attempt = plan->first;
  t.plan = plan->second;
  if (spec) exchange_policy(*spec, t);
  t.switch_step = status.value("switchStep", int64_t{-1});
  t.round = status.value("restartsInPlace", int64_t{0});
  return t;
}

}  // namespace

const char* plural(Resource r) {
  switch (r) {
    case Resource::kSecret: return "secrets";
    case Resource::kService: return "services";
    case Resource::kConfigMap: return "configmaps";
    case Resource::kPod: return "pods";
  }
  return "";
}

const char* name(Reason r) {
  switch (r) {
    case Reason::kPlaced: return "Placed";
    case Reason::kUnschedulable: return "Unschedulable";
    case Reason::kAdmissionRejected: return "AdmissionRejected";
    case Reason::kGangRestart: return "GangRestart";
    case Reason::kCompleted: return "Completed";
    case Reason::kPhaseSwitch: return "PhaseSwitch";
    case Reason::kExchangeChosen: return "ExchangeChosen";
    case Reason::kStraggler: return "Straggler";
    case Reason::kStragglerGone: return "StragglerGone";
    case Reason::kSuspended: return "Suspended";
    case Reason::kResumed: return "Resumed";
    case Reason::kSpecChangeRejected: return "SpecChangeRejected";
    case Reason::kSpecWarning: return "SpecWarning";
    case Reason::kTTLExpired: return "TTLExpired";
    case Reason::kFailedCreate: return "FailedCreate";
    case Reason::kPodNotStarting: return "PodNotStarting";
    case Reason::kPreempted: return "Preempted";
    case Reason::kScaledDown: return "ScaledDown";
    case Reason::kScaledUp: return "ScaledUp";
    case Reason::kStartFailed: return "StartFailed";
    case Reason::kInvalidSpec: return "InvalidSpec";
    case Reason::kInvalidConfiguration: return "InvalidConfiguration";
    case Reason::kTrainingDiverged: return "TrainingDiverged";
    case Reason::kBackoffLimitExceeded: return "BackoffLimitExceeded";
    case Reason::kDeadlineExceeded: return "DeadlineExceeded";
  }
  return "";
}

std::string Action::describe() const {
  std::string singular = plural(resource);
  singular.pop_back();
  switch (kind) {
    case Kind::kCreate:
      if (resource == Resource::kPod)
        return detail::concat("create pod ", name, " on ", object["spec"].value("nodeName", ""));
      return detail::concat("create ", singular, " ", name);
    case Kind::kUpdate: return detail::concat("update ", singular, " ", name);
    case Kind::kDelete:
      return detail::concat("delete ", singular, " ", name,
                            object.is_object() && object.value("gracePeriodSeconds", -1) == 0 ? " now" : "");
    case Kind::kPatchStatus: {
      std::string s = "status";
      for (const char* k : {"phase", "reason", "restarts"})
        if (object.contains(k) && !object[k].is_null())
          s += detail::concat(" ", k, "=", object[k].is_string() ? object[k].get<std::string>() : object[k].dump());
      return s;
    }
    case Kind::kEvent:
      return detail::concat("event ", warning ? "Warning " : "Normal ", tessera::reconcile::name(reason));
    case Kind::kDeleteJob: return "delete job";
    case Kind::kServeRendezvous:
      return detail::concat("serve rendezvous attempt ", rendezvous.attempt,
                            rendezvous.round ? detail::concat(" round ", rendezvous.round) : "");
    case Kind::kStopRendezvous: return "stop rendezvous";
  }
  return "";
}

bool needs_all_nodes(const json& job) {
  // Read before the spec is validated: a field of the wrong type means "no" (validation reports it).
  auto integer = [](const json& o, const char* key, int64_t otherwise) {
    const auto it = o.is_object() ? o.find(key) : o.end();
    return it != o.end() && it->is_number_integer() ? it->get<int64_t>() : otherwise;
  };
  auto text = [](const json& o, const char* key) {
    const auto it = o.is_object() ? o.find(key) : o.end();
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const json none;
  const json& spec = job.is_object() && job.contains("spec") ? job["spec"] : none;
  const json& status = job.is_object() && job.contains("status") ? job["status"] : none;
  const json& elastic = spec.is_object() && spec.contains("elastic") ? spec["elastic"] : none;
  const std::string phase = text(status, "phase");
  const int64_t replicas = integer(status, "replicas", 0);
  return integer(elastic, "minReplicas", 0) > 0 && phase != "Succeeded" && phase != "Failed" && replicas > 0 &&
         replicas < integer(spec, "replicas", 1);
}

std::vector<std::string> plan_nodes(const json& config_map) {
  std::set<std::string> nodes;
  if (const auto plan = read_plan(config_map))
    for (const auto& a : plan->second) nodes.insert(a.node);
  return {nodes.begin(), nodes.end()};
}

int attempt_of(const json& status) {
  if (!status.is_object()) return 0;
  if (status.contains("attempt")) return status.value("attempt", 0);
  return status.value("restarts", 0) - status.value("restartsInPlace", 0) + status.value("preemptions", 0);
}

std::string pod_name(const std::string& job, int attempt, int replica) {
  return detail::concat(job, "-", attempt, "-", replica);
}
std::string token_secret_name(const std::string& job) { return job + "-token"; }

json apply_status_patch(json status, const json& patch) {
  if (!status.is_object()) status = json::object();
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    if (it.value().is_null()) status.erase(it.key());
    else status[it.key()] = it.value();
  }
  return status;
}

std::string format_time(Time t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm;
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::optional<Time> parse_time(const std::string& s) {
  std::tm tm{};
  if (!strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return std::nullopt;
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

std::optional<RendezvousTarget> rendezvous_target(const Observed& o) {
  if (!o.has_secret) return std::nullopt;
  const std::optional<json> frozen = frozen_spec(o.config_map);
  std::optional<api::TrainingJobSpec> spec;
  if (frozen) {
    const json doc = {
        {"apiVersion", api::kApiVersion}, {"kind", api::kKind}, {"metadata", {{"name", "job"}}}, {"spec", *frozen}};
    spec = parse_job(doc).job.spec;
  }
  return target_of(o.token, o.job.contains("status") ? o.job["status"] : json::object(), spec ? &*spec : nullptr,
                   read_plan(o.config_map));
}

namespace {

// One reconcile of one job: the phases in the order they are decided, each adding actions and
// changing the working status; a phase that returns true has completed the decision.
class Reconciler {
 public:
  Reconciler(const Observed& obs, const ReconcileOptions& options) : o(obs), opt(options) {
    const json& m = o.job.at("metadata");
    name = m.value("name", "");
    ns = m.value("namespace", "default");
    uid = m.value("uid", "");
    original_status = o.job.contains("status") && o.job["status"].is_object() ? o.job["status"] : json::object();
    status.s = original_status;
    status.generation = m.value("generation", int64_t{1});
    status.now = o.now;
  }

  Decision run() {
    observe();
    const bool decided = finish() || validate() || (create_base_children(), suspend()) || enforce_deadline() ||
                         clear_old_gang() || evacuate() || restart() || complete() || place();
    if (!decided && !starting()) {
      create_pods();
      progress();
    }
    return decision();
  }

 private:
  // ---- observe: the spec to run, and what it says ----
  // The spec the job started with (its ConfigMap's), with the current runPolicy: the only part that
  // may change once it has started. A change elsewhere is rejected with a condition and an Event.
  void observe() {
    frozen = frozen_spec(o.config_map);
    spec = with_defaults(o.job.contains("spec") ? o.job["spec"] : json::object(), opt.spec_defaults);
    if (frozen) {
      std::vector<std::string> changed;
      differing(without_run_policy(*frozen), without_run_policy(spec), "spec", &changed);
      const json* c = status.find("SpecChangeRejected");
      if (!changed.empty()) {
        std::string fields;
        for (const auto& f : changed) fields += (fields.empty() ? "" : ", ") + f;
        const std::string message = detail::concat(fields,
                                                   " changed after the job started; only spec.runPolicy can change "
                                                   "(suspend included): the change is not applied");
        if (!c || c->value("observedGeneration", int64_t{0}) != status.generation || c->value("status", "") != "True")
          event(true, Reason::kSpecChangeRejected, message);
        status.condition("SpecChangeRejected", true, "ImmutableField", message);
      } else if (c && c->value("status", "") == "True") {
        status.condition("SpecChangeRejected", false, "SpecMatches", "");
      }
      json run_policy = spec.contains("runPolicy") ? spec["runPolicy"] : json();
      spec = *frozen;
      if (run_policy.is_null()) spec.erase("runPolicy");
      else spec["runPolicy"] = run_policy;
    }
    const json doc = {{"apiVersion", o.job.value("apiVersion", api::kApiVersion)},
                      {"kind", o.job.value("kind", api::kKind)},
                      {"metadata", {{"name", name}, {"namespace", ns}}},
                      {"spec", spec}};
    parsed = parse_job(doc);
    plan = read_plan(o.config_map);
    attempt = attempt_of(status.s);
    restarts = status.s.value("restarts", 0);
    for (const auto& p : o.pods) (p.attempt == attempt ? current : old_pods).push_back(&p);
  }
  const api::TrainingJobSpec& s() const { return parsed.job.spec; }

  // ---- finish: an ended job runs nothing; its TTL deletes it ----
  bool finish() {
    const std::string phase = original_status.value("phase", "");
    if (phase != "Succeeded" && phase != "Failed") return false;
    delete_pods(live_pods());
    const int64_t ttl = s().run_policy.ttl_seconds_after_finished;
    const auto done = parse_time(status.s.value("completionTime", ""));
    if (ttl >= 0 && done) {
      const auto expiry = *done + seconds(ttl);
      if (o.now >= expiry) {
        event(false, Reason::kTTLExpired, detail::concat("deleting the job ", ttl, " s after it finished"));
        Action a;
        a.kind = Action::Kind::kDeleteJob;
        d.actions.push_back(a);
      } else {
        requeue(duration_cast<milliseconds>(expiry - o.now) + milliseconds(100));
      }
    }
    return true;
  }

  // ---- validate: an invalid spec fails the job once, naming the fields; it is not retried ----
  bool validate() {
    std::vector<FieldProblem> problems = parsed.problems;
    if (const size_t bytes = spec.dump().size(); bytes > kMaxSpecBytes)
      problems.insert(problems.begin(),
                      {"spec", detail::concat(bytes, " bytes of JSON, above the limit of ", kMaxSpecBytes,
                                              " (the job's ConfigMap carries the spec)")});
    if (parsed.ok() && opt.cluster) {
      // What a cluster needs beyond the API's rules: volumes every pod mounts.
      if (!s().checkpoint.path.empty() && !s().checkpoint.volume.given())
        problems.push_back({"spec.checkpoint.volume",
                            "required on a cluster: the volume every node mounts at spec.checkpoint.path "
                            "(persistentVolumeClaim, nfs, or hostPath of a shared mount)"});
      if (s().dataset.format != "synthetic" && !s().dataset.volume.given() && s().cache.nfs_server.empty())
        problems.push_back({"spec.dataset.volume",
                            "required on a cluster for an hdf5 dataset (or spec.cache.remote.nfs): "
                            "the volume mounted at spec.dataset.path"});
    }
    if (problems.empty()) {
      warn_ineffective_fields();
      return false;
    }
    std::string message;
    for (size_t i = 0; i < std::min(problems.size(), kMaxProblems); ++i)
      message += (i ? "; " : "") + problems[i].field + ": " + last_chars(problems[i].reason, kMessageChars);
    if (problems.size() > kMaxProblems)
      message +=
          detail::concat("; and ", detail::count(static_cast<int64_t>(problems.size() - kMaxProblems), "more problem"),
                         " (tessera validate lists them all)");
    fail(Reason::kInvalidSpec, message);
    return true;
  }

  // Fields that have no effect where they stand: one Warning Event per job (the first reconcile).
  void warn_ineffective_fields() {
    if (parsed.warnings.empty() || original_status.contains("observedGeneration")) return;
    std::string message;
    for (const auto& w : parsed.warnings) message += (message.empty() ? "" : "; ") + w.field + ": " + w.reason;
    event(true, Reason::kSpecWarning, last_chars(message, kMessageChars));
  }

  // ---- the children every job has: the rendezvous token and the headless Service of its pods ----
  void create_base_children() {
    if (!status.s.contains("restarts")) status.set("restarts", 0);
    if (!status.s.contains("attempt")) status.set("attempt", attempt);
    if (!o.has_secret) {
      TESSERA_CHECK(!o.token.empty(), "the backend gave job ", name, " no token");
      create(Resource::kSecret, token_secret_name(name), token_secret(job_ref(), o.token));
    }
    if (!o.has_service) create(Resource::kService, name, headless_service(job_ref()));
  }

  // ---- suspend: no pod runs, the checkpoints stay; resuming starts the deadline's clock again ----
  bool suspend() {
    const std::string phase = original_status.value("phase", "");
    if (s().run_policy.suspend) {
      delete_pods(live_pods());
      if (phase != "Suspended") {
        status.set("phase", "Suspended");
        status.condition("Suspended", true, "Suspended",
                         "spec.runPolicy.suspend is true: the pods are deleted, the checkpoints kept");
        if (status.find("Running")) status.condition("Running", false, "Suspended", "");
        event(false, Reason::kSuspended, "the job is suspended: its pods are deleted, its checkpoints kept");
      }
      return true;
    }
    if (phase == "Suspended") {
      status.condition("Suspended", false, "Resumed", "");
      status.set("startTime", format_time(o.now));
      status.set("phase", "Pending");
      event(false, Reason::kResumed, "the job is resumed: its gang starts again from the newest checkpoint");
    }
    return false;
  }

  // ---- the deadline, counted from the start (or the last resume) ----
  bool enforce_deadline() {
    const int64_t deadline = s().run_policy.active_deadline_seconds;
    if (deadline <= 0) return false;
    const auto start = parse_time(status.s.value("startTime", ""));
    if (!start) return false;
    const auto end = *start + seconds(deadline);
    if (o.now >= end) {
      fail(Reason::kDeadlineExceeded,
           detail::concat("the job ran longer than spec.runPolicy.activeDeadlineSeconds (", deadline, " s)"));
      return true;
    }
    requeue(duration_cast<milliseconds>(end - o.now) + milliseconds(100));
    return false;
  }

  // ---- pods of earlier attempts go first; the new gang starts when they have ended ----
  bool clear_old_gang() {
    if (old_pods.empty()) return false;
    // A pod on a lost node never ends on its own (no kubelet is left to confirm): deleted at once.
    for (const PodInfo* p : old_pods)
      if (!lost_node_reason(p->node).empty()) delete_pods({p}, true);
    delete_pods(old_pods);
    // Once every old pod has ended (its processes have exited, so the checkpoints are final, and it
    // holds no resources), the new gang does not wait for the kubelets to remove them: kubelet 1.20
    // sometimes leaves that to its container garbage collection, once a minute.
    if (std::all_of(old_pods.begin(), old_pods.end(),
                    [](const PodInfo* p) { return p->phase == "Succeeded" || p->phase == "Failed"; }))
      return false;
    requeue(milliseconds(1000));
    return true;
  }

  // ---- restart: a failed pod restarts the gang from its checkpoints, or fails the job ----
  bool restart() {
    const PodInfo* failed = nullptr;
    const PodInfo* stopped = nullptr;  // a pod whose ranks stopped on SIGTERM, after their checkpoint
    bool rejected = false;
    for (const PodInfo* p : current) {
      if (p->phase != "Failed") continue;
      if (admission_rejected(*p)) {
        rejected = true;
        continue;
      }
      if (p->exit_code == kExitStopped) {
        if (!stopped) stopped = p;
        continue;
      }
      // The cause of a gang failure: a worker killed by a signal rather than its peers, which fail
      // when it disappears.
      if (!failed || (p->exit_code > 128 && failed->exit_code <= 128)) failed = p;
    }
    // A rank failed while every pod goes on: its supervisor reported it (the others' follow, their
    // peers gone).
    if (!failed && !stopped && !rejected && o.progress && !o.progress->exits.empty()) return restart_reported_exit();
    // Stopped on SIGTERM (someone deleted or evicted a pod): the gang checkpointed and stops as one.
    // A real failure among its pods outranks it.
    if (stopped && !failed) {
      preempt(stopped->name, stopped->node, "PodStopped",
              detail::concat("pod ", stopped->name, " on ", stopped->node, " was stopped (SIGTERM)"));
      return true;
    }
    // A peer that failed because one worker was killed often ends first: wait for the killed one to
    // be reported, so that the restart names the cause. Its kubelet reports it within moments; a pod
    // that stays Running may be on a node that is lost, which the node's status says within the node
    // monitor's grace period (40 s by default): then the gang moves as a preemption (evacuate).
    if (failed && failed->exit_code <= 128 && failed->finished && o.now - *failed->finished < lost_node_wait()) {
      bool peers_running = false;
      for (const PodInfo* p : current) peers_running = peers_running || p->phase == "Running";
      if (peers_running) {
        requeue(milliseconds(500));
        return true;
      }
    }
    if (failed) {
      restart_gang(*failed);
      return true;
    }
    if (!rejected) return false;
    replace_rejected();
    return true;
  }

  // A rank that its pod's supervisor reported: the gang restarts (in place where the job allows).
  // The cause is a rank killed by a signal rather than its peers, which is waited for a moment.
  bool restart_reported_exit() {
    const RankExit* cause = &o.progress->exits.front();
    auto first = cause->time;
    std::set<int> reported;  // pods
    for (const auto& e : o.progress->exits) {
      if (e.exit_code > 128 && cause->exit_code <= 128) cause = &e;
      first = std::min(first, e.time);
      reported.insert(e.replica);
    }
    // Only peers reported (their rank lost a peer): the killed rank's pod reports within moments;
    // a pod that stays silent may be on a lost node, which its status says within the node
    // monitor's grace period (then the gang moves as a preemption, evacuate).
    const bool silent_pod = reported.size() < current.size();
    if (cause->exit_code <= 128 &&
        (o.now - first < kKilledRankWait || (silent_pod && o.now - first < lost_node_wait()))) {
      requeue(milliseconds(500));
      return true;
    }
    PodInfo p;
    p.replica = cause->replica;
    p.name = pod_name(name, attempt, cause->replica);
    for (const PodInfo* q : current)
      if (q->replica == cause->replica) p.node = q->node;
    p.exit_code = cause->exit_code;
    p.message = detail::concat("slot ", cause->slot, ": ", cause->message);
    restart_gang(p, s().run_policy.restart_in_place);
    return true;
  }

  // Pods a node refused (admission): the gang is placed again, not restarted.
  void replace_rejected() {
    std::string why;
    for (const PodInfo* p : current)
      if (admission_rejected(*p))
        why = detail::concat("node ", p->node, " refused pod ", p->name, " (", p->reason,
                             p->message.empty() ? "" : ": " + p->message, ")");
    status.condition("Placed", false, "AdmissionRejected", why + "; placing the gang again");
    event(true, Reason::kAdmissionRejected, why + "; placing the gang again (not a restart)");
    // The plan of this attempt is void: the next gang is placed afresh once these pods are gone.
    delete_pods(current);
    if (o.config_map && plan) {
      json cm = *o.config_map;
      cm["data"].erase(kPlanFile);
      update(Resource::kConfigMap, config_map_name(name), cm);
      plan.reset();
    }
    requeue(milliseconds(500));
  }

  // A failure: the gang starts again from its newest checkpoint, in its pods (a new rendezvous round)
  // or in new pods (a new attempt).
  void restart_gang(const PodInfo& failed, bool in_place = false) {
    const auto& rp = s().run_policy;
    std::string why = detail::concat("pod ", failed.name, " on ", failed.node, " failed");
    if (failed.exit_code >= 0) why += detail::concat(" with exit code ", failed.exit_code);
    if (!failed.reason.empty()) why += " (" + failed.reason + ")";
    // A pod's message is its termination log (up to 4 KiB, or its last log lines): the status keeps its end.
    if (!failed.message.empty()) why += ": " + last_chars(failed.message, kMessageChars);
    if (failed.exit_code == kExitConfigError)
      return fail(Reason::kInvalidConfiguration, why + "; a configuration error is not retried");
    // The runtime could not start the container at all (a command missing from the image, say):
    // every new gang would meet the same, so the restarts are not spent on it.
    if (failed.reason == "StartError" || failed.reason == "ContainerCannotRun")
      return fail(Reason::kStartFailed,
                  why + "; a container that cannot start is not retried (spec.image: " + s().image + ")");
    if (failed.exit_code == kExitDiverged) {
      const std::string hint = "lower spec.training.optimizer.learningRate or set spec.training.gradClip";
      return fail(Reason::kTrainingDiverged, why + "; a diverged run would diverge again, so it is not retried" +
                                                 (why.find(hint) == std::string::npos ? " (" + hint + ")" : ""));
    }
    if (restarts >= rp.backoff_limit)
      return fail(Reason::kBackoffLimitExceeded,
                  detail::concat(why, "; the gang was restarted ", restarts, " times (spec.runPolicy.backoffLimit ",
                                 rp.backoff_limit, ")"));
    const int64_t at = record_restart(failed.name, failed.node, failed.exit_code, why, false);
    status.set("restarts", restarts + 1);
    if (in_place) {
      json history = status.s["restartHistory"];
      history.back()["inPlace"] = true;
      status.set("restartHistory", history);
      status.set("restartsInPlace", status.s.value("restartsInPlace", 0) + 1);
      status.condition("Restarting", true, "RankFailed", why);
      event(true, Reason::kGangRestart,
            detail::concat(why, " at step ", at,
                           "; restarting the gang in place from its last checkpoint: its pods stay and start "
                           "their processes again (restart ",
                           restarts + 1, " of at most ", rp.backoff_limit, ")"));
      return;
    }
    status.set("attempt", attempt + 1);
    status.condition("Restarting", true, "PodFailed", why);
    event(true, Reason::kGangRestart,
          detail::concat(why, " at step ", at, "; restarting the gang from its last checkpoint (restart ", restarts + 1,
                         " of at most ", rp.backoff_limit, ")"));
    delete_pods(current);
  }

  // The restart's entry in restartHistory, the phase and the Running condition; the step it failed at.
  int64_t record_restart(const std::string& pod, const std::string& node, int exit_code, const std::string& why,
                         bool preempted) {
    const int64_t at = o.progress ? o.progress->step : status.s.value("step", int64_t{-1});
    json history = status.s.value("restartHistory", json::array());
    json entry = {{"reason", why},      {"pod", pod},         {"node", node}, {"time", format_time(o.now)},
                  {"failedAtStep", at}, {"resumedAtStep", -1}};
    if (exit_code >= 0) entry["exitCode"] = exit_code;
    if (preempted) entry["preempted"] = true;
    history.push_back(entry);
    if (history.size() > kRestartHistory) history.erase(history.begin(), history.end() - kRestartHistory);
    status.set("restartHistory", history);
    status.set("phase", "Restarting");
    status.condition("Running", false, "Restarting", "");
    return at;
  }

  // ---- evacuate: a gang with a node that is leaving (cordoned: a drain; tainted NoExecute) or lost
  // (not ready, deleted) moves. Its pods there are stopped: their ranks tell the gang, which agrees on
  // a step, checkpoints it and stops (exit status 4). Pods on a lost node are deleted at once (no
  // kubelet is left to confirm), and the gang, whose ranks lost peers, restarts from its newest
  // checkpoint. Either way a preemption, placed again away from the node. ----
  bool evacuate() {
    if (!plan || plan->first != attempt || o.nodes.empty()) return false;
    std::map<std::string, const placement::NodeInfo*> by_name;
    for (const auto& n : o.nodes) by_name[n.name] = &n;
    std::string lost, lost_why, leaving, leaving_why;
    std::set<std::string> planned;
    for (const auto& a : plan->second) planned.insert(a.node);
    for (const auto& node : planned) {
      auto it = by_name.find(node);
      if (const std::string why = lost_node_reason(node); !why.empty()) {
        if (lost.empty()) lost = node, lost_why = why;
      } else if (leaving.empty()) {
        if (it->second->unschedulable) leaving = node, leaving_why = "was cordoned (a drain)";
        for (const auto& t : it->second->taints)
          if (leaving.empty() && t.effect == "NoExecute" && !placement::tolerates(s().placement.tolerations, t))
            leaving = node,
            leaving_why = detail::concat("is tainted ", t.key, t.value.empty() ? "" : "=" + t.value, ":NoExecute");
      }
    }
    if (lost.empty() && leaving.empty()) return false;
    // The pod of the gang on the node (by the plan: it may be gone already).
    const std::string& node = lost.empty() ? leaving : lost;
    std::string pod;
    for (const auto& a : plan->second)
      if (a.node == node && pod.empty()) pod = pod_name(name, attempt, a.replica);
    if (!lost.empty()) {
      // The lost node's ranks are gone, so the others cannot agree on a step to checkpoint (that
      // takes every rank): the whole gang is deleted at once, and the new one starts from the newest
      // checkpoint without waiting out the grace period of pods stuck in a collective.
      preempt(pod, lost, "NodeLost", detail::concat("node ", lost, " ", lost_why));
      return true;
    }
    // Leaving: its pods are stopped (SIGTERM), and the gang moves once they have ended.
    bool live = false, running = false;
    for (const PodInfo* p : current) {
      if (p->phase == "Succeeded" || p->phase == "Failed") continue;
      running = true;
      if (p->node == leaving) {
        live = true;
        if (!p->terminating) child(Action::Kind::kDelete, Resource::kPod, p->name);
      }
    }
    if (!status.is("Preempted") || status.find("Preempted")->value("message", "").find(leaving) == std::string::npos)
      status.condition("Preempted", true, "NodeLeaving",
                       detail::concat("node ", leaving, " ", leaving_why, ": the gang checkpoints and moves"));
    // Once the pods there have ended their account of the stop may be gone with them (a deleted pod
    // leaves the API as its container ends); the gang's other ranks stop at the same step with the
    // same account, so they are waited for too, up to the grace period from when the node was seen
    // leaving (the condition's transition) and a moment more.
    bool waiting = live;
    if (!waiting && running && !stopped_account()) {
      const auto since = parse_time(status.find("Preempted")->value("lastTransitionTime", ""));
      waiting = since && o.now < *since + seconds(s().run_policy.termination_grace_period_seconds) + kKilledRankWait;
    }
    if (waiting) {
      requeue(milliseconds(live ? 1000 : 500));
      return true;
    }
    preempt(pod, leaving, "NodeLeaving", detail::concat("node ", leaving, " ", leaving_why));
    return true;
  }

  // A pod whose ranks stopped on SIGTERM with their account (their termination message): the step
  // they agreed on and checkpointed.
  const PodInfo* stopped_account() const {
    for (const PodInfo* p : current)
      if (p->exit_code == kExitStopped && !p->message.empty()) return p;
    return nullptr;
  }

  // A new gang after a preemption (`cause`: PodStopped, NodeLeaving, NodeLost): a restart-history
  // entry, the Preempted condition and an Event that say which node was left and why, and how much of
  // the run the checkpoint kept; not counted against backoffLimit.
  void preempt(const std::string& pod, const std::string& node, const std::string& cause, std::string why) {
    if (const PodInfo* stopped = stopped_account()) {
      why += ": " + last_chars(stopped->message, kMessageChars);
    } else if (cause == "NodeLost") {
      why += ": its ranks could not checkpoint; the gang resumes from its newest checkpoint";
    } else {
      why += detail::concat(
          ": the gang did not checkpoint on SIGTERM within spec.runPolicy.terminationGracePeriodSeconds (",
          s().run_policy.termination_grace_period_seconds, " s); it resumes from its newest periodic checkpoint");
    }
    int exit_code = -1;  // the named pod's, if it has ended and is still there
    for (const PodInfo* p : current)
      if (p->name == pod) exit_code = p->exit_code;
    const int64_t at = record_restart(pod, node, exit_code, why, true);
    const int preemptions = status.s.value("preemptions", 0) + 1;
    status.set("preemptions", preemptions);
    status.set("attempt", attempt + 1);
    status.condition("Preempted", true, cause, why);
    status.condition("Restarting", true, cause, why);
    event(true, Reason::kPreempted,
          detail::concat(why, " (step ", at, "); placing the gang again away from node ", node, " (preemption ",
                         preemptions, ", not counted against backoffLimit)"));
    delete_pods(current, cause == "NodeLost");
  }

  // ---- starting: a pod whose containers the kubelet cannot start (its image cannot be pulled, its
  // container cannot be made) is waited for, up to spec.runPolicy.startTimeoutSeconds from its
  // creation, with a condition and an Event that name it; then the job fails. Never a gang restart:
  // a new gang would meet the same image. ----
  bool starting() {
    const PodInfo* stuck = nullptr;
    for (const PodInfo* p : current)
      if (p->phase == "Pending" && !p->waiting_reason.empty() &&
          (!stuck || (p->created && stuck->created && *p->created < *stuck->created)))
        stuck = p;
    if (!stuck) {
      if (const json* c = status.find("PodsStarted"); c && c->value("status", "") == "False")
        status.condition("PodsStarted", true, "ContainersStarted", "");
      return false;
    }
    const int64_t limit = s().run_policy.start_timeout_seconds;
    std::string why = detail::concat(
        "pod ", stuck->name, " on ", stuck->node, ": the kubelet cannot start image ",
        stuck->waiting_image.empty() ? s().image : stuck->waiting_image, " (", stuck->waiting_reason,
        stuck->waiting_message.empty() ? "" : ": " + last_chars(stuck->waiting_message, kMessageChars), ")");
    const auto waited = stuck->created ? std::chrono::duration_cast<seconds>(o.now - *stuck->created) : seconds(0);
    if (waited.count() >= limit)
      return fail(Reason::kStartFailed,
                  detail::concat(why, " for ", waited.count(), " s (spec.runPolicy.startTimeoutSeconds ", limit, ")")),
             true;
    const json* c = status.find("PodsStarted");
    const bool news = !c || c->value("status", "") != "False" || c->value("reason", "") != stuck->waiting_reason;
    status.condition("PodsStarted", false, stuck->waiting_reason,
                     detail::concat(why, "; waiting up to ", limit, " s for it (spec.runPolicy.startTimeoutSeconds)"));
    if (news)
      event(true, Reason::kPodNotStarting, detail::concat(why, "; waiting up to ", limit, " s (not a restart)"));
    requeue(std::min<milliseconds>(seconds(limit) - waited, seconds(5)));
    return false;  // the other pods of the gang are still made, and its progress kept
  }

  // ---- complete: every pod of the gang succeeded ----
  bool complete() {
    int succeeded = 0;
    for (const PodInfo* p : current) succeeded += p->phase == "Succeeded";
    if (succeeded != gang_size()) return false;
    // Rank 0's summary, from its pod's termination message: the run's steps, its samples/s over the
    // whole run, its validation, and (hybrid) the step it switched at.
    for (const PodInfo* p : current) {
      if (p->message.rfind("{\"type\":\"summary\"", 0) != 0) continue;
      const json summary = json::parse(p->message, nullptr, false);
      if (summary.is_discarded()) continue;
      status.set("step", summary.value("steps", int64_t{0}));
      status.set("samplesPerSecond", summary.value("samples_per_second", 0.0));
      status.set("validation", validation_status(summary));
      if (const int64_t sw = summary.value("switch_step", int64_t{-1}); sw >= 0) status.set("switchStep", sw);
    }
    status.set("phase", "Succeeded");
    status.set("completionTime", format_time(o.now));
    status.set("epoch", s().training.epochs);
    // The training phase the job ended in: its last step's.
    status.set("trainingPhase",
               training_phase(s().communication, INT64_MAX, status.s.value("switchStep", int64_t{-1})));
    status.erase("reason");
    status.erase("message");
    status.condition("Running", false, "Completed", "");
    status.condition("Succeeded", true, "Completed", detail::concat("all ", gang_size(), " pods succeeded"));
    event(false, Reason::kCompleted, detail::concat("the job succeeded after ", attempt, " restart(s)"));
    if (s().run_policy.ttl_seconds_after_finished >= 0)
      requeue(seconds(s().run_policy.ttl_seconds_after_finished) + milliseconds(100));
    return true;
  }

  // ---- place: a new gang, all of it or none, with its ring plan in the ConfigMap ----
  bool place() {
    if (plan && plan->first != attempt) plan.reset();
    if (plan) return false;
    if (!current.empty()) {  // pods of a void plan still terminating
      requeue(milliseconds(500));
      return true;
    }
    std::string full_reason, avoided;
    const placement::PlacementResult placed = fit_gang(full_reason, avoided);
    if (!placed.placed) {
      const json* c = status.find("Placed");
      if (!c || c->value("message", "") != full_reason) event(true, Reason::kUnschedulable, full_reason);
      status.condition("Placed", false, "Unschedulable", full_reason);
      if (status.phase().empty() || status.phase() == "Placing") status.set("phase", "Pending");
      requeue(milliseconds(5000));
      return true;
    }
    const auto ranks =
        placement::plan_ring(placed.nodes, s().ranks_per_replica, o.nodes, gang_request(s().replicas).topology_keys);
    plan = std::make_pair(attempt, ranks);
    json cm = job_config_map(job_ref(), spec, attempt, ranks);
    if (o.config_map) {
      json updated = *o.config_map;
      updated["data"] = cm["data"];
      if (frozen) updated["data"][kConfigFile] = (*o.config_map)["data"][kConfigFile];
      update(Resource::kConfigMap, config_map_name(name), updated);
    } else {
      create(Resource::kConfigMap, config_map_name(name), cm);
    }
    record_placement(placed, ranks, full_reason, avoided);
    return false;
  }

  // The gang's room: the full gang, or an elastic job's largest down to spec.elastic.minReplicas.
  // The nodes of the ranks the last gang found slow are avoided while other room exists (`avoided`
  // names them). full_reason: why the full gang does not fit, if it does not.
  placement::PlacementResult fit_gang(std::string& full_reason, std::string& avoided) const {
    std::set<std::string> slow;
    if (const auto last = read_plan(o.config_map); last && status.s.contains("slowRanks"))
      for (const auto& r : status.s["slowRanks"])
        for (const auto& a : last->second)
          if (r.is_number_integer() && a.rank == r.get<int>()) slow.insert(a.node);
    auto fit = [&](const placement::GangRequest& req) {
      placement::PlacementResult placed;
      avoided.clear();
      if (!slow.empty()) {
        std::vector<placement::NodeInfo> fast = o.nodes;
        for (auto& n : fast)
          if (slow.count(n.name)) n.unschedulable = true;
        placed = placement::GangPlacer().place(req, fast);
        for (const auto& n : slow) avoided += (avoided.empty() ? "" : ", ") + n;
      }
      if (!placed.placed) {
        placed = placement::GangPlacer().place(req, o.nodes);
        avoided.clear();
      }
      return placed;
    };
    placement::PlacementResult placed = fit(gang_request(s().replicas));
    full_reason = placed.reason;
    for (int r = s().replicas - 1; !placed.placed && s().elastic.min_replicas > 0 && r >= s().elastic.min_replicas; --r)
      placed = fit(gang_request(r));
    return placed;
  }

  // The status and Events of a placed gang: where each pod runs, whether an elastic gang scaled down.
  void record_placement(const placement::PlacementResult& placed, const std::vector<placement::RankAssignment>& ranks,
                        const std::string& full_reason, const std::string& avoided) {
    const int replicas = static_cast<int>(placed.nodes.size());
    json placement = json::array();
    std::string where;
    for (int r = 0; r < replicas; ++r) {
      json rank_list = json::array();
      for (const auto& a : ranks)
        if (a.replica == r) rank_list.push_back(a.rank);
      placement.push_back({{"replica", r}, {"node", placed.nodes[r]}, {"ranks", rank_list}});
      where += (where.empty() ? "" : ", ") + placed.nodes[r];
    }
    status.set("placement", placement);
    status.set("replicas", replicas);
    if (replicas < s().replicas) {
      const std::string why =
          detail::concat("room for ", replicas, " of ", s().replicas, " pods (", full_reason, "): training on ",
                         replicas, " from the newest checkpoint, the global batch of ", s().training.batch_size,
                         " kept by accumulating gradients; the gang grows back when room returns");
      status.condition("ScaledDown", true, "NotEnoughRoom", why);
      event(true, Reason::kScaledDown, why);
    } else if (status.is("ScaledDown")) {
      status.condition("ScaledDown", false, "AllReplicas", "");
    }
    const std::string message = detail::concat(replicas, " pods of ", s().ranks_per_replica, " ranks on ", where,
                                               avoided.empty() ? "" : " (avoiding the slow node(s) " + avoided + ")");
    status.condition("Placed", true, "GangFits", message);
    if (status.s.contains("slowRanks")) {  // the new gang measures afresh
      status.erase("slowRanks");
      status.condition("Straggler", false, "GangRestarted", "");
    }
    event(false, Reason::kPlaced, message);
    if (!status.s.contains("startTime")) status.set("startTime", format_time(o.now));
    if (status.phase().empty() || status.phase() == "Pending") status.set("phase", "Placing");
  }

  // ---- create children: the gang's pods that are missing (all of them for a new gang) ----
  void create_pods() {
    std::set<int> have;
    for (const PodInfo* p : current) have.insert(p->replica);
    std::map<int, std::string> node_of;
    for (const auto& a : plan->second) node_of[a.replica] = a.node;
    for (const auto& [r, node] : node_of)
      if (!have.count(r))
        create(Resource::kPod, pod_name(name, attempt, r), worker_pod(job_ref(), s(), opt, attempt, r, node));
  }

  // ---- progress: Running, and the workers' progress, written at most every status interval ----
  // auto: the controller's choice of exchange into the status and an Event, each time a new one is
  // made; whether it was news.
  bool report_exchange(const ExchangeDecision& x) {
    if (x.version <= 0 || x.from_step < 0 ||
        x.version == status.s.value("exchange", json::object()).value("choice", int64_t{0}))
      return false;
    json e = {{"choice", x.version}, {"fromStep", x.from_step}, {"strategy", x.sparse.empty() ? x.dense : x.sparse},
              {"dense", x.dense},    {"reason", x.reason},      {"computeSeconds", x.compute_s}};
    if (!x.sparse.empty()) e["density"] = x.density;
    if (x.inter_bits_per_second > 0) e["interNodeGbps"] = x.inter_bits_per_second / 1e9;
    json predicted = json::array();
    for (const auto& [name, seconds] : x.predicted) predicted.push_back({{"exchange", name}, {"stepSeconds", seconds}});
    e["predicted"] = predicted;
    status.set("exchange", e);
    event(false, Reason::kExchangeChosen,
          detail::concat(
              x.sparse.empty() ? x.dense : detail::concat(x.sparse, " at density ", x.density, ", then ", x.dense),
              " from step ", x.from_step, ": ", x.reason));
    return true;
  }

  void progress() {
    const auto& sp = s();
    int running = 0;
    for (const PodInfo* p : current) running += p->phase == "Running";
    // After a restart in place the pods run throughout: the gang runs again once its ranks report.
    const json restarted = status.s.value("restartHistory", json::array());
    const bool resuming_in_place = !restarted.empty() && restarted.back().value("inPlace", false) &&
                                   restarted.back().value("resumedAtStep", int64_t{-1}) < 0 &&
                                   !(o.progress && o.progress->step >= 0);
    if (running == gang_size() && status.phase() != "Running" && !resuming_in_place) {
      status.set("phase", "Running");
      status.condition("Running", true, "GangRunning", detail::concat("all ", gang_size(), " pods are running"));
      if (status.is("Restarting")) status.condition("Restarting", false, "GangRunning", "");
      if (status.is("Preempted")) status.condition("Preempted", false, "GangRunning", "");
    }
    if (o.progress && o.progress->step >= 0) {
      const Progress& p = *o.progress;
      const auto last = parse_time(status.s.value("lastProgressTime", ""));
      const int64_t known_switch = status.s.value("switchStep", int64_t{-1});
      const bool switch_news = p.switch_step >= 0 && p.switch_step != known_switch;
      const ExchangeDecision& x = p.exchange;
      const bool exchange_news = report_exchange(x);
      if (switch_news) {
        status.set("switchStep", p.switch_step);
        const bool chosen = sp.communication.strategy == "auto";
        event(false, Reason::kPhaseSwitch,
              detail::concat("the gang switches from ", chosen ? x.sparse : sp.communication.sparse, " to ",
                             chosen ? x.dense : sp.communication.dense, " at step ", p.switch_step));
      }
      // Stragglers: news when the ranks that rank 0 reports as slow change; the figures of the same
      // ranks are refreshed with the rest of the progress.
      const json slow = p.slow_ranks;
      const bool straggler_news = slow != status.s.value("slowRanks", json::array());
      if (straggler_news && slow.empty()) {
        status.erase("slowRanks");
        status.condition("Straggler", false, "NoStraggler", "");
        event(false, Reason::kStragglerGone, "no rank holds the gang back any more");
      } else if (straggler_news) {  // the condition is set with the rest of the progress below
        status.set("slowRanks", slow);
        event(true, Reason::kStraggler, p.slow_reason);
      }
      json history = status.s.value("restartHistory", json::array());
      bool resumed = false;
      if (!history.empty() && history.back().value("resumedAtStep", int64_t{-1}) < 0) {
        history.back()["resumedAtStep"] = p.first_step >= 0 ? p.first_step : p.step;
        status.set("restartHistory", history);
        resumed = true;
      }
      if (switch_news || exchange_news || straggler_news || resumed || !last || o.now - *last >= opt.status_interval) {
        if (!slow.empty()) status.condition("Straggler", true, "SlowRank", p.slow_reason);
        status.set("step", p.step);
        status.set("epoch", p.epoch + 1);  // 1-based, as the logs count: the epoch under way
        status.set("loss", p.loss);
        status.set("samplesPerSecond", p.samples_per_second);
        status.set("trainingPhase", training_phase(sp.communication, p.step,
                                                   p.switch_step >= 0 ? p.switch_step : known_switch, &p.exchange));
        status.set("lastProgressTime", format_time(o.now));
      } else {
        requeue(duration_cast<milliseconds>(opt.status_interval - (o.now - *last)) + milliseconds(10));
      }
    }
    if (running == gang_size()) {
      requeue(opt.status_interval);
      grow();
    }
  }

  // ---- grow: an elastic gang on fewer pods than spec.replicas, once all of them fit (its own pods'
  // room counted as free), stops at a checkpoint (SIGTERM: every rank at the same step) and is
  // placed again whole ----
  void grow() {
    if (s().elastic.min_replicas == 0 || gang_size() >= s().replicas || o.nodes.empty()) return;
    std::vector<placement::NodeInfo> freed = o.nodes;
    const placement::GangRequest request = gang_request(s().replicas);
    for (const PodInfo* p : current)
      for (auto& n : freed)
        if (n.name == p->node) {
          n.used.gpu -= request.per_pod.gpu;
          n.used.cpu -= request.per_pod.cpu;
          n.used.memory -= request.per_pod.memory;
        }
    const placement::PlacementResult all = placement::GangPlacer().place(request, freed);
    if (!all.placed) return;
    const std::string why =
        detail::concat("room for all ", s().replicas, " pods again: the gang of ", gang_size(),
                       " stops at a checkpoint, every rank at the same step, and is placed again whole");
    status.set("attempt", attempt + 1);
    status.set("phase", "Restarting");
    status.condition("Restarting", true, "ScalingUp", why);
    status.condition("Running", false, "Restarting", "");
    event(false, Reason::kScaledUp, why);
    delete_pods(current);
  }

  placement::GangRequest gang_request(int replicas) const {
    placement::GangRequest request;
    request.replicas = replicas;
    // A virtual node of `tessera run` has one GPU slot per rank, GPUs or not, and no CPU to account.
    request.per_pod.gpu = opt.cluster ? s().resources.gpu : s().ranks_per_replica;
    request.per_pod.cpu = opt.cluster ? s().resources.cpu : 0;
    request.per_pod.memory = s().resources.memory;
    request.node_selector = s().placement.node_selector;
    request.tolerations = s().placement.tolerations;
    request.topology_keys = s().placement.topology_keys;
    return request;
  }

  // The pods of the current gang: its plan's (an elastic gang may have fewer than spec.replicas).
  int gang_size() const {
    if (!plan) return s().replicas;
    std::set<int> replicas;
    for (const auto& a : plan->second) replicas.insert(a.replica);
    return static_cast<int>(replicas.size());
  }

  // ---- the decision: the status patch first, so that a decision is recorded before it is carried
  // out (a restart counted before the old gang is deleted: a controller that stops in between
  // resumes from it); the rendezvous serves the gang before its first pod is created ----
  Decision decision() {
    status.s["observedGeneration"] = status.generation;
    // the spec as parsed for this reconcile: the frozen one (with the current runPolicy), or the job's
    const std::optional<RendezvousTarget> target = target_of(o.token, status.s, &s(), plan);
    if (target && (o.served_attempt != target->attempt || o.served_round != target->round)) {
      Action a;
      a.kind = Action::Kind::kServeRendezvous;
      a.rendezvous = *target;
      auto first_pod = std::find_if(d.actions.begin(), d.actions.end(), [](const Action& x) {
        return x.kind == Action::Kind::kCreate && x.resource == Resource::kPod;
      });
      d.actions.insert(first_pod, a);
    } else if (!target && o.served_attempt) {
      Action a;
      a.kind = Action::Kind::kStopRendezvous;
      d.actions.push_back(a);
    }
    const json patch = status_patch(original_status, status.s);
    if (!patch.empty()) {
      Action a;
      a.kind = Action::Kind::kPatchStatus;
      a.object = patch;
      d.actions.insert(d.actions.begin(), a);
    }
    return std::move(d);
  }

  // ---- helpers ----
  void event(bool warning, Reason reason, const std::string& message) {
    Action a;
    a.kind = Action::Kind::kEvent;
    a.warning = warning;
    a.reason = reason;
    a.message = message;
    d.actions.push_back(a);
  }
  void child(Action::Kind kind, Resource resource, const std::string& child_name, json object = {}) {
    Action a;
    a.kind = kind;
    a.resource = resource;
    a.name = child_name;
    a.object = std::move(object);
    d.actions.push_back(std::move(a));
  }
  void create(Resource r, const std::string& child_name, json object) {
    child(Action::Kind::kCreate, r, child_name, std::move(object));
  }
  void update(Resource r, const std::string& child_name, json object) {
    child(Action::Kind::kUpdate, r, child_name, std::move(object));
  }
  void requeue(milliseconds after) {
    if (after.count() <= 0) after = milliseconds(1);
    if (d.requeue_after.count() == 0 || after < d.requeue_after) d.requeue_after = after;
  }
  Owner job_ref() const { return {name, ns, uid}; }
  // Deletes the pods, gracefully (their ranks get SIGTERM and the grace period to checkpoint) or,
  // with `now`, at once.
  void delete_pods(const std::vector<const PodInfo*>& pods, bool now = false) {
    for (const PodInfo* p : pods)
      if ((now || !p->terminating) && !deleting(p->name))
        child(Action::Kind::kDelete, Resource::kPod, p->name, now ? json{{"gracePeriodSeconds", 0}} : json());
  }
  std::chrono::seconds lost_node_wait() const { return opt.cluster ? kLostNodeWait : kKilledRankWait; }
  // Why `node` is lost ("was deleted", "is not ready ..."), or "" when it is not (or nodes were not observed).
  std::string lost_node_reason(const std::string& node) const {
    if (o.nodes.empty() || node.empty()) return "";
    for (const auto& n : o.nodes)
      if (n.name == node) return n.ready ? "" : "is not ready (its kubelet stopped reporting)";
    return "was deleted";
  }
  // The decision deletes the pod already.
  bool deleting(const std::string& pod) const {
    return std::any_of(d.actions.begin(), d.actions.end(), [&](const Action& a) {
      return a.kind == Action::Kind::kDelete && a.resource == Resource::kPod && a.name == pod;
    });
  }
  std::vector<const PodInfo*> live_pods() const {
    std::vector<const PodInfo*> out;
    for (const auto& p : o.pods)
      if (p.phase != "Succeeded" && p.phase != "Failed") out.push_back(&p);
    return out;
  }
  // Ends the job: phase, reason, message, the final condition, an Event; the running pods are stopped.
  void fail(Reason reason, const std::string& message) {
    status.set("phase", "Failed");
    status.set("reason", tessera::reconcile::name(reason));
    status.set("message", message);
    status.set("completionTime", format_time(o.now));
    status.condition("Failed", true, tessera::reconcile::name(reason), message);
    status.condition("Running", false, tessera::reconcile::name(reason), "");
    if (status.find("Restarting")) status.condition("Restarting", false, tessera::reconcile::name(reason), "");
    event(true, reason, message);
    delete_pods(live_pods());
  }

  const Observed& o;
  const ReconcileOptions& opt;
  Decision d;
  std::string name, ns, uid;
  Status status;
  json original_status;
  std::optional<json> frozen;  // the spec the job started with
  json spec;                   // the spec to run
  api::ParsedJob parsed;
  std::optional<std::pair<int, std::vector<placement::RankAssignment>>> plan;  // the ring plan, if placed
  int attempt = 0;                                // of the current gang's pods (attempt_of)
  int restarts = 0;                               // gang restarts after failures, counted against backoffLimit
  std::vector<const PodInfo*> current, old_pods;  // pods of this attempt, and of earlier ones
};

}  // namespace

Decision reconcile(const Observed& o, const ReconcileOptions& opt) {
  if (o.job["metadata"].contains("deletionTimestamp")) return {};  // the garbage collector removes the children
  return Reconciler(o, opt).run();
}

json validation_status(const json& summary) {
  if (!summary.value("validated", true))
    return {{"message", "no validation set: give spec.dataset.validationPath or validationSplit"}};
  json v = {{"loss", summary.value("val_loss", 0.0)},
            {"metric", summary.value("val_metric", 0.0)},
            {"baselineLoss", summary.value("baseline_loss", 0.0)},
            {"baselineMetric", summary.value("baseline_metric", 0.0)}};
  if (summary.contains("val_top5")) v["top5"] = summary["val_top5"];
  if (summary.contains("iou")) v["iou"] = summary["iou"];
  return v;
}

json with_defaults(json spec, const json& defaults) {
  if (!spec.is_object() || !defaults.is_object()) return spec;
  for (auto it = defaults.begin(); it != defaults.end(); ++it) {
    if (!spec.contains(it.key())) spec[it.key()] = it.value();
    else if (spec[it.key()].is_object()) spec[it.key()] = with_defaults(spec[it.key()], it.value());
  }
  return spec;
}

}  // namespace tessera::reconcile
