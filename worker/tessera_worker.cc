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
// configuration, 3 training diverged (the controller does not retry it), 4 stopped on SIGTERM (the
// gang checkpointed the step it agreed on), 1 any other failure.
#include <fcntl.h>
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
#include <limits>
#include <optional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "api/training_job.h"
#include "tessera/config.h"
#include "worker/comm/gloo/gloo_communicator.h"
#if TESSERA_HAVE_NCCL
#include "worker/comm/nccl/nccl_communicator.h"
#endif
#include "worker/comm/grpc_store.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/process.h"
#include "common/http_server.h"
#include "worker/metrics/worker_metrics.h"
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
  if (e.val_top5 >= 0) v["val_top5"] = e.val_top5;
  if (!e.iou.empty()) v["iou"] = e.iou;
  return v;
}

std::atomic<int> g_forward_signal{0};
// A rank's stop request (SIGTERM or SIGINT once it trains): the gang agrees on a step, checkpoints
// it and exits with kExitStopped.
std::atomic<bool> g_stop{false};
void on_rank_signal(int) { g_stop = true; }

// A rank of a pod tells its supervisor why it ended (see run_slots), at most 4 KiB of it; false when
// it has no supervisor.
bool tell_supervisor(const std::string& why) {
  const auto supervisor = parse_int(env_value("TESSERA_SUPERVISOR_PID").value_or(""));
  const auto fd = parse_int(env_value("TESSERA_ERROR_FD").value_or(""));
  if (!fd || !supervisor || *supervisor != getppid()) return false;
  const std::string line = why.substr(0, 4096) + "\n";
  [[maybe_unused]] const ssize_t n = write(static_cast<int>(*fd), line.data(), line.size());
  return true;
}

// The descriptor a rank of a pod writes why it failed to (see run_slots).
constexpr int kErrorFd = 3;

void on_supervisor_signal(int sig) { g_forward_signal = sig; }

// The arguments of the rank in `slot` of the pod that `o` describes.
std::vector<std::string> slot_args(const Options& o, int slot) {
  std::vector<std::string> args = {"--config", o.config, "--replica", std::to_string(o.replica), "--slot", std::to_string(slot)};
  for (const auto& [flag, value] : {std::pair{"--rendezvous", o.rendezvous}, {"--metrics", o.metrics}})
    if (!value.empty()) args.insert(args.end(), {flag, value});
  if (o.threads > 0) args.insert(args.end(), {"--threads", std::to_string(o.threads)});
  return args;
}

// The device IDs in NVIDIA_VISIBLE_DEVICES (or CUDA_VISIBLE_DEVICES), in order; none for "all",
// "none", "void" or an unset variable.
std::vector<std::string> visible_gpus() {
  std::optional<std::string> v = env_value("NVIDIA_VISIBLE_DEVICES");
  if (!v || v->empty()) v = env_value("CUDA_VISIBLE_DEVICES");
  std::vector<std::string> ids;
  if (!v || *v == "all" || *v == "none" || *v == "void") return ids;
  std::stringstream in(*v);
  for (std::string id; std::getline(in, id, ',');)
    if (!id.empty()) ids.push_back(id);
  return ids;
}

// The ranks of a pod, as child processes of its supervisor: their pids and the read end of each
// one's error pipe (what it wrote on failing).
struct Ranks {
  std::vector<pid_t> pids;
  std::vector<int> errors;
  ~Ranks() {
    for (int fd : errors) close(fd);
  }
  void signal_all(int sig) const {
    for (pid_t p : pids)
      if (p > 0) kill(p, sig);
  }
};

