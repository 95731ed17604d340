#include "controller/local/local_launcher.h"

#include <unistd.h>

#include <yaml-cpp/yaml.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/files.h"
#include "common/http_server.h"
#include "common/log.h"
#include "controller/local/console.h"
#include "controller/local/emulated_network.h"
#include "controller/local/local_pods.h"
#include "controller/local/prometheus.h"
#include "controller/metrics/controller_metrics.h"
#include "controller/placement/gang_placer.h"
#include "controller/reconcile/manifest.h"
#include "controller/reconcile/reconciler.h"
#include "controller/rendezvous/rendezvous_service.h"

namespace tessera::local {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using reconcile::Action;
using reconcile::Reason;

std::atomic<bool> g_interrupted{false};

// The last summary line rank 0 printed to its pod's log.
json read_summary(const std::string& log) {
  std::ifstream in(log);
  std::string line;
  json last;
  while (std::getline(in, line)) {
    const auto at = line.find("{\"type\":\"summary\"");
    if (at == std::string::npos) continue;
    const json parsed = json::parse(line.substr(at), nullptr, false);
    if (!parsed.is_discarded()) last = parsed;
  }
  return last;
}

// The reconcile's backend on this machine: the job object and its children are kept in memory,
// pods run on the virtual nodes (LocalPods), the job's status is written to <workDir>/status.json,
// and Events and progress are printed.
class Launch {
 public:
  Launch(const api::TrainingJob& job, const LocalOptions& options)
      : job_(job),
        options_(options),
        spec_(job.spec),
        console_(options.out, job),
        dir_(spec_.local.work_dir),
        work_dir_abs_(fs::absolute(dir_).lexically_normal().string()),
        checkpoint_dir_(api::under_work_dir(spec_.checkpoint.path, work_dir_abs_)) {
    fs::create_directories(dir_);
    if (options_.fresh) remove_checkpoints();
    json spec = json::object();
    try {
      const json manifest = reconcile::yaml_to_json(YAML::LoadFile(options_.manifest));
      if (manifest.contains("spec")) spec = manifest["spec"];
    } catch (const YAML::Exception& e) {
      throw ConfigError(options_.manifest, e.what());
    }
    object_ = {{"apiVersion", api::kApiVersion},
               {"kind", api::kKind},
               {"metadata", {{"name", job_.name}, {"namespace", job_.namespace_}, {"uid", "local"}, {"generation", 1}}},
               {"spec", spec},
               {"status", json::object()}};
    for (int i = 0; i < spec_.local.nodes; ++i) nodes_.push_back(virtual_node(detail::concat("local-", i)));
    // Requests to remove or add back a virtual node (tessera node) left by an earlier run.
    fs::remove_all(fs::path(dir_) / kNodeControlDir);
    // The machine's cores shared by the job's ranks, unless the job says how many threads a rank runs.
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    threads_ = spec_.training.threads > 0 ? spec_.training.threads : std::max(1, cores / spec_.workers());
  }

  ~Launch() {
    pods_.reset();  // the workers stop before the network and the endpoints they use go
    metrics_.on_scrape(nullptr);
  }

