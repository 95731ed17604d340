// The TrainingJob reconcile, as mpi-operator's controller tests do it: observed objects in, the
// expected list of actions out.
#include <gtest/gtest.h>

#include <algorithm>

#include "common/config_node.h"
#include "controller/reconcile/observe.h"
#include "controller/reconcile/reconciler.h"

namespace tessera::reconcile {
namespace {

using std::chrono::seconds;

const Time kNow = std::chrono::system_clock::from_time_t(1'800'000'000);

json job(json spec_patch = json::object(), json status = json()) {
  json spec = {
      {"replicas", 2},
      {"ranksPerReplica", 2},
      {"resources", {{"gpu", 2}}},
      {"model", {{"name", "cosmoflow"}, {"inputSize", 16}}},
      {"dataset", {{"synthetic", "cosmo"}}},
      {"training", {{"epochs", 2}, {"batchSize", 4}}},
      {"communication", {{"strategy", "hybrid"}, {"sparse", "topk"}, {"dense", "dense"}, {"switchAtEpoch", 1}}},
      {"runPolicy", {{"backoffLimit", 2}}}};
  spec.merge_patch(spec_patch);
  json j = {{"apiVersion", "tessera.dev/v1alpha1"},
            {"kind", "TrainingJob"},
            {"metadata", {{"name", "j"}, {"namespace", "ml"}, {"uid", "u-1"}, {"generation", 1}}},
            {"spec", spec}};
  if (!status.is_null()) j["status"] = status;
  return j;
}

placement::NodeInfo node(const std::string& name, const std::string& zone, int gpus, int used = 0) {
  placement::NodeInfo n;
  n.name = name;
  n.labels = {{"kubernetes.io/hostname", name}, {"topology.kubernetes.io/zone", zone}};
  n.allocatable.gpu = gpus;
  n.used.gpu = used;
  return n;
}

PodInfo pod(int attempt, int replica, const std::string& phase, int exit_code = -1, const std::string& reason = "") {
  PodInfo p;
  p.name = pod_name("j", attempt, replica);
  p.node = "n" + std::to_string(replica);
  p.replica = replica;
  p.attempt = attempt;
  p.phase = phase;
  p.exit_code = exit_code;
  p.reason = reason;
  return p;
}

// The ConfigMap a placed gang of `attempt` left, with the spec the job started with.
json config_map(const json& j, int attempt) {
  json plan = {{"attempt", attempt},
               {"ranks", json::array({{{"rank", 0}, {"replica", 0}, {"slot", 0}, {"node", "n0"}, {"localRank", 0}},
                                      {{"rank", 1}, {"replica", 0}, {"slot", 1}, {"node", "n0"}, {"localRank", 1}},
                                      {{"rank", 2}, {"replica", 1}, {"slot", 0}, {"node", "n1"}, {"localRank", 0}},
                                      {{"rank", 3}, {"replica", 1}, {"slot", 1}, {"node", "n1"}, {"localRank", 1}}})}};
  json manifest = {{"apiVersion", "tessera.dev/v1alpha1"},
                   {"kind", "TrainingJob"},
                   {"metadata", j["metadata"]},
                   {"spec", j["spec"]}};
  return {{"metadata", {{"name", "j-config"}, {"namespace", "ml"}, {"resourceVersion", "7"}}},
          {"data", {{"job.yaml", manifest.dump()}, {"plan.json", plan.dump()}}}};
}

// A running job of `attempt` with its children in place.
Observed running(int attempt = 0, json spec_patch = json::object()) {
  Observed o;
  json status = {{"phase", "Running"},
                 {"restarts", attempt},
                 {"attempt", attempt},
                 {"observedGeneration", 1},
                 {"startTime", format_time(kNow - seconds(60))}};
  o.job = job(spec_patch, status);
  o.token = "t0k3n";
  o.has_secret = true;
  o.has_service = true;
  o.config_map = config_map(o.job, attempt);
  o.nodes = {node("n0", "a", 2, 2), node("n1", "b", 2, 2)};
  o.pods = {pod(attempt, 0, "Running"), pod(attempt, 1, "Running")};
  o.served_attempt = attempt;  // the backend's rendezvous serves the gang
  o.now = kNow;
  return o;
}

ReconcileOptions options() {
  ReconcileOptions r;
  r.rendezvous_address = "10.0.0.1:7070";
  r.status_interval = std::chrono::milliseconds(5000);
  return r;
}

std::vector<std::string> describe(const Decision& d) {
  std::vector<std::string> out;
  for (const auto& a : d.actions) out.push_back(a.describe());
  return out;
}

const Action* find(const Decision& d, Action::Kind kind, const std::string& resource = "") {
  for (const auto& a : d.actions)
    if (a.kind == kind && (resource.empty() || plural(a.resource) == resource)) return &a;
  return nullptr;
}

TEST(ReconcileTest, NewJobCreatesItsChildrenAndTheWholeGang) {
  Observed o;
  o.job = job();
  o.token = "new-token";
  o.nodes = {node("n0", "a", 2), node("n1", "a", 2), node("n2", "b", 2)};
  o.now = kNow;
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d),
            (std::vector<std::string>{"status phase=Placing restarts=0", "create secret j-token", "create service j",
                                      "create configmap j-config", "event Normal Placed", "serve rendezvous attempt 0",
                                      "create pod j-0-0 on n0", "create pod j-0-1 on n1"}));
  // Both pods in zone a (the closest topology), bound by the controller, owned by the job.
  const Action* p = find(d, Action::Kind::kCreate, "pods");
  ASSERT_NE(p, nullptr);
  const json& spec = p->object["spec"];
  EXPECT_EQ(spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "2");
  EXPECT_EQ(p->object["metadata"]["ownerReferences"][0]["uid"], "u-1");
  EXPECT_EQ(p->object["metadata"]["labels"][kAttemptLabel], "0");
  EXPECT_EQ(spec["restartPolicy"], "Never");
  EXPECT_EQ(spec["automountServiceAccountToken"], false);
  // Workers run non-root, on a read-only root file system, with no capability and no escalation.
  const json& sc = spec["containers"][0]["securityContext"];
  EXPECT_EQ(sc["runAsNonRoot"], true);
  EXPECT_EQ(sc["readOnlyRootFilesystem"], true);
  EXPECT_EQ(sc["allowPrivilegeEscalation"], false);
  EXPECT_EQ(sc["capabilities"]["drop"], json::array({"ALL"}));
  const json args = spec["containers"][0]["args"];
  EXPECT_NE(std::find(args.begin(), args.end(), "grpc://10.0.0.1:7070"), args.end()) << args;
  EXPECT_NE(std::find(args.begin(), args.end(), "--slots"), args.end()) << args;
  const json secret = find(d, Action::Kind::kCreate, "secrets")->object;
  EXPECT_EQ(secret["stringData"]["token"], "new-token");
  const json status = find(d, Action::Kind::kPatchStatus)->object;
  EXPECT_EQ(status["placement"].size(), 2u);
  EXPECT_EQ(status["conditions"][0]["type"], "Placed");
  EXPECT_EQ(status["conditions"][0]["status"], "True");
  EXPECT_EQ(status["startTime"], format_time(kNow));
}

TEST(ReconcileTest, PodsDeclareAMetricsPortPerRank) {
  Observed o;
  o.job = job();
  o.token = "new-token";
  o.nodes = {node("n0", "a", 2), node("n1", "a", 2)};
  o.now = kNow;
  const json c = find(reconcile(o, options()), Action::Kind::kCreate, "pods")->object["spec"]["containers"][0];
  EXPECT_EQ(c["ports"], (json::array({{{"name", "metrics-0"}, {"containerPort", 9400}, {"protocol", "TCP"}},
                                      {{"name", "metrics-1"}, {"containerPort", 9401}, {"protocol", "TCP"}}})));
  bool addr = false;
  for (const auto& e : c["env"]) addr |= e["name"] == "TESSERA_METRICS_ADDR" && e["value"] == "0.0.0.0:9400";
  EXPECT_TRUE(addr) << c["env"];
}

TEST(ReconcileTest, TheControllersJobDefaultsFillWhatTheSpecLeavesUnset) {
  Observed o;
  o.job = job({{"cache", {{"memory", "1Gi"}}}});
  o.token = "new-token";
  placement::NodeInfo gpu_pool = node("n2", "a", 2), gpu_pool2 = node("n3", "a", 2);
  gpu_pool.labels["pool"] = gpu_pool2.labels["pool"] = "gpu";
  o.nodes = {node("n0", "a", 2), node("n1", "a", 2), gpu_pool, gpu_pool2};
  o.now = kNow;
  ReconcileOptions opt = options();
  opt.spec_defaults = {{"placement", {{"nodeSelector", {{"pool", "gpu"}}}}},
                       {"cache", {{"memory", "2Gi"}, {"localSSD", {{"path", "/mnt/ssd"}}}}}};
  const Decision d = reconcile(o, opt);
  // Placed on the node pool of the defaults only.
  EXPECT_EQ(describe(d).back(), "create pod j-0-1 on n3");
  const json cm = find(d, Action::Kind::kCreate, "configmaps")->object;
  const json frozen = json::parse(cm["data"]["job.yaml"].get<std::string>());
  EXPECT_EQ(frozen["spec"]["cache"]["localSSD"]["path"], "/mnt/ssd");
  EXPECT_EQ(frozen["spec"]["cache"]["memory"], "1Gi");  // the job's own value wins
  // The running job, reconciled again with the same defaults, is not a spec change.
  Observed again = running();
  again.job = job({{"cache", {{"memory", "1Gi"}}}}, again.job["status"]);
  again.token = "new-token";
  again.config_map = cm;
  again.config_map->at("metadata")["resourceVersion"] = "7";
  for (const auto& a : reconcile(again, opt).actions)
    EXPECT_NE(std::string(name(a.reason)), "SpecChangeRejected") << a.message;
}

TEST(ReconcileTest, ReconcilingAgainAfterTheActionsChangesNothing) {
  Observed o = running();
  o.job["status"]["placement"] = json::array();
  Decision first = reconcile(o, options());
  // Apply its status patch, then reconcile the same world again: only the periodic requeue is left.
  for (const auto& a : first.actions)
    if (a.kind == Action::Kind::kPatchStatus) o.job["status"] = apply_status_patch(o.job["status"], a.object);
  const Decision again = reconcile(o, options());
  EXPECT_TRUE(again.actions.empty()) << describe(again)[0];
  EXPECT_GT(again.requeue_after.count(), 0);
}

TEST(ReconcileTest, AMissingPodOfTheGangIsCreatedOnItsPlannedNode) {
  Observed o = running();
  o.pods = {pod(0, 1, "Running")};
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"create pod j-0-0 on n0"}));
}

