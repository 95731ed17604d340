// tessera-worker: one rank of a training job.
//
//   tessera-worker --config job.yaml [--rank R --world-size N --node NAME --local-rank L]
//                  [--rendezvous DIR | --rendezvous grpc://HOST:PORT --replica P --slot S]
//                  [--metrics FILE] [--metrics-addr HOST:PORT] [--threads T]
//   tessera-worker --slots N --replica P ...   (a pod's entrypoint: the N ranks of pod P)
//
// With a rendezvous directory (a file store shared by all ranks), rank, world size, node and local
// rank come from the flags or from TESSERA_RANK, TESSERA_WORLD_SIZE, TESSERA_NODE,
// TESSERA_LOCAL_RANK. With the controller's rendezvous service (grpc://), the worker registers as
// process --slot of pod --replica (TESSERA_REPLICA, TESSERA_SLOT) of job TESSERA_JOB with token
// TESSERA_TOKEN and gets its rank, node and local rank from the job's ring plan. The rendezvous
// also comes from TESSERA_RENDEZVOUS. With a world of one no rendezvous is needed. With --slots N the
// process starts N workers (slots 0..N-1, the other flags passed on), forwards SIGTERM and SIGINT to
// them, and exits as soon as one fails, stopping the others, with that worker's exit status. --metrics appends one JSON line per step and per epoch (epochs counted from 1, as in the log).
// --metrics-addr (or TESSERA_METRICS_ADDR) serves the rank's Prometheus metrics at /metrics there
// (port 0: a free one; with --slots N and a port P, slot S serves on P + S) and announces the port
// at registration, so the controller lists the rank for Prometheus. Exit status: 0 done, 2 bad
// configuration, 3 training diverged (the controller does not retry it), 1 any other failure.
#include <omp.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include <atomic>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "api/training_job.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/grpc_store.h"
#include "worker/core/error.h"
#include "worker/core/log.h"
#include "worker/metrics/http_server.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/train/trainer.h"

namespace tessera {
namespace {

struct Options {
  std::string config, rendezvous, metrics, metrics_addr, node;
  int rank = 0, world = 1, local_rank = -1, threads = 0;
  int replica = 0, slot = 0;  // with the rendezvous service
  bool service() const { return rendezvous.rfind("grpc://", 0) == 0; }
};

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end) throw ConfigError(name, std::string("'") + v + "' is not an integer");
  return static_cast<int>(x);
}

std::string env_str(const char* name, const std::string& def) {
  const char* v = std::getenv(name);
  return v && *v ? v : def;
}

constexpr const char* kUsage =
    "usage: tessera-worker --config JOB.yaml [--rank R --world-size N --node NAME --local-rank L]\n"
    "                      [--rendezvous DIR | --rendezvous grpc://HOST:PORT --replica P --slot S]\n"
    "                      [--metrics FILE] [--metrics-addr HOST:PORT] [--threads T]\n"
    "       tessera-worker --slots N --replica P ...   (a pod's entrypoint: the N ranks of pod P)\n"
    "One rank of a training job. Rank, world size, node and local rank also come from TESSERA_RANK,\n"
    "TESSERA_WORLD_SIZE, TESSERA_NODE and TESSERA_LOCAL_RANK; the rendezvous from TESSERA_RENDEZVOUS.\n"
    "  --config FILE         the TrainingJob manifest (or the job configuration the controller wrote)\n"
    "  --rendezvous DIR      a directory shared by all ranks of this run (a fresh one per run)\n"
    "  --rendezvous grpc://  the controller's rendezvous service; the rank comes from its ring plan\n"
    "  --metrics FILE        append one JSON line per step and per epoch\n"
    "  --metrics-addr H:P    serve Prometheus metrics at /metrics (port 0: a free one)\n"
    "  --threads T           compute threads (default: spec.training.threads, else the cores)\n"
    "Exit status: 0 done, 2 bad configuration, 3 training diverged (not retried), 1 any other failure.\n";

