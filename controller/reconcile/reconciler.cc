#include "controller/reconcile/reconciler.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <yaml-cpp/yaml.h>

#include "api/training_job.h"
#include "common/config_node.h"

namespace tessera::reconcile {
namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::seconds;

const char* kConfigFile = "job.yaml";
const char* kPlanFile = "plan.json";
const char* kConfigMount = "/etc/tessera";

std::string config_map_name(const std::string& job) { return job + "-config"; }

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

struct Builder {
  const Observed& o;
  const ReconcileOptions& opt;
  Decision d;
  std::string name, ns, uid;
  Status status;
  json original_status;

  Builder(const Observed& obs, const ReconcileOptions& options) : o(obs), opt(options) {
    const json& m = o.job.at("metadata");
    name = m.value("name", "");
    ns = m.value("namespace", "default");
    uid = m.value("uid", "");
    original_status = o.job.contains("status") && o.job["status"].is_object() ? o.job["status"] : json::object();
    status.s = original_status;
    status.generation = m.value("generation", int64_t{1});
    status.now = o.now;
  }

  void event(const std::string& type, const std::string& reason, const std::string& message) {
    Action a;
    a.kind = Action::Kind::kEvent;
    a.event_type = type;
    a.reason = reason;
    a.message = message;
    d.actions.push_back(a);
  }
  void child(Action::Kind kind, const std::string& resource, const std::string& name, json object = {}) {
    Action a;
    a.kind = kind;
    a.resource = resource;
    a.name = name;
    a.object = std::move(object);
    d.actions.push_back(std::move(a));
  }
  void create(const std::string& resource, const std::string& name, json object) {
    child(Action::Kind::kCreate, resource, name, std::move(object));
  }
  void update(const std::string& resource, const std::string& name, json object) {
    child(Action::Kind::kUpdate, resource, name, std::move(object));
  }
  void remove(const std::string& resource, const std::string& name) { child(Action::Kind::kDelete, resource, name); }
  void requeue(milliseconds after) {
    if (after.count() <= 0) after = milliseconds(1);
    if (d.requeue_after.count() == 0 || after < d.requeue_after) d.requeue_after = after;
  }
  // The status patch goes first, so that a decision is recorded before it is carried out (a restart
  // counted before the old gang is deleted): a controller that stops in between resumes from it.
  Decision finish() {
    status.s["observedGeneration"] = status.generation;
    const json patch = status_patch(original_status, status.s);
    if (!patch.empty()) {
      Action a;
      a.kind = Action::Kind::kPatchStatus;
      a.object = patch;
      d.actions.insert(d.actions.begin(), a);
    }
    return std::move(d);
  }

  json owner() const {
    return json::array({{{"apiVersion", api::kApiVersion},
                         {"kind", api::kKind},
                         {"name", name},
                         {"uid", uid},
                         {"controller", true},
                         {"blockOwnerDeletion", true}}});
  }
  json meta(const std::string& child, json labels = json::object()) const {
    labels[kJobLabel] = name;
    return {{"name", child}, {"namespace", ns}, {"labels", labels}, {"ownerReferences", owner()}};
  }

  void delete_pods(const std::vector<const PodInfo*>& pods) {
    for (const PodInfo* p : pods)
      if (!p->terminating) remove("pods", p->name);
  }
  std::vector<const PodInfo*> live_pods() const {
    std::vector<const PodInfo*> out;
    for (const auto& p : o.pods)
      if (p.phase != "Succeeded" && p.phase != "Failed") out.push_back(&p);
    return out;
  }