TEST(ReconcileTest, AFailedPodRestartsTheWholeGangOnce) {
  Observed o = running();
  o.pods = {pod(0, 0, "Running"), pod(0, 1, "Failed", 137, "Error")};
  o.progress = Progress{23, 0, 0, 0.5, 10, -1, {}, "", {}, {}};
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status phase=Restarting restarts=1", "event Warning GangRestart",
                                                   "delete pod j-0-0", "delete pod j-0-1", "stop rendezvous"}));
  const json status = d.actions[0].object;
  ASSERT_EQ(status["restartHistory"].size(), 1u);
  EXPECT_EQ(status["restartHistory"][0]["pod"], "j-0-1");
  EXPECT_EQ(status["restartHistory"][0]["exitCode"], 137);
  EXPECT_EQ(status["restartHistory"][0]["failedAtStep"], 23);

  // Next: the restart is recorded; the old gang's pods go before the new one is placed.
  Observed next = o;
  next.job["status"] = apply_status_patch(next.job["status"], status);
  next.served_attempt.reset();  // the backend stopped serving attempt 0
  next.pods = {pod(0, 0, "Running"), pod(0, 1, "Failed", 137)};
  next.pods[0].terminating = true;
  EXPECT_EQ(describe(reconcile(next, options())), (std::vector<std::string>{"delete pod j-0-1"}));
  // Once they have ended, attempt 1 is placed afresh on the freed nodes (ended pods hold nothing),
  // whether the kubelets have removed them yet or not.
  const std::vector<std::string> fresh = {"status",
                                          "update configmap j-config",
                                          "event Normal Placed",
                                          "serve rendezvous attempt 1",
                                          "create pod j-1-0 on n0",
                                          "create pod j-1-1 on n1"};
  next.nodes = {node("n0", "a", 2), node("n1", "b", 2)};
  next.pods = {pod(0, 0, "Failed", 137), pod(0, 1, "Failed", 137)};
  next.pods[0].terminating = next.pods[1].terminating = true;
  EXPECT_EQ(describe(reconcile(next, options())), fresh);
  next.pods.clear();
  EXPECT_EQ(describe(reconcile(next, options())), fresh);
}

TEST(ReconcileTest, ExitStatusTwoIsAConfigurationErrorAndIsNotRetried) {
  Observed o = running();
  o.pods = {pod(0, 0, "Failed", 2), pod(0, 1, "Running")};
  o.pods[0].message = "spec.dataset.path: '/data/train' has no index (manifest.tsv)";
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d),
            (std::vector<std::string>{"status phase=Failed reason=InvalidConfiguration",
                                      "event Warning InvalidConfiguration", "delete pod j-0-1", "stop rendezvous"}));
  EXPECT_NE(d.actions[0].object["message"].get<std::string>().find("spec.dataset.path"), std::string::npos);
  // A pod's long message (its last log lines) goes into the status bounded, by its end.
  o.pods[0].message = std::string(20000, 'x') + " the end";
  const std::string bounded = reconcile(o, options()).actions[0].object["message"].get<std::string>();
  EXPECT_LT(bounded.size(), 1300u);
  EXPECT_NE(bounded.find("...xxx"), std::string::npos);
  EXPECT_NE(bounded.find(" the end; a configuration error is not retried"), std::string::npos) << bounded;
}

TEST(ReconcileTest, ExitStatusThreeIsADivergedRunAndIsNotRetried) {
  Observed o = running();
  o.pods = {pod(0, 0, "Failed", 3), pod(0, 1, "Running")};
  o.pods[0].message = "training diverged: loss is nan at step 7";
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d),
            (std::vector<std::string>{"status phase=Failed reason=TrainingDiverged", "event Warning TrainingDiverged",
                                      "delete pod j-0-1", "stop rendezvous"}));
  const std::string message = d.actions[0].object["message"].get<std::string>();
  EXPECT_NE(message.find("loss is nan at step 7"), std::string::npos) << message;
  EXPECT_NE(message.find("not retried"), std::string::npos) << message;
}

TEST(ReconcileTest, APodWhoseImageCannotBePulledIsWaitedForThenFailsTheJobWithoutARestart) {
  Observed o = running();
  o.pods = {pod(0, 0, "Running"), pod(0, 1, "Pending")};
  o.pods[1].created = kNow - seconds(10);
  o.pods[1].waiting_reason = "ImagePullBackOff";
  o.pods[1].waiting_message = "Back-off pulling image \"tessera/worker:9.9\"";
  o.pods[1].waiting_image = "tessera/worker:9.9";
  // Within spec.runPolicy.startTimeoutSeconds (300 s): a condition and one Event naming the pod,
  // the image and the kubelet's reason; no pod deleted, no restart counted.
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status", "event Warning PodNotStarting"}));
  const json& c = d.actions[0].object["conditions"].back();
  EXPECT_EQ(c["type"], "PodsStarted");
  EXPECT_EQ(c["status"], "False");
  EXPECT_EQ(c["reason"], "ImagePullBackOff");
  const std::string message = c["message"];
  for (const char* part : {"pod j-0-1 on n1", "image tessera/worker:9.9", "ImagePullBackOff", "Back-off pulling image",
                           "startTimeoutSeconds"})
    EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  EXPECT_GT(d.requeue_after.count(), 0);
  // Seen again with the same reason: no second Event.
  Observed again = o;
  again.job["status"] = apply_status_patch(again.job["status"], d.actions[0].object);
  EXPECT_EQ(describe(reconcile(again, options())), (std::vector<std::string>{}));
  // Past the bound: the job fails (StartFailed), its restarts untouched.
  again.now = kNow + seconds(300);
  const Decision failed = reconcile(again, options());
  EXPECT_EQ(describe(failed),
            (std::vector<std::string>{"status phase=Failed reason=StartFailed", "event Warning StartFailed",
                                      "delete pod j-0-0", "delete pod j-0-1", "stop rendezvous"}));
  EXPECT_FALSE(failed.actions[0].object.contains("restarts"));
  // Started after all: the condition turns True.
  Observed started = again;
  started.now = kNow + seconds(20);
  started.pods[1] = pod(0, 1, "Running");
  const Decision ok = reconcile(started, options());
  ASSERT_FALSE(ok.actions.empty());
  EXPECT_EQ(ok.actions[0].object["conditions"].back()["status"], "True");
}

