// The objects a TrainingJob owns, as the reconcile creates them: the rendezvous token's Secret, the
// headless Service of its pods, the ConfigMap with the spec the gang runs and its ring plan, and one
// Pod per replica (`tessera-worker --slots N`). Each builder is a pure function of the job and the
// reconcile's options, so tests check the objects directly; every child carries the job's label
// and an owner reference (the API server's garbage collector deletes it with the job).
#pragma once

#include <string>
#include <vector>

#include "api/training_job.h"
#include "controller/placement/ring_planner.h"
#include "controller/reconcile/reconciler.h"

namespace tessera::reconcile {

// The ConfigMap's keys: the job's manifest as the gang runs it, and the ring plan.
inline constexpr const char* kConfigFile = "job.yaml";
inline constexpr const char* kPlanFile = "plan.json";
// Where a pod mounts the ConfigMap.
inline constexpr const char* kConfigMount = "/etc/tessera";
// The worker image's user and group (images/worker.Dockerfile: USER 65532:65532).
inline constexpr int kWorkerUid = 65532;

// The job that owns a child.
struct Owner {
  std::string name, ns = "default", uid;
};

std::string config_map_name(const std::string& job);
// metadata of the child `child_name`: namespace, the job's label besides `labels`, owner reference.
json child_metadata(const Owner& job, const std::string& child_name, json labels = json::object());

json token_secret(const Owner& job, const std::string& token);
json headless_service(const Owner& job);
// The ring plan as the ConfigMap keeps it: {"attempt": A, "ranks": [{rank, replica, slot, node, localRank}]}.
json plan_json(int attempt, const std::vector<placement::RankAssignment>& plan);
// spec: the job's spec as it runs (defaults merged), written as its manifest.
json job_config_map(const Owner& job, const json& spec, int attempt,
                    const std::vector<placement::RankAssignment>& plan);
// The pod of replica `replica` of gang `attempt`, bound to `node`: one rank per GPU, its volumes
// (dataset, checkpoints, SSD cache, on a cluster), least privilege, the metrics ports.
json worker_pod(const Owner& job, const api::TrainingJobSpec& spec, const ReconcileOptions& options, int attempt,
                int replica, const std::string& node);

}  // namespace tessera::reconcile
