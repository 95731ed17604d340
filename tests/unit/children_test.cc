// The reconcile's children (controller/reconcile/children.h) built directly from a spec, as
// mpi-operator's tests build newWorker: the Pod, the ConfigMap, the Secret and the Service.
#include "controller/reconcile/children.h"

#include <gtest/gtest.h>

#include "common/config_node.h"
#include "common/error.h"

namespace tessera::reconcile {
namespace {

const Owner kJob{"cosmo", "ml", "uid-1"};

// The spec of a manifest whose spec is `spec_yaml` (every problem fails the test).
api::TrainingJobSpec spec_of(const std::string& spec_yaml) {
  const std::string doc =
      "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: cosmo, namespace: ml}\nspec:\n" +
      spec_yaml;
  const api::ParsedJob p = api::parse_training_job(ConfigNode::load_string(doc, "job"));
  for (const auto& problem : p.problems) ADD_FAILURE() << problem.field << ": " << problem.reason;
  return p.job.spec;
}

ReconcileOptions cluster() {
  ReconcileOptions o;
  o.rendezvous_address = "tessera.tessera-system:7070";
  o.worker_image = "registry.local/tessera-worker:1";
  return o;
}

const json* env_var(const json& container, const std::string& name) {
  for (const auto& e : container["env"])
    if (e["name"] == name) return &e;
  return nullptr;
}

const json* volume(const json& pod, const std::string& name) {
  for (const auto& v : pod["spec"]["volumes"])
    if (v["name"] == name) return &v;
  return nullptr;
}

TEST(ChildrenTest, AWorkerPodRunsTheSupervisorOfItsReplicasRanksOnItsNode) {
  const api::TrainingJobSpec sp =
      spec_of("  replicas: 2\n  ranksPerReplica: 4\n  resources: {gpu: 4, cpu: 8}\n  dataset: {format: synthetic}\n");
  const json p = worker_pod(kJob, sp, cluster(), 3, 1, "gpu-b");
  EXPECT_EQ(p["metadata"]["name"], pod_name("cosmo", 3, 1));
  EXPECT_EQ(p["metadata"]["namespace"], "ml");
  EXPECT_EQ(p["metadata"]["labels"][kJobLabel], "cosmo");
  EXPECT_EQ(p["metadata"]["labels"][kReplicaLabel], "1");
  EXPECT_EQ(p["metadata"]["labels"][kAttemptLabel], "3");
  EXPECT_EQ(p["metadata"]["ownerReferences"][0]["uid"], "uid-1");
  EXPECT_EQ(p["spec"]["nodeName"], "gpu-b");
  EXPECT_EQ(p["spec"]["restartPolicy"], "Never");
  const json& c = p["spec"]["containers"][0];
  EXPECT_EQ(c["image"], "registry.local/tessera-worker:1");  // spec.image left at the API's default
  EXPECT_EQ(c["args"], (json{"--slots", "4", "--replica", "1", "--config", "/etc/tessera/job.yaml", "--rendezvous",
                             "grpc://tessera.tessera-system:7070", "--threads", "2"}));  // 8 cores over 4 ranks
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "4");
  EXPECT_EQ(c["resources"]["requests"]["cpu"], "8000m");
  ASSERT_NE(env_var(c, "TESSERA_JOB"), nullptr);
  EXPECT_EQ((*env_var(c, "TESSERA_JOB"))["value"], "ml/cosmo");
  EXPECT_EQ((*env_var(c, "TESSERA_TOKEN"))["valueFrom"]["secretKeyRef"]["name"], token_secret_name("cosmo"));
  EXPECT_EQ((*env_var(c, "TESSERA_METRICS_ADDR"))["value"], "0.0.0.0:9400");
  ASSERT_EQ(c["ports"].size(), 4u);
  EXPECT_EQ(c["ports"][3]["containerPort"], 9403);
  EXPECT_EQ(c["securityContext"]["readOnlyRootFilesystem"], true);
  EXPECT_FALSE(p["spec"].contains("initContainers"));  // no hostPath volume to own
}

TEST(ChildrenTest, TheDatasetIsMountedWhereBothItsSplitsLie) {
  const api::TrainingJobSpec sp = spec_of(
      "  dataset: {format: hdf5, path: /data/cosmo/train, validationPath: /data/cosmo/val,\n"
      "            volume: {persistentVolumeClaim: {claimName: cosmo-data}}}\n");
  const json p = worker_pod(kJob, sp, cluster(), 0, 0, "n0");
  ASSERT_NE(volume(p, "dataset"), nullptr);
  EXPECT_EQ((*volume(p, "dataset"))["persistentVolumeClaim"]["claimName"], "cosmo-data");
  EXPECT_EQ((*volume(p, "dataset"))["persistentVolumeClaim"]["readOnly"], true);
  bool mounted = false;
  for (const auto& m : p["spec"]["containers"][0]["volumeMounts"])
    if (m["name"] == "dataset") mounted = m["mountPath"] == "/data/cosmo" && m["readOnly"] == true;
  EXPECT_TRUE(mounted) << p["spec"]["containers"][0]["volumeMounts"].dump();
  // Locally (tessera run) the paths are this machine's: no volume but the configuration.
  ReconcileOptions local = cluster();
  local.cluster = false;
  EXPECT_EQ(worker_pod(kJob, sp, local, 0, 0, "local-0")["spec"]["volumes"].size(), 1u);
}

TEST(ChildrenTest, HostPathCheckpointsAndCacheAreGivenToTheWorkersUserFirst) {
  const api::TrainingJobSpec sp = spec_of(
      "  dataset: {format: synthetic}\n"
      "  checkpoint: {path: /ckpt, volume: {hostPath: {path: /mnt/ckpt}}}\n"
      "  cache: {localSSD: {path: /mnt/ssd, sizeLimit: 1Gi}}\n"
      "  placement: {tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]}\n");
  const json p = worker_pod(kJob, sp, cluster(), 0, 0, "n0");
  ASSERT_NE(volume(p, "checkpoints"), nullptr);
  EXPECT_EQ((*volume(p, "checkpoints"))["hostPath"]["type"], "DirectoryOrCreate");
  ASSERT_TRUE(p["spec"].contains("initContainers"));
  const json& init = p["spec"]["initContainers"][0];
  EXPECT_EQ(init["command"], (json{"chown"}));
  EXPECT_EQ(init["args"][0], "65532:65532");
  EXPECT_NE(std::find(init["args"].begin(), init["args"].end(), "/ckpt"), init["args"].end()) << init.dump();
  EXPECT_EQ(p["spec"]["tolerations"],
            (json::array({{{"key", "gpu"}, {"operator", "Exists"}, {"effect", "NoSchedule"}}})));
}

TEST(ChildrenTest, TheConfigMapCarriesTheManifestAndTheRingPlan) {
  const std::vector<placement::RankAssignment> plan = {{0, 0, 0, "n0", 0}, {1, 1, 0, "n1", 0}};
  const json cm = job_config_map(kJob, json{{"replicas", 2}}, 5, plan);
  EXPECT_EQ(cm["metadata"]["name"], config_map_name("cosmo"));
  const json manifest = json::parse(cm["data"][kConfigFile].get<std::string>());
  EXPECT_EQ(manifest["kind"], "TrainingJob");
  EXPECT_EQ(manifest["spec"]["replicas"], 2);
  const json p = json::parse(cm["data"][kPlanFile].get<std::string>());
  EXPECT_EQ(p["attempt"], 5);
  EXPECT_EQ(p["ranks"][1]["node"], "n1");
  EXPECT_EQ(p, plan_json(5, plan));
}

TEST(ChildrenTest, TheServiceIsHeadlessOverTheJobsPodsAndTheSecretHoldsTheToken) {
  const json svc = headless_service(kJob);
  EXPECT_EQ(svc["spec"]["clusterIP"], "None");
  EXPECT_EQ(svc["spec"]["selector"][kJobLabel], "cosmo");
  EXPECT_EQ(svc["spec"]["publishNotReadyAddresses"], true);
  const json secret = token_secret(kJob, "abc");
  EXPECT_EQ(secret["metadata"]["name"], token_secret_name("cosmo"));
  EXPECT_EQ(secret["stringData"]["token"], "abc");
}

}  // namespace
}  // namespace tessera::reconcile