TEST(ReconcileTest, AContainerThatCannotStartFailsTheJobWithoutSpendingRestarts) {
  Observed o = running();
  o.pods = {pod(0, 0, "Running"), pod(0, 1, "Failed", 128, "StartError")};
  o.pods[1].message = "exec: \"tessera-worker\": executable file not found in $PATH";
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d),
            (std::vector<std::string>{"status phase=Failed reason=StartFailed", "event Warning StartFailed",
                                      "delete pod j-0-0", "stop rendezvous"}));
  const std::string message = d.actions[0].object["message"];
  EXPECT_NE(message.find("executable file not found"), std::string::npos) << message;
  EXPECT_NE(message.find("not retried"), std::string::npos) << message;
}

TEST(ReconcileTest, WorkerPodsRunAsTheImagesUserAndOwnTheirHostPathVolumes) {
  json spec = {
      {"cache", {{"localSSD", {{"path", "/mnt/ssd"}, {"sizeLimit", "1Gi"}}}}},
      {"checkpoint", {{"path", "/ckpt"}, {"everySteps", 10}, {"volume", {{"hostPath", {{"path", "/var/ckpt"}}}}}}}};
  Observed o = running(0, spec);
  o.pods = {pod(0, 0, "Running")};  // replica 1's pod is created
  const Decision made = reconcile(o, options());
  const Action* create = find(made, Action::Kind::kCreate, "pods");
  ASSERT_NE(create, nullptr) << ::testing::PrintToString(describe(made));
  const json& ps = create->object["spec"];
  EXPECT_EQ(ps["securityContext"]["runAsUser"], 65532);
  EXPECT_EQ(ps["securityContext"]["fsGroup"], 65532);
  ASSERT_TRUE(ps.contains("initContainers"));
  const json& init = ps["initContainers"][0];
  EXPECT_EQ(init["command"][0], "chown");
  EXPECT_EQ(init["args"], (json{"65532:65532", "/ckpt", "/mnt/ssd"}));
  EXPECT_EQ(init["securityContext"]["capabilities"]["add"], (json{"CHOWN"}));
  // With the SSD tier on an emptyDir (and a PVC for checkpoints) nothing needs root.
  spec["cache"]["localSSD"]["volume"] = "emptyDir";
  spec["checkpoint"]["volume"] = {{"persistentVolumeClaim", {{"claimName", "ckpt"}}}};
  o = running(0, spec);
  o.pods = {pod(0, 0, "Running")};
  const Decision made_plain = reconcile(o, options());
  const Action* plain = find(made_plain, Action::Kind::kCreate, "pods");
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->object["spec"].contains("initContainers"));
  bool empty_dir = false;
  for (const auto& v : plain->object["spec"]["volumes"])
    if (v["name"] == "ssd-cache") empty_dir = v["emptyDir"]["sizeLimit"] == std::to_string(2 * (int64_t{1} << 30));
  EXPECT_TRUE(empty_dir) << plain->object["spec"]["volumes"].dump();
}

TEST(ReconcileTest, BackoffLimitExceededFailsTheJob) {
  Observed o = running(2);
  o.pods = {pod(2, 0, "Failed", 1), pod(2, 1, "Running")};
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d),
            (std::vector<std::string>{"status phase=Failed reason=BackoffLimitExceeded",
                                      "event Warning BackoffLimitExceeded", "delete pod j-2-1", "stop rendezvous"}));
}

TEST(ReconcileTest, AdmissionRejectionPlacesTheGangAgainWithoutARestart) {
  Observed o = running();
  o.pods = {pod(0, 0, "Running"), pod(0, 1, "Failed", -1, "OutOfnvidia.com/gpu")};
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d),
            (std::vector<std::string>{"status", "event Warning AdmissionRejected", "delete pod j-0-0",
                                      "delete pod j-0-1", "update configmap j-config", "stop rendezvous"}));
  EXPECT_FALSE(d.actions[0].object.contains("restarts"));
  EXPECT_FALSE(find(d, Action::Kind::kUpdate)->object["data"].contains("plan.json"));
}

TEST(ReconcileTest, AllPodsSucceededSucceedsTheJob) {
  Observed o = running(0, {{"runPolicy", {{"ttlSecondsAfterFinished", 60}}}});
  o.job["status"]["switchStep"] = 8;
  o.pods = {pod(0, 0, "Succeeded", 0), pod(0, 1, "Succeeded", 0)};
  o.pods[0].message =
      R"({"type":"summary","job":"j","steps":48,"samples_per_second":12.5,"val_loss":0.1,"val_metric":0.2,"baseline_loss":0.3,"val_top5":0.7})";
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d),
            (std::vector<std::string>{"status phase=Succeeded", "event Normal Completed", "stop rendezvous"}));
  EXPECT_EQ(d.actions[0].object["step"], 48);
  EXPECT_EQ(d.actions[0].object["validation"]["baselineLoss"], 0.3);
  EXPECT_EQ(d.actions[0].object["validation"]["top5"], 0.7);
  EXPECT_EQ(d.actions[0].object["trainingPhase"], "dense");
  EXPECT_EQ(d.actions[0].object["completionTime"], format_time(kNow));
  EXPECT_EQ(d.requeue_after, std::chrono::milliseconds(60100));
}

TEST(ReconcileTest, SuspendDeletesThePodsAndResumeStartsTheClockAgain) {
  Observed o = running(0, {{"runPolicy", {{"suspend", true}, {"activeDeadlineSeconds", 100}}}});
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status phase=Suspended", "delete pod j-0-0", "delete pod j-0-1",
                                                   "event Normal Suspended", "stop rendezvous"}));
  // Resumed 500 s later: past the deadline counted from the first start, yet it runs.
  Observed r = running(0, {{"runPolicy", {{"suspend", false}, {"activeDeadlineSeconds", 100}}}});
  r.job["status"]["phase"] = "Suspended";
  r.job["status"]["startTime"] = format_time(kNow - seconds(500));
  r.pods.clear();
  r.nodes = {node("n0", "a", 2), node("n1", "b", 2)};
  const Decision resumed = reconcile(r, options());
  EXPECT_EQ(describe(resumed), (std::vector<std::string>{"status phase=Pending", "event Normal Resumed",
                                                         "create pod j-0-0 on n0", "create pod j-0-1 on n1"}));
  EXPECT_EQ(resumed.actions[0].object["startTime"], format_time(kNow));
}

TEST(ReconcileTest, DeadlineFailsTheJobAndStopsItsPods) {
  Observed o = running(0, {{"runPolicy", {{"activeDeadlineSeconds", 30}}}});
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d),
            (std::vector<std::string>{"status phase=Failed reason=DeadlineExceeded", "event Warning DeadlineExceeded",
                                      "delete pod j-0-0", "delete pod j-0-1", "stop rendezvous"}));
  Observed early = running(0, {{"runPolicy", {{"activeDeadlineSeconds", 90}}}});
  const Decision wait = reconcile(early, options());
  EXPECT_EQ(find(wait, Action::Kind::kDelete), nullptr);
  EXPECT_LE(wait.requeue_after, std::chrono::milliseconds(30100));
}