  // Ends the job: phase, reason, message, the final condition, an Event; the running pods are stopped.
  Decision fail(const std::string& reason, const std::string& message) {
    status.set("phase", "Failed");
    status.set("reason", reason);
    status.set("message", message);
    status.set("completionTime", format_time(o.now));
    status.condition("Failed", true, reason, message);
    status.condition("Running", false, reason, "");
    if (status.find("Restarting")) status.condition("Restarting", false, reason, "");
    event("Warning", reason, message);
    delete_pods(live_pods());
    return finish();
  }
};

std::string dataset_mount(const api::DatasetSpec& d) {
  namespace fs = std::filesystem;
  if (d.validation_path.empty()) return d.path;
  // The directory holding both the training and the validation data.
  fs::path a = fs::path(d.path).lexically_normal(), b = fs::path(d.validation_path).lexically_normal(), common;
  auto ia = a.begin(), ib = b.begin();
  for (; ia != a.end() && ib != b.end() && *ia == *ib; ++ia, ++ib) common /= *ia;
  std::string c = common.string();
  while (c.size() > 1 && c.back() == '/') c.pop_back();
  return c.empty() ? "/" : c;
}

json volume_source(const api::VolumeSpec& v, bool read_only) {
  if (v.kind == "hostPath") return {{"hostPath", {{"path", v.path}, {"type", read_only ? "Directory" : "DirectoryOrCreate"}}}};
  if (v.kind == "nfs") return {{"nfs", {{"server", v.server}, {"path", v.path}, {"readOnly", read_only}}}};
  return {{"persistentVolumeClaim", {{"claimName", v.claim_name}, {"readOnly", read_only}}}};
}

std::string training_phase(const api::CommunicationSpec& c, int64_t step, int64_t switch_step) {
  if (c.strategy == "hybrid") return switch_step >= 0 && step >= switch_step ? "dense" : "sparse";
  return c.strategy == "topk" || c.strategy == "hitopk" ? "sparse" : "dense";
}

// A pod the node refused before it ran (kubelet admission), or lost with its node: placing the gang
// again is not a restart.
bool admission_rejected(const PodInfo& p) {
  return p.phase == "Failed" && p.exit_code < 0 &&
         (p.reason.rfind("OutOf", 0) == 0 || p.reason == "UnexpectedAdmissionError" || p.reason == "NodeAffinity" ||
          p.reason == "NodeLost" || p.reason == "NodeSelectorMismatching");
}

json plan_json(int attempt, const std::vector<placement::RankAssignment>& plan) {
  json ranks = json::array();
  for (const auto& a : plan)
    ranks.push_back({{"rank", a.rank}, {"replica", a.replica}, {"slot", a.slot}, {"node", a.node}, {"localRank", a.local_rank}});
  return {{"attempt", attempt}, {"ranks", ranks}};
}

std::optional<std::pair<int, std::vector<placement::RankAssignment>>> read_plan(const std::optional<json>& cm) {
  if (!cm || !cm->contains("data") || !(*cm)["data"].contains(kPlanFile)) return std::nullopt;
  const json p = json::parse((*cm)["data"][kPlanFile].get<std::string>(), nullptr, false);
  if (p.is_discarded() || !p.contains("attempt")) return std::nullopt;
  std::vector<placement::RankAssignment> plan;
  for (const auto& r : p["ranks"])
    plan.push_back({r.value("rank", 0), r.value("replica", 0), r.value("slot", 0), r.value("node", ""), r.value("localRank", 0)});
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

}  // namespace

std::string Action::describe() const {
  const char* singular = resource == "pods" ? "pod" : resource == "secrets" ? "secret" : resource == "services" ? "service"
                                                                                      : "configmap";
  switch (kind) {
    case Kind::kCreate:
      if (resource == "pods") return detail::concat("create pod ", name, " on ", object["spec"].value("nodeName", ""));
      return detail::concat("create ", singular, " ", name);
    case Kind::kUpdate: return detail::concat("update ", singular, " ", name);
    case Kind::kDelete: return detail::concat("delete ", singular, " ", name);
    case Kind::kPatchStatus: {
      std::string s = "status";
      for (const char* k : {"phase", "reason", "restarts"})
        if (object.contains(k) && !object[k].is_null()) s += detail::concat(" ", k, "=", object[k].is_string() ? object[k].get<std::string>() : object[k].dump());
      return s;
    }
    case Kind::kEvent: return detail::concat("event ", event_type, " ", reason);
    case Kind::kDeleteJob: return "delete job";
  }
  return "";
}

std::string pod_name(const std::string& job, int attempt, int replica) { return detail::concat(job, "-", attempt, "-", replica); }
std::string token_secret_name(const std::string& job) { return job + "-token"; }

namespace {
// The most of a worker's message that goes into the job's status and Events.
constexpr size_t kMessageChars = 1024;
// The largest spec a job may have: the job's ConfigMap carries it, and a ConfigMap holds at most 1 MiB.
constexpr size_t kMaxSpecBytes = size_t{512} << 10;
// The problems of an invalid spec named in its status, and the gang restarts kept in restartHistory
// (status.restarts counts them all): the status stays small whatever the spec or the run.
constexpr size_t kMaxProblems = 10;
constexpr size_t kRestartHistory = 20;

// The last n characters of s (its end says why), marked when cut; never splits a UTF-8 character.
std::string last_chars(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  size_t from = s.size() - n;
  while (from < s.size() && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) ++from;
  return "..." + s.substr(from);
}
}  // namespace
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
  const json status = o.job.contains("status") ? o.job["status"] : json::object();
  const std::string phase = status.is_object() ? status.value("phase", "") : "";
  if (!o.has_secret || o.token.empty() || phase == "Succeeded" || phase == "Failed" || phase == "Suspended") return std::nullopt;
  const auto plan = read_plan(o.config_map);
  if (!plan || plan->first != status.value("restarts", 0)) return std::nullopt;
  RendezvousTarget t;
  t.token = o.token;
  t.attempt = plan->first;
  t.plan = plan->second;
  const auto spec = frozen_spec(o.config_map);
  if (spec && spec->contains("communication") && (*spec)["communication"].value("strategy", "") == "hybrid")
    t.switch_at_epoch = (*spec)["communication"].value("switchAtEpoch", 1);
  t.switch_step = status.value("switchStep", int64_t{-1});
  return t;
}