  LocalResult run() {
    start_ = Clock::now();
    if (!spec_.local.network_rate.empty())
      network_ = std::make_unique<EmulatedNetwork>(options_.netns_bin, spec_.local.nodes, spec_.local.network_rate,
                                                   spec_.local.network_delay, "spec.local.network");
    // Emulated: the workers reach the rendezvous over the cluster's bridge.
    const std::string host = network_ ? EmulatedNetwork::kBridge : "127.0.0.1";
    service_ = std::make_unique<RendezvousService>(host + ":0");
    rendezvous_ = detail::concat(host, ":", service_->port());
    serve_metrics();
    LocalPodsOptions pods;
    pods.work_dir = work_dir_abs_;
    pods.worker_bin = options_.worker_bin;
    if (network_) pods.emulated_prefix = EmulatedNetwork::kNamespacePrefix;
    pods_ = std::make_unique<LocalPods>(pods);
    reconcile_options_.rendezvous_address = rendezvous_;
    reconcile_options_.status_interval = std::chrono::milliseconds(1000);
    reconcile_options_.cluster = false;
    reconcile_options_.threads_per_rank = spec_.training.threads > 0 ? 0 : threads_;
    token_ = new_job_token();
    auto last_line_at = Clock::now();
    for (;;) {
      if (g_interrupted) {
        pods_->stop_all();
        return finish_local("Failed", "Interrupted", "interrupted; the workers were stopped");
      }
      const auto reconcile_start = Clock::now();
      control_nodes();
      const reconcile::Observed o = observe();
      const reconcile::Decision d = reconcile::reconcile(o, reconcile_options_);
      try {
        apply(d);
      } catch (const PodStartError& e) {
        pods_->stop_all();
        return finish_local("Failed", "StartFailed", detail::concat(e.reason(), ": ", e.what()));
      }
      const double took = std::chrono::duration<double>(Clock::now() - reconcile_start).count();
      metrics_.observe_reconcile(took);
      for (const auto& a : d.actions)  // the reconcile that placed the gang (or found it does not fit)
        if (a.kind == Action::Kind::kEvent && (a.reason == Reason::kPlaced || a.reason == Reason::kUnschedulable))
          metrics_.observe_placement(took);
      metrics_.observe_job(job_.namespace_, job_.name, status());
      const std::string phase = status().value("phase", "");
      if ((phase == "Succeeded" || phase == "Failed" || phase == "Suspended") && pods_->running() == 0) return finish();
      // The virtual cluster grows only back to its nodes: a gang that does not fit all of them never will.
      if (const json* c = condition("Placed"); c && (*c).value("reason", "") == "Unschedulable" && removed_.empty())
        return unschedulable(*c);
      if (std::chrono::duration<double>(Clock::now() - last_line_at).count() >= options_.progress_seconds) {
        console_.progress(last_progress_, status());
        last_line_at = Clock::now();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  json& status() { return object_["status"]; }
  const json& status() const { return object_["status"]; }
  const json* condition(const std::string& type) {
    if (!status().contains("conditions")) return nullptr;
    for (const auto& c : status()["conditions"])
      if (c.value("type", "") == type) return &c;
    return nullptr;
  }
  std::string key() const { return job_.namespace_ + "/" + job_.name; }

  placement::NodeInfo virtual_node(const std::string& name) const {
    placement::NodeInfo n;
    n.name = name;
    n.labels = {{"kubernetes.io/hostname", n.name}, {"topology.kubernetes.io/zone", "local"}};
    n.allocatable.gpu = spec_.local.gpus_per_node;
    return n;
  }

  // `tessera node remove|add NAME` leaves a request in <workDir>/nodes: a removed virtual node is a
  // lost machine (its pods killed at once, the node gone); one added back is a node that returns.
  void control_nodes() {
    const fs::path dir = fs::path(dir_) / kNodeControlDir;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return;
    std::vector<fs::path> requests;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".request") requests.push_back(e.path());
    std::sort(requests.begin(), requests.end());
    for (const auto& file : requests) {
      std::string verb, node;
      std::ifstream(file) >> verb >> node;
      fs::remove(file, ec);
      auto it =
          std::find_if(nodes_.begin(), nodes_.end(), [&](const placement::NodeInfo& n) { return n.name == node; });
      if (verb == "remove" && it != nodes_.end()) {
        std::vector<std::string> lost;
        for (const auto& p : pods_->observe(std::chrono::system_clock::now()))
          if (p.node == node) lost.push_back(p.name);
        pods_->kill(lost);
        nodes_.erase(it);
        removed_.insert(node);
        say(detail::concat("virtual node ", node, " removed, as a lost machine: ",
                           detail::count(static_cast<int>(lost.size()), "pod"), " killed"));
      } else if (verb == "add" && removed_.erase(node)) {
        nodes_.push_back(virtual_node(node));
        say(detail::concat("virtual node ", node, " added back"));
      } else {
        say(detail::concat("ignoring '", verb, " ", node, "': ",
                           verb == "remove" ? "no such node"
                           : verb == "add"  ? "the node was not removed"
                                            : "not remove or add"));
      }
    }
  }

  reconcile::Observed observe() {
    reconcile::Observed o;
    o.job = object_;
    o.token = token_;
    o.has_secret = secret_.has_value();
    o.has_service = true;  // pods reach each other on this machine: nothing to create
    o.config_map = config_map_;
    o.now = std::chrono::system_clock::now();
    o.nodes = nodes_;
    o.pods = pods_->observe(o.now);
    for (const auto& p : o.pods)
      if (p.phase == "Running")
        for (auto& n : o.nodes)
          if (n.name == p.node) n.used.gpu += spec_.ranks_per_replica;
    if (served_attempt_ >= 0) o.served_attempt = served_attempt_;
    o.served_round = served_round_;
    if (served_attempt_ >= 0 && served_attempt_ == reconcile::attempt_of(status()) &&
        served_round_ == status().value("restartsInPlace", int64_t{0})) {
      const RendezvousProgress p = service_->progress(key());
      o.progress = p;
      if (p.step >= 0) last_progress_ = p;
      if (p.step >= 0 && p.first_step > 0 && !resume_told_ && reconcile::attempt_of(status()) == 0) {
        resume_told_ = true;  // said as the gang starts, so a user sees at once where it went on from
        say(detail::concat("the job resumed from its checkpoint at step ", p.first_step, " in ", checkpoint_dir_,
                           " (tessera run --fresh starts it over)"));
      }
    }
    return o;
  }

  // --fresh: the job's checkpoint files go; everything else in the directory stays.
  void remove_checkpoints() {
    if (checkpoint_dir_.empty() || !fs::is_directory(checkpoint_dir_)) return;
    static const std::regex kCheckpoint("ckpt-[0-9]+-rank[0-9]+\\.bin(\\.tmp.*)?");
    int removed = 0;
    for (const auto& e : fs::directory_iterator(checkpoint_dir_))
      if (e.is_regular_file() && std::regex_match(e.path().filename().string(), kCheckpoint)) {
        fs::remove(e.path());
        ++removed;
      }
    say(detail::concat("--fresh: removed ", detail::count(removed, "checkpoint file"), " from ", checkpoint_dir_));
  }

  // The controller's endpoints (and Prometheus, when asked for) on loopback.
  void serve_metrics() {
    metrics_.set_leader(true);
    metrics_.on_scrape([this](ControllerMetrics& m) { m.set_rendezvous(service_->counters()); });
    http_ = std::make_unique<HttpServer>(options_.metrics_addr, "--metrics-addr");
    http_->handle("/metrics", [this] {
      return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics_.text()};
    });
    http_->handle("/targets", [this] {
      return HttpResponse{200, "application/json", http_sd_targets(service_->metrics_targets())};
    });
    const std::string at = detail::concat("127.0.0.1:", http_->port());
    say(detail::concat("metrics: the controller's at http://", at, "/metrics; the workers' are listed at http://", at,
                       "/targets"));
    if (!options_.prometheus_addr.empty())
      prometheus_ = std::make_unique<LocalPrometheus>((fs::path(dir_) / "prometheus").string(), options_.prometheus_bin,
                                                      options_.prometheus_addr, at,
                                                      [this](const std::string& line) { say(line); });
  }

  // Carries out the reconcile's actions, as the Kubernetes backend does with API calls.
  void apply(const reconcile::Decision& d) {
    const json before = status();
    for (const auto& a : d.actions) {
      metrics_.observe_action(job_.namespace_, job_.name, before, a);
      switch (a.kind) {
        case Action::Kind::kPatchStatus:
          status() = reconcile::apply_status_patch(status(), a.object);
          write_status();
          break;
        case Action::Kind::kCreate:
        case Action::Kind::kUpdate:
          if (a.resource == reconcile::Resource::kSecret) secret_ = a.object["stringData"];
          else if (a.resource == reconcile::Resource::kConfigMap) config_map_ = a.object;
          else if (a.resource == reconcile::Resource::kPod) start_pod(a.object);
          break;
        case Action::Kind::kDelete:
          if (a.resource == reconcile::Resource::kPod) pods_->stop({a.name});
          break;
        case Action::Kind::kEvent:
          if (a.reason == Reason::kPlaced) console_.placed(status(), a.message, rendezvous_, threads_, dir_ + "/logs");
          else if (a.reason == Reason::kGangRestart) say(a.message);
          else if (a.reason != Reason::kCompleted && a.reason != Reason::kPhaseSwitch)
            say(detail::concat(job_.name, ": ", reconcile::name(a.reason), ": ", a.message));
          break;
        case Action::Kind::kDeleteJob: break;  // ttlSecondsAfterFinished: nothing is stored locally but status.json
        case Action::Kind::kServeRendezvous: {
          RendezvousJobPolicy policy;
          policy.switch_at_epoch = a.rendezvous.switch_at_epoch;
          policy.switch_step = a.rendezvous.switch_step;
          policy.round = a.rendezvous.round;
          policy.auto_exchange = a.rendezvous.auto_exchange;
          policy.epochs = a.rendezvous.epochs;
          policy.densities = {a.rendezvous.density};
          service_->add_job(key(), a.rendezvous.token, a.rendezvous.plan, policy);
          served_attempt_ = a.rendezvous.attempt;
          served_round_ = a.rendezvous.round;
          plan_ = a.rendezvous.plan;
          break;
        }
        case Action::Kind::kStopRendezvous:
          service_->remove_job(key());
          served_attempt_ = -1;
          break;
      }
    }
  }

  // The reconcile's pod, on its virtual node: `tessera-worker --slots N` with the pod's environment,
  // its ConfigMap volume a directory of the pod's.
  void start_pod(const json& pod) {
    pods_->start(pod, [this](const std::string& resource, const std::string& name) -> std::optional<json> {
      if (resource == "secrets" && secret_ && name == reconcile::token_secret_name(job_.name)) return *secret_;
      if (resource == "configmaps" && config_map_ && (*config_map_)["metadata"].value("name", "") == name)
        return (*config_map_)["data"];
      return std::nullopt;
    });
    write_status();
  }

  // The gang does not fit the virtual cluster: what would.
  LocalResult unschedulable(const json& placed) {
    const int r = spec_.replicas, k = spec_.ranks_per_replica, g = spec_.local.gpus_per_node;
    // A replica's ranks share one node.
    const std::string fix =
        g < k ? detail::concat("each replica needs ", detail::count(k, "GPU slot"),
                               " on one node: give nodes of at least ", k, " (--gpus-per-node ", k, ")")
              : detail::concat("it needs ", detail::count((r + g / k - 1) / (g / k), "node"), " of ",
                               detail::count(g, "GPU slot"), " (--nodes ", (r + g / k - 1) / (g / k), ")");
    return finish_local(
        "Failed", "Unschedulable",
        detail::concat("the gang of ", detail::count(r, "replica"), " x ", detail::count(k, "rank"), " does not fit ",
                       detail::count(spec_.local.nodes, "virtual node"), " of ", detail::count(g, "GPU slot"), " (",
                       options_.cluster_from, "); ", fix, ": ", placed.value("message", "")));
  }

  // The job ended as the reconcile decided (its status holds the summary of a success).
  LocalResult finish() {
    const std::string phase = status().value("phase", "");
    result_.phase = phase;
    result_.reason = status().value("reason", "");
    result_.message = status().value("message", "");
    if (phase == "Suspended") result_.message = "spec.runPolicy.suspend is true: nothing runs";
    if (phase == "Succeeded") {
      const std::string log = rank0_log();
      const json s = read_summary(log);
      if (s.is_null()) return finish_local("Failed", "NoSummary", "rank 0 ended without a summary; see " + log);
      result_.steps = status().value("step", int64_t{0});
      const int64_t first = s.value("first_step", int64_t{0});
      if (first > 0 && first == result_.steps && reconcile::attempt_of(status()) == 0)
        say(detail::concat("the job's checkpoint in ", checkpoint_dir_, " is at its last step (", first,
                           "): it had already finished (tessera run --fresh starts it over)"));
      result_.samples_per_second = status().value("samplesPerSecond", 0.0);
      result_.switch_step = status().value("switchStep", int64_t{-1});
      result_.validated = s.value("validated", true);
      result_.val_loss = s.value("val_loss", 0.0);
      result_.val_metric = s.value("val_metric", 0.0);
      result_.val_top5 = s.value("val_top5", -1.0);
      result_.baseline_loss = s.value("baseline_loss", 0.0);
      result_.baseline_metric = s.value("baseline_metric", 0.0);
      if (s.contains("iou")) result_.iou = s["iou"].get<std::vector<double>>();
    }
    return done();
  }

  // An end the launcher decides itself (interrupted, a virtual cluster too small, ...).
  LocalResult finish_local(const std::string& phase, const std::string& reason, const std::string& message) {
    status()["phase"] = phase;
    status()["reason"] = reason;
    status()["message"] = message;
    status()["completionTime"] = reconcile::format_time(std::chrono::system_clock::now());
    json& conditions = status()["conditions"];
    if (!conditions.is_array()) conditions = json::array();
    conditions.push_back({{"type", phase},
                          {"status", "True"},
                          {"reason", reason},
                          {"message", message},
                          {"lastTransitionTime", status()["completionTime"]}});
    result_.phase = phase;
    result_.reason = reason;
    result_.message = message;
    return done();
  }

  LocalResult done() {
    result_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    result_.restarts = reconcile::attempt_of(status());
    for (const auto& r : status().value("restartHistory", json::array()))
      result_.restart_history.push_back(
          {r.value("reason", ""), r.value("failedAtStep", int64_t{-1}), r.value("resumedAtStep", int64_t{-1})});
    write_status();
    console_.report(result_);
    return result_;
  }

  // The log of the pod that runs rank 0.
  std::string rank0_log() const {
    int replica = 0;
    for (const auto& a : plan_)
      if (a.rank == 0) replica = a.replica;
    return pods_->log(reconcile::pod_name(
        job_.name, served_attempt_ >= 0 ? served_attempt_ : reconcile::attempt_of(status()), replica));
  }

  void say(const std::string& line) const { console_.say(line); }

  // status.json: the CRD's status, plus the worker processes of the current gang.
  void write_status() {
    json list = json::array();
    for (const auto& w : pods_->workers()) {
      json entry = {{"replica", w.replica}, {"slot", w.slot}, {"pod", w.pod},
                    {"node", w.node},       {"pid", w.pid},   {"log", w.log}};
      for (const auto& a : plan_)
        if (a.replica == w.replica && a.slot == w.slot) entry["rank"] = a.rank, entry["localRank"] = a.local_rank;
      list.push_back(entry);
    }
    status()["workers"] = list;
    write_file_atomic((fs::path(dir_) / "status.json").string(), json{{"apiVersion", api::kApiVersion},
                                                                      {"kind", api::kKind},
                                                                      {"metadata", {{"name", job_.name}}},
                                                                      {"status", status()}}
                                                                         .dump(2) +
                                                                     "\n");
  }

  const api::TrainingJob& job_;
  const LocalOptions& options_;
  const api::TrainingJobSpec& spec_;
  JobConsole console_;
  const std::string dir_, work_dir_abs_, checkpoint_dir_;  // the work directory (as given, absolute), checkpoints in it
  std::string token_;                                      // the job's, random per run
  json object_;                                            // the TrainingJob, its status kept here
  std::optional<json> secret_, config_map_;                // the job's children: the token Secret's data, the ConfigMap
  std::vector<placement::NodeInfo> nodes_;
  std::vector<placement::RankAssignment> plan_;  // of the gang the rendezvous serves
  int served_attempt_ = -1, threads_ = 1;
  int64_t served_round_ = 0;
  std::set<std::string> removed_;  // virtual nodes removed (tessera node remove) and not added back
  std::unique_ptr<EmulatedNetwork> network_;
  std::unique_ptr<RendezvousService> service_;
  std::string rendezvous_;  // host:port the workers reach the rendezvous at
  ControllerMetrics metrics_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<LocalPrometheus> prometheus_;
  std::unique_ptr<LocalPods> pods_;
  reconcile::ReconcileOptions reconcile_options_;
  bool resume_told_ = false;
  RendezvousProgress last_progress_;
  Clock::time_point start_;
  LocalResult result_;
};

}  // namespace

void request_node_change(const std::string& work_dir, const std::string& verb, const std::string& node) {
  if (!fs::exists(fs::path(work_dir) / "status.json"))
    throw ConfigError(
        "--work-dir",
        "'" + work_dir + "' holds no job (no status.json): give the work directory of a running tessera run");
  const fs::path dir = fs::path(work_dir) / kNodeControlDir;
  fs::create_directories(dir);
  static int sequence = 0;
  const std::string name = detail::concat(std::time(nullptr), "-", getpid(), "-", sequence++);
  const fs::path tmp = dir / (name + ".tmp"), file = dir / (name + ".request");
  std::ofstream(tmp) << verb << " " << node << "\n";
  fs::rename(tmp, file);
}

LocalLauncher::LocalLauncher(api::TrainingJob job, LocalOptions options)
    : job_(std::move(job)), options_(std::move(options)) {}

LocalResult LocalLauncher::run() {
  Launch launch(job_, options_);
  return launch.run();
}

void LocalLauncher::interrupt() { g_interrupted = true; }

}  // namespace tessera::local