TEST(ReconcileTest, TtlDeletesTheFinishedJob) {
  Observed o = running(0, {{"runPolicy", {{"ttlSecondsAfterFinished", 10}}}});
  o.job["status"]["phase"] = "Succeeded";
  o.job["status"]["completionTime"] = format_time(kNow - seconds(11));
  o.pods = {pod(0, 0, "Succeeded", 0), pod(0, 1, "Succeeded", 0)};
  o.served_attempt.reset();  // stopped when the job succeeded
  EXPECT_EQ(describe(reconcile(o, options())), (std::vector<std::string>{"event Normal TTLExpired", "delete job"}));
  o.job["status"]["completionTime"] = format_time(kNow - seconds(4));
  const Decision d = reconcile(o, options());
  EXPECT_EQ(find(d, Action::Kind::kDeleteJob), nullptr);
  EXPECT_EQ(d.requeue_after, std::chrono::milliseconds(6100));
}

TEST(ReconcileTest, ADeletedJobLeavesItsChildrenToTheGarbageCollector) {
  Observed o = running();
  o.job["metadata"]["deletionTimestamp"] = format_time(kNow);
  EXPECT_TRUE(reconcile(o, options()).actions.empty());
}

TEST(ReconcileTest, AGangThatDoesNotFitStaysPendingAndSaysWhatIsMissing) {
  Observed o;
  o.job = job({{"replicas", 4}, {"training", {{"batchSize", 8}}}});
  o.token = "t";
  o.has_secret = true;
  o.has_service = true;
  o.nodes = {node("n0", "a", 2), node("n1", "a", 2), node("n2", "b", 2), node("n3", "b", 2, 2)};
  o.now = kNow;
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status phase=Pending restarts=0", "event Warning Unschedulable"}));
  const json c = d.actions[0].object["conditions"][0];
  EXPECT_EQ(c["type"], "Placed");
  EXPECT_EQ(c["status"], "False");
  EXPECT_EQ(c["reason"], "Unschedulable");
  EXPECT_NE(c["message"].get<std::string>().find(
                "needs 8 GPUs (4 pods of 2) on nodes matching any labels; 6 free on 3 nodes"),
            std::string::npos)
      << c["message"];
  EXPECT_GT(d.requeue_after.count(), 0);
  // The same world again: no second Event.
  o.job["status"] = apply_status_patch(o.job["status"], d.actions[0].object);
  EXPECT_TRUE(reconcile(o, options()).actions.empty());
  // A node more: the gang starts.
  o.nodes.push_back(node("n4", "b", 2));
  EXPECT_EQ(find(reconcile(o, options()), Action::Kind::kCreate, "pods")->object["spec"]["nodeName"], "n0");
}

TEST(ReconcileTest, AnEditToAStartedJobIsReportedAndNotApplied) {
  Observed o = running();
  o.job["spec"]["model"]["inputSize"] = 32;
  o.job["metadata"]["generation"] = 2;
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status", "event Warning SpecChangeRejected"}));
  const json& conditions = d.actions[0].object["conditions"];
  EXPECT_EQ(conditions.back()["type"], "SpecChangeRejected");
  EXPECT_NE(conditions.back()["message"].get<std::string>().find("spec.model.inputSize"), std::string::npos);
  EXPECT_EQ(conditions.back()["observedGeneration"], 2);
  // runPolicy may change: a suspend is applied.
  Observed s = running();
  s.job["spec"]["runPolicy"]["suspend"] = true;
  EXPECT_EQ(describe(reconcile(s, options()))[0], "status phase=Suspended");
}

// A field with no effect is one Warning Event, on the job's first reconcile only.
TEST(ReconcileTest, AFieldWithNoEffectIsOneWarningEvent) {
  Observed o;
  o.job = job({{"communication", {{"strategy", "dense"}, {"sparse", "topk"}}}});
  o.token = "t";
  o.nodes = {node("n0", "a", 2), node("n1", "a", 2)};
  o.now = kNow;
  const Decision d = reconcile(o, options());
  const Action* w = nullptr;
  for (const auto& a : d.actions)
    if (a.kind == Action::Kind::kEvent && a.reason == Reason::kSpecWarning) w = &a;
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->warning);
  EXPECT_NE(w->message.find("spec.communication.sparse: has no effect with strategy dense"), std::string::npos)
      << w->message;
  o.job["status"] = apply_status_patch(o.job["status"], d.actions[0].object);
  for (const auto& a : reconcile(o, options()).actions) EXPECT_NE(a.reason, Reason::kSpecWarning) << a.describe();
}

TEST(ReconcileTest, AnInvalidSpecFailsOnceNamingTheField) {
  Observed o;
  o.job = job({{"parallelism", {{"spatial", {{"d", 3}}}}}});
  o.now = kNow;
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d),
            (std::vector<std::string>{"status phase=Failed reason=InvalidSpec", "event Warning InvalidSpec"}));
  EXPECT_NE(d.actions[0].object["message"].get<std::string>().find("spec.parallelism.spatial.d"), std::string::npos);
  o.job["status"] = apply_status_patch(o.job["status"], d.actions[0].object);
  EXPECT_TRUE(reconcile(o, options()).actions.empty());
  // A cluster needs a volume for the checkpoints.
  Observed c;
  c.job = job({{"checkpoint", {{"path", "/ckpt"}, {"everySteps", 10}}}});
  c.now = kNow;
  EXPECT_NE(
      reconcile(c, options()).actions[0].object["message"].get<std::string>().find("spec.checkpoint.volume: required"),
      std::string::npos);
}

TEST(ReconcileTest, TheStatusStaysSmallWhateverTheSpecOrTheRun) {
  // A spec larger than its ConfigMap could carry.
  Observed big;
  big.job = job({{"placement", {{"nodeSelector", {{"pool", std::string(600 << 10, 'a')}}}}}});
  big.now = kNow;
  const Decision d = reconcile(big, options());
  ASSERT_EQ(describe(d)[0], "status phase=Failed reason=InvalidSpec");
  const std::string m = d.actions[0].object["message"];
  EXPECT_EQ(m.rfind("spec: ", 0), 0u) << m.substr(0, 200);
  EXPECT_NE(m.find("bytes of JSON, above the limit of 524288 (the job's ConfigMap carries the spec)"),
            std::string::npos);
  EXPECT_LT(m.size(), 4096u);
  // Many problems: the first ten are named, and how many more there are.
  json bad = json::object();
  for (int i = 0; i < 14; ++i) bad["unknown" + std::to_string(i)] = 1;
  Observed many;
  many.job = job(bad);
  many.now = kNow;
  const std::string mm = reconcile(many, options()).actions[0].object["message"];
  EXPECT_NE(mm.find("; and 4 more problems (tessera validate lists them all)"), std::string::npos) << mm;
  // The restart history keeps the last 20 restarts; status.restarts counts them all.
  Observed o = running(25, {{"runPolicy", {{"backoffLimit", 100}}}});
  json history = json::array();
  for (int i = 0; i < 20; ++i) history.push_back({{"reason", "r"}, {"failedAtStep", i}, {"resumedAtStep", i}});
  o.job["status"]["restartHistory"] = history;
  o.pods = {pod(25, 0, "Running"), pod(25, 1, "Failed", 137)};
  const json s = reconcile(o, options()).actions[0].object;
  EXPECT_EQ(s["restarts"], 26);
  ASSERT_EQ(s["restartHistory"].size(), 20u);
  EXPECT_EQ(s["restartHistory"][0]["failedAtStep"], 1);
  EXPECT_EQ(s["restartHistory"][19]["pod"], "j-25-1");
}

TEST(ReconcileTest, ProgressIsWrittenAtMostEveryStatusInterval) {
  Observed o = running();
  o.progress = Progress{40, 30, 1, 0.25, 12.5, 32, {}, "", {}, {}};
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status", "event Normal PhaseSwitch"}));
  const json s = d.actions[0].object;
  EXPECT_EQ(s["step"], 40);
  EXPECT_EQ(s["trainingPhase"], "dense");
  EXPECT_EQ(s["switchStep"], 32);
  // Two seconds later with new progress: not yet.
  o.job["status"] = apply_status_patch(o.job["status"], s);
  o.now = kNow + seconds(2);
  o.progress->step = 44;
  const Decision later = reconcile(o, options());
  EXPECT_TRUE(later.actions.empty());
  EXPECT_LE(later.requeue_after, std::chrono::milliseconds(3010));
  o.now = kNow + seconds(5);
  EXPECT_EQ(reconcile(o, options()).actions[0].object["step"], 44);
}

