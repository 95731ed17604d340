#include "controller/local/local_launcher.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <regex>
#include <thread>
#include <yaml-cpp/yaml.h>

#include "common/process.h"
#include "controller/metrics/controller_metrics.h"
#include "controller/placement/gang_placer.h"
#include "controller/placement/ring_planner.h"
#include "controller/reconcile/reconciler.h"
#include "controller/rendezvous/rendezvous_service.h"
#include "common/error.h"
#include "common/log.h"
#include "common/http_server.h"

namespace tessera::local {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using reconcile::Time;

std::atomic<bool> g_interrupted{false};

std::string clock_time() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", std::localtime(&t));
  return buf;
}

std::string duration(double seconds) {
  const int s = static_cast<int>(seconds + 0.5);
  return s >= 60 ? detail::concat(s / 60, "m", s % 60 < 10 ? "0" : "", s % 60, "s") : detail::concat(s, "s");
}

// Prometheus scraping the local controller at `controller` and, through its /targets, the workers.
// honor_labels: the series' own job and namespace labels (the TrainingJob's) are kept.
std::string prometheus_config(const std::string& controller) {
  return detail::concat("# Written by tessera run.\n",
                        "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n",
                        "scrape_configs:\n",
                        "  - job_name: tessera-controller\n    honor_labels: true\n    static_configs:\n      - targets: ['", controller, "']\n",
                        "  - job_name: tessera-workers\n    honor_labels: true\n    http_sd_configs:\n",
                        "      - url: http://", controller, "/targets\n        refresh_interval: 2s\n");
}

// The last non-empty line of a log (a worker's error message when it failed).
std::string last_line(const std::string& log) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// The last summary line rank 0 printed to its log.
json read_summary(const std::string& log) {
  std::ifstream in(log);
  std::string line;
  json last;
  while (std::getline(in, line))
    if (line.rfind("{\"type\":\"summary\"", 0) == 0) {
      try {
        last = json::parse(line);
      } catch (const json::exception&) {
      }
    }
  return last;
}

// A pod of the local backend: one tessera-worker process per rank of its replica.
struct LocalPod {
  std::string name, node;
  int replica = 0, attempt = 0;
  struct Rank {
    placement::RankAssignment at;
    std::string log;
    std::unique_ptr<Process> process;
    std::optional<int> status;
  };
  std::vector<Rank> ranks;
  std::optional<Time> finished;
};

// The reconcile's backend on this machine: pods are worker processes on virtual nodes, the job's
// status lives in <workDir>/status.json, Events are printed.
class Launch {
 public:
  Launch(const api::TrainingJob& job, const LocalOptions& options) : job_(job), options_(options), spec_(job.spec) {
    dir_ = spec_.local.work_dir;
    fs::create_directories(fs::path(dir_) / "logs");
    work_dir_abs_ = fs::absolute(dir_).lexically_normal().string();
    checkpoint_dir_ = api::under_work_dir(spec_.checkpoint.path, work_dir_abs_);
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
    for (int i = 0; i < spec_.local.nodes; ++i) {
      placement::NodeInfo n;
      n.name = detail::concat("local-", i);
      n.labels = {{"kubernetes.io/hostname", n.name}, {"topology.kubernetes.io/zone", "local"}};
      n.allocatable.gpu = spec_.local.gpus_per_node;
      nodes_.push_back(n);
    }
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    threads_ = spec_.training.threads > 0 ? spec_.training.threads : std::max(1, cores / spec_.workers());
  }

  ~Launch() {
    if (emulated_) {
      stop_pods(all_pod_names());
      [[maybe_unused]] int rc = std::system(detail::concat(options_.netns_bin, " down").c_str());
    }
    metrics_.on_scrape(nullptr);
    if (prometheus_) {
      prometheus_->stop(std::chrono::milliseconds(10000));
      say(detail::concat("Prometheus stopped; its data stays in ", dir_, "/prometheus: `", options_.prometheus_bin,
                         " --config.file=", dir_, "/prometheus/prometheus.yml --storage.tsdb.path=", dir_,
                         "/prometheus/data` serves it again"));
    }
  }