// Starts the pod's ranks (slots 0..N-1), the other flags passed on.
std::unique_ptr<Ranks> start_ranks(const char* argv0, const Options& o, const std::vector<std::string>& gpus) {
  const std::string& metrics_addr = o.metrics_addr;
  // Slot S serves its metrics on the pod's port + S (the ports the pod declares).
  const auto colon = metrics_addr.rfind(':');
  const int metrics_port = colon == std::string::npos ? 0 : static_cast<int>(parse_int(metrics_addr.substr(colon + 1)).value_or(0));
  auto ranks = std::make_unique<Ranks>();
  for (int slot = 0; slot < o.slots; ++slot) {
    if (!gpus.empty()) {
      // The pod's GPU IDs, and which of the devices this process sees (the runtime numbers them 0..n-1).
      setenv("TESSERA_GPU", gpus[slot % gpus.size()].c_str(), 1);
      setenv("TESSERA_GPU_INDEX", std::to_string(slot % gpus.size()).c_str(), 1);
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw Error(detail::concat("cannot make a pipe for slot ", slot, ": ", std::strerror(errno)));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], kErrorFd);  // the copy keeps no close-on-exec
    std::vector<std::string> args = {argv0};
    const auto rank_args = slot_args(o, slot);
    args.insert(args.end(), rank_args.begin(), rank_args.end());
    if (!metrics_addr.empty()) {
      args.push_back("--metrics-addr");
      args.push_back(metrics_port > 0 ? metrics_addr.substr(0, colon + 1) + std::to_string(metrics_port + slot) : metrics_addr);
    }
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, cargv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (spawned != 0) {
      close(fds[0]);
      ranks->signal_all(SIGKILL);
      throw Error(detail::concat("cannot start the worker of slot ", slot, ": ", std::strerror(spawned)));
    }
    ranks->pids.push_back(pid);
    ranks->errors.push_back(fds[0]);
  }
  return ranks;
}

// How a pod's ranks ended: the first failure's status and slot (and what it wrote); kExitStopped
// when they stopped on request, each after the checkpoint of the step the gang agreed on; or a new
// round of the gang, which they were stopped for.
struct RanksEnd {
  int status = 0, slot = -1;
  std::string why;
  bool new_round = false;
};

