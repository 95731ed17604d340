// The TrainingJob reconcile: a pure, level-based function from what is observed (the job as stored,
// its children, the nodes, the workers' last progress, the time) to the list of actions that moves
// the world toward the job's spec (create or delete a child, patch the job's status, record an
// Event, delete the job). It keeps no state of its own: everything it must remember across calls is
// in the job's status (restarts, placement, switch step, start time) or its children (the
// ConfigMap holds the spec the job started with and the ring plan of its current gang), so calling
// it again on the same world gives the same actions, and a restarted controller carries on.
//
// The gang: pods are created only when GangPlacer fits all of them; they are named
// <job>-<attempt>-<replica> (attempt_of: the restarts that replaced the pods), so a retried create
// can never make a second pod for a replica. One failed pod restarts the whole gang from its
// checkpoints (a new attempt), up to runPolicy.backoffLimit; a worker exit status 2 (a configuration
// error) fails the job at once; a pod the node refused at admission is placed again, which is not a
// restart. A rank that fails while its pod and node stay healthy is reported by its pod's
// supervisor: with runPolicy.restartInPlace the gang restarts in place (a new rendezvous round: the
// supervisors start their ranks again, which resume from the newest checkpoint; no pod is replaced),
// else its pods are replaced; either counts against backoffLimit. A preemption is not a failure either: a gang whose
// node is leaving (cordoned, drained, tainted NoExecute) is stopped there, checkpoints the step its ranks agree on
// (worker exit status 4) and is placed again on other nodes; a gang whose node is lost (NotReady, deleted) is placed
// again at once, from its newest checkpoint; neither counts against backoffLimit (status.preemptions). A new gang
// avoids the nodes of the ranks the last one reported slow when other room exists. An elastic job
// (spec.elastic.minReplicas) that does not fit whole is placed on the most pods that fit, down to its minimum
// (ScaledDown), and stops and is placed whole again once room returns (ScaledUp). A job needs every node observed while
// it is elastic and short of pods (needs_all_nodes). Thread-compatible.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "controller/placement/gang_placer.h"
#include "controller/placement/ring_planner.h"
#include "controller/reconcile/progress.h"