  LocalResult run() {
    start_ = Clock::now();
    emulate_network();
    // Emulated: the workers reach the rendezvous over the cluster's bridge.
    service_ = std::make_unique<RendezvousService>(emulated_ ? std::string(kBridge) + ":0" : "127.0.0.1:0");
    rendezvous_ = emulated_ ? detail::concat(kBridge, ":", service_->port()) : service_->target();
    serve_metrics();
    options_reconcile_.rendezvous_address = rendezvous_;
    options_reconcile_.status_interval = std::chrono::milliseconds(1000);
    options_reconcile_.cluster = false;
    token_ = new_job_token();
    auto last_line_at = Clock::now();
    for (;;) {
      if (g_interrupted) {
        stop_pods(all_pod_names());
        return finish_local("Failed", "Interrupted", "interrupted; the workers were stopped");
      }
      const auto reconcile_start = Clock::now();
      reconcile::Observed o = observe();
      const reconcile::Decision d = reconcile::reconcile(o, options_reconcile_);
      try {
        apply(d);
      } catch (const Error& e) {
        stop_pods(all_pod_names());
        return finish_local("Failed", "StartFailed", e.what());
      }
      const double took = std::chrono::duration<double>(Clock::now() - reconcile_start).count();
      metrics_.observe_reconcile(took);
      for (const auto& a : d.actions)  // the reconcile that placed the gang (or found it does not fit)
        if (a.kind == reconcile::Action::Kind::kEvent && (a.reason == "Placed" || a.reason == "Unschedulable")) metrics_.observe_placement(took);
      metrics_.observe_job(job_.namespace_, job_.name, status());
      const std::string phase = status().value("phase", "");
      if ((phase == "Succeeded" || phase == "Failed" || phase == "Suspended") && live_pods() == 0) return finish();
      // The virtual cluster never grows: a gang that does not fit now never will.
      if (const json* c = condition("Placed"); c && (*c).value("reason", "") == "Unschedulable") {
        const int r = spec_.replicas, k = spec_.ranks_per_replica, g = spec_.local.gpus_per_node;
        // A replica's ranks share one node: what would fit.
        const std::string fix =
            g < k ? detail::concat("each replica needs ", detail::count(k, "GPU slot"), " on one node: give nodes of at least ", k,
                                   " (--gpus-per-node ", k, ")")
                  : detail::concat("it needs ", detail::count((r + g / k - 1) / (g / k), "node"), " of ",
                                   detail::count(g, "GPU slot"), " (--nodes ", (r + g / k - 1) / (g / k), ")");
        return finish_local("Failed", "Unschedulable",
                            detail::concat("the gang of ", detail::count(r, "replica"), " x ", detail::count(k, "rank"),
                                           " does not fit ", detail::count(spec_.local.nodes, "virtual node"), " of ",
                                           detail::count(g, "GPU slot"), " (", options_.cluster_from, "); ", fix, ": ",
                                           (*c).value("message", "")));
      }
      if (std::chrono::duration<double>(Clock::now() - last_line_at).count() >= options_.progress_seconds) {
        progress_line();
        last_line_at = Clock::now();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  json& status() { return object_["status"]; }
  const json* condition(const std::string& type) {
    if (!status().contains("conditions")) return nullptr;
    for (const auto& c : status()["conditions"])
      if (c.value("type", "") == type) return &c;
    return nullptr;
  }

  reconcile::Observed observe() {
    reconcile::Observed o;
    o.job = object_;
    o.token = token_;
    o.has_secret = has_secret_;
    o.has_service = true;  // pods reach each other on loopback: nothing to create
    o.config_map = config_map_;
    o.now = std::chrono::system_clock::now();
    o.nodes = nodes_;
    for (auto& [name, pod] : pods_) {
      reconcile::PodInfo p;
      p.name = name;
      p.node = pod.node;
      p.replica = pod.replica;
      p.attempt = pod.attempt;
      int done = 0;
      const LocalPod::Rank* failed = nullptr;
      for (auto& r : pod.ranks) {
        if (!r.status) r.status = r.process->poll();
        if (!r.status) continue;
        if (*r.status == 0) ++done;
        else if (!failed || (*r.status > 128 && *failed->status <= 128)) failed = &r;
      }
      if (failed) {
        if (!pod.finished) pod.finished = o.now;
        p.phase = "Failed";
        p.exit_code = *failed->status;
        p.finished = pod.finished;
        p.message = detail::concat("worker replica ", failed->at.replica, " slot ", failed->at.slot, " (rank ", failed->at.rank, ") ",
                                   Process::describe(*failed->status));
        const std::string last = last_line(failed->log);
        if (!last.empty()) p.message += ": " + last;
        p.message += "; see " + failed->log;
      } else {
        p.phase = done == static_cast<int>(pod.ranks.size()) ? "Succeeded" : "Running";
        if (p.phase == "Succeeded") p.exit_code = 0;
      }
      o.pods.push_back(p);
      if (p.phase == "Running")
        for (auto& n : o.nodes)
          if (n.name == pod.node) n.used.gpu += spec_.ranks_per_replica;
    }
    if (served_attempt_ >= 0 && served_attempt_ == status().value("restarts", 0)) {
      const RendezvousProgress p = service_->progress(key());
      o.progress = p;
      if (p.step >= 0) last_progress_ = p;
      if (p.step >= 0 && p.first_step > 0 && !resume_told_ && status().value("restarts", 0) == 0) {
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

  std::string key() const { return job_.namespace_ + "/" + job_.name; }

  // spec.local.network: the virtual nodes in the emulated cluster's namespaces (tessera-netns up).
  void emulate_network() {
    if (spec_.local.network_rate.empty()) return;
    if (geteuid() != 0)
      throw ConfigError("spec.local.network", "an emulated network needs root (network namespaces and tc); run as root or leave it out");
    const std::string up = detail::concat(options_.netns_bin, " up --nodes ", spec_.local.nodes, " --rate ",
                                          spec_.local.network_rate,
                                          spec_.local.network_delay.empty() ? "" : " --delay " + spec_.local.network_delay);
    std::fflush(options_.out);
    if (std::system(up.c_str()) != 0)
      throw ConfigError("spec.local.network", "the emulated network did not come up (" + up + ")");
    emulated_ = true;
  }

  // The controller's endpoints (and Prometheus, when asked for) on loopback.
  void serve_metrics() {
    metrics_.set_leader(true);
    metrics_.on_scrape([this](ControllerMetrics& m) { m.set_rendezvous(service_->counters()); });
    http_ = std::make_unique<HttpServer>(options_.metrics_addr, "--metrics-addr");
    http_->handle("/metrics", [this] { return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics_.text()}; });
    http_->handle("/targets", [this] { return HttpResponse{200, "application/json", http_sd_targets(service_->metrics_targets())}; });
    const std::string at = detail::concat("127.0.0.1:", http_->port());
    say(detail::concat("metrics: the controller's at http://", at, "/metrics; the workers' are listed at http://", at, "/targets"));
    if (options_.prometheus_addr.empty()) return;
    const fs::path dir = fs::path(dir_) / "prometheus";
    fs::create_directories(dir / "data");
    std::ofstream(dir / "prometheus.yml") << prometheus_config(at);
    prometheus_ = std::make_unique<Process>(
        std::vector<std::string>{options_.prometheus_bin, "--config.file=" + (dir / "prometheus.yml").string(),
                                 "--storage.tsdb.path=" + (dir / "data").string(), "--web.listen-address=" + options_.prometheus_addr},
        std::vector<std::string>{}, (dir / "prometheus.log").string());
    say(detail::concat("Prometheus at http://", options_.prometheus_addr, " (log ", (dir / "prometheus.log").string(), ")"));
  }

  void apply(const reconcile::Decision& d) {
    const json before = status();
    for (const auto& a : d.actions) {
      metrics_.observe_action(job_.namespace_, job_.name, before, a);
      switch (a.kind) {
        case reconcile::Action::Kind::kPatchStatus:
          status() = reconcile::apply_status_patch(status(), a.object);
          write_status();
          break;
        case reconcile::Action::Kind::kCreate:
        case reconcile::Action::Kind::kUpdate:
          if (a.resource == "secrets") has_secret_ = true;  // the token stays in memory
          else if (a.resource == "configmaps") config_map_ = a.object;
          else if (a.resource == "pods") start_pod(a);
          break;
        case reconcile::Action::Kind::kDelete:
          if (a.resource == "pods") stop_pods({a.name});
          break;
        case reconcile::Action::Kind::kEvent:
          if (a.reason == "Placed") placed(a.message);
          else if (a.reason == "GangRestart")
            say(a.message);
          else if (a.reason != "Completed" && a.reason != "PhaseSwitch")
            say(detail::concat(job_.name, ": ", a.reason, ": ", a.message));
          break;
        case reconcile::Action::Kind::kDeleteJob:
          break;  // ttlSecondsAfterFinished: nothing is stored locally but status.json
      }
    }
  }

  void placed(const std::string& where) {
    const auto& c = spec_.communication;
    std::string strategy = c.strategy;
    if (c.strategy == "hybrid") strategy = detail::concat("hybrid: ", c.sparse, " until epoch ", c.switch_at_epoch, ", then ", c.dense);
    if (!announced_) {
      say(detail::concat("job ", job_.name, ": ", detail::count(spec_.workers(), "worker"), " (",
                         detail::count(spec_.replicas, "replica"), " x ", detail::count(spec_.ranks_per_replica, "rank"), ") on ",
                         detail::count(spec_.local.nodes, "virtual node"), " of ", detail::count(spec_.local.gpus_per_node, "GPU slot"),
                         "; spatial ", spec_.parallelism.spatial_size(), " x data ", spec_.data_replicas(), "; ", strategy, "; ",
                         detail::count(threads_, "thread"), " per worker"));
      for (const auto& p : status().value("placement", json::array()))
        say(detail::concat("  replica ", p["replica"].get<int>(), " on ", p["node"].get<std::string>(), ": ranks ", p["ranks"].dump()));
      say(detail::concat("rendezvous on ", rendezvous_, "; worker logs in ", dir_, "/logs"));
      announced_ = true;
    } else {
      say(detail::concat(job_.name, ": placed again: ", where));
    }
  }

  // The ranks of a pod as worker processes (the pod's args, its --slots spread over processes).
  void start_pod(const reconcile::Action& a) {
    if (config_map_) {
      auto plan = reconcile::rendezvous_target(observe_for_rendezvous());
      if (plan && served_attempt_ != plan->attempt) {
        RendezvousJobPolicy policy;
        policy.switch_at_epoch = plan->switch_at_epoch;
        policy.switch_step = plan->switch_step;
        service_->add_job(key(), plan->token, plan->plan, policy);
        served_attempt_ = plan->attempt;
        plan_ = plan->plan;
      }
    }
    LocalPod pod;
    pod.name = a.name;
    pod.node = a.object["spec"].value("nodeName", "");
    pod.replica = std::stoi(a.object["metadata"]["labels"][reconcile::kReplicaLabel].get<std::string>());
    pod.attempt = std::stoi(a.object["metadata"]["labels"][reconcile::kAttemptLabel].get<std::string>());
    for (const auto& at : plan_) {
      if (at.replica != pod.replica) continue;
      LocalPod::Rank r;
      r.at = at;
      r.log = worker_log(at.replica, at.slot);
      std::vector<std::string> argv = {options_.worker_bin, "--config", options_.manifest, "--rendezvous",
                                       "grpc://" + rendezvous_, "--replica", std::to_string(at.replica),
                                       "--slot", std::to_string(at.slot), "--threads", std::to_string(threads_),
                                       "--metrics-addr", emulated_ ? "0.0.0.0:0" : "127.0.0.1:0"};
      std::vector<std::string> env = {"TESSERA_JOB=" + key(), "TESSERA_TOKEN=" + token_, "TESSERA_POD=" + pod.name,
                                      "TESSERA_WORK_DIR=" + work_dir_abs_};
      if (emulated_) {
        // In the node's namespace; Gloo binds the node's link, so ranks of other nodes come over it.
        argv.insert(argv.begin(), {"ip", "netns", "exec", "tessera-n" + pod.node.substr(pod.node.rfind('-') + 1)});
        env.push_back("TESSERA_GLOO_IFACE=eth0");
      }
      r.process = std::make_unique<Process>(argv, env, r.log);
      pod.ranks.push_back(std::move(r));
    }
    pods_[pod.name] = std::move(pod);
    write_status();
  }

  reconcile::Observed observe_for_rendezvous() {
    reconcile::Observed o;
    o.job = object_;
    o.token = token_;
    o.has_secret = has_secret_;
    o.config_map = config_map_;
    return o;
  }

  void stop_pods(const std::vector<std::string>& names) {
    for (const auto& n : names)
      if (auto it = pods_.find(n); it != pods_.end())
        for (auto& r : it->second.ranks) r.process->terminate();
    for (const auto& n : names)
      if (auto it = pods_.find(n); it != pods_.end()) {
        for (auto& r : it->second.ranks) r.process->stop(std::chrono::milliseconds(3000));
        pods_.erase(it);
      }
  }
  std::vector<std::string> all_pod_names() const {
    std::vector<std::string> out;
    for (const auto& [n, p] : pods_) out.push_back(n);
    return out;
  }
  int live_pods() {
    int n = 0;
    for (auto& [name, pod] : pods_)
      for (auto& r : pod.ranks)
        if (!r.status && !(r.status = r.process->poll())) {
          ++n;
          break;
        }
    return n;
  }

  void progress_line() {
    const RendezvousProgress& p = last_progress_;
    if (p.step < 0 || status().value("phase", "") != "Running") return;
    const auto& c = spec_.communication;
    const std::string phase = status().value("trainingPhase", "sparse");
    // hybrid: "sparse phase (hitopk)"; otherwise the one strategy.
    const std::string exchange =
        c.strategy == "hybrid" ? detail::concat(phase, " phase (", phase == "sparse" ? c.sparse : c.dense, ")") : c.strategy;
    say(detail::concat(job_.name, " Running  epoch ", p.epoch + 1, "/", spec_.training.epochs, "  step ", p.step, "  ",
                       fixed_digits(p.samples_per_second, 1), " samples/s  loss ", fixed_digits(p.loss, 4), "  ", exchange,
                       "  restarts ", status().value("restarts", 0)));
  }

  // The job ended as the reconcile decided: the summary of rank 0 completes a success.
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
      result_.steps = s.value("steps", int64_t{0});
      const int64_t first = s.value("first_step", int64_t{0});
      if (first > 0 && first == result_.steps && status().value("restarts", 0) == 0)
        say(detail::concat("the job's checkpoint in ", checkpoint_dir_, " is at its last step (", first,
                           "): it had already finished (tessera run --fresh starts it over)"));
      result_.samples_per_second = s.value("samples_per_second", 0.0);
      result_.switch_step = s.value("switch_step", int64_t{-1});
      result_.validated = s.value("validated", true);
      result_.val_loss = s.value("val_loss", 0.0);
      result_.val_metric = s.value("val_metric", 0.0);
      result_.baseline_loss = s.value("baseline_loss", 0.0);
      result_.baseline_metric = s.value("baseline_metric", 0.0);
      if (s.contains("iou")) result_.iou = s["iou"].get<std::vector<double>>();
      status()["step"] = result_.steps;
      status()["samplesPerSecond"] = result_.samples_per_second;  // over the whole run
      status()["validation"] = reconcile::validation_status(s);
      if (result_.switch_step >= 0) {
        status()["switchStep"] = result_.switch_step;
        status()["trainingPhase"] = "dense";
      }
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
    conditions.push_back({{"type", phase}, {"status", "True"}, {"reason", reason}, {"message", message},
                          {"lastTransitionTime", status()["completionTime"]}});
    result_.phase = phase;
    result_.reason = reason;
    result_.message = message;
    return done();
  }

  LocalResult done() {
    result_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    result_.restarts = status().value("restarts", 0);
    for (const auto& r : status().value("restartHistory", json::array()))
      result_.restart_history.push_back({r.value("reason", ""), r.value("failedAtStep", int64_t{-1}), r.value("resumedAtStep", int64_t{-1})});
    write_status();
    report();
    return result_;
  }

  std::string worker_log(int replica, int slot) const { return detail::concat(dir_, "/logs/worker-", replica, "-", slot, ".log"); }
  std::string rank0_log() const {
    for (const auto& a : plan_)
      if (a.rank == 0) return worker_log(a.replica, a.slot);
    return worker_log(0, 0);
  }

  void report() {
    const LocalResult& r = result_;
    if (r.phase != "Succeeded") {
      say(detail::concat(job_.name, " ", r.phase, r.reason.empty() ? "" : " (" + r.reason + ")", " after ",
                         duration(r.seconds), ": ", r.message));
      return;
    }
    std::string line = detail::concat(job_.name, " Succeeded in ", duration(r.seconds), ": ", r.steps, " steps, ",
                                      fixed_digits(r.samples_per_second, 2), " samples/s, restarts ", r.restarts);
    if (r.switch_step >= 0) line += detail::concat(", switched to ", spec_.communication.dense, " at step ", r.switch_step);
    say(line);
    for (const auto& h : r.restart_history)
      say(detail::concat("  restart: ", h.reason, " at step ", h.failed_at_step, "; resumed at step ", h.resumed_at_step));
    if (!r.validated)
      say("  no validation: the job has no validation set (spec.dataset.validationPath or validationSplit gives one)");
    else if (spec_.model.name == "cosmoflow")
      say(detail::concat("  validation MSE ", fixed_digits(r.val_loss, 4), " vs predict-the-mean ", fixed_digits(r.baseline_loss, 4), ": ",
                         fixed_digits(r.val_loss / std::max(r.baseline_loss, 1e-12), 3), "x; MAE ", fixed_digits(r.val_metric, 4)));
    else
      say(detail::concat("  validation loss ", fixed_digits(r.val_loss, 4), ", accuracy ", fixed_digits(r.val_metric, 4),
                         class_scores_text(r.baseline_metric, r.iou)));
  }

  void say(const std::string& line) {
    std::fprintf(options_.out, "[%s] %s\n", clock_time().c_str(), line.c_str());
    std::fflush(options_.out);
  }

  // status.json: the CRD's status, plus the worker processes of the current gang.
  void write_status() {
    json list = json::array();
    for (const auto& [name, pod] : pods_)
      for (const auto& r : pod.ranks)
        list.push_back({{"replica", r.at.replica}, {"slot", r.at.slot}, {"rank", r.at.rank}, {"node", r.at.node},
                        {"localRank", r.at.local_rank}, {"pid", r.process->pid()}, {"log", r.log}});
    status()["workers"] = list;
    const fs::path file = fs::path(dir_) / "status.json", tmp = fs::path(dir_) / "status.json.tmp";
    {
      std::ofstream out(tmp);
      out << json{{"apiVersion", api::kApiVersion}, {"kind", api::kKind}, {"metadata", {{"name", job_.name}}},
                  {"status", status()}}
                 .dump(2)
          << "\n";
    }
    fs::rename(tmp, file);
  }

  const api::TrainingJob& job_;
  const LocalOptions& options_;
  const api::TrainingJobSpec& spec_;
  std::string dir_, token_;  // token_: the job's, random per run
  bool has_secret_ = false;
  json object_;
  std::optional<json> config_map_;
  std::vector<placement::NodeInfo> nodes_;
  std::map<std::string, LocalPod> pods_;
  std::vector<placement::RankAssignment> plan_;
  static constexpr const char* kBridge = "10.77.0.254";  // the emulated cluster's bridge (tessera-netns)
  std::unique_ptr<RendezvousService> service_;
  std::string rendezvous_;  // host:port the workers reach the rendezvous at
  bool emulated_ = false;
  ControllerMetrics metrics_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<Process> prometheus_;
  reconcile::ReconcileOptions options_reconcile_;
  int served_attempt_ = -1, threads_ = 1;
  bool announced_ = false, resume_told_ = false;
  std::string work_dir_abs_, checkpoint_dir_;  // the work directory, and where checkpoints go in it
  RendezvousProgress last_progress_;
  Clock::time_point start_;
  LocalResult result_;
};

}  // namespace

LocalLauncher::LocalLauncher(api::TrainingJob job, LocalOptions options)
    : job_(std::move(job)), options_(std::move(options)) {}

LocalResult LocalLauncher::run() {
  Launch launch(job_, options_);
  return launch.run();
}

void LocalLauncher::interrupt() { g_interrupted = true; }

}  // namespace tessera::local
