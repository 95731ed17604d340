#include "controller/reconcile/children.h"

#include <algorithm>
#include <filesystem>

namespace tessera::reconcile {
namespace {

// Where a pod mounts the dataset: the directory holding both the training and the validation data.
std::string dataset_mount(const api::DatasetSpec& d) {
  namespace fs = std::filesystem;
  if (d.validation_path.empty()) return d.path;
  fs::path a = fs::path(d.path).lexically_normal(), b = fs::path(d.validation_path).lexically_normal(), common;
  auto ia = a.begin(), ib = b.begin();
  for (; ia != a.end() && ib != b.end() && *ia == *ib; ++ia, ++ib) common /= *ia;
  std::string c = common.string();
  while (c.size() > 1 && c.back() == '/') c.pop_back();
  return c.empty() ? "/" : c;
}

json volume_source(const api::VolumeSpec& v, bool read_only) {
  if (v.kind == "hostPath")
    return {{"hostPath", {{"path", v.path}, {"type", read_only ? "Directory" : "DirectoryOrCreate"}}}};
  if (v.kind == "nfs") return {{"nfs", {{"server", v.server}, {"path", v.path}, {"readOnly", read_only}}}};
  return {{"persistentVolumeClaim", {{"claimName", v.claim_name}, {"readOnly", read_only}}}};
}

// The supervisor's arguments: N ranks of replica r, the job's configuration, the rendezvous, and the
// compute threads of each rank unless the spec sets them.
json worker_args(const api::TrainingJobSpec& sp, const ReconcileOptions& opt, int replica) {
  json args = {
      "--slots",  std::to_string(sp.ranks_per_replica),          "--replica",    std::to_string(replica),
      "--config", std::string(kConfigMount) + "/" + kConfigFile, "--rendezvous", "grpc://" + opt.rendezvous_address};
  if (sp.training.threads == 0) {
    const int threads = opt.threads_per_rank > 0 ? opt.threads_per_rank
                        : sp.resources.cpu > 0 ? std::max(1, static_cast<int>(sp.resources.cpu / sp.ranks_per_replica))
                                               : 0;
    if (threads > 0) args.push_back("--threads"), args.push_back(std::to_string(threads));
  }
  return args;
}

json worker_env(const Owner& job, const api::TrainingJobSpec& sp, const ReconcileOptions& opt) {
  auto field = [](const char* path) { return json{{"fieldRef", {{"fieldPath", path}}}}; };
  json env = json::array(
      {{{"name", "TESSERA_JOB"}, {"value", job.ns + "/" + job.name}},
       {{"name", "TESSERA_TOKEN"},
        {"valueFrom", {{"secretKeyRef", {{"name", token_secret_name(job.name)}, {"key", "token"}}}}}},
       {{"name", "TESSERA_POD"}, {"valueFrom", field("metadata.name")}},
       {{"name", "TESSERA_NODE"}, {"valueFrom", field("spec.nodeName")}},
       // The address the ranks' peers connect to (another pod is another network).
       {{"name", "TESSERA_POD_IP"}, {"valueFrom", field("status.podIP")}},
       {{"name", "TESSERA_TERMINATION_LOG"}, {"value", "/dev/termination-log"}},
       // How long the ranks may take to agree on a step and checkpoint it on SIGTERM.
       {{"name", "TESSERA_GRACE_SECONDS"}, {"value", std::to_string(sp.run_policy.termination_grace_period_seconds)}}});
  if (opt.metrics_port > 0)
    env.push_back({{"name", "TESSERA_METRICS_ADDR"}, {"value", "0.0.0.0:" + std::to_string(opt.metrics_port)}});
  return env;
}

// The pod's volumes and the worker's mounts of them: the ConfigMap, and on a cluster the dataset,
// the checkpoints and the SSD cache.
void worker_volumes(const Owner& job, const api::TrainingJobSpec& sp, const ReconcileOptions& opt, json& volumes,
                    json& mounts) {
  mounts = json::array({{{"name", "config"}, {"mountPath", kConfigMount}, {"readOnly", true}}});
  volumes = json::array({{{"name", "config"},
                          {"configMap",
                           {{"name", config_map_name(job.name)},
                            {"items", json::array({{{"key", kConfigFile}, {"path", kConfigFile}}})}}}}});
  if (!opt.cluster) return;
  auto add = [&](const char* name, json source, json mount) {
    source["name"] = name;
    volumes.push_back(std::move(source));
    mount["name"] = name;
    mounts.push_back(std::move(mount));
  };
  if (sp.dataset.format != "synthetic") {
    api::VolumeSpec v = sp.dataset.volume;
    if (!v.given()) v = {"nfs", sp.cache.nfs_path, sp.cache.nfs_server, ""};
    add("dataset", volume_source(v, true), {{"mountPath", dataset_mount(sp.dataset)}, {"readOnly", true}});
  }
  if (!sp.checkpoint.path.empty())
    add("checkpoints", volume_source(sp.checkpoint.volume, false), {{"mountPath", sp.checkpoint.path}});
  if (!sp.cache.ssd_path.empty()) {
    const json source =
        sp.cache.ssd_volume == "emptyDir"
            ? json{{"emptyDir", {{"sizeLimit", std::to_string(sp.cache.ssd_bytes * sp.ranks_per_replica)}}}}
            : json{{"hostPath", {{"path", sp.cache.ssd_path}, {"type", "DirectoryOrCreate"}}}};
    add("ssd-cache", source, {{"mountPath", sp.cache.ssd_path}});
  }
}

json worker_container(const std::string& image, json args, json env, json ports, json mounts,
                      const api::ResourcesSpec& res) {
  json requests = json::object(), limits = json::object();
  if (res.gpu > 0) requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = std::to_string(res.gpu);
  if (res.cpu > 0) requests["cpu"] = std::to_string(static_cast<int64_t>(res.cpu * 1000)) + "m";
  if (res.memory > 0) requests["memory"] = std::to_string(res.memory);
  return {{"name", "worker"},
          {"image", image},
          {"command", {"tessera-worker"}},
          {"args", std::move(args)},
          {"env", std::move(env)},
          {"ports", std::move(ports)},
          {"volumeMounts", std::move(mounts)},
          // Rank 0's summary, or why the pod failed: the controller reads it from the pod's status.
          {"terminationMessagePath", "/dev/termination-log"},
          {"terminationMessagePolicy", "FallbackToLogsOnError"},
          {"resources", {{"requests", requests}, {"limits", limits}}},
          // Least privilege: the worker writes only to its checkpoint and SSD-cache volumes.
          {"securityContext",
           {{"runAsNonRoot", true},
            {"readOnlyRootFilesystem", true},
            {"allowPrivilegeEscalation", false},
            {"capabilities", {{"drop", json::array({"ALL"})}}},
            {"seccompProfile", {{"type", "RuntimeDefault"}}}}}};
}

// The kubelet makes a missing hostPath directory owned by root, and fsGroup does not reach
// hostPath: an init container gives the worker's user the directories it writes (only the
// directory itself; what is inside was written by the worker). Null when no volume needs it.
json volume_owner(const std::string& image, const json& volumes, const json& mounts) {
  json owned = json::array();
  for (const auto& v : volumes)
    if (v.contains("hostPath") && v["hostPath"].value("type", "") == "DirectoryOrCreate") owned.push_back(v["name"]);
  if (owned.empty()) return nullptr;
  json args = {std::to_string(kWorkerUid) + ":" + std::to_string(kWorkerUid)}, init_mounts = json::array();
  for (const auto& m : mounts)
    if (std::find(owned.begin(), owned.end(), m["name"]) != owned.end())
      args.push_back(m["mountPath"]), init_mounts.push_back(m);
  return {{"name", "volume-owner"},
          {"image", image},
          {"command", {"chown"}},
          {"args", args},
          {"volumeMounts", init_mounts},
          {"securityContext",
           {{"runAsUser", 0},
            {"runAsNonRoot", false},
            {"readOnlyRootFilesystem", true},
            {"allowPrivilegeEscalation", false},
            {"capabilities", {{"drop", json::array({"ALL"})}, {"add", json::array({"CHOWN"})}}}}}};
}

json tolerations(const std::vector<api::Toleration>& given) {
  json out = json::array();
  for (const auto& t : given) {
    json tol = {{"operator", t.op}};
    if (!t.key.empty()) tol["key"] = t.key;
    if (!t.value.empty()) tol["value"] = t.value;
    if (!t.effect.empty()) tol["effect"] = t.effect;
    out.push_back(tol);
  }
  return out;
}

}  // namespace

std::string config_map_name(const std::string& job) { return job + "-config"; }

json child_metadata(const Owner& job, const std::string& child_name, json labels) {
  labels[kJobLabel] = job.name;
  const json owner = json::array({{{"apiVersion", api::kApiVersion},
                                   {"kind", api::kKind},
                                   {"name", job.name},
                                   {"uid", job.uid},
                                   {"controller", true},
                                   {"blockOwnerDeletion", true}}});
  return {{"name", child_name}, {"namespace", job.ns}, {"labels", labels}, {"ownerReferences", owner}};
}

json token_secret(const Owner& job, const std::string& token) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", child_metadata(job, token_secret_name(job.name))},
          {"type", "Opaque"},
          {"stringData", {{"token", token}}}};
}