Options parse(int argc, char** argv) {
  Options o;
  o.rank = env_int("TESSERA_RANK", 0);
  o.world = env_int("TESSERA_WORLD_SIZE", 1);
  o.local_rank = env_int("TESSERA_LOCAL_RANK", -1);
  o.node = env_str("TESSERA_NODE", "");
  o.rendezvous = env_str("TESSERA_RENDEZVOUS", "");
  o.replica = env_int("TESSERA_REPLICA", 0);
  o.slot = env_int("TESSERA_SLOT", 0);
  o.metrics_addr = env_str("TESSERA_METRICS_ADDR", "");
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a, "needs a value");
      return argv[++i];
    };
    auto number = [&]() {
      std::string v = value();
      char* end = nullptr;
      long x = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end) throw ConfigError(a, "'" + v + "' is not an integer");
      return static_cast<int>(x);
    };
    if (a == "--config") o.config = value();
    else if (a == "--rank") o.rank = number();
    else if (a == "--world-size") o.world = number();
    else if (a == "--local-rank") o.local_rank = number();
    else if (a == "--node") o.node = value();
    else if (a == "--rendezvous") o.rendezvous = value();
    else if (a == "--metrics") o.metrics = value();
    else if (a == "--metrics-addr") o.metrics_addr = value();
    else if (a == "--threads") o.threads = number();
    else if (a == "--replica") o.replica = number();
    else if (a == "--slot") o.slot = number();
    else if (a == "--slots") value();  // handled by run_slots
    else if (a.rfind("-", 0) != 0) throw ConfigError(a, "unexpected argument (the manifest goes after --config)");
    else throw ConfigError(a, "unknown flag (tessera-worker --help lists them)");
  }
  if (o.config.empty()) throw ConfigError("--config", "a job configuration file is required");
  if (o.world < 1) throw ConfigError("--world-size", "must be at least 1");
  if (o.rank < 0 || o.rank >= o.world) throw ConfigError("--rank", detail::concat(o.rank, " is outside [0, ", o.world, ")"));
  if (o.world > 1 && o.rendezvous.empty() && !o.service())
    throw ConfigError("--rendezvous", "needed when the world has more than one rank");
  if (o.node.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    o.node = host;
  }
  if (o.local_rank < 0) o.local_rank = o.world == 1 ? 0 : o.rank;  // all on one node by default
  return o;
}

// A rendezvous directory keeps the addresses of the ranks that met there: ranks of a later run would
// connect to peers that are gone and wait until their timeout. So each rank records itself first,
// and one that finds its rank already recorded stops at once, saying why.
void claim_rank(Store& store, const std::string& dir, int rank) {
  const std::string key = "process/" + std::to_string(rank);
  if (auto earlier = store.try_get(key))
    throw ConfigError("--rendezvous", detail::concat("'", dir, "' holds the rendezvous of an earlier run (rank ", rank,
                                                     " was ", *earlier, "); give each run a new directory, or empty this one"));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  store.set(key, detail::concat("process ", getpid(), " on ", host));
}

// An epoch's validation as the --metrics lines and the summary carry it.
nlohmann::ordered_json validation_fields(const EpochRecord& e) {
  if (!e.validated) return {{"validated", false}};
  nlohmann::ordered_json v = {{"val_loss", e.val_loss}, {"val_metric", e.val_metric}, {"baseline_loss", e.baseline_loss},
                              {"baseline_metric", e.baseline_metric}};
  if (!e.iou.empty()) v["iou"] = e.iou;
  return v;
}

std::atomic<int> g_forward_signal{0};

void on_supervisor_signal(int sig) { g_forward_signal = sig; }

