// A pod's supervisor (`tessera-worker --slots N`): the pod's entrypoint, which starts its N ranks as
// child processes (common/process.h) and ends with the pod's exit status.
//
// - The ranks: slot S gets the S-th GPU the pod was given (NVIDIA_VISIBLE_DEVICES, as NVIDIA's
//   device plugin sets it, else CUDA_VISIBLE_DEVICES) as TESSERA_GPU and TESSERA_GPU_INDEX, and a
//   pipe at descriptor kErrorFd where it writes why it failed (tell_supervisor): the first failure's
//   reason is the pod's last line and its termination message.
// - A rank that fails ends the others at once (SIGKILL: the gang starts again from its newest
//   checkpoint in any case); the pod's status is the first failure's.
// - SIGTERM or SIGINT to the supervisor is passed on to the ranks, which get the grace period to
//   agree on a step and checkpoint it (they exit with kExitStopped), then SIGKILL.
// - Under the controller's rendezvous, restarts in place: a failed rank is reported for the gang's
//   round, and the pod waits for the next round (up to restart_wait), then starts its ranks again;
//   the ranks of a pod whose own did not fail are ended and started again when a new round begins.
//   The controller may instead replace the pods, which ends this one.
//
// supervise_pod runs on the calling thread, with a thread of its own that follows the rounds, and
// installs handlers for SIGTERM and SIGINT while it runs (the previous ones are put back).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace tessera {

// The descriptor where a rank of a pod writes why it failed.
inline constexpr int kErrorFd = 3;

struct PodOptions {
  int slots = 1;
  int replica = 0;  // the pod's replica in the gang
  // The ranks' program (tessera-worker: /proc/self/exe) and the arguments of slot S's rank (argv[0]
  // included).
  std::string program;
  std::function<std::vector<std::string>(int slot)> rank_args;
  // The controller's rendezvous service ("host:port") and the job's key and token; an empty target:
  // no restarts in place (a failed rank fails the pod).
  std::string rendezvous, job_key, token;
  // Where the first failure's reason is written (the container's termination log); empty: nowhere.
  std::string termination_log;
  std::chrono::milliseconds grace{30000};          // from SIGTERM to SIGKILL (TESSERA_GRACE_SECONDS)
  std::chrono::milliseconds restart_wait{120000};  // for the next round after a failure (TESSERA_RESTART_WAIT_SECONDS)
};

// Supervises the pod's ranks until they end; returns the pod's exit status: 0 when every rank
// succeeded, kExitStopped when they stopped on request, else the first failure's status (the exit
// code, or 128 + the signal). Throws Error when a rank cannot be started.
int supervise_pod(const PodOptions& options);

// A rank's side: tells the supervisor that started it (TESSERA_SUPERVISOR_PID, TESSERA_ERROR_FD) why
// it ends, at most 4 KiB of it; false when it has no supervisor.
bool tell_supervisor(const std::string& why);
// Whether this process is a rank started by a pod's supervisor.
bool supervised();

// The device IDs in NVIDIA_VISIBLE_DEVICES (or CUDA_VISIBLE_DEVICES), in order; none for "all",
// "none", "void" or an unset variable.
std::vector<std::string> visible_gpus();

}  // namespace tessera