// strategy auto: the rendezvous's choice goes into status.exchange with an ExchangeChosen event, once
// per choice; the training phase follows it (sparse from its step until the switch step).
TEST(ReconcileTest, TheChosenExchangeIsInTheStatusWithAnEvent) {
  Observed o =
      running(0, {{"communication", {{"strategy", "auto"}, {"density", 0.01}}}, {"training", {{"epochs", 4}}}});
  o.progress = Progress{12, 0, 0, 0.5, 10, -1, {}, "", {}, {}};
  ExchangeDecision& x = o.progress->exchange;
  x.version = 1, x.from_step = 7, x.sparse = "hitopk", x.density = 0.01, x.dense = "torus";
  x.reason =
      "inter-node links measured at 100 Mbit/s; hitopk at density 0.01 predicted 0.74 s a step against torus 9.1 s";
  x.predicted = {{"hitopk at density 0.01, then torus", 2.1}, {"torus", 9.1}};
  x.inter_bits_per_second = 0.1e9, x.compute_s = 0.143;
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status", "event Normal ExchangeChosen"}));
  const json s = d.actions[0].object;
  EXPECT_EQ(s["trainingPhase"], "sparse");
  const json& e = s["exchange"];
  EXPECT_EQ(e["choice"], 1);
  EXPECT_EQ(e["fromStep"], 7);
  EXPECT_EQ(e["strategy"], "hitopk");
  EXPECT_EQ(e["density"], 0.01);
  EXPECT_EQ(e["dense"], "torus");
  EXPECT_EQ(e["reason"], x.reason);
  EXPECT_DOUBLE_EQ(e["interNodeGbps"].get<double>(), 0.1);
  ASSERT_EQ(e["predicted"].size(), 2u);
  EXPECT_EQ(e["predicted"][0]["exchange"], "hitopk at density 0.01, then torus");
  EXPECT_EQ(e["predicted"][1]["stepSeconds"], 9.1);
  EXPECT_EQ(d.actions[1].message, "hitopk at density 0.01, then torus from step 7: " + x.reason);
  // The same choice later is no news; the switch step is, and the phase turns dense there.
  o.job["status"] = apply_status_patch(o.job["status"], s);
  o.now = kNow + seconds(10);
  o.progress->step = 21;
  o.progress->switch_step = 20;
  const Decision later = reconcile(o, options());
  EXPECT_EQ(describe(later), (std::vector<std::string>{"status", "event Normal PhaseSwitch"}));
  EXPECT_EQ(later.actions[0].object["trainingPhase"], "dense");
  EXPECT_FALSE(later.actions[0].object.contains("exchange"));
  EXPECT_EQ(later.actions[1].message, "the gang switches from hitopk to torus at step 20");
  // A dense choice: no density, dense throughout.
  o.job["status"] = apply_status_patch(o.job["status"], later.actions[0].object);
  o.now = kNow + seconds(20);
  x.version = 2, x.from_step = 30, x.sparse = "", x.dense = "dense";
  const Decision again = reconcile(o, options());
  EXPECT_EQ(describe(again), (std::vector<std::string>{"status", "event Normal ExchangeChosen"}));
  EXPECT_EQ(again.actions[0].object["exchange"]["strategy"], "dense");
  EXPECT_FALSE(again.actions[0].object["exchange"].contains("density"));
}

TEST(ReconcileTest, StragglersAreNamedInTheStatusAndAnEventWhenTheyChange) {
  Observed o = running();
  o.job["status"]["lastProgressTime"] = format_time(kNow);
  o.progress = Progress{40, 0, 1, 0.25, 12.5, -1, {}, "", {}, {}};
  o.progress->slow_ranks = {2, 3};
  o.progress->slow_reason = "node n1 (ranks 2, 3) has a slow network: ...";
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status", "event Warning Straggler"}));
  EXPECT_EQ(d.actions[1].message, "node n1 (ranks 2, 3) has a slow network: ...");
  o.job["status"] = apply_status_patch(o.job["status"], d.actions[0].object);
  EXPECT_EQ(o.job["status"]["slowRanks"], json::array({2, 3}));
  const json* c = nullptr;
  for (const json& e : o.job["status"]["conditions"])
    if (e["type"] == "Straggler") c = &e;
  ASSERT_NE(c, nullptr);
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_EQ((*c)["reason"], "SlowRank");
  // The same ranks with new figures: no Event, the message refreshed with the progress.
  o.now = kNow + seconds(1);
  o.progress->slow_reason = "node n1 (ranks 2, 3) has a slow network: newer figures";
  EXPECT_TRUE(reconcile(o, options()).actions.empty());
  o.now = kNow + seconds(6);
  const Decision later = reconcile(o, options());
  EXPECT_EQ(describe(later), (std::vector<std::string>{"status"}));
  EXPECT_EQ(later.actions[0].object["conditions"].back()["message"],
            "node n1 (ranks 2, 3) has a slow network: newer figures");
  o.job["status"] = apply_status_patch(o.job["status"], later.actions[0].object);
  // The node recovers.
  o.progress->slow_ranks.clear();
  o.progress->slow_reason.clear();
  const Decision gone = reconcile(o, options());
  EXPECT_EQ(describe(gone), (std::vector<std::string>{"status", "event Normal StragglerGone"}));
  EXPECT_TRUE(gone.actions[0].object["slowRanks"].is_null());
  // After a gang restart the new gang avoids the slow ranks' node while other room exists, and
  // measures afresh.
  o.job["status"]["slowRanks"] = json::array({2, 3});  // n1's ranks in the plan
  o.pods = {pod(0, 0, "Running"), pod(0, 1, "Failed", 137)};
  const Decision restart = reconcile(o, options());
  ASSERT_FALSE(restart.actions.empty());
  o.job["status"] = apply_status_patch(o.job["status"], restart.actions[0].object);
  o.pods.clear();
  o.served_attempt.reset();
  o.nodes = {node("n0", "a", 2), node("n1", "a", 2), node("n2", "b", 2)};
  const Decision placed = reconcile(o, options());
  EXPECT_EQ(describe(placed), (std::vector<std::string>{"status", "update configmap j-config", "event Normal Placed",
                                                        "serve rendezvous attempt 1", "create pod j-1-0 on n0",
                                                        "create pod j-1-1 on n2"}));
  EXPECT_TRUE(placed.actions[0].object["slowRanks"].is_null());
  EXPECT_NE(find(placed, Action::Kind::kEvent)->message.find("avoiding the slow node(s) n1"), std::string::npos);
  // Without other room the slow node is used.
  o.nodes = {node("n0", "a", 2), node("n1", "a", 2)};
  EXPECT_EQ(
      describe(reconcile(o, options())),
      (std::vector<std::string>{"status", "update configmap j-config", "event Normal Placed",
                                "serve rendezvous attempt 1", "create pod j-1-0 on n0", "create pod j-1-1 on n1"}));
}

// A preemption: the pods' ranks stopped on SIGTERM after checkpointing the step they agreed on
// (exit status 4). The gang is placed again and the failure budget is untouched (backoffLimit 0
// would fail the job on a failure).
TEST(ReconcileTest, AStoppedGangIsPlacedAgainWithoutCountingAFailure) {
  Observed o = running(0, {{"runPolicy", {{"backoffLimit", 0}}}});
  o.pods = {pod(0, 0, "Failed", kExitStopped), pod(0, 1, "Failed", kExitStopped)};
  o.pods[1].message =
      "slot 0: stopped at step 30 on SIGTERM, every rank at the same step; the checkpoint of step 30 is written";
  o.progress = Progress{30, 0, 0, 0.5, 10, -1, {}, "", {}, {}};
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status phase=Restarting", "event Warning Preempted",
                                                   "delete pod j-0-0", "delete pod j-0-1", "stop rendezvous"}));
  const json& status = d.actions[0].object;
  EXPECT_FALSE(status.contains("restarts"));
  EXPECT_EQ(status["preemptions"], 1);
  const json& entry = status["restartHistory"][0];
  EXPECT_EQ(entry["preempted"], true);
  EXPECT_EQ(entry["exitCode"], kExitStopped);
  EXPECT_EQ(entry["failedAtStep"], 30);
  EXPECT_NE(entry["reason"].get<std::string>().find("the checkpoint of step 30 is written"), std::string::npos)
      << entry;
  EXPECT_NE(d.actions[1].message.find("not counted against backoffLimit"), std::string::npos) << d.actions[1].message;
  // The next gang is attempt 1 (restarts 0 + preemptions 1).
  Observed next = o;
  next.job["status"] = apply_status_patch(next.job["status"], status);
  EXPECT_EQ(attempt_of(next.job["status"]), 1);
  next.pods.clear();
  next.served_attempt.reset();
  next.nodes = {node("n0", "a", 2), node("n1", "b", 2)};
  EXPECT_EQ(
      describe(reconcile(next, options())),
      (std::vector<std::string>{"status", "update configmap j-config", "event Normal Placed",
                                "serve rendezvous attempt 1", "create pod j-1-0 on n0", "create pod j-1-1 on n1"}));
  // A real failure among stopped pods is a failure.
  o.pods[0] = pod(0, 0, "Failed", 137);
  EXPECT_EQ(describe(reconcile(o, options()))[0], "status phase=Failed reason=BackoffLimitExceeded");
}