// --slots N: the ranks of one pod, as child processes of this one.
int run_slots(int argc, char** argv, int slots) {
  std::vector<std::string> base;
  std::string metrics_addr = env_str("TESSERA_METRICS_ADDR", "");
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--slots" || a == "--slot" || a == "--metrics-addr") {
      if (a == "--metrics-addr" && i + 1 < argc) metrics_addr = argv[i + 1];
      ++i;
      continue;
    }
    base.push_back(a);
  }
  // Slot S serves its metrics on the pod's port + S (the ports the pod declares).
  const auto colon = metrics_addr.rfind(':');
  const int metrics_port = colon == std::string::npos ? 0 : std::atoi(metrics_addr.c_str() + colon + 1);
  std::signal(SIGTERM, on_supervisor_signal);
  std::signal(SIGINT, on_supervisor_signal);
  // The ranks end with this process, even when it is killed outright.
  setenv("TESSERA_SUPERVISOR_PID", std::to_string(getpid()).c_str(), 1);
  // Each rank writes why it failed to a file of its own; the first failure's reason is this pod's
  // last line (its termination message), after whatever the stopped ranks print.
  std::string errors = (std::filesystem::temp_directory_path() / "tessera-slots-XXXXXX").string();
  if (!mkdtemp(errors.data())) throw Error(detail::concat("cannot create a directory in ", std::filesystem::temp_directory_path()));
  std::vector<pid_t> pids;
  for (int slot = 0; slot < slots; ++slot) {
    setenv("TESSERA_ERROR_FILE", detail::concat(errors, "/slot-", slot).c_str(), 1);
    std::vector<std::string> args = {argv[0]};
    args.insert(args.end(), base.begin(), base.end());
    args.push_back("--slot");
    args.push_back(std::to_string(slot));
    if (!metrics_addr.empty()) {
      args.push_back("--metrics-addr");
      args.push_back(metrics_port > 0 ? metrics_addr.substr(0, colon + 1) + std::to_string(metrics_port + slot) : metrics_addr);
    }
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargv.data(), environ) != 0)
      throw Error(detail::concat("cannot start the worker of slot ", slot, ": ", std::strerror(errno)));
    pids.push_back(pid);
  }
  auto stop_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) kill(p, sig);
  };
  int result = 0, failed_slot = -1;
  size_t running = pids.size();
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    if (g_forward_signal && stop_deadline == std::chrono::steady_clock::time_point::max()) {
      stop_all(g_forward_signal);
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      if (result == 0) result = 128 + g_forward_signal;
    }
    if (std::chrono::steady_clock::now() > stop_deadline) stop_all(SIGKILL);
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    int slot = -1;
    for (size_t i = 0; i < pids.size(); ++i)
      if (pids[i] == done) pids[i] = -1, --running, slot = static_cast<int>(i);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && result == 0) {
      // The first failure decides the pod's exit status; the other ranks are stopped.
      result = code;
      failed_slot = slot;
      std::fprintf(stderr, "tessera-worker: slot %d of this pod ended with status %d; stopping the others\n", slot, code);
      stop_all(SIGTERM);
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
  }
  if (failed_slot >= 0) {
    std::ifstream in(detail::concat(errors, "/slot-", failed_slot));
    std::string why((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!why.empty() && why.back() == '\n') why.pop_back();
    if (why.empty()) why = result > 128 ? detail::concat("killed by signal ", result - 128, " (", strsignal(result - 128), ")")
                                        : detail::concat("exited with status ", result);
    std::fprintf(stderr, "tessera-worker: slot %d: %s\n", failed_slot, why.c_str());
    if (const char* file = std::getenv("TESSERA_TERMINATION_LOG"); file && *file)
      std::ofstream(file) << "slot " << failed_slot << ": " << why << "\n";
  }
  std::filesystem::remove_all(errors);
  return result;
}