json headless_service(const Owner& job) {
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata", child_metadata(job, job.name)},
          {"spec", {{"clusterIP", "None"}, {"selector", {{kJobLabel, job.name}}}, {"publishNotReadyAddresses", true}}}};
}

json plan_json(int attempt, const std::vector<placement::RankAssignment>& plan) {
  json ranks = json::array();
  for (const auto& a : plan)
    ranks.push_back(
        {{"rank", a.rank}, {"replica", a.replica}, {"slot", a.slot}, {"node", a.node}, {"localRank", a.local_rank}});
  return {{"attempt", attempt}, {"ranks", ranks}};
}

json job_config_map(const Owner& job, const json& spec, int attempt,
                    const std::vector<placement::RankAssignment>& plan) {
  const json manifest = {{"apiVersion", api::kApiVersion},
                         {"kind", api::kKind},
                         {"metadata", {{"name", job.name}, {"namespace", job.ns}}},
                         {"spec", spec}};
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", child_metadata(job, config_map_name(job.name))},
          {"data", {{kConfigFile, manifest.dump(2)}, {kPlanFile, plan_json(attempt, plan).dump()}}}};
}

json worker_pod(const Owner& job, const api::TrainingJobSpec& sp, const ReconcileOptions& opt, int attempt, int replica,
                const std::string& node) {
  const std::string pod = pod_name(job.name, attempt, replica);
  const std::string image =
      sp.image == api::TrainingJobSpec().image && !opt.worker_image.empty() ? opt.worker_image : sp.image;
  json ports = json::array();
  if (opt.metrics_port > 0)
    for (int slot = 0; slot < sp.ranks_per_replica; ++slot)
      ports.push_back({{"name", "metrics-" + std::to_string(slot)},
                       {"containerPort", opt.metrics_port + slot},
                       {"protocol", "TCP"}});
  json volumes, mounts;
  worker_volumes(job, sp, opt, volumes, mounts);
  const json init = volume_owner(image, volumes, mounts);
  json pod_spec = {
      {"nodeName", node},
      {"restartPolicy", "Never"},
      // The image's user; fsGroup makes emptyDir and most persistent volumes its group's.
      {"securityContext",
       {{"runAsUser", kWorkerUid},
        {"runAsGroup", kWorkerUid},
        {"fsGroup", kWorkerUid},
        {"fsGroupChangePolicy", "OnRootMismatch"},
        {"seccompProfile", {{"type", "RuntimeDefault"}}}}},
      {"hostname", pod},
      {"subdomain", job.name},
      {"automountServiceAccountToken", false},
      {"terminationGracePeriodSeconds", sp.run_policy.termination_grace_period_seconds},
      {"containers", json::array({worker_container(image, worker_args(sp, opt, replica), worker_env(job, sp, opt),
                                                   ports, mounts, sp.resources)})},
      {"volumes", volumes}};
  if (const json t = tolerations(sp.placement.tolerations); !t.empty()) pod_spec["tolerations"] = t;
  if (!init.is_null()) pod_spec["initContainers"] = json::array({init});
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       child_metadata(job, pod, {{kReplicaLabel, std::to_string(replica)}, {kAttemptLabel, std::to_string(attempt)}})},
      {"spec", pod_spec}};
}

}  // namespace tessera::reconcile
