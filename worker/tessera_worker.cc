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
// process is the pod's supervisor (worker/pod/supervisor.h): it starts N workers (slots 0..N-1, the
// other flags passed on), forwards SIGTERM and SIGINT to them, and exits as soon as one fails,
// stopping the others, with that worker's exit status. --metrics appends one JSON line per step and
// per epoch (epochs counted from 1, as in the log).
// --metrics-addr (or TESSERA_METRICS_ADDR) serves the rank's Prometheus metrics at /metrics there
// (port 0: a free one; with --slots N and a port P, slot S serves on P + S) and announces the port
// at registration, so the controller lists the rank for Prometheus. Exit status: 0 done, 2 bad
// configuration, 3 training diverged (the controller does not retry it), 4 stopped on SIGTERM (the
// gang checkpointed the step it agreed on), 1 any other failure.
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/training_job.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/http_server.h"
#include "common/log.h"
#include "tessera/config.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/grpc_store.h"
#if TESSERA_HAVE_NCCL
#include "worker/comm/nccl/nccl_communicator.h"
#endif
#include "worker/metrics/worker_metrics.h"
#include "worker/pod/supervisor.h"
#include "worker/train/trainer.h"

namespace tessera {
namespace {

struct Options {
  std::string config, rendezvous, metrics, metrics_addr, node;
  int rank = 0, world = 1, local_rank = -1, threads = 0;
  int replica = 0, slot = 0;  // with the rendezvous service
  int slots = 0;              // > 0: a pod's entrypoint, starting that many ranks
  // The pod's environment (the reconcile sets it, on a cluster and under tessera run alike).
  std::string job_key, token, pod, namespace_, work_dir, termination_log;
  bool service() const { return rendezvous.rfind("grpc://", 0) == 0; }
};

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
    "  --slots N             start the N ranks of pod --replica P (slots 0..N-1) and supervise them\n"
    "  --metrics FILE        append one JSON line per step and per epoch\n"
    "  --metrics-addr H:P    serve Prometheus metrics at /metrics (port 0: a free one)\n"
    "  --threads T           compute threads (default: spec.training.threads, else the cores)\n"
    "Exit status: 0 done, 2 bad configuration, 3 training diverged (not retried), 4 stopped on SIGTERM\n"
    "after the gang checkpointed one agreed step, 1 any other failure.\n";

constexpr int kMaxRanks = 65536;

std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Empty when --help was asked for (the usage is printed).
std::optional<Options> parse(int argc, char** argv) {
  Options o;
  Flags flags("tessera-worker", kUsage);
  flags.text("--config", &o.config)
      .integer("--rank", &o.rank, 0, kMaxRanks - 1, "TESSERA_RANK")
      .integer("--world-size", &o.world, 1, kMaxRanks, "TESSERA_WORLD_SIZE")
      .integer("--local-rank", &o.local_rank, 0, kMaxRanks - 1, "TESSERA_LOCAL_RANK")
      .text("--node", &o.node, "TESSERA_NODE")
      .text("--rendezvous", &o.rendezvous, "TESSERA_RENDEZVOUS")
      .text("--metrics", &o.metrics)
      .text("--metrics-addr", &o.metrics_addr, "TESSERA_METRICS_ADDR")
      .integer("--threads", &o.threads, 1, 1024)
      .integer("--replica", &o.replica, 0, kMaxRanks - 1, "TESSERA_REPLICA")
      .integer("--slot", &o.slot, 0, 1023, "TESSERA_SLOT")
      .integer("--slots", &o.slots, 1, 1024);
  if (!flags.parse(argc, argv)) return std::nullopt;
  o.job_key = env_value("TESSERA_JOB").value_or("");
  o.token = env_value("TESSERA_TOKEN").value_or("");
  o.pod = env_value("TESSERA_POD").value_or("");
  o.namespace_ = env_value("TESSERA_NAMESPACE").value_or("default");
  o.work_dir = env_value("TESSERA_WORK_DIR").value_or("");
  o.termination_log = env_value("TESSERA_TERMINATION_LOG").value_or("");
  if (o.config.empty()) throw ConfigError("--config", "a job configuration file is required");
  if (o.slots > 0) return o;  // the ranks check the rest
  if (o.rank >= o.world) throw ConfigError("--rank", detail::concat(o.rank, " is outside [0, ", o.world, ")"));
  if (o.world > 1 && o.rendezvous.empty() && !o.service())
    throw ConfigError("--rendezvous", "needed when the world has more than one rank");
  if (o.node.empty()) {
    o.node = host_name();
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
    throw ConfigError("--rendezvous",
                      detail::concat("'", dir, "' holds the rendezvous of an earlier run (rank ", rank, " was ",
                                     *earlier, "); give each run a new directory, or empty this one"));
  store.set(key, detail::concat("process ", getpid(), " on ", host_name()));
}

// An epoch's validation as the --metrics lines and the summary carry it.
nlohmann::ordered_json validation_fields(const EpochRecord& e) {
  if (!e.validated) return {{"validated", false}};
  nlohmann::ordered_json v = {{"val_loss", e.val_loss},
                              {"val_metric", e.val_metric},
                              {"baseline_loss", e.baseline_loss},
                              {"baseline_metric", e.baseline_metric}};
  if (e.val_top5 >= 0) v["val_top5"] = e.val_top5;
  if (!e.iou.empty()) v["iou"] = e.iou;
  return v;
}

// A rank's stop request (SIGTERM or SIGINT once it trains): the gang agrees on a step, checkpoints
// it and exits with kExitStopped.
std::atomic<bool> g_stop{false};
void on_rank_signal(int) { g_stop = true; }

// The pod's ranks (--slots N): tessera-worker itself, each as process --slot S of pod --replica P,
// the other flags passed on. Slot S serves its metrics on the pod's port + S (the ports the pod
// declares).
PodOptions pod_options(const char* argv0, const Options& o) {
  PodOptions pod;
  pod.slots = o.slots;
  pod.replica = o.replica;
  pod.program = "/proc/self/exe";
  pod.rank_args = [o, argv0 = std::string(argv0)](int slot) {
    std::vector<std::string> args = {argv0,    "--config",          o.config, "--replica", std::to_string(o.replica),
                                     "--slot", std::to_string(slot)};
    for (const auto& [flag, value] : {std::pair{"--rendezvous", o.rendezvous}, {"--metrics", o.metrics}})
      if (!value.empty()) args.insert(args.end(), {flag, value});
    if (o.threads > 0) args.insert(args.end(), {"--threads", std::to_string(o.threads)});
    if (!o.metrics_addr.empty()) {
      const auto colon = o.metrics_addr.rfind(':');
      const int port =
          colon == std::string::npos ? 0 : static_cast<int>(parse_int(o.metrics_addr.substr(colon + 1)).value_or(0));
      args.push_back("--metrics-addr");
      args.push_back(port > 0 ? o.metrics_addr.substr(0, colon + 1) + std::to_string(port + slot) : o.metrics_addr);
    }
    return args;
  };
  if (o.service()) {
    pod.rendezvous = o.rendezvous.substr(7);
    pod.job_key = o.job_key;
    pod.token = o.token;
  }
  pod.termination_log = o.termination_log;
  pod.grace = std::chrono::seconds(env_int("TESSERA_GRACE_SECONDS", 30, 1, 86400));
  pod.restart_wait = std::chrono::seconds(env_int("TESSERA_RESTART_WAIT_SECONDS", 120, 1, 86400));
  return pod;
}

// The job as this rank runs it: under `tessera run`, relative checkpoint and cache paths live in
// the job's work directory; --threads overrides spec.training.threads.
JobConfig read_job(const Options& o) {
  JobConfig job = load_job_config(o.config);
  if (!o.work_dir.empty()) {
    job.checkpoint.path = api::under_work_dir(job.checkpoint.path, o.work_dir);
    job.data.cache.ssd_dir = api::under_work_dir(job.data.cache.ssd_dir, o.work_dir);
  }
  if (o.threads > 0) job.training.threads = o.threads;
  return job;
}

// The rank's place in the gang and its communicators (members destroyed in reverse order: the
// groups before the stores they met in).
struct Gang {
  std::unique_ptr<Store> store;
  std::unique_ptr<CommGroups> groups, device_groups;  // null for a world of one; device: NCCL's
  std::unique_ptr<Store> nccl_store;
};

// Meets the gang: registers with the controller's rendezvous (which gives `o` its rank, world, node
// and local rank; `metrics_port` is announced) or claims the rank in a rendezvous directory, then
// connects the Gloo groups and, for gradients in GPU memory, NCCL's over the same ranks.
Gang meet(Options& o, const JobConfig& job, int metrics_port) {
  Gang g;
  const Millis timeout(job.communication.timeout_ms);
  if (o.service()) {
    auto grpc = std::make_unique<GrpcStore>(o.rendezvous.substr(7), o.job_key.empty() ? job.name : o.job_key, o.token);
    const auto a = grpc->register_worker(o.replica, o.slot, host_name(), metrics_port, timeout);
    o.rank = a.rank;
    o.world = a.world_size;
    o.node = a.node;
    o.local_rank = a.local_rank;
    set_log_tag("rank " + std::to_string(o.rank));
    g.store = std::move(grpc);
  }
  // Ranks that are not the job's workers would wait for each other until the timeout: say so now.
  // (An elastic job's gang may be smaller: whole spatial groups, at least spec.elastic.minReplicas.)
  if (!api::gang_size_fits(o.world, job.workers, job.min_workers, job.model.spatial.size()))
    throw ConfigError(o.service() ? "spec.replicas" : "--world-size",
                      detail::concat(detail::count(o.world, "rank"), " but the job has ",
                                     detail::count(job.workers, "worker"), " (spec.replicas x spec.ranksPerReplica)"));
  if (o.world == 1) return g;
  if (!g.store) {
    g.store = std::make_unique<FileStore>(o.rendezvous);
    claim_rank(*g.store, o.rendezvous, o.rank);
  }
  Topology topo = Topology::discover(*g.store, o.rank, o.world, RankPlacement{o.node, o.local_rank}, timeout);
  g.groups = std::make_unique<CommGroups>(
      connect_groups(*g.store, topo, o.rank, gloo_factory(timeout), job.model.spatial.size()));
  // Gradients in GPU memory: NCCL groups over the same ranks, met under their own keys.
  if (resolve_transport(job, resolve_device(job)) == "nccl") {
#if TESSERA_HAVE_NCCL
    gpu::set_device(rank_gpu_ordinal());
    g.nccl_store = std::make_unique<PrefixStore>("nccl", *g.store);
    g.device_groups = std::make_unique<CommGroups>(connect_groups(*g.nccl_store, std::move(topo), o.rank,
                                                                  nccl_factory(timeout, gpu::current_device()),
                                                                  job.model.spatial.size()));
#endif
  }
  return g;
}

// The rank's Prometheus metrics, served at /metrics of `exporter`. TESSERA_JOB is the job's key,
// "namespace/name", under a controller.
std::unique_ptr<WorkerMetrics> export_metrics(HttpServer& exporter, const Options& o, const JobConfig& job) {
  WorkerIdentity who;
  const std::string& key = o.job_key;
  const auto slash = key.find('/');
  who.job = slash == std::string::npos ? job.name : key.substr(slash + 1);
  who.namespace_ = slash == std::string::npos ? o.namespace_ : key.substr(0, slash);
  who.rank = o.rank;
  who.node = o.node;
  who.pod = o.pod.empty() ? host_name() : o.pod;
  auto exported = std::make_unique<WorkerMetrics>(who);
  exporter.handle("/metrics", [m = exported.get()] {
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", m->text()};
  });
  log_info("metrics at http://", o.metrics_addr.substr(0, o.metrics_addr.rfind(':')), ":", exporter.port(), "/metrics");
  return exported;
}

// --metrics FILE: a JSON line per step and per epoch, appended.
class MetricsFile {
 public:
  MetricsFile(const std::string& path, int rank) : rank_(rank) {
    if (path.empty()) return;
    out_.open(path, std::ios::app);
    if (!out_) throw Error("cannot open metrics file '" + path + "'");
  }
  void step(const StepRecord& r) {
    if (!out_.is_open()) return;
    char line[640];
    std::snprintf(
        line, sizeof(line),
        "{\"type\":\"step\",\"rank\":%d,\"step\":%lld,\"epoch\":%d,\"loss\":%.9g,\"lr\":%.6g,\"strategy\":\"%s\","
        "\"global_batch\":%lld,\"micro_batches\":%d,"
        "\"data_s\":%.6f,\"forward_s\":%.6f,\"backward_s\":%.6f,\"comm_s\":%.6f,\"comm_total_s\":%.6f,\"select_s\":%."
        "6f,"
        "\"update_s\":%.6f,\"bytes_intra\":%llu,\"bytes_inter\":%llu}\n",
        rank_, static_cast<long long>(r.step), r.epoch + 1, r.loss, r.lr, r.strategy.c_str(),
        static_cast<long long>(r.global_batch), r.micro_batches, r.data_s, r.forward_s, r.backward_s, r.comm_s,
        r.comm_total_s, r.select_s, r.update_s, static_cast<unsigned long long>(r.bytes_intra),
        static_cast<unsigned long long>(r.bytes_inter));
    out_ << line << std::flush;
  }
  void epoch(const EpochRecord& e) {
    if (!out_.is_open()) return;
    nlohmann::ordered_json line = {{"type", "epoch"}, {"rank", rank_}, {"epoch", e.epoch}};
    line.update(validation_fields(e));
    out_ << line.dump() << "\n" << std::flush;
  }

 private:
  int rank_;
  std::ofstream out_;
};

// How the run ended, as the pod tells it: a stop on SIGTERM (kExitStopped, its reason to the
// supervisor or the termination log), or rank 0's summary line (stdout and the termination log,
// which the controller reads).
int report_end(const TrainSummary& s, const Options& o, const JobConfig& job) {
  if (s.stopped) {
    const std::string why = detail::concat(
        "stopped at step ", s.steps, " on SIGTERM, every rank at the same step; ",
        s.checkpointed ? detail::concat("the checkpoint of step ", s.steps, " is written")
                       : std::string("no checkpoint (spec.checkpoint.path is not set): the next run starts at step 0"));
    log_info(why);
    if (!tell_supervisor(why) && !o.termination_log.empty()) std::ofstream(o.termination_log) << why << "\n";
    return kExitStopped;
  }
  if (o.rank != 0) return 0;
  nlohmann::ordered_json summary = {
      {"type", "summary"},           {"job", job.name},      {"steps", s.steps},
      {"first_step", s.first_step},  {"seconds", s.seconds}, {"samples_per_second", s.samples_per_second},
      {"switch_step", s.switch_step}};
  if (!s.exchange.empty()) summary["exchange"] = s.exchange;  // strategy auto: the last choice
  summary.update(validation_fields(s.last_epoch));
  const std::string line = summary.dump() + "\n";
  std::fputs(line.c_str(), stdout);
  if (!o.termination_log.empty()) std::ofstream(o.termination_log) << line;
  return 0;
}

int run(int argc, char** argv) {
  const std::optional<Options> parsed = parse(argc, argv);
  if (!parsed) return 0;
  Options o = *parsed;
  if (o.slots > 0) {
    log_info("pod replica ", o.replica, ": starting ", detail::count(o.slots, "rank"), " (tessera-worker --slots ",
             o.slots, ")");
    return supervise_pod(pod_options(argv[0], o));
  }
  if (supervised()) prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (const auto gpu = env_value("TESSERA_GPU"))
    log_info("slot ", o.slot, ": GPU ", *gpu, " of this pod's GPUs ",
             env_value("NVIDIA_VISIBLE_DEVICES").value_or("?"));
  // A peer that vanished must fail the collective with an error naming it, not kill this rank with
  // SIGPIPE when Gloo writes to its closed socket.
  signal(SIGPIPE, SIG_IGN);
  set_log_tag("rank " + std::to_string(o.rank));
  const JobConfig job = read_job(o);
  // The exporter listens before registration, which announces its port; it is destroyed (its
  // thread joined) before the metrics it serves.
  std::unique_ptr<WorkerMetrics> exported;
  std::unique_ptr<HttpServer> exporter;
  if (!o.metrics_addr.empty()) exporter = std::make_unique<HttpServer>(o.metrics_addr, "--metrics-addr");
  Gang gang = meet(o, job, exporter ? exporter->port() : 0);
  Trainer trainer(job, gang.groups.get(), gang.device_groups.get());
  std::unique_ptr<ControlAgent> control;
  if (o.service()) {
    control = std::make_unique<ControlAgent>(o.rendezvous.substr(7), o.job_key.empty() ? job.name : o.job_key, o.token,
                                             o.rank, Millis(job.communication.timeout_ms));
    trainer.set_control(control.get());
  }
  if (exporter) exported = export_metrics(*exporter, o, job);
  const double rank_samples = static_cast<double>(job.training.batch_size) / o.world;
  MetricsFile metrics(o.metrics, o.rank);
  trainer.on_step = [&](const StepRecord& r) {
    if (exported) exported->observe(r, rank_samples, trainer.cache(), trainer.sample_cache());
    metrics.step(r);
  };
  trainer.on_epoch = [&](const EpochRecord& e) { metrics.epoch(e); };
  // From here a SIGTERM (a drained or reclaimed node, a deleted pod) asks the gang to checkpoint and
  // stop; before, it ends the process, which holds nothing to save.
  trainer.set_stop_flag(&g_stop);
  std::signal(SIGTERM, on_rank_signal);
  std::signal(SIGINT, on_rank_signal);
  return report_end(trainer.run(), o, job);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::keep_freed_tensor_memory();
  return tessera::run_command("tessera-worker", [&] {
    try {
      return tessera::run(argc, argv);
    } catch (const std::exception& e) {
      tessera::tell_supervisor(e.what());
      throw;
    }
  });
}
