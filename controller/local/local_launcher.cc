#include "controller/local/local_launcher.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "controller/local/process.h"
#include "controller/placement/gang_placer.h"
#include "controller/placement/ring_planner.h"
#include "controller/rendezvous/rendezvous_service.h"
#include "worker/core/error.h"

namespace tessera::local {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_interrupted{false};

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

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

// The training phase a job is in: hybrid jobs are sparse until the switch step.
std::string training_phase(const api::CommunicationSpec& c, const RendezvousProgress& p) {
  if (c.strategy == "hybrid") return p.switch_step >= 0 && p.step >= p.switch_step ? "dense" : "sparse";
  return c.strategy == "topk" || c.strategy == "hitopk" ? "sparse" : "dense";
}

struct Worker {
  placement::RankAssignment at;
  std::string log;
  std::unique_ptr<Process> process;
};

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

// How watching a gang ended.
enum class Outcome {
  kSucceeded,  // every worker exited 0
  kRestart,    // a worker failed and the gang is to be started again
  kEnded,      // the job ended (failed, interrupted, deadline): finish() has run
};

class Launch {
 public:
  Launch(const api::TrainingJob& job, const LocalOptions& options) : job_(job), options_(options), spec_(job.spec) {
    dir_ = spec_.local.work_dir;
    fs::create_directories(fs::path(dir_) / "logs");
    status_["phase"] = "Pending";
    status_["restarts"] = 0;
    status_["startTime"] = utc_now();
    status_["restartHistory"] = json::array();
    status_["conditions"] = json::array();
  }

  LocalResult run() {
    start_ = Clock::now();
    if (spec_.run_policy.suspend) return finish("Suspended", "", "spec.runPolicy.suspend is true: nothing runs");
    status_["phase"] = "Placing";
    write_status();
    if (!place()) return result_;
    status_["phase"] = "Running";
    for (;;) {
      service_->add_job(job_.name, token_, plan_, policy_);
      if (!start_gang()) return result_;
      const Outcome outcome = watch_gang();
      if (outcome == Outcome::kSucceeded) return succeed();
      if (outcome == Outcome::kEnded) return result_;
    }
  }

 private:
  bool place() {
    std::vector<placement::NodeInfo> nodes(spec_.local.nodes);
    for (int i = 0; i < spec_.local.nodes; ++i) {
      nodes[i].name = detail::concat("local-", i);
      nodes[i].labels = {{"kubernetes.io/hostname", nodes[i].name}, {"topology.kubernetes.io/zone", "local"}};
      nodes[i].allocatable.gpu = spec_.local.gpus_per_node;
    }
    placement::GangRequest request;
    request.replicas = spec_.replicas;
    request.per_pod.gpu = spec_.ranks_per_replica;  // one slot per rank
    request.topology_keys = spec_.placement.topology_keys;
    const placement::PlacementResult placed = placement::GangPlacer().place(request, nodes);
    if (!placed.placed) {
      set_condition("Placed", "False", "Unschedulable", placed.reason);
      finish("Failed", "Unschedulable",
             detail::concat("the gang of ", spec_.replicas, " replicas x ", spec_.ranks_per_replica, " ranks does not fit ",
                            spec_.local.nodes, " virtual nodes of ", spec_.local.gpus_per_node,
                            " GPU slots (spec.local): ", placed.reason));
      return false;
    }
    set_condition("Placed", "True", "GangFits", detail::concat(spec_.replicas, " replicas on ", spec_.local.nodes, " virtual nodes"));
    plan_ = placement::plan_ring(placed.nodes, spec_.ranks_per_replica, nodes, request.topology_keys);
    service_ = std::make_unique<RendezvousService>("127.0.0.1:0");
    token_ = new_job_token();
    if (spec_.communication.strategy == "hybrid") policy_.switch_at_epoch = spec_.communication.switch_at_epoch;

    const int cores = std::max(1u, std::thread::hardware_concurrency());
    threads_ = spec_.training.threads > 0 ? spec_.training.threads : std::max(1, cores / spec_.workers());
    const auto& c = spec_.communication;
    std::string strategy = c.strategy;
    if (c.strategy == "hybrid") strategy = detail::concat("hybrid: ", c.sparse, " until epoch ", c.switch_at_epoch, ", then ", c.dense);
    say(detail::concat("job ", job_.name, ": ", spec_.workers(), " workers (", spec_.replicas, " replicas x ",
                       spec_.ranks_per_replica, " ranks) on ", spec_.local.nodes, " virtual nodes of ",
                       spec_.local.gpus_per_node, " GPU slots; spatial ", spec_.parallelism.spatial_size(), " x data ",
                       spec_.data_replicas(), "; ", strategy, "; ", threads_, " threads per worker"));
    json placement = json::array();
    for (int r = 0; r < spec_.replicas; ++r) {
      json ranks = json::array();
      for (const auto& a : plan_)
        if (a.replica == r) ranks.push_back(a.rank);
      placement.push_back({{"replica", r}, {"node", placed.nodes[r]}, {"ranks", ranks}});
      say(detail::concat("  replica ", r, " on ", placed.nodes[r], ": ranks ", ranks.dump()));
    }
    status_["placement"] = placement;
    say(detail::concat("rendezvous on ", service_->target(), "; worker logs in ", dir_, "/logs"));
    return true;
  }

