#include "worker/pod/supervisor.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/process.h"
#include "worker/comm/grpc_store.h"

namespace tessera {
namespace {

std::atomic<int> g_forward_signal{0};
void on_supervisor_signal(int sig) { g_forward_signal = sig; }

// Installs the supervisor's handlers for SIGTERM and SIGINT, and puts the previous ones back.
class SignalForwarding {
 public:
  SignalForwarding() {
    g_forward_signal = 0;
    term_ = std::signal(SIGTERM, on_supervisor_signal);
    int_ = std::signal(SIGINT, on_supervisor_signal);
  }
  ~SignalForwarding() {
    std::signal(SIGTERM, term_);
    std::signal(SIGINT, int_);
  }
  int received() const { return g_forward_signal.load(); }

 private:
  void (*term_)(int) = SIG_DFL;
  void (*int_)(int) = SIG_DFL;
};

// The ranks of a pod, as child processes of its supervisor, and the read end of each one's error
// pipe (what it wrote on failing). Destroying it kills the ranks still running.
struct Ranks {
  std::vector<std::unique_ptr<Process>> processes;  // null once ended
  std::vector<int> errors;
  Ranks() = default;
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;
  ~Ranks() {
    processes.clear();
    for (int fd : errors) close(fd);
  }
  void signal_all(int sig) const {
    for (const auto& p : processes)
      if (p) p->signal(sig);
  }
};

// Starts the pod's ranks (slots 0..N-1).
std::unique_ptr<Ranks> start_ranks(const PodOptions& o, const std::vector<std::string>& gpus) {
  auto ranks = std::make_unique<Ranks>();
  for (int slot = 0; slot < o.slots; ++slot) {
    SpawnOptions so;
    so.program = o.program;
    // The ranks end with this process, even when it is killed outright.
    so.env = {"TESSERA_SUPERVISOR_PID=" + std::to_string(getpid()), "TESSERA_ERROR_FD=" + std::to_string(kErrorFd)};
    if (!gpus.empty()) {
      // The pod's GPU IDs, and which of the devices this process sees (the runtime numbers them 0..n-1).
      so.env.push_back("TESSERA_GPU=" + gpus[slot % gpus.size()]);
      so.env.push_back("TESSERA_GPU_INDEX=" + std::to_string(slot % gpus.size()));
    }
    // A pipe, not a file: a pod's root file system is read-only.
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
      throw Error(detail::concat("cannot make a pipe for slot ", slot, ": ", std::strerror(errno)));
    so.fds = {{fds[1], kErrorFd}};
    try {
      ranks->processes.push_back(std::make_unique<Process>(o.rank_args(slot), so));
    } catch (const Error& e) {
      close(fds[0]);
      close(fds[1]);
      throw Error(detail::concat("cannot start the worker of slot ", slot, ": ", e.what()));
    }
    close(fds[1]);
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

// What the slot's rank wrote to its pipe before it ended (its pipe then reads end of file).
std::string read_why(int fd) {
  std::string why;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR);)
    if (n > 0) why.append(buf, static_cast<size_t>(n));
  while (!why.empty() && why.back() == '\n') why.pop_back();
  return why;
}

// Waits for the ranks to end (see the header): a failure ends the others, a forwarded signal gives
// them the grace period, and a round later than `round` ends them at once.
RanksEnd wait_ranks(Ranks& ranks, const SignalForwarding& signals, const std::atomic<int64_t>& latest_round,
                    int64_t round, std::chrono::milliseconds grace) {
  using SteadyClock = std::chrono::steady_clock;
  RanksEnd end;
  size_t running = ranks.processes.size();
  auto stop_deadline = SteadyClock::time_point::max();
  bool forwarded = false;
  while (running > 0) {
    if (signals.received() && !forwarded) {
      forwarded = true;
      ranks.signal_all(signals.received());
      stop_deadline = std::min(stop_deadline, SteadyClock::now() + grace);
    }
    if (!end.new_round && round >= 0 && latest_round.load() > round && !forwarded) {
      end.new_round = true;
      ranks.signal_all(SIGKILL);
    }
    if (SteadyClock::now() > stop_deadline) ranks.signal_all(SIGKILL);
    bool any = false;
    for (size_t slot = 0; slot < ranks.processes.size(); ++slot) {
      auto& p = ranks.processes[slot];
      const std::optional<int> code = p ? p->poll() : std::nullopt;
      if (!code) continue;
      p.reset();
      --running;
      any = true;
      if (end.new_round) continue;
      if (*code == kExitStopped && end.status == 0) {
        // The gang agreed to stop: the other ranks stop at the same step, after their checkpoints.
        end.status = *code;
        end.slot = static_cast<int>(slot);
        stop_deadline = std::min(stop_deadline, SteadyClock::now() + grace);
      } else if (*code != 0 && *code != kExitStopped && (end.status == 0 || end.status == kExitStopped)) {
        // The first failure decides the pod's exit status; the other ranks are ended.
        end.status = *code;
        end.slot = static_cast<int>(slot);
        std::fprintf(stderr, "tessera-worker: slot %zu of this pod ended with status %d; stopping the others\n", slot,
                     *code);
        ranks.signal_all(SIGKILL);
      }
    }
    if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (end.slot >= 0) {
    end.why = read_why(ranks.errors[end.slot]);
    if (end.why.empty()) end.why = Process::describe(end.status);
  }
  return end;
}

// Whether a gang whose rank ended with `status` may start again in place: not for a configuration
// error or a diverged run (the controller fails the job), nor a stop (the gang moves).
bool restartable(int status) {
  return status != 0 && status != kExitConfigError && status != kExitDiverged && status != kExitStopped;
}

// The gang's rounds, as the controller's rendezvous serves them: the round at the start, and a
// thread that follows the later ones. Without a service (or when it does not answer) there are
// none: round() is -1.
class RoundWatch {
 public:
  explicit RoundWatch(const PodOptions& o) {
    if (o.rendezvous.empty()) return;
    control_ = std::make_unique<GrpcStore>(o.rendezvous, o.job_key, o.token);
    round_ = control_->await_round(-1, std::chrono::seconds(10)).value_or(-1);
    latest_ = round_;
    if (round_ < 0) {
      log_warn("the controller's rendezvous did not answer: a failed rank fails this pod (no restart in place)");
      return;
    }
    watcher_ = std::thread([this] {
      while (!done_)
        if (const auto r = control_->await_round(latest_.load(), std::chrono::seconds(1)); r && *r > latest_.load())
          latest_ = *r;
        else if (!r) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    });
  }
  ~RoundWatch() {
    done_ = true;
    if (watcher_.joinable()) watcher_.join();
  }
  int64_t round() const { return round_; }
  const std::atomic<int64_t>& latest() const { return latest_; }
  // Takes the latest round as the pod's.
  int64_t advance() { return round_ = latest_.load(); }
  // Reports the failure of the pod's rank and waits up to `wait` for the next round; true when it began.
  bool report_and_await(const PodOptions& o, const RanksEnd& end, const SignalForwarding& signals) {
    if (!control_->report_exit(o.replica, end.slot, end.status, end.why, round_, std::chrono::seconds(10)))
      return false;
    const auto until = std::chrono::steady_clock::now() + o.restart_wait;
    while (latest_.load() <= round_ && !signals.received() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return latest_.load() > round_ && !signals.received();
  }

 private:
  std::unique_ptr<GrpcStore> control_;
  int64_t round_ = -1;
  std::atomic<int64_t> latest_{-1};
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

}  // namespace

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

int supervise_pod(const PodOptions& o) {
  SignalForwarding signals;
  const std::vector<std::string> gpus = visible_gpus();
  if (!gpus.empty() && static_cast<int>(gpus.size()) < o.slots)
    log_warn("this pod was given ", detail::count(static_cast<int>(gpus.size()), "GPU"), " for ",
             detail::count(o.slots, "rank"), ": ranks share them");
  RoundWatch rounds(o);
  for (;;) {
    RanksEnd end;
    {
      std::unique_ptr<Ranks> ranks = start_ranks(o, gpus);
      end = wait_ranks(*ranks, signals, rounds.latest(), rounds.round(), o.grace);
    }
    if (!end.new_round) {
      if (end.slot >= 0) std::fprintf(stderr, "tessera-worker: slot %d: %s\n", end.slot, end.why.c_str());
      const bool in_place = rounds.round() >= 0 && restartable(end.status) && !signals.received() &&
                            rounds.report_and_await(o, end, signals);
      if (!in_place) {
        if (end.slot >= 0 && !o.termination_log.empty())
          std::ofstream(o.termination_log) << "slot " << end.slot << ": " << end.why << "\n";
        return end.status;
      }
    }
    log_info("the gang restarts in place (round ", rounds.advance(), "): starting this pod's ",
             detail::count(o.slots, "rank"), " again");
  }
}

bool supervised() {
  const auto supervisor = parse_int(env_value("TESSERA_SUPERVISOR_PID").value_or(""));
  return supervisor && *supervisor == getppid();
}

bool tell_supervisor(const std::string& why) {
  const auto fd = parse_int(env_value("TESSERA_ERROR_FD").value_or(""));
  if (!fd || !supervised()) return false;
  const std::string line = why.substr(0, 4096) + "\n";
  [[maybe_unused]] const ssize_t n = write(static_cast<int>(*fd), line.data(), line.size());
  return true;
}

}  // namespace tessera