namespace tessera::reconcile {

using json = nlohmann::json;
using Time = std::chrono::system_clock::time_point;

inline constexpr const char* kJobLabel = "tessera.dev/job";
inline constexpr const char* kReplicaLabel = "tessera.dev/replica";
inline constexpr const char* kAttemptLabel = "tessera.dev/attempt";

// A pod of the job, as observed.
struct PodInfo {
  std::string name, node;
  int replica = -1, attempt = -1;
  std::string phase;             // Pending | Running | Succeeded | Failed | Unknown
  bool terminating = false;      // deletionTimestamp set
  int exit_code = -1;            // the worker container's, once terminated
  std::string reason, message;   // status.reason (admission: OutOfnvidia.com/gpu, ...) or the container's
  std::optional<Time> finished;  // when the failed container ended
  std::optional<Time> created;   // metadata.creationTimestamp
  // A container (or init container) the kubelet cannot start yet: its waiting reason (ErrImagePull,
  // ImagePullBackOff, CreateContainerConfigError, ...), the kubelet's message and the image.
  std::string waiting_reason, waiting_message, waiting_image;
};

// The gang the rendezvous must serve for the job: the ring plan and attempt of its current gang.
struct RendezvousTarget {
  std::string token;
  int attempt = 0;
  int64_t round = 0;  // status.restartsInPlace: the gang's round in its current pods
  std::vector<placement::RankAssignment> plan;
  int switch_at_epoch = -1;    // hybrid jobs; auto: the latest epoch a sparse phase may reach
  int64_t switch_step = -1;    // already chosen (kept in the status)
  bool auto_exchange = false;  // communication.strategy auto: the rendezvous chooses the exchange
  int epochs = 1;
  double density = 0.01;  // auto: the sparse phase's density
};

struct Observed {
  json job;                   // the TrainingJob as stored: metadata, spec, status
  std::vector<PodInfo> pods;  // pods labelled with the job
  std::string token;          // the job's rendezvous token, from the backend (derived from the job's uid
                              // on a cluster, random per run locally); its Secret hands it to the pods
  bool has_secret = false;    // the job's token Secret exists (as the backend knows: it created it)
  bool has_service = false;
  std::optional<json> config_map;          // the job's ConfigMap
  std::vector<placement::NodeInfo> nodes;  // used: requests of all pods bound there that hold resources
  std::optional<Progress> progress;        // for the current attempt
  std::optional<int> served_attempt;  // the attempt of the job's gang the backend's rendezvous serves; none: not served
  int64_t served_round = 0;           // and its round
  Time now;
};

// The children a job has, as the API names their collections.
enum class Resource { kSecret, kService, kConfigMap, kPod };
const char* plural(Resource r);  // "secrets", "services", "configmaps", "pods"

// Why an Event is recorded (its reason), and why a job failed (status.reason).
enum class Reason {
  kPlaced,
  kUnschedulable,
  kAdmissionRejected,
  kGangRestart,
  kCompleted,
  kPhaseSwitch,
  kStraggler,
  kStragglerGone,
  kSuspended,
  kResumed,
  kSpecChangeRejected,
  kSpecWarning,
  kTTLExpired,
  kFailedCreate,
  kPodNotStarting,
  kPreempted,
  kScaledDown,
  kScaledUp,
  kExchangeChosen,
  // the job failed:
  kInvalidSpec,
  kInvalidConfiguration,
  kTrainingDiverged,
  kBackoffLimitExceeded,
  kDeadlineExceeded,
  kStartFailed,
};
const char* name(Reason r);  // "Placed", "GangRestart", ...

struct Action {
  enum class Kind {
    kCreate,
    kUpdate,
    kDelete,           // a child: resource, name, object (a delete's: its DeleteOptions, if any)
    kPatchStatus,      // object: the merge patch of the job's status
    kEvent,            // warning, reason, message
    kDeleteJob,        // ttlSecondsAfterFinished
    kServeRendezvous,  // rendezvous: the gang the backend's rendezvous serves from now on
    kStopRendezvous,   // the job has no gang to serve any more
  };
  Kind kind = Kind::kCreate;
  Resource resource = Resource::kPod;
  std::string name;
  json object;
  bool warning = false;  // event: Warning, else Normal
  Reason reason = Reason::kPlaced;
  std::string message;
  RendezvousTarget rendezvous;
  // One line for tests and logs: "create pod j-0-1 on n2", "delete pod j-0-1", "delete pod j-0-1 now"
  // (grace period 0: its node is lost), "status phase=Running",
  // "event Warning GangRestart", "delete job", "serve rendezvous attempt 0", "stop rendezvous".
  std::string describe() const;
};

struct Decision {
  std::vector<Action> actions;
  // Reconcile again after this long even if nothing changes (deadlines, TTL, progress); 0: no need.
  std::chrono::milliseconds requeue_after{0};
};

struct ReconcileOptions {
  std::string rendezvous_address;                   // host:port the workers reach the controller at
  std::string worker_image;                         // used when spec.image is the API default
  std::chrono::milliseconds status_interval{5000};  // progress is written at most this often
  json spec_defaults = json::object();              // spec fields of every job that leaves them unset
                                        // (tessera-controller --job-defaults: node pools, topology keys, SSD path)
  int metrics_port = 9400;   // slot S of a pod serves /metrics on this port + S (declared as the
                             // pod's ports metrics-S); 0: the workers serve no metrics
  bool cluster = true;       // Kubernetes: a job needs volumes every node mounts. false (tessera
                             // run): paths are this machine's, every rank takes one GPU slot of
                             // its virtual node, and nodes have no CPU to account
  int threads_per_rank = 0;  // > 0: every rank's --threads, unless spec.training.threads is set
                             // (tessera run: the machine's cores over the job's ranks); 0: from
                             // spec.resources.cpu
};

Decision reconcile(const Observed& observed, const ReconcileOptions& options);
// `spec` with every field of `defaults` it does not set (objects merged field by field; a list or
// value the spec sets is kept whole).
json with_defaults(json spec, const json& defaults);

// status.validation from rank 0's summary line: loss, metric, and what they compare with
// (baselineLoss for regression; baselineMetric, the most frequent class's accuracy, and the IoU of
// each class for segmentation).
json validation_status(const json& summary);

// The status a kPatchStatus action leaves: `status` with the patch's top-level keys set (null removes one).
json apply_status_patch(json status, const json& patch);
// The gang the rendezvous must serve for the job as observed (its Secret, ConfigMap and status);
// none when the job has no gang (finished, suspended, not placed).
std::optional<RendezvousTarget> rendezvous_target(const Observed& observed);

// The attempt of the job's current gang, which its pods' names carry: status.attempt (each restart
// that replaces the pods adds one: a failure, a preemption, an elastic gang growing back); for a
// status written before it was kept, status.restarts - status.restartsInPlace + status.preemptions.
int attempt_of(const json& status);

// Whether the reconcile of this job looks for room on every node although its gang is placed: an
// elastic job on fewer pods than spec.replicas (the backend observes the nodes for it).
bool needs_all_nodes(const json& job);

// The nodes of the ring plan in the job's ConfigMap (none before its gang is placed).
std::vector<std::string> plan_nodes(const json& config_map);

// Names of the job's children.
std::string pod_name(const std::string& job, int attempt, int replica);
std::string token_secret_name(const std::string& job);

// RFC 3339 (seconds), as Kubernetes Time, and back.
std::string format_time(Time t);
std::optional<Time> parse_time(const std::string& s);

}  // namespace tessera::reconcile