  bool start_gang() {
    workers_.clear();
    json list = json::array();
    for (const auto& a : plan_) {
      Worker w;
      w.at = a;
      w.log = detail::concat(dir_, "/logs/worker-", a.replica, "-", a.slot, ".log");
      const std::vector<std::string> argv = {options_.worker_bin, "--config", options_.manifest, "--rendezvous",
                                             "grpc://" + service_->target(), "--replica", std::to_string(a.replica),
                                             "--slot", std::to_string(a.slot), "--threads", std::to_string(threads_)};
      try {
        w.process = std::make_unique<Process>(argv, std::vector<std::string>{"TESSERA_JOB=" + job_.name,
                                                                             "TESSERA_TOKEN=" + token_},
                                              w.log);
      } catch (const Error& e) {
        stop_gang();
        finish("Failed", "StartFailed", e.what());
        return false;
      }
      list.push_back({{"replica", a.replica}, {"slot", a.slot}, {"rank", a.rank}, {"node", a.node},
                      {"localRank", a.local_rank}, {"pid", w.process->pid()}, {"log", w.log}});
      workers_.push_back(std::move(w));
    }
    status_["workers"] = list;
    write_status();
    return true;
  }

  void stop_gang() {
    for (auto& w : workers_)
      if (w.process) w.process->terminate();
    for (auto& w : workers_)
      if (w.process) w.process->stop(std::chrono::milliseconds(3000));
  }

  // Watches the gang until it succeeds, must restart or the job ends.
  Outcome watch_gang() {
    auto last_line = Clock::now(), last_status = Clock::now();
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const RendezvousProgress p = service_->progress(job_.name);
      if (!status_["restartHistory"].empty() && status_["restartHistory"].back()["resumedAtStep"] == -1 && p.step >= 0)
        status_["restartHistory"].back()["resumedAtStep"] = p.step;
      if (p.step >= 0) last_step_ = p.step;

      if (g_interrupted) {
        stop_gang();
        finish("Failed", "Interrupted", "interrupted; the workers were stopped");
        return Outcome::kEnded;
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
      if (spec_.run_policy.active_deadline_seconds > 0 && elapsed > spec_.run_policy.active_deadline_seconds) {
        stop_gang();
        finish("Failed", "DeadlineExceeded",
               detail::concat("the job ran longer than spec.runPolicy.activeDeadlineSeconds (",
                              spec_.run_policy.active_deadline_seconds, " s)"));
        return Outcome::kEnded;
      }

      int done = 0;
      const Worker* failed = nullptr;
      int failed_status = 0;
      // The cause of a gang failure: a worker killed by a signal rather than its peers, which fail
      // when it disappears.
      for (auto& w : workers_) {
        const auto st = w.process->poll();
        if (!st) continue;
        if (*st == 0) ++done;
        else if (!failed || (*st > 128 && failed_status <= 128)) failed = &w, failed_status = *st;
      }
      if (failed) return restart_or_fail(*failed, failed_status);
      if (done == static_cast<int>(workers_.size())) return Outcome::kSucceeded;

      if (Clock::now() - last_status > std::chrono::seconds(1)) {
        update_progress(p);
        write_status();
        last_status = Clock::now();
      }
      if (std::chrono::duration<double>(Clock::now() - last_line).count() >= options_.progress_seconds && p.step >= 0) {
        const auto& c = spec_.communication;
        const std::string phase = training_phase(c, p);
        const std::string used = c.strategy == "hybrid" ? (phase == "sparse" ? c.sparse : c.dense) : c.strategy;
        say(detail::concat(job_.name, " Running  epoch ", p.epoch + 1, "/", spec_.training.epochs, "  step ", p.step, "  ",
                           fixed(p.samples_per_second, 1), " samples/s  loss ", fixed(p.loss, 4), "  ", phase, " (", used,
                           ")  restarts ", restarts_));
        last_line = Clock::now();
      }
    }
  }