Decision reconcile(const Observed& o, const ReconcileOptions& opt) {
  Builder b(o, opt);
  const json& job = o.job;
  if (job["metadata"].contains("deletionTimestamp")) return {};  // the garbage collector removes the children
  const std::string phase = b.status.phase();

  // The spec to run: the one the job started with, with the current runPolicy (the only part that
  // may change once it has started).
  const std::optional<json> frozen = frozen_spec(o.config_map);
  json spec = with_defaults(job.contains("spec") ? job["spec"] : json::object(), opt.spec_defaults);
  if (frozen) {
    std::vector<std::string> changed;
    differing(without_run_policy(*frozen), without_run_policy(spec), "spec", &changed);
    const json* c = b.status.find("SpecChangeRejected");
    if (!changed.empty()) {
      std::string fields;
      for (const auto& f : changed) fields += (fields.empty() ? "" : ", ") + f;
      const std::string message = detail::concat(fields, " changed after the job started; only spec.runPolicy can change "
                                                 "(suspend included): the change is not applied");
      if (!c || c->value("observedGeneration", int64_t{0}) != b.status.generation || c->value("status", "") != "True")
        b.event("Warning", "SpecChangeRejected", message);
      b.status.condition("SpecChangeRejected", true, "ImmutableField", message);
    } else if (c && c->value("status", "") == "True") {
      b.status.condition("SpecChangeRejected", false, "SpecMatches", "");
    }
    json run_policy = spec.contains("runPolicy") ? spec["runPolicy"] : json();
    spec = *frozen;
    if (run_policy.is_null()) spec.erase("runPolicy");
    else spec["runPolicy"] = run_policy;
  }

  json doc = {{"apiVersion", job.value("apiVersion", api::kApiVersion)},
              {"kind", job.value("kind", api::kKind)},
              {"metadata", {{"name", b.name}, {"namespace", b.ns}}},
              {"spec", spec}};
  const api::ParsedJob parsed = api::parse_training_job(ConfigNode::load_string(doc.dump(), "job"));
  const api::TrainingJobSpec& s = parsed.job.spec;
  const auto& rp = s.run_policy;

  // Finished jobs: nothing runs; the TTL deletes them.
  if (phase == "Succeeded" || phase == "Failed") {
    b.delete_pods(b.live_pods());
    const int64_t ttl = rp.ttl_seconds_after_finished;
    const auto done = parse_time(b.status.s.value("completionTime", ""));
    if (ttl >= 0 && done) {
      const auto expiry = *done + seconds(ttl);
      if (o.now >= expiry) {
        b.event("Normal", "TTLExpired", detail::concat("deleting the job ", ttl, " s after it finished"));
        Action a;
        a.kind = Action::Kind::kDeleteJob;
        b.d.actions.push_back(a);
      } else {
        b.requeue(duration_cast<milliseconds>(expiry - o.now) + milliseconds(100));
      }
    }
    return b.finish();
  }

  // An invalid spec fails the job once, naming the fields; it is not retried.
  std::vector<FieldProblem> problems = parsed.problems;
  if (const size_t bytes = spec.dump().size(); bytes > kMaxSpecBytes)
    problems.insert(problems.begin(), {"spec", detail::concat(bytes, " bytes of JSON, above the limit of ", kMaxSpecBytes,
                                                              " (the job's ConfigMap carries the spec)")});
  if (parsed.ok() && opt.cluster) {
    // What a cluster needs beyond the API's rules: volumes every pod mounts.
    if (!s.checkpoint.path.empty() && !s.checkpoint.volume.given())
      problems.push_back({"spec.checkpoint.volume", "required on a cluster: the volume every node mounts at spec.checkpoint.path "
                                                    "(persistentVolumeClaim, nfs, or hostPath of a shared mount)"});
    if (s.dataset.format != "synthetic" && !s.dataset.volume.given() && s.cache.nfs_server.empty())
      problems.push_back({"spec.dataset.volume", "required on a cluster for an hdf5 dataset (or spec.cache.remote.nfs): "
                                                 "the volume mounted at spec.dataset.path"});
  }
  if (!problems.empty()) {
    std::string message;
    for (size_t i = 0; i < std::min(problems.size(), kMaxProblems); ++i)
      message += (i ? "; " : "") + problems[i].field + ": " + last_chars(problems[i].reason, kMessageChars);
    if (problems.size() > kMaxProblems)
      message += detail::concat("; and ", detail::count(static_cast<int64_t>(problems.size() - kMaxProblems), "more problem"),
                                " (tessera validate lists them all)");
    return b.fail("InvalidSpec", message);
  }

  // Children every job has: the rendezvous token and the headless Service of its pods.
  if (!o.has_secret) {
    TESSERA_CHECK(!o.token.empty(), "the backend gave job ", b.name, " no token");
    b.create("secrets", token_secret_name(b.name),
             {{"apiVersion", "v1"},
              {"kind", "Secret"},
              {"metadata", b.meta(token_secret_name(b.name))},
              {"type", "Opaque"},
              {"stringData", {{"token", o.token}}}});
  }
  if (!o.has_service) {
    b.create("services", b.name,
             {{"apiVersion", "v1"},
              {"kind", "Service"},
              {"metadata", b.meta(b.name)},
              {"spec", {{"clusterIP", "None"}, {"selector", {{kJobLabel, b.name}}}, {"publishNotReadyAddresses", true}}}});
  }
  if (!b.status.s.contains("restarts")) b.status.set("restarts", 0);
  const int attempt = b.status.s.value("restarts", 0);

  // Suspended: no pod runs; the checkpoints stay. Resuming starts the deadline's clock again.
  if (rp.suspend) {
    b.delete_pods(b.live_pods());
    if (phase != "Suspended") {
      b.status.set("phase", "Suspended");
      b.status.condition("Suspended", true, "Suspended", "spec.runPolicy.suspend is true: the pods are deleted, the checkpoints kept");
      if (b.status.find("Running")) b.status.condition("Running", false, "Suspended", "");
      b.event("Normal", "Suspended", "the job is suspended: its pods are deleted, its checkpoints kept");
    }
    return b.finish();
  }
  if (phase == "Suspended") {
    b.status.condition("Suspended", false, "Resumed", "");
    b.status.set("startTime", format_time(o.now));
    b.status.set("phase", "Pending");
    b.event("Normal", "Resumed", "the job is resumed: its gang starts again from the newest checkpoint");
  }

  // The deadline, counted from the start (or the last resume).
  if (rp.active_deadline_seconds > 0) {
    if (const auto start = parse_time(b.status.s.value("startTime", ""))) {
      const auto end = *start + seconds(rp.active_deadline_seconds);
      if (o.now >= end)
        return b.fail("DeadlineExceeded", detail::concat("the job ran longer than spec.runPolicy.activeDeadlineSeconds (",
                                                         rp.active_deadline_seconds, " s)"));
      b.requeue(duration_cast<milliseconds>(end - o.now) + milliseconds(100));
    }
  }

  // Pods of earlier attempts go first; the new gang starts when they are gone.
  std::vector<const PodInfo*> old_pods, current;
  for (const auto& p : o.pods) (p.attempt == attempt ? current : old_pods).push_back(&p);
  if (!old_pods.empty()) {
    b.delete_pods(old_pods);
    b.requeue(milliseconds(1000));
    return b.finish();
  }

  // A failed pod of the current gang.
  const PodInfo* failed = nullptr;
  bool rejected = false;
  for (const PodInfo* p : current) {
    if (p->phase != "Failed") continue;
    if (admission_rejected(*p)) {
      rejected = true;
      continue;
    }
    // The cause of a gang failure: a worker killed by a signal rather than its peers, which fail
    // when it disappears.
    if (!failed || (p->exit_code > 128 && failed->exit_code <= 128)) failed = p;
  }
  // A peer that failed because one worker was killed often ends first: wait a moment for the killed
  // one to be reported, so that the restart names the cause.
  if (failed && failed->exit_code <= 128 && failed->finished && o.now - *failed->finished < seconds(3)) {
    bool peers_running = false;
    for (const PodInfo* p : current) peers_running = peers_running || p->phase == "Running";
    if (peers_running) {
      b.requeue(milliseconds(500));
      return b.finish();
    }
  }
  if (failed) {
    std::string why = detail::concat("pod ", failed->name, " on ", failed->node, " failed");
    if (failed->exit_code >= 0) why += detail::concat(" with exit code ", failed->exit_code);
    if (!failed->reason.empty()) why += " (" + failed->reason + ")";
    // A pod's message is its termination log (up to 4 KiB, or its last log lines): the status keeps its end.
    if (!failed->message.empty()) why += ": " + last_chars(failed->message, kMessageChars);
    if (failed->exit_code == 2) return b.fail("InvalidConfiguration", why + "; a configuration error is not retried");
    if (failed->exit_code == 3) {
      const std::string hint = "lower spec.training.optimizer.learningRate or set spec.training.gradClip";
      return b.fail("TrainingDiverged", why + "; a diverged run would diverge again, so it is not retried" +
                                            (why.find(hint) == std::string::npos ? " (" + hint + ")" : ""));
    }
    if (attempt >= rp.backoff_limit)
      return b.fail("BackoffLimitExceeded", detail::concat(why, "; the gang was restarted ", attempt,
                                                           " times (spec.runPolicy.backoffLimit ", rp.backoff_limit, ")"));
    const int64_t at = o.progress ? o.progress->step : b.status.s.value("step", int64_t{-1});
    json history = b.status.s.value("restartHistory", json::array());
    json entry = {{"reason", why}, {"pod", failed->name}, {"time", format_time(o.now)}, {"failedAtStep", at}, {"resumedAtStep", -1}};
    if (failed->exit_code >= 0) entry["exitCode"] = failed->exit_code;
    history.push_back(entry);
    if (history.size() > kRestartHistory) history.erase(history.begin(), history.end() - kRestartHistory);
    b.status.set("restartHistory", history);
    b.status.set("restarts", attempt + 1);
    b.status.set("phase", "Restarting");
    b.status.condition("Restarting", true, "PodFailed", why);
    b.status.condition("Running", false, "Restarting", "");
    if (b.status.s.contains("slowRanks")) {  // the next gang measures afresh
      b.status.erase("slowRanks");
      b.status.condition("Straggler", false, "GangRestarted", "");
    }
    b.event("Warning", "GangRestart", detail::concat(why, " at step ", at, "; restarting the gang from its last checkpoint (restart ",
                                                     attempt + 1, " of at most ", rp.backoff_limit, ")"));
    b.delete_pods(current);
    return b.finish();
  }
  if (rejected) {
    std::string why;
    for (const PodInfo* p : current)
      if (admission_rejected(*p)) why = detail::concat("node ", p->node, " refused pod ", p->name, " (", p->reason, p->message.empty() ? "" : ": " + p->message, ")");
    b.status.condition("Placed", false, "AdmissionRejected", why + "; placing the gang again");
    b.event("Warning", "AdmissionRejected", why + "; placing the gang again (not a restart)");
    // The plan of this attempt is void: the next gang is placed afresh once these pods are gone.
    b.delete_pods(current);
    if (o.config_map && read_plan(o.config_map)) {
      json cm = *o.config_map;
      cm["data"].erase(kPlanFile);
      b.update("configmaps", config_map_name(b.name), cm);
    }
    b.requeue(milliseconds(500));
    return b.finish();
  }

  // Succeeded: every pod of the gang finished.
  int succeeded = 0, running = 0;
  for (const PodInfo* p : current) {
    if (p->phase == "Succeeded") ++succeeded;
    if (p->phase == "Running") ++running;
  }
  if (succeeded == s.replicas) {
    // Rank 0's summary, from its pod's termination message.
    for (const PodInfo* p : current) {
      if (p->message.rfind("{\"type\":\"summary\"", 0) != 0) continue;
      const json summary = json::parse(p->message, nullptr, false);
      if (summary.is_discarded()) continue;
      b.status.set("step", summary.value("steps", int64_t{0}));
      b.status.set("samplesPerSecond", summary.value("samples_per_second", 0.0));  // over the whole run
      b.status.set("validation", validation_status(summary));
    }
    b.status.set("phase", "Succeeded");
    b.status.set("completionTime", format_time(o.now));
    b.status.set("epoch", s.training.epochs);
    const int64_t sw = b.status.s.value("switchStep", int64_t{-1});
    b.status.set("trainingPhase", training_phase(s.communication, INT64_MAX, sw));
    b.status.erase("reason");
    b.status.erase("message");
    b.status.condition("Running", false, "Completed", "");
    b.status.condition("Succeeded", true, "Completed", detail::concat("all ", s.replicas, " pods succeeded"));
    b.event("Normal", "Completed", detail::concat("the job succeeded after ", attempt, " restart(s)"));
    if (rp.ttl_seconds_after_finished >= 0) b.requeue(seconds(rp.ttl_seconds_after_finished) + milliseconds(100));
    return b.finish();
  }

  // Place a new gang, or complete the current one.
  std::optional<std::pair<int, std::vector<placement::RankAssignment>>> plan = read_plan(o.config_map);
  if (plan && plan->first != attempt) plan.reset();
  if (!plan) {
    if (!current.empty()) {  // pods of a void plan still terminating
      b.requeue(milliseconds(500));
      return b.finish();
    }
    placement::GangRequest request;
    request.replicas = s.replicas;
    // A virtual node of `tessera run` has one GPU slot per rank, GPUs or not.
    request.per_pod.gpu = opt.cluster ? s.resources.gpu : s.ranks_per_replica;
    request.per_pod.cpu = s.resources.cpu;
    request.per_pod.memory = s.resources.memory;
    request.node_selector = s.placement.node_selector;
    request.tolerations = s.placement.tolerations;
    request.topology_keys = s.placement.topology_keys;
    const placement::PlacementResult placed = placement::GangPlacer().place(request, o.nodes);
    if (!placed.placed) {
      const json* c = b.status.find("Placed");
      if (!c || c->value("message", "") != placed.reason)
        b.event("Warning", "Unschedulable", placed.reason);
      b.status.condition("Placed", false, "Unschedulable", placed.reason);
      if (b.status.phase().empty() || b.status.phase() == "Placing") b.status.set("phase", "Pending");
      b.requeue(milliseconds(5000));
      return b.finish();
    }
    const auto ranks = placement::plan_ring(placed.nodes, s.ranks_per_replica, o.nodes, request.topology_keys);
    plan = std::make_pair(attempt, ranks);
    json cm = {{"apiVersion", "v1"},
               {"kind", "ConfigMap"},
               {"metadata", b.meta(config_map_name(b.name))},
               {"data",
                {{kConfigFile,
                  json{{"apiVersion", api::kApiVersion}, {"kind", api::kKind}, {"metadata", {{"name", b.name}, {"namespace", b.ns}}},
                       {"spec", spec}}
                      .dump(2)},
                 {kPlanFile, plan_json(attempt, ranks).dump()}}}};
    if (o.config_map) {
      json updated = *o.config_map;
      updated["data"] = cm["data"];
      if (frozen) updated["data"][kConfigFile] = (*o.config_map)["data"][kConfigFile];
      b.update("configmaps", config_map_name(b.name), updated);
    } else {
      b.create("configmaps", config_map_name(b.name), cm);
    }
    json placement = json::array();
    std::string where;
    for (int r = 0; r < s.replicas; ++r) {
      json rank_list = json::array();
      for (const auto& a : ranks)
        if (a.replica == r) rank_list.push_back(a.rank);
      placement.push_back({{"replica", r}, {"node", placed.nodes[r]}, {"ranks", rank_list}});
      where += (where.empty() ? "" : ", ") + placed.nodes[r];
    }
    b.status.set("placement", placement);
    const std::string message = detail::concat(s.replicas, " pods of ", s.ranks_per_replica, " ranks on ", where);
    b.status.condition("Placed", true, "GangFits", message);
    b.event("Normal", "Placed", message);
    if (!b.status.s.contains("startTime")) b.status.set("startTime", format_time(o.now));
    if (b.status.phase().empty() || b.status.phase() == "Pending") b.status.set("phase", "Placing");
  }

  // The gang's pods that are missing (all of them for a new gang).
  std::set<int> have;
  for (const PodInfo* p : current) have.insert(p->replica);
  std::map<int, std::string> node_of;
  for (const auto& a : plan->second) node_of[a.replica] = a.node;
  const std::string image = s.image == api::TrainingJobSpec().image && !opt.worker_image.empty() ? opt.worker_image : s.image;
  for (int r = 0; r < s.replicas; ++r) {
    if (have.count(r)) continue;
    const std::string pod = pod_name(b.name, attempt, r);
    json args = {"--slots", std::to_string(s.ranks_per_replica), "--replica", std::to_string(r), "--config",
                 std::string(kConfigMount) + "/" + kConfigFile, "--rendezvous", "grpc://" + opt.rendezvous_address};
    if (s.training.threads == 0 && s.resources.cpu > 0)
      args.push_back("--threads"), args.push_back(std::to_string(std::max(1, static_cast<int>(s.resources.cpu / s.ranks_per_replica))));
    json env = json::array({{{"name", "TESSERA_JOB"}, {"value", b.ns + "/" + b.name}},
                            {{"name", "TESSERA_TOKEN"},
                             {"valueFrom", {{"secretKeyRef", {{"name", token_secret_name(b.name)}, {"key", "token"}}}}}},
                            {{"name", "TESSERA_POD"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.name"}}}}}},
                            {{"name", "TESSERA_NODE"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "spec.nodeName"}}}}}},
                            {{"name", "TESSERA_TERMINATION_LOG"}, {"value", "/dev/termination-log"}}});
    json ports = json::array();
    if (opt.metrics_port > 0) {
      env.push_back({{"name", "TESSERA_METRICS_ADDR"}, {"value", "0.0.0.0:" + std::to_string(opt.metrics_port)}});
      for (int slot = 0; slot < s.ranks_per_replica; ++slot)
        ports.push_back({{"name", "metrics-" + std::to_string(slot)}, {"containerPort", opt.metrics_port + slot}, {"protocol", "TCP"}});
    }
    json requests = json::object(), limits = json::object();
    if (s.resources.gpu > 0) requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = std::to_string(s.resources.gpu);
    if (s.resources.cpu > 0) requests["cpu"] = std::to_string(static_cast<int64_t>(s.resources.cpu * 1000)) + "m";
    if (s.resources.memory > 0) requests["memory"] = std::to_string(s.resources.memory);
    json mounts = json::array({{{"name", "config"}, {"mountPath", kConfigMount}, {"readOnly", true}}});
    json volumes = json::array({{{"name", "config"}, {"configMap", {{"name", config_map_name(b.name)}, {"items", json::array({{{"key", kConfigFile}, {"path", kConfigFile}}})}}}}});
    if (s.dataset.format != "synthetic") {
      api::VolumeSpec v = s.dataset.volume;
      if (!v.given()) v = {"nfs", s.cache.nfs_path, s.cache.nfs_server, ""};
      json source = volume_source(v, true);
      source["name"] = "dataset";
      volumes.push_back(source);
      mounts.push_back({{"name", "dataset"}, {"mountPath", dataset_mount(s.dataset)}, {"readOnly", true}});
    }
    if (!s.checkpoint.path.empty()) {
      json source = volume_source(s.checkpoint.volume, false);
      source["name"] = "checkpoints";
      volumes.push_back(source);
      mounts.push_back({{"name", "checkpoints"}, {"mountPath", s.checkpoint.path}});
    }
    if (!s.cache.ssd_path.empty()) {
      volumes.push_back({{"name", "ssd-cache"}, {"hostPath", {{"path", s.cache.ssd_path}, {"type", "DirectoryOrCreate"}}}});
      mounts.push_back({{"name", "ssd-cache"}, {"mountPath", s.cache.ssd_path}});
    }
    json tolerations = json::array();
    for (const auto& t : s.placement.tolerations) {
      json tol = {{"operator", t.op}};
      if (!t.key.empty()) tol["key"] = t.key;
      if (!t.value.empty()) tol["value"] = t.value;
      if (!t.effect.empty()) tol["effect"] = t.effect;
      tolerations.push_back(tol);
    }
    json container = {{"name", "worker"},
                      {"image", image},
                      {"command", {"tessera-worker"}},
                      {"args", args},
                      {"env", env},
                      {"ports", ports},
                      {"volumeMounts", mounts},
                      // Rank 0's summary, or why the pod failed: the controller reads it from the pod's status.
                      {"terminationMessagePath", "/dev/termination-log"},
                      {"terminationMessagePolicy", "FallbackToLogsOnError"},
                      {"resources", {{"requests", requests}, {"limits", limits}}},
                      // Least privilege: the worker writes only to its checkpoint and SSD-cache volumes.
                      {"securityContext", {{"runAsNonRoot", true},
                                           {"readOnlyRootFilesystem", true},
                                           {"allowPrivilegeEscalation", false},
                                           {"capabilities", {{"drop", json::array({"ALL"})}}},
                                           {"seccompProfile", {{"type", "RuntimeDefault"}}}}}};
    json pod_spec = {{"nodeName", node_of[r]},
                     {"restartPolicy", "Never"},
                     {"hostname", pod},
                     {"subdomain", b.name},
                     {"automountServiceAccountToken", false},
                     {"terminationGracePeriodSeconds", 30},
                     {"containers", json::array({container})},
                     {"volumes", volumes}};
    if (!tolerations.empty()) pod_spec["tolerations"] = tolerations;
    b.create("pods", pod,
             {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", b.meta(pod, {{kReplicaLabel, std::to_string(r)}, {kAttemptLabel, std::to_string(attempt)}})},
              {"spec", pod_spec}});
  }

  // Running: the workers' progress, written at most every status interval.
  if (running == s.replicas) {
    if (b.status.phase() != "Running") {
      b.status.set("phase", "Running");
      b.status.condition("Running", true, "GangRunning", detail::concat("all ", s.replicas, " pods are running"));
      if (b.status.is("Restarting")) b.status.condition("Restarting", false, "GangRunning", "");
    }
  }
  if (o.progress && o.progress->step >= 0) {
    const Progress& p = *o.progress;
    const auto last = parse_time(b.status.s.value("lastProgressTime", ""));
    const int64_t known_switch = b.status.s.value("switchStep", int64_t{-1});
    const bool switch_news = p.switch_step >= 0 && p.switch_step != known_switch;
    if (switch_news) {
      b.status.set("switchStep", p.switch_step);
      b.event("Normal", "PhaseSwitch", detail::concat("the gang switches from ", s.communication.sparse, " to ", s.communication.dense,
                                                      " at step ", p.switch_step));
    }
    // Stragglers: news when the ranks that rank 0 reports as slow change; the figures of the same
    // ranks are refreshed with the rest of the progress.
    const json slow = p.slow_ranks;
    const bool straggler_news = slow != b.status.s.value("slowRanks", json::array());
    if (straggler_news && slow.empty()) {
      b.status.erase("slowRanks");
      b.status.condition("Straggler", false, "NoStraggler", "");
      b.event("Normal", "StragglerGone", "no rank holds the gang back any more");
    } else if (straggler_news) {  // the condition is set with the rest of the progress below
      b.status.set("slowRanks", slow);
      b.event("Warning", "Straggler", p.slow_reason);
    }
    json history = b.status.s.value("restartHistory", json::array());
    bool resumed = false;
    if (!history.empty() && history.back().value("resumedAtStep", int64_t{-1}) < 0) {
      history.back()["resumedAtStep"] = p.first_step >= 0 ? p.first_step : p.step;
      b.status.set("restartHistory", history);
      resumed = true;
    }
    if (switch_news || straggler_news || resumed || !last || o.now - *last >= opt.status_interval) {
      if (!slow.empty()) b.status.condition("Straggler", true, "SlowRank", p.slow_reason);
      b.status.set("step", p.step);
      b.status.set("epoch", p.epoch + 1);  // 1-based, as the logs count: the epoch under way
      b.status.set("loss", p.loss);
      b.status.set("samplesPerSecond", p.samples_per_second);
      b.status.set("trainingPhase", training_phase(s.communication, p.step, p.switch_step >= 0 ? p.switch_step : known_switch));
      b.status.set("lastProgressTime", format_time(o.now));
    } else {
      b.requeue(duration_cast<milliseconds>(opt.status_interval - (o.now - *last)) + milliseconds(10));
    }
  }
  if (running == s.replicas) b.requeue(opt.status_interval);
  return b.finish();
}

json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (auto it = n.begin(); it != n.end(); ++it) o[it->first.as<std::string>()] = yaml_to_json(it->second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& e : n) a.push_back(yaml_to_json(e));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string v = n.Scalar();
      if (n.Tag() == "!") return v;
      static const std::regex integer("[-+]?[0-9]+"), real("[-+]?([0-9]*\\.[0-9]+|[0-9]+\\.?[0-9]*)([eE][-+]?[0-9]+)?");
      if (v == "true" || v == "True") return true;
      if (v == "false" || v == "False") return false;
      if (v == "null" || v == "~") return nullptr;
      try {
        if (std::regex_match(v, integer)) return std::stoll(v);
        if (std::regex_match(v, real)) return std::stod(v);
      } catch (const std::exception&) {
      }
      return v;
    }
    default:
      return nullptr;
  }
}


json validation_status(const json& summary) {
  if (!summary.value("validated", true))
    return {{"message", "no validation set: give spec.dataset.validationPath or validationSplit"}};
  json v = {{"loss", summary.value("val_loss", 0.0)},
            {"metric", summary.value("val_metric", 0.0)},
            {"baselineLoss", summary.value("baseline_loss", 0.0)},
            {"baselineMetric", summary.value("baseline_metric", 0.0)}};
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