// kubectl drain: the node is cordoned, then its pods evicted. The controller stops the gang's pod
// there (SIGTERM: the ranks agree on a step and checkpoint it), waits for it, and places the gang
// away from the node.
TEST(ReconcileTest, ADrainedNodesPodIsStoppedAndTheGangMovesAway) {
  Observed o = running();
  o.nodes[1].unschedulable = true;
  o.nodes.push_back(node("n2", "b", 2));
  o.progress = Progress{41, 0, 0, 0.5, 10, -1, {}, "", {}, {}};
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status", "delete pod j-0-1"}));
  EXPECT_EQ(d.actions[0].object["conditions"].back()["type"], "Preempted");
  EXPECT_EQ(d.actions[0].object["conditions"].back()["reason"], "NodeLeaving");
  EXPECT_GT(d.requeue_after.count(), 0);
  o.job["status"] = apply_status_patch(o.job["status"], d.actions[0].object);
  // Stopping: the pod there terminating, the other one stopped after the checkpoint. Waited for.
  o.pods[1].terminating = true;
  o.pods[0] = pod(0, 0, "Failed", kExitStopped);
  o.pods[0].message =
      "slot 1: stopped at step 42 on SIGTERM, every rank at the same step; the checkpoint of step 42 is written";
  EXPECT_EQ(describe(reconcile(o, options())), (std::vector<std::string>{}));
  // Gone: a preemption naming the node, and the new gang away from it.
  o.pods.pop_back();
  const Decision moved = reconcile(o, options());
  EXPECT_EQ(describe(moved), (std::vector<std::string>{"status phase=Restarting", "event Warning Preempted",
                                                       "delete pod j-0-0", "stop rendezvous"}));
  const json& entry = moved.actions[0].object["restartHistory"][0];
  EXPECT_EQ(entry["node"], "n1");
  EXPECT_EQ(entry["pod"], "j-0-1");
  const std::string why = entry["reason"];
  EXPECT_NE(why.find("node n1 was cordoned"), std::string::npos) << why;
  EXPECT_NE(why.find("the checkpoint of step 42 is written"), std::string::npos) << why;
  o.job["status"] = apply_status_patch(o.job["status"], moved.actions[0].object);
  o.pods.clear();
  o.served_attempt.reset();
  o.nodes = {node("n0", "a", 2), node("n1", "b", 2), node("n2", "b", 2)};
  o.nodes[1].unschedulable = true;
  const Decision placed = reconcile(o, options());
  EXPECT_EQ(describe(placed), (std::vector<std::string>{"status", "update configmap j-config", "event Normal Placed",
                                                        "serve rendezvous attempt 1", "create pod j-1-0 on n0",
                                                        "create pod j-1-1 on n2"}));
  // A drain that outlasts the grace period: the closing message says the periodic checkpoint stands.
  Observed late = running();
  late.nodes[1].unschedulable = true;
  late.pods = {pod(0, 0, "Failed", 1)};
  const Decision stood = reconcile(late, options());
  ASSERT_FALSE(stood.actions.empty());
  const std::string message = stood.actions[0].object["restartHistory"][0]["reason"];
  EXPECT_NE(message.find("did not checkpoint on SIGTERM within spec.runPolicy.terminationGracePeriodSeconds (30 s)"),
            std::string::npos)
      << message;
}

// A drained node's pod can leave the API as its container ends, and its account of the stop with it.
// The gang's other ranks stop at the same step with the same account: they are waited for, up to the
// grace period from when the node was seen leaving, and then the gang moves without it.
TEST(ReconcileTest, ADrainedGangWaitsForItsOtherRanksWhenThePodThereIsGone) {
  Observed o = running();
  o.nodes[1].unschedulable = true;
  o.nodes.push_back(node("n2", "b", 2));
  const Decision d = reconcile(o, options());
  ASSERT_EQ(describe(d), (std::vector<std::string>{"status", "delete pod j-0-1"}));
  o.job["status"] = apply_status_patch(o.job["status"], d.actions[0].object);
  o.pods.pop_back();  // j-0-1 gone; j-0-0 still running
  o.now += seconds(2);
  const Decision waited = reconcile(o, options());
  EXPECT_EQ(describe(waited), (std::vector<std::string>{}));
  EXPECT_GT(waited.requeue_after.count(), 0);
  // Its ranks stop with the account: the preemption says where the gang stopped.
  Observed stopped = o;
  stopped.pods[0] = pod(0, 0, "Failed", kExitStopped);
  stopped.pods[0].message =
      "slot 0: stopped at step 42 on SIGTERM, every rank at the same step; the checkpoint of step 42 is written";
  const Decision moved = reconcile(stopped, options());
  EXPECT_EQ(describe(moved), (std::vector<std::string>{"status phase=Restarting", "event Warning Preempted",
                                                       "delete pod j-0-0", "stop rendezvous"}));
  std::string why = moved.actions[0].object["restartHistory"][0]["reason"];
  EXPECT_NE(why.find("stopped at step 42 on SIGTERM"), std::string::npos) << why;
  EXPECT_EQ(moved.actions[0].object["restartHistory"][0]["pod"], "j-0-1");
  // Still running past the grace period (30 s) and a moment: the gang moves from its periodic checkpoint.
  o.now += seconds(30);
  EXPECT_EQ(describe(reconcile(o, options())), (std::vector<std::string>{}));
  o.now += seconds(4);
  const Decision late = reconcile(o, options());
  EXPECT_EQ(describe(late), (std::vector<std::string>{"status phase=Restarting", "event Warning Preempted",
                                                      "delete pod j-0-0", "stop rendezvous"}));
  why = late.actions[0].object["restartHistory"][0]["reason"];
  EXPECT_NE(why.find("did not checkpoint on SIGTERM"), std::string::npos) << why;
}

// A node lost (its kubelet stopped reporting, or the node deleted): the gang's pods are deleted at
// once (no kubelet is left to confirm a graceful delete of the lost node's pod, and the others' ranks
// cannot agree on a step to checkpoint without its ranks) and the gang is placed elsewhere.
TEST(ReconcileTest, ALostNodesGangIsPlacedElsewhereAtOnce) {
  for (const bool deleted : {false, true}) {
    Observed o = running();
    if (deleted) o.nodes.pop_back();
    else o.nodes[1].ready = false;
    o.nodes.push_back(node("n2", "b", 2));
    const Decision d = reconcile(o, options());
    EXPECT_EQ(describe(d),
              (std::vector<std::string>{"status phase=Restarting", "event Warning Preempted", "delete pod j-0-0 now",
                                        "delete pod j-0-1 now", "stop rendezvous"}));
    EXPECT_EQ(d.actions[0].object["preemptions"], 1);
    EXPECT_EQ(d.actions[0].object["restartHistory"][0]["node"], "n1");
    const std::string why = d.actions[0].object["restartHistory"][0]["reason"];
    EXPECT_NE(why.find(deleted ? "node n1 was deleted" : "node n1 is not ready"), std::string::npos) << why;
    o.job["status"] = apply_status_patch(o.job["status"], d.actions[0].object);
    o.pods.clear();
    o.served_attempt.reset();
    o.nodes[0].used.gpu = 0;
    const std::vector<std::string> placed = describe(reconcile(o, options()));
    EXPECT_EQ(std::count_if(placed.begin(), placed.end(),
                            [](const std::string& a) { return a.rfind("create pod j-1-", 0) == 0; }),
              2);
    EXPECT_EQ(std::count_if(placed.begin(), placed.end(),
                            [](const std::string& a) { return a.find(" on n1") != std::string::npos; }),
              0)
        << ::testing::PrintToString(placed);
  }
}