int run(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--slots") {
      char* end = nullptr;
      const long n = std::strtol(argv[i + 1], &end, 10);
      if (*end || n < 1 || n > 1024) throw ConfigError("--slots", std::string("'") + argv[i + 1] + "' is not a count of ranks");
      return run_slots(argc, argv, static_cast<int>(n));
    }
  if (const char* sup = std::getenv("TESSERA_SUPERVISOR_PID"); sup && std::atoi(sup) == getppid())
    prctl(PR_SET_PDEATHSIG, SIGKILL);
  // A peer that vanished must fail the collective with an error naming it, not kill this rank with
  // SIGPIPE when Gloo writes to its closed socket.
  signal(SIGPIPE, SIG_IGN);
  Options o = parse(argc, argv);
  set_log_tag("rank " + std::to_string(o.rank));
  JobConfig job = load_job_config(o.config);
  // Under `tessera run`, relative checkpoint and cache paths live in the job's work directory.
  if (const char* wd = std::getenv("TESSERA_WORK_DIR"); wd && *wd) {
    job.checkpoint.path = api::under_work_dir(job.checkpoint.path, wd);
    job.data.cache.ssd_dir = api::under_work_dir(job.data.cache.ssd_dir, wd);
  }
  if (o.threads > 0) job.training.threads = o.threads;

  std::unique_ptr<Store> store;
  std::unique_ptr<CommGroups> groups;
  const Millis timeout(job.communication.timeout_ms);
  // The exporter listens before registration, which announces its port; it is destroyed (its
  // thread joined) before the metrics it serves.
  std::unique_ptr<WorkerMetrics> exported;
  std::unique_ptr<HttpServer> exporter;
  if (!o.metrics_addr.empty()) exporter = std::make_unique<HttpServer>(o.metrics_addr, "--metrics-addr");
  if (o.service()) {
    auto grpc = std::make_unique<GrpcStore>(o.rendezvous.substr(7), env_str("TESSERA_JOB", job.name),
                                            env_str("TESSERA_TOKEN", ""));
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    const auto a = grpc->register_worker(o.replica, o.slot, host, exporter ? exporter->port() : 0, timeout);
    o.rank = a.rank;
    o.world = a.world_size;
    o.node = a.node;
    o.local_rank = a.local_rank;
    set_log_tag("rank " + std::to_string(o.rank));
    store = std::move(grpc);
  }
  // Ranks that are not the job's workers would wait for each other until the timeout: say so now.
  if (o.world != job.workers)
    throw ConfigError(o.service() ? "spec.replicas" : "--world-size",
                      detail::concat(detail::count(o.world, "rank"), " but the job has ", detail::count(job.workers, "worker"),
                                     " (spec.replicas x spec.ranksPerReplica)"));
  if (o.world > 1) {
    if (!store) {
      store = std::make_unique<FileStore>(o.rendezvous);
      claim_rank(*store, o.rendezvous, o.rank);
    }
    Topology topo = Topology::discover(*store, o.rank, o.world, RankPlacement{o.node, o.local_rank}, timeout);
    groups = std::make_unique<CommGroups>(
        connect_groups(*store, std::move(topo), o.rank, gloo_factory(timeout), job.model.spatial.size()));
  }
  Trainer trainer(job, groups.get());
  std::unique_ptr<ControlAgent> control;
  if (o.service()) {
    control = std::make_unique<ControlAgent>(o.rendezvous.substr(7), env_str("TESSERA_JOB", job.name),
                                             env_str("TESSERA_TOKEN", ""), o.rank, timeout);
    trainer.set_control(control.get());
  }
  if (exporter) {
    // TESSERA_JOB is the job's key, "namespace/name", under a controller.
    WorkerIdentity who;
    const std::string key = env_str("TESSERA_JOB", "");
    const auto slash = key.find('/');
    who.job = slash == std::string::npos ? job.name : key.substr(slash + 1);
    who.namespace_ = slash == std::string::npos ? env_str("TESSERA_NAMESPACE", "default") : key.substr(0, slash);
    who.rank = o.rank;
    who.node = o.node;
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    who.pod = env_str("TESSERA_POD", host);
    exported = std::make_unique<WorkerMetrics>(who);
    exporter->handle("/metrics", [m = exported.get()] {
      return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", m->text()};
    });
    log_info("metrics at http://", o.metrics_addr.substr(0, o.metrics_addr.rfind(':')), ":", exporter->port(), "/metrics");
  }
  const double rank_samples = static_cast<double>(job.training.batch_size) / o.world;
  std::ofstream metrics;
  if (!o.metrics.empty()) {
    metrics.open(o.metrics, std::ios::app);
    if (!metrics) throw Error("cannot open metrics file '" + o.metrics + "'");
  }
  trainer.on_step = [&](const StepRecord& r) {
    if (exported) exported->observe(r, rank_samples, trainer.cache());
    if (!metrics.is_open()) return;
    char line[512];
    std::snprintf(line, sizeof(line),
                  "{\"type\":\"step\",\"rank\":%d,\"step\":%lld,\"epoch\":%d,\"loss\":%.9g,\"lr\":%.6g,\"strategy\":\"%s\","
                  "\"data_s\":%.6f,\"forward_s\":%.6f,\"backward_s\":%.6f,\"comm_s\":%.6f,\"comm_total_s\":%.6f,\"select_s\":%.6f,\"update_s\":%.6f,"
                  "\"bytes_intra\":%llu,\"bytes_inter\":%llu}\n",
                  o.rank, static_cast<long long>(r.step), r.epoch + 1, r.loss, r.lr, r.strategy.c_str(), r.data_s, r.forward_s,
                  r.backward_s, r.comm_s, r.comm_total_s, r.select_s, r.update_s, static_cast<unsigned long long>(r.bytes_intra),
                  static_cast<unsigned long long>(r.bytes_inter));
    metrics << line << std::flush;
  };
  trainer.on_epoch = [&](const EpochRecord& e) {
    if (!metrics.is_open()) return;
    nlohmann::ordered_json line = {{"type", "epoch"}, {"rank", o.rank}, {"epoch", e.epoch}};
    line.update(validation_fields(e));
    metrics << line.dump() << "\n" << std::flush;
  };
  TrainSummary s = trainer.run();
  if (o.rank == 0) {
    nlohmann::ordered_json summary = {{"type", "summary"},      {"job", job.name},
                                      {"steps", s.steps},        {"first_step", s.first_step},
                                      {"seconds", s.seconds},    {"samples_per_second", s.samples_per_second},
                                      {"switch_step", s.switch_step}};
    summary.update(validation_fields(s.last_epoch));
    const std::string line = summary.dump() + "\n";
    std::fputs(line.c_str(), stdout);
    // In a pod: the summary is the container's termination message, which the controller reads.
    if (const char* file = std::getenv("TESSERA_TERMINATION_LOG"); file && *file) std::ofstream(file) << line;
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::keep_freed_tensor_memory();
  return tessera::run_command("tessera-worker", [&] {
    try {
      return tessera::run(argc, argv);
    } catch (const std::exception& e) {
      // A rank of a pod tells its supervisor why it failed (see run_slots).
      if (const char* file = std::getenv("TESSERA_ERROR_FILE"); file && *file) std::ofstream(file) << e.what() << "\n";
      throw;
    }
  });
}