// Waits for the ranks to end. A failed rank ends the others at once (SIGKILL: the gang starts again
// from its newest checkpoint in any case); SIGTERM to the pod is passed on and gives them the grace
// period to agree on a step and checkpoint it; a round later than `round` (the controller restarts
// the gang in place) ends them at once.
RanksEnd wait_ranks(Ranks& ranks, const std::atomic<int64_t>& latest_round, int64_t round) {
  using SteadyClock = std::chrono::steady_clock;
  const auto grace = std::chrono::seconds(env_int("TESSERA_GRACE_SECONDS", 30, 1, 86400));
  RanksEnd end;
  size_t running = ranks.pids.size();
  auto stop_deadline = SteadyClock::time_point::max();
  bool forwarded = false;
  while (running > 0) {
    if (g_forward_signal && !forwarded) {
      forwarded = true;
      ranks.signal_all(g_forward_signal);
      stop_deadline = std::min(stop_deadline, SteadyClock::now() + grace);
    }
    if (!end.new_round && round >= 0 && latest_round.load() > round && !forwarded) {
      end.new_round = true;
      ranks.signal_all(SIGKILL);
    }
    if (SteadyClock::now() > stop_deadline) ranks.signal_all(SIGKILL);
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done <= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    int slot = -1;
    for (size_t i = 0; i < ranks.pids.size(); ++i)
      if (ranks.pids[i] == done) ranks.pids[i] = -1, --running, slot = static_cast<int>(i);
    if (slot < 0) continue;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (end.new_round) continue;
    if (code == kExitStopped && end.status == 0) {
      // The gang agreed to stop: the other ranks stop at the same step, after their checkpoints.
      end.status = code;
      end.slot = slot;
      stop_deadline = std::min(stop_deadline, SteadyClock::now() + grace);
    } else if (code != 0 && code != kExitStopped && (end.status == 0 || end.status == kExitStopped)) {
      // The first failure decides the pod's exit status; the other ranks are ended.
      end.status = code;
      end.slot = slot;
      std::fprintf(stderr, "tessera-worker: slot %d of this pod ended with status %d; stopping the others\n", slot, code);
      ranks.signal_all(SIGKILL);
    }
  }
  if (end.slot >= 0) {
    // The slot has ended: its pipe holds what it wrote, then end of file.
    char buf[4096];
    for (ssize_t n; (n = read(ranks.errors[end.slot], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR);)
      if (n > 0) end.why.append(buf, static_cast<size_t>(n));
    while (!end.why.empty() && end.why.back() == '\n') end.why.pop_back();
    if (end.why.empty()) end.why = Process::describe(end.status);
  }
  return end;
}

// Whether a gang whose rank ended with `status` may start again in place: not for a configuration
// error or a diverged run (the controller fails the job), nor a stop (the gang moves).
bool restartable(int status) {
  return status != 0 && status != kExitConfigError && status != kExitDiverged && status != kExitStopped;
}

// --slots N: the ranks of one pod, as child processes of this one.
int run_slots(const char* argv0, const Options& o) {
  std::signal(SIGTERM, on_supervisor_signal);
  std::signal(SIGINT, on_supervisor_signal);
  // The ranks end with this process, even when it is killed outright.
  setenv("TESSERA_SUPERVISOR_PID", std::to_string(getpid()).c_str(), 1);
  // Each rank writes why it failed to a pipe of its own (its descriptor kErrorFd): the first
  // failure's reason is this pod's last line (its termination message), after whatever the stopped
  // ranks print. A pipe, not a file: a pod's root file system is read-only.
  setenv("TESSERA_ERROR_FD", std::to_string(kErrorFd).c_str(), 1);
  // The GPUs the pod was given (NVIDIA_VISIBLE_DEVICES, as NVIDIA's device plugin sets it; else
  // CUDA_VISIBLE_DEVICES): slot S takes the S-th, and says so.
  const std::vector<std::string> gpus = visible_gpus();
  if (!gpus.empty() && static_cast<int>(gpus.size()) < o.slots)
    log_warn("this pod was given ", detail::count(static_cast<int>(gpus.size()), "GPU"), " for ", detail::count(o.slots, "rank"),
             ": ranks share them");
  // Restarts in place (under the controller's rendezvous): a failed rank is reported and the pod
  // waits for the gang's next round, then starts its ranks again; the ranks of a pod whose own did
  // not fail are restarted when the round begins. The controller chooses (spec.runPolicy.
  // restartInPlace): it may instead replace the pods, which ends this one.
  std::unique_ptr<GrpcStore> control;
  int64_t round = -1;
  std::atomic<int64_t> latest_round{-1};
  std::atomic<bool> done{false};
  std::thread watcher;
  if (o.service()) {
    control = std::make_unique<GrpcStore>(o.rendezvous.substr(7), o.job_key, o.token);
    round = control->await_round(-1, std::chrono::seconds(10)).value_or(-1);
    latest_round = round;
    if (round < 0) {
      log_warn("the controller's rendezvous did not answer: a failed rank fails this pod (no restart in place)");
    } else {
      watcher = std::thread([&] {
        while (!done)
          if (const auto r = control->await_round(latest_round.load(), std::chrono::seconds(1)); r && *r > latest_round.load())
            latest_round = *r;
          else if (!r)
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
      });
    }
  }
  struct JoinWatcher {
    std::atomic<bool>& done;
    std::thread& t;
    ~JoinWatcher() {
      done = true;
      if (t.joinable()) t.join();
    }
  } join_watcher{done, watcher};
  // How long a pod whose rank failed waits for the controller to restart the gang in place.
  const auto restart_wait = std::chrono::seconds(env_int("TESSERA_RESTART_WAIT_SECONDS", 120, 1, 86400));
  for (;;) {
    RanksEnd end;
    {
      std::unique_ptr<Ranks> ranks = start_ranks(argv0, o, gpus);
      end = wait_ranks(*ranks, latest_round, round);
    }
    if (end.new_round) {
      round = latest_round;
      log_info("the gang restarts in place (round ", round, "): starting this pod's ", detail::count(o.slots, "rank"), " again");
      continue;
    }
    if (end.slot >= 0) std::fprintf(stderr, "tessera-worker: slot %d: %s\n", end.slot, end.why.c_str());
    if (round >= 0 && restartable(end.status) && !g_forward_signal) {
      if (control->report_exit(o.replica, end.slot, end.status, end.why, round, std::chrono::seconds(10))) {
        const auto until = std::chrono::steady_clock::now() + restart_wait;
        while (latest_round.load() <= round && !g_forward_signal && std::chrono::steady_clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (latest_round.load() > round && !g_forward_signal) {
          round = latest_round;
          log_info("the gang restarts in place (round ", round, "): starting this pod's ", detail::count(o.slots, "rank"), " again");
          continue;
        }
      }
    }
    if (end.slot >= 0 && !o.termination_log.empty()) std::ofstream(o.termination_log) << "slot " << end.slot << ": " << end.why << "\n";
    return end.status;
  }
}

int run(int argc, char** argv) {
  const std::optional<Options> parsed = parse(argc, argv);
  if (!parsed) return 0;
  Options o = *parsed;
  if (o.slots > 0) {
    log_info("pod replica ", o.replica, ": starting ", detail::count(o.slots, "rank"), " (tessera-worker --slots ", o.slots, ")");
    return run_slots(argv[0], o);
  }
  if (env_int("TESSERA_SUPERVISOR_PID", 0, 0, std::numeric_limits<int>::max()) == getppid()) prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (const auto gpu = env_value("TESSERA_GPU"))
    log_info("slot ", o.slot, ": GPU ", *gpu, " of this pod's GPUs ", env_value("NVIDIA_VISIBLE_DEVICES").value_or("?"));
  // A peer that vanished must fail the collective with an error naming it, not kill this rank with
  // SIGPIPE when Gloo writes to its closed socket.
  signal(SIGPIPE, SIG_IGN);
  set_log_tag("rank " + std::to_string(o.rank));
  JobConfig job = load_job_config(o.config);
  // Under `tessera run`, relative checkpoint and cache paths live in the job's work directory.
  if (!o.work_dir.empty()) {
    job.checkpoint.path = api::under_work_dir(job.checkpoint.path, o.work_dir);
    job.data.cache.ssd_dir = api::under_work_dir(job.data.cache.ssd_dir, o.work_dir);
  }
  if (o.threads > 0) job.training.threads = o.threads;

  std::unique_ptr<Store> store;
  std::unique_ptr<CommGroups> groups, device_groups;
  std::unique_ptr<Store> nccl_store;
  const Millis timeout(job.communication.timeout_ms);
  // The exporter listens before registration, which announces its port; it is destroyed (its
  // thread joined) before the metrics it serves.
  std::unique_ptr<WorkerMetrics> exported;
  std::unique_ptr<HttpServer> exporter;
  if (!o.metrics_addr.empty()) exporter = std::make_unique<HttpServer>(o.metrics_addr, "--metrics-addr");
  if (o.service()) {
    auto grpc = std::make_unique<GrpcStore>(o.rendezvous.substr(7), o.job_key.empty() ? job.name : o.job_key, o.token);
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
  // (An elastic job's gang may be smaller: whole spatial groups, at least spec.elastic.minReplicas.)
  const bool elastic_world = job.min_workers > 0 && o.world >= job.min_workers && o.world <= job.workers &&
                             o.world % job.model.spatial.size() == 0;
  if (o.world != job.workers && !elastic_world)
    throw ConfigError(o.service() ? "spec.replicas" : "--world-size",
                      detail::concat(detail::count(o.world, "rank"), " but the job has ", detail::count(job.workers, "worker"),
                                     " (spec.replicas x spec.ranksPerReplica)"));
  if (o.world > 1) {
    if (!store) {
      store = std::make_unique<FileStore>(o.rendezvous);
      claim_rank(*store, o.rendezvous, o.rank);
    }
    Topology topo = Topology::discover(*store, o.rank, o.world, RankPlacement{o.node, o.local_rank}, timeout);
    groups = std::make_unique<CommGroups>(connect_groups(*store, topo, o.rank, gloo_factory(timeout), job.model.spatial.size()));
    // Gradients in GPU memory: NCCL groups over the same ranks, met under their own keys.
    const Device device = resolve_device(job);
    if (resolve_transport(job, device) == "nccl") {
#if TESSERA_HAVE_NCCL
      gpu::set_device(rank_gpu_ordinal());
      nccl_store = std::make_unique<PrefixStore>("nccl", *store);
      device_groups = std::make_unique<CommGroups>(
          connect_groups(*nccl_store, std::move(topo), o.rank, nccl_factory(timeout, gpu::current_device()),
                         job.model.spatial.size()));
#endif
    }
  }
  Trainer trainer(job, groups.get(), device_groups.get());
  std::unique_ptr<ControlAgent> control;
  if (o.service()) {
    control = std::make_unique<ControlAgent>(o.rendezvous.substr(7), o.job_key.empty() ? job.name : o.job_key, o.token, o.rank,
                                             timeout);
    trainer.set_control(control.get());
  }
  if (exporter) {
    // TESSERA_JOB is the job's key, "namespace/name", under a controller.
    WorkerIdentity who;
    const std::string& key = o.job_key;
    const auto slash = key.find('/');
    who.job = slash == std::string::npos ? job.name : key.substr(slash + 1);
    who.namespace_ = slash == std::string::npos ? o.namespace_ : key.substr(0, slash);
    who.rank = o.rank;
    who.node = o.node;
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    who.pod = o.pod.empty() ? host : o.pod;
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
    if (exported) exported->observe(r, rank_samples, trainer.cache(), trainer.sample_cache());
    if (!metrics.is_open()) return;
    char line[640];
    std::snprintf(line, sizeof(line),
                  "{\"type\":\"step\",\"rank\":%d,\"step\":%lld,\"epoch\":%d,\"loss\":%.9g,\"lr\":%.6g,\"strategy\":\"%s\","
                  "\"global_batch\":%lld,\"micro_batches\":%d,"
                  "\"data_s\":%.6f,\"forward_s\":%.6f,\"backward_s\":%.6f,\"comm_s\":%.6f,\"comm_total_s\":%.6f,\"select_s\":%.6f,\"update_s\":%.6f,"
                  "\"bytes_intra\":%llu,\"bytes_inter\":%llu}\n",
                  o.rank, static_cast<long long>(r.step), r.epoch + 1, r.loss, r.lr, r.strategy.c_str(),
                  static_cast<long long>(r.global_batch), r.micro_batches, r.data_s, r.forward_s,
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
  // From here a SIGTERM (a drained or reclaimed node, a deleted pod) asks the gang to checkpoint and
  // stop; before, it ends the process, which holds nothing to save.
  trainer.set_stop_flag(&g_stop);
  std::signal(SIGTERM, on_rank_signal);
  std::signal(SIGINT, on_rank_signal);
  TrainSummary s = trainer.run();
  if (s.stopped) {
    // Why the pod ended: its supervisor's (or this process's) termination message, which the
    // controller records with the restart.
    const std::string why = detail::concat(
        "stopped at step ", s.steps, " on SIGTERM, every rank at the same step; ",
        s.checkpointed ? detail::concat("the checkpoint of step ", s.steps, " is written")
                       : std::string("no checkpoint (spec.checkpoint.path is not set): the next run starts at step 0"));
    log_info(why);
    if (!tell_supervisor(why) && !o.termination_log.empty()) std::ofstream(o.termination_log) << why << "\n";
    return kExitStopped;
  }
  if (o.rank == 0) {
    nlohmann::ordered_json summary = {{"type", "summary"},      {"job", job.name},
                                      {"steps", s.steps},        {"first_step", s.first_step},
                                      {"seconds", s.seconds},    {"samples_per_second", s.samples_per_second},
                                      {"switch_step", s.switch_step}};
    if (!s.exchange.empty()) summary["exchange"] = s.exchange;  // strategy auto: the last choice
    summary.update(validation_fields(s.last_epoch));
    const std::string line = summary.dump() + "\n";
    std::fputs(line.c_str(), stdout);
    // In a pod: the summary is the container's termination message, which the controller reads.
    if (!o.termination_log.empty()) std::ofstream(o.termination_log) << line;
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
      tessera::tell_supervisor(e.what());
      throw;
    }
  });
}