// The node's kubelet and containers die together: the peers fail first, while the node's pod stays
// Running in the API until the node monitor calls the node NotReady. The restart waits for that, so
// the gang moves as a preemption; an old pod left on the lost node is deleted at once.
TEST(ReconcileTest, PeersOfAPodThatStaysRunningWaitForItsNodeToBeCalledLost) {
  Observed o = running(0, {{"runPolicy", {{"backoffLimit", 0}}}});
  o.pods[0] = pod(0, 0, "Failed", 1);
  o.pods[0].finished = kNow - seconds(10);
  const Decision waiting = reconcile(o, options());
  EXPECT_EQ(describe(waiting), (std::vector<std::string>{}));
  EXPECT_GT(waiting.requeue_after.count(), 0);
  o.nodes[1].ready = false;
  EXPECT_EQ(describe(reconcile(o, options())),
            (std::vector<std::string>{"status phase=Restarting", "event Warning Preempted", "delete pod j-0-0 now",
                                      "delete pod j-0-1 now", "stop rendezvous"}));
  // Not called lost within the bound: a failure after all.
  o.nodes[1].ready = true;
  o.now = kNow + seconds(60);
  EXPECT_EQ(describe(reconcile(o, options()))[0], "status phase=Failed reason=BackoffLimitExceeded");
  // The same with supervisors that report their ranks' exits (restarts in place): the pod on the lost
  // node stays silent, and the restart waits for the node to be called lost.
  Observed quiet = running();
  quiet.progress = Progress{23, 0, 0, 0.5, 10, -1, {}, "", {}, {}};
  quiet.progress->exits = {{0, 0, 1, "lost the connection to rank 2", kNow - seconds(10)}};
  EXPECT_EQ(describe(reconcile(quiet, options())), (std::vector<std::string>{}));
  // Under tessera run there is no node monitor to wait for: the gang restarts in place at once.
  ReconcileOptions local = options();
  local.cluster = false;
  EXPECT_EQ(describe(reconcile(quiet, local))[0], "status phase=Restarting restarts=1");
  quiet.nodes[1].ready = false;
  EXPECT_EQ(describe(reconcile(quiet, options()))[3], "delete pod j-0-1 now");
  // A pod of an earlier gang on a lost node, terminating for ever: deleted at once.
  Observed old = running(1);
  old.pods = {pod(0, 1, "Running")};
  old.pods[0].terminating = true;
  old.nodes[1].ready = false;
  EXPECT_EQ(describe(reconcile(old, options())), (std::vector<std::string>{"delete pod j-0-1 now"}));
}

// kill -9 of one worker process: its pod's supervisor reports it (exit 137), and the peers' theirs
// (exit 1, their peer gone); the pods run on. The gang restarts in place: a new rendezvous round,
// no pod deleted or created; counted against backoffLimit.
TEST(ReconcileTest, AFailedRankRestartsTheGangInPlace) {
  Observed o = running();
  o.progress = Progress{23, 0, 0, 0.5, 10, -1, {}, "", {}, {}};
  o.progress->exits = {{0, 1, 1, "rank 1: peer rank 2 closed the connection", kNow - seconds(1)}};
  // The peer's report first: the killed one's is waited for.
  const Decision waiting = reconcile(o, options());
  EXPECT_EQ(describe(waiting), (std::vector<std::string>{}));
  EXPECT_GT(waiting.requeue_after.count(), 0);
  o.progress->exits.push_back({1, 0, 137, "killed by signal 9", kNow});
  const Decision d = reconcile(o, options());
  EXPECT_EQ(describe(d), (std::vector<std::string>{"status phase=Restarting restarts=1", "event Warning GangRestart",
                                                   "serve rendezvous attempt 0 round 1"}));
  const json& status = d.actions[0].object;
  EXPECT_EQ(status["restartsInPlace"], 1);
  const json& entry = status["restartHistory"][0];
  EXPECT_EQ(entry["inPlace"], true);
  EXPECT_EQ(entry["pod"], "j-0-1");
  EXPECT_EQ(entry["node"], "n1");
  EXPECT_EQ(entry["exitCode"], 137);
  EXPECT_NE(entry["reason"].get<std::string>().find("slot 0: killed by signal 9"), std::string::npos) << entry;
  EXPECT_NE(d.actions[1].message.find("in place"), std::string::npos);
  // The new round is served; the pods run on, and the job stays Restarting until its ranks report.
  Observed next = o;
  next.job["status"] = apply_status_patch(next.job["status"], status);
  next.served_round = 1;
  next.progress = Progress{};
  EXPECT_EQ(describe(reconcile(next, options())), (std::vector<std::string>{}));
  next.progress = Progress{21, 20, 0, 0.5, 10, -1, {}, "", {}, {}};
  const Decision resumed = reconcile(next, options());
  ASSERT_FALSE(resumed.actions.empty());
  EXPECT_EQ(resumed.actions[0].object["phase"], "Running");
  EXPECT_EQ(resumed.actions[0].object["restartHistory"][0]["resumedAtStep"], 20);
  // With runPolicy.restartInPlace false the pods are replaced instead.
  Observed replaced = o;
  replaced.job["spec"]["runPolicy"]["restartInPlace"] = false;
  EXPECT_EQ(describe(reconcile(replaced, options())),
            (std::vector<std::string>{"status phase=Restarting restarts=1", "event Warning GangRestart",
                                      "delete pod j-0-0", "delete pod j-0-1", "stop rendezvous"}));
}