  Outcome restart_or_fail(const Worker& failed, int status) {
    std::string why = detail::concat("worker replica ", failed.at.replica, " slot ", failed.at.slot, " (rank ",
                                     failed.at.rank, ") ", Process::describe(status));
    const std::string last = last_line(failed.log);
    if (!last.empty()) why += ": " + last;
    stop_gang();
    // Exit status 2 is a configuration error (a dataset that is not there, a split the model cannot
    // take): the same gang would fail the same way, so it is not restarted.
    if (status == 2) {
      finish("Failed", "InvalidConfiguration", detail::concat(why, "; see ", failed.log));
      return Outcome::kEnded;
    }
    if (restarts_ >= spec_.run_policy.backoff_limit) {
      finish("Failed", "BackoffLimitExceeded",
             detail::concat(why, "; the gang was restarted ", restarts_, " times (spec.runPolicy.backoffLimit ",
                            spec_.run_policy.backoff_limit, "); see ", failed.log));
      return Outcome::kEnded;
    }
    ++restarts_;
    status_["restarts"] = restarts_;
    status_["phase"] = "Restarting";
    status_["restartHistory"].push_back({{"reason", why}, {"failedAtStep", last_step_}, {"resumedAtStep", -1}});
    write_status();
    say(detail::concat(why, " at step ", last_step_, "; restarting the gang from its last checkpoint (restart ", restarts_,
                       " of at most ", spec_.run_policy.backoff_limit, ")"));
    status_["phase"] = "Running";
    return Outcome::kRestart;
  }

  void update_progress(const RendezvousProgress& p) {
    if (p.step < 0) return;
    status_["step"] = p.step;
    status_["epoch"] = p.epoch;
    status_["loss"] = p.loss;
    status_["samplesPerSecond"] = p.samples_per_second;
    status_["trainingPhase"] = training_phase(spec_.communication, p);
    if (p.switch_step >= 0) status_["switchStep"] = p.switch_step;
  }

  LocalResult succeed() {
    const auto rank0 = std::find_if(workers_.begin(), workers_.end(), [](const Worker& w) { return w.at.rank == 0; });
    const json s = read_summary(rank0->log);
    if (s.is_null()) return finish("Failed", "NoSummary", "rank 0 ended without a summary; see " + rank0->log);
    result_.steps = s.value("steps", int64_t{0});
    const int64_t first = s.value("first_step", int64_t{0});
    if (first > 0 && restarts_ == 0)
      say(detail::concat("the job resumed from its checkpoint at step ", first, " in ", spec_.checkpoint.path,
                         first == result_.steps ? ": it had already finished" : ""));
    result_.samples_per_second = s.value("samples_per_second", 0.0);
    result_.switch_step = s.value("switch_step", int64_t{-1});
    result_.val_loss = s.value("val_loss", 0.0);
    result_.val_metric = s.value("val_metric", 0.0);
    result_.baseline_loss = s.value("baseline_loss", 0.0);
    status_["step"] = result_.steps;
    status_["epoch"] = spec_.training.epochs;
    status_["samplesPerSecond"] = result_.samples_per_second;  // over the whole run
    status_["validation"] = {{"loss", result_.val_loss}, {"metric", result_.val_metric}, {"baselineLoss", result_.baseline_loss}};
    if (result_.switch_step >= 0) status_["switchStep"] = result_.switch_step;
    RendezvousProgress last;
    last.step = result_.steps - 1;
    last.switch_step = result_.switch_step;
    status_["trainingPhase"] = training_phase(spec_.communication, last);
    return finish("Succeeded", "", "");
  }

  LocalResult finish(const std::string& phase, const std::string& reason, const std::string& message) {
    result_.phase = phase;
    result_.reason = reason;
    result_.message = message;
    result_.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    result_.restarts = restarts_;
    for (const auto& r : status_["restartHistory"])
      result_.restart_history.push_back({r["reason"], r["failedAtStep"], r["resumedAtStep"]});
    status_["phase"] = phase;
    if (phase == "Succeeded" || phase == "Failed") set_condition(phase, "True", reason.empty() ? phase : reason, message);
    if (!reason.empty()) status_["reason"] = reason;
    if (!message.empty()) status_["message"] = message;
    status_["completionTime"] = utc_now();
    write_status();
    report();
    return result_;
  }

  void report() {
    const LocalResult& r = result_;
    if (r.phase != "Succeeded") {
      say(detail::concat(job_.name, " ", r.phase, r.reason.empty() ? "" : " (" + r.reason + ")", " after ",
                         duration(r.seconds), ": ", r.message));
      return;
    }
    std::string line = detail::concat(job_.name, " Succeeded in ", duration(r.seconds), ": ", r.steps, " steps, ",
                                      fixed(r.samples_per_second, 2), " samples/s, restarts ", r.restarts);
    if (r.switch_step >= 0) line += detail::concat(", switched to ", spec_.communication.dense, " at step ", r.switch_step);
    say(line);
    for (const auto& h : r.restart_history)
      say(detail::concat("  restart: ", h.reason, " at step ", h.failed_at_step, "; resumed at step ", h.resumed_at_step));
    if (spec_.model.name == "cosmoflow")
      say(detail::concat("  validation MSE ", fixed(r.val_loss, 4), " vs predict-the-mean ", fixed(r.baseline_loss, 4), ": ",
                         fixed(r.val_loss / std::max(r.baseline_loss, 1e-12), 3), "x; MAE ", fixed(r.val_metric, 4)));
    else
      say(detail::concat("  validation loss ", fixed(r.val_loss, 4), ", accuracy ", fixed(r.val_metric, 4)));
  }

  static std::string fixed(double v, int digits) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
    return buf;
  }

  void say(const std::string& line) {
    std::fprintf(options_.out, "[%s] %s\n", clock_time().c_str(), line.c_str());
    std::fflush(options_.out);
  }

  // Sets the condition of `type` (as in a Kubernetes status), keeping its transition time when its
  // status does not change.
  void set_condition(const std::string& type, const std::string& value, const std::string& reason,
                     const std::string& message) {
    json* c = nullptr;
    for (auto& existing : status_["conditions"])
      if (existing["type"] == type) c = &existing;
    if (!c) {
      status_["conditions"].push_back({{"type", type}});
      c = &status_["conditions"].back();
    }
    if (!c->contains("status") || (*c)["status"] != value) (*c)["lastTransitionTime"] = utc_now();
    (*c)["status"] = value;
    (*c)["reason"] = reason;
    // Empty strings are left out, as Kubernetes API objects do (an empty string is not a valid value there).
    if (message.empty()) c->erase("message");
    else (*c)["message"] = message;
  }

  void write_status() {
    const fs::path file = fs::path(dir_) / "status.json", tmp = fs::path(dir_) / "status.json.tmp";
    {
      std::ofstream out(tmp);
      out << json{{"apiVersion", api::kApiVersion}, {"kind", api::kKind}, {"metadata", {{"name", job_.name}}},
                  {"status", status_}}
                 .dump(2)
          << "\n";
    }
    fs::rename(tmp, file);
  }

  const api::TrainingJob& job_;
  const LocalOptions& options_;
  const api::TrainingJobSpec& spec_;
  std::string dir_, token_;
  Clock::time_point start_;
  std::vector<placement::RankAssignment> plan_;
  std::unique_ptr<RendezvousService> service_;
  RendezvousJobPolicy policy_;
  int threads_ = 1, restarts_ = 0;
  int64_t last_step_ = -1;
  std::vector<Worker> workers_;
  json status_;
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