// spec.elastic: a lost node leaves no room for the whole gang, so it goes on with the pods that fit
// (ScaledDown); once the node is back the smaller gang stops at a checkpoint and is placed whole
// (ScaledUp). Neither counts against backoffLimit.
TEST(ReconcileTest, AnElasticGangShrinksToTheRoomLeftAndGrowsBackWhenItReturns) {
  Observed o = running(0, {{"elastic", {{"minReplicas", 1}}}});
  o.nodes[1].ready = false;
  const Decision lost = reconcile(o, options());
  ASSERT_FALSE(lost.actions.empty());
  o.job["status"] = apply_status_patch(o.job["status"], lost.actions[0].object);
  o.pods.clear();
  o.served_attempt.reset();
  o.nodes[0].used.gpu = 0;
  const Decision shrunk = reconcile(o, options());
  EXPECT_EQ(describe(shrunk),
            (std::vector<std::string>{"status", "update configmap j-config", "event Warning ScaledDown",
                                      "event Normal Placed", "serve rendezvous attempt 1", "create pod j-1-0 on n0"}));
  EXPECT_EQ(shrunk.actions[0].object["replicas"], 1);
  const std::string why = find(shrunk, Action::Kind::kEvent)->message;
  EXPECT_NE(why.find("room for 1 of 2 pods"), std::string::npos) << why;
  EXPECT_NE(why.find("the global batch of 4 kept"), std::string::npos) << why;
  // The smaller gang runs; nothing changes while the node is away.
  o.job["status"] = apply_status_patch(o.job["status"], shrunk.actions[0].object);
  o.config_map = find(shrunk, Action::Kind::kUpdate)->object;
  o.served_attempt = 1;
  o.pods = {pod(1, 0, "Running")};
  o.nodes[0].used.gpu = 2;
  EXPECT_TRUE(needs_all_nodes(o.job));
  // Read before validation: fields of the wrong type mean no, never an exception.
  for (const auto& [pointer, bad] : std::vector<std::pair<std::string, json>>{{"/spec/elastic/minReplicas", "1"},
                                                                              {"/spec/elastic", 3},
                                                                              {"/status/replicas", 1.5},
                                                                              {"/status", "x"},
                                                                              {"/spec", nullptr}}) {
    json j = o.job;
    j[json::json_pointer(pointer)] = bad;
    EXPECT_FALSE(needs_all_nodes(j)) << pointer;
  }
  const Decision waiting = reconcile(o, options());
  for (const auto& a : describe(waiting)) EXPECT_EQ(a.rfind("delete", 0), std::string::npos) << a;
  if (const Action* patch = find(waiting, Action::Kind::kPatchStatus))
    o.job["status"] = apply_status_patch(o.job["status"], patch->object);
  EXPECT_EQ(o.job["status"]["phase"], "Running");
  // The node is back: the gang stops (SIGTERM: a checkpoint at a step every rank agrees on) and is
  // placed whole.
  o.nodes[1].ready = true;
  o.nodes[1].used.gpu = 0;
  const Decision grow = reconcile(o, options());
  EXPECT_EQ(describe(grow), (std::vector<std::string>{"status phase=Restarting", "event Normal ScaledUp",
                                                      "delete pod j-1-0", "stop rendezvous"}));
  EXPECT_EQ(grow.actions[0].object["attempt"], 2);
  o.job["status"] = apply_status_patch(o.job["status"], grow.actions[0].object);
  EXPECT_EQ(o.job["status"]["restarts"], 0);
  o.pods.clear();
  o.served_attempt.reset();
  o.nodes[0].used.gpu = 0;
  const Decision whole = reconcile(o, options());
  EXPECT_EQ(describe(whole), (std::vector<std::string>{"status", "update configmap j-config", "event Normal Placed",
                                                       "serve rendezvous attempt 2", "create pod j-2-0 on n0",
                                                       "create pod j-2-1 on n1"}));
  EXPECT_EQ(whole.actions[0].object["replicas"], 2);
  // A job that is not elastic waits for room instead.
  Observed fixed = running();
  fixed.job["status"]["attempt"] = 1;
  fixed.job["status"]["preemptions"] = 1;
  fixed.pods.clear();
  fixed.served_attempt.reset();
  fixed.nodes[1].ready = false;
  fixed.nodes[0].used.gpu = 0;
  EXPECT_EQ(describe(reconcile(fixed, options()))[1], "event Warning Unschedulable");
}

TEST(ReconcileTest, ThePodsGracePeriodIsTheRunPolicys) {
  Observed o = running(0, {{"runPolicy", {{"terminationGracePeriodSeconds", 120}}}});
  o.pods = {pod(0, 1, "Running")};
  const Decision d = reconcile(o, options());
  const Action* p = find(d, Action::Kind::kCreate, "pods");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->object["spec"]["terminationGracePeriodSeconds"], 120);
  bool env = false;
  for (const auto& e : p->object["spec"]["containers"][0]["env"])
    env = env || (e["name"] == "TESSERA_GRACE_SECONDS" && e["value"] == "120");
  EXPECT_TRUE(env);
}

TEST(ReconcileTest, TheRestartRecordsWhereTheNewGangResumed) {
  Observed o = running(1);
  o.job["status"]["restartHistory"] = json::array({{{"reason", "r"}, {"failedAtStep", 23}, {"resumedAtStep", -1}}});
  o.progress = Progress{26, 20, 0, 0.5, 10, -1, {}, "", {}, {}};  // the new gang started at its checkpoint, step 20
  const Decision d = reconcile(o, options());
  ASSERT_FALSE(d.actions.empty());
  EXPECT_EQ(d.actions[0].object["restartHistory"][0]["resumedAtStep"], 20);
}

TEST(ReconcileTest, LocallyEveryRankTakesAGpuSlotAndNoVolumeIsNeeded) {
  Observed o;
  o.job = job({{"resources", {{"gpu", 0}}}, {"checkpoint", {{"path", "/tmp/ckpt"}, {"everySteps", 5}}}});
  o.token = "new-token";
  o.nodes = {node("local-0", "local", 2), node("local-1", "local", 2)};
  o.now = kNow;
  ReconcileOptions local = options();
  local.cluster = false;
  const Decision d = reconcile(o, local);
  std::vector<std::string> nodes;
  for (const auto& a : d.actions)
    if (a.kind == Action::Kind::kCreate && a.resource == Resource::kPod) nodes.push_back(a.object["spec"]["nodeName"]);
  EXPECT_EQ(nodes, (std::vector<std::string>{"local-0", "local-1"}));  // 2 slots each: one replica per node
  // On a cluster the same CPU job packs (no GPU requested) but needs a checkpoint volume.
  const Decision cluster = reconcile(o, options());
  EXPECT_EQ(describe(cluster)[0], "status phase=Failed reason=InvalidSpec");
}

TEST(ReconcileTest, TheRendezvousServesTheCurrentGangWithItsSwitchStep) {
  Observed o = running(1);
  o.job["status"]["switchStep"] = 64;
  const auto t = rendezvous_target(o);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->attempt, 1);
  EXPECT_EQ(t->token, "t0k3n");
  EXPECT_EQ(t->plan.size(), 4u);
  EXPECT_EQ(t->switch_step, 64);
  EXPECT_EQ(t->switch_at_epoch, 1);
  o.job["status"]["phase"] = "Succeeded";
  EXPECT_FALSE(rendezvous_target(o).has_value());
}

TEST(ObserveTest, PodsAndNodesFromApiObjects) {
  const json p = {{"metadata", {{"name", "j-1-0"}, {"labels", {{kReplicaLabel, "0"}, {kAttemptLabel, "1"}}}}},
                  {"spec",
                   {{"nodeName", "n0"},
                    {"containers", json::array({{{"resources",
                                                  {{"limits", {{"nvidia.com/gpu", "2"}}},
                                                   {"requests", {{"cpu", "500m"}, {"memory", "1Gi"}}}}}}})}}},
                  {"status",
                   {{"phase", "Failed"},
                    {"containerStatuses", json::array({{{"state", {{"terminated", {{"exitCode", 137}}}}}}})}}}};
  const PodInfo info = pod_info(p);
  EXPECT_EQ(info.attempt, 1);
  EXPECT_EQ(info.exit_code, 137);
  // An init container that could not start decides, though the worker container never ran.
  json init_failed = p;
  init_failed["status"]["initContainerStatuses"] = json::array(
      {{{"state",
         {{"terminated", {{"exitCode", 128}, {"reason", "StartError"}, {"message", "exec: \"chown\": not found"}}}}}}});
  init_failed["status"]["containerStatuses"] =
      json::array({{{"state", {{"waiting", {{"reason", "PodInitializing"}}}}}}});
  const PodInfo init = pod_info(init_failed);
  EXPECT_EQ(init.exit_code, 128);
  EXPECT_EQ(init.reason, "StartError");
  EXPECT_EQ(init.message, "exec: \"chown\": not found");
  EXPECT_TRUE(init.waiting_reason.empty());  // PodInitializing is a start under way
  const auto r = pod_requests(p);
  EXPECT_EQ(r.gpu, 2);
  EXPECT_DOUBLE_EQ(r.cpu, 0.5);
  EXPECT_EQ(r.memory, int64_t{1} << 30);
  json running_pod = p;
  running_pod["status"]["phase"] = "Running";
  const json n = {{"metadata", {{"name", "n0"}, {"labels", {{"kubernetes.io/hostname", "n0"}}}}},
                  {"status",
                   {{"allocatable", {{"nvidia.com/gpu", "4"}, {"cpu", "8"}}},
                    {"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})}}}};
  const placement::NodeInfo node = node_info(n);
  EXPECT_TRUE(node.ready);
  EXPECT_EQ(node.allocatable.gpu, 4);
  std::map<std::string, placement::Resources> used;
  add_usage(p, &used);
  add_usage(running_pod, &used);
  EXPECT_EQ(used["n0"].gpu, 2);  // the failed pod holds nothing
  EXPECT_EQ(*parse_quantity("64Mi"), double(int64_t{64} << 20));
  EXPECT_DOUBLE_EQ(*parse_quantity("1500m"), 1.5);
  EXPECT_FALSE(parse_quantity("1.5 cores").has_value());
}

}  // namespace
}  // namespace tessera::reconcile
