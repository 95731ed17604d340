// tessera-simulated-nodes: nodes with nothing behind them, for the controller's scale benchmark
// (`tessera-bench controller`, 1,000 nodes; scripts/test-cluster.sh start --simulate). It registers
// N nodes with GPU capacity and hostname/zone/rack labels, Ready and untainted, and answers for the
// pods bound to them as a kubelet's status would, running nothing: a pod is admitted only when its
// node has the GPUs it requests (else it fails with OutOfnvidia.com/gpu, as a kubelet's admission
// does) and is then marked Running; a pod being deleted is removed at once. The tests that run pods
// use real nodes (a kubelet and containerd each, scripts/test-cluster.sh start --nodes N).
//
//   tessera-simulated-nodes --kubeconfig FILE --nodes N [--gpus G] [--zones Z] [--cpus C] [--memory BYTES]
#include <signal.h>

#include <atomic>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/flags.h"
#include "common/log.h"
#include "controller/kube/client.h"
#include "controller/kube/informer.h"
#include "controller/kube/leader_election.h"  // micro_time_now
#include "controller/kube/work_queue.h"
#include "controller/reconcile/observe.h"

namespace tessera {
namespace {

using kube::json;

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

struct Options {
  std::string kubeconfig;
  int nodes = 0, gpus = 2, zones = 2, cpus = 16;
  int64_t memory = int64_t{64} << 30;
};

std::string now() { return kube::micro_time_now().substr(0, 19) + "Z"; }

class SimulatedNodes {
 public:
  SimulatedNodes(const kube::KubeClient& client, Options o) : client_(client), o_(std::move(o)) {
    for (int i = 0; i < o_.nodes; ++i) names_.insert("node-" + std::to_string(i));
  }

  void register_nodes() {
    for (int i = 0; i < o_.nodes; ++i) {
      const std::string name = "node-" + std::to_string(i);
      json node = {{"apiVersion", "v1"},
                   {"kind", "Node"},
                   {"metadata",
                    {{"name", name},
                     {"labels",
                      {{"kubernetes.io/hostname", name},
                       {"topology.kubernetes.io/zone", "zone-" + std::to_string(i % o_.zones)},
                       {"topology.tessera.dev/rack",
                        "rack-" + std::to_string(i % o_.zones) + "-" + std::to_string(i / (2 * o_.zones))},
                       {"tessera.dev/test-node", "true"}}}}}};
      try {
        client_.create(kube::core_path("", "nodes"), node);
      } catch (const kube::ApiError& e) {
        if (!e.already_exists()) throw;
      }
      client_.merge_patch(kube::core_path("", "nodes", name) + "/status", node_status());
      // The API server taints a new node not-ready; the node lifecycle controller (not run with
      // simulated nodes) would lift the taint once the node reports Ready.
      client_.merge_patch(kube::core_path("", "nodes", name), {{"spec", {{"taints", nullptr}}}});
    }
    log_info("registered ", o_.nodes, " simulated node(s) of ", o_.gpus, " GPUs");
  }

  void run() {
    kube::Informer pods(client_, kube::core_path("", "pods"), "", "spec.nodeName!=");
    pods_ = &pods;
    pods.set_handler([this](const std::string&, const json& p) {
      if (names_.count(p["spec"].value("nodeName", ""))) queue_.add(kube::object_key(p));
    });
    pods.start();
    std::vector<std::thread> workers;
    for (int i = 0; i < 4; ++i)
      workers.emplace_back([this] {
        std::string key;
        while (queue_.get(&key)) {
          try {
            sync(key);
            queue_.forget(key);
          } catch (const std::exception& e) {
            log_warn("pod ", key, ": ", e.what());
            queue_.add_rate_limited(key);
          }
          queue_.done(key);
        }
      });
    while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    queue_.shutdown();
    for (auto& t : workers) t.join();
    pods.stop();
  }

 private:
  struct Admitted {
    std::string uid, node, started_at;
    int gpus = 0;
  };

  json node_status() const {
    const std::string t = now();
    json cap = {{"cpu", std::to_string(o_.cpus)},
                {"memory", std::to_string(o_.memory)},
                {"pods", "110"},
                {"nvidia.com/gpu", std::to_string(o_.gpus)}};
    return {{"status",
             {{"capacity", cap},
              {"allocatable", cap},
              {"addresses", json::array({{{"type", "InternalIP"}, {"address", "127.0.0.1"}}})},
              {"conditions", json::array({{{"type", "Ready"},
                                           {"status", "True"},
                                           {"reason", "KubeletReady"},
                                           {"message", "tessera-simulated-nodes is posting ready status"},
                                           {"lastHeartbeatTime", t},
                                           {"lastTransitionTime", t}}})}}}};
  }

  // Patches the pod's status; a pod already gone is no error.
  void patch_status(const std::string& ns, const std::string& name, const json& status) {
    const json body = {{"status", status}};
    kube::Response r =
        client_.request("PATCH", kube::core_path(ns, "pods", name) + "/status", &body, "application/merge-patch+json");
    if (r.code == 404) return;
    if (r.code / 100 != 2)
      throw kube::ApiError(r.code, "", "patch pod status " + ns + "/" + name + ": HTTP " + std::to_string(r.code));
  }

  // Whether the pod's node has its GPUs free; admits it if so. REQUIRES: mu_ held.
  bool admit(const std::string& key, const json& pod, std::string* refusal) {
    const std::string node = pod["spec"].value("nodeName", "");
    const int gpus = reconcile::pod_requests(pod).gpu;
    int used = 0;
    for (const auto& [k, a] : admitted_)
      if (a.node == node) used += a.gpus;
    if (used + gpus > o_.gpus) {
      *refusal = detail::concat("Node didn't have enough resource: nvidia.com/gpu, requested: ", gpus, ", used: ", used,
                                ", capacity: ", o_.gpus);
      return false;
    }
    admitted_[key] = {pod["metadata"].value("uid", ""), node, now(), gpus};
    return true;
  }

  void sync(const std::string& key) {
    const auto pod = pods_->get(key);
    std::unique_lock<std::mutex> lock(mu_);
    auto it = admitted_.find(key);
    // Gone from the API, or replaced by a new pod of the same name: its GPUs are free again.
    if (it != admitted_.end() && (!pod || it->second.uid != (*pod)["metadata"].value("uid", ""))) admitted_.erase(it);
    if (!pod) return;
    const json& meta = (*pod)["metadata"];
    const std::string ns = meta.value("namespace", ""), name = meta.value("name", "");
    if (meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null()) {
      admitted_.erase(key);
      lock.unlock();
      client_.remove(kube::core_path(ns, "pods", name),
                     {{"gracePeriodSeconds", 0}, {"preconditions", {{"uid", meta.value("uid", "")}}}});
      return;
    }
    const std::string phase = (*pod).contains("status") ? (*pod)["status"].value("phase", "Pending") : "Pending";
    if (phase != "Pending" || admitted_.count(key)) return;  // answered already
    std::string refusal;
    if (!admit(key, *pod, &refusal)) {
      lock.unlock();
      log_info("pod ", key, " on ", (*pod)["spec"].value("nodeName", ""), " refused: ", refusal);
      patch_status(ns, name, {{"phase", "Failed"}, {"reason", "OutOfnvidia.com/gpu"}, {"message", refusal}});
      return;
    }
    const std::string started = admitted_[key].started_at;
    lock.unlock();
    json containers = json::array();
    for (const json& c : (*pod)["spec"].value("containers", json::array()))
      containers.push_back({{"name", c.value("name", "")},
                            {"ready", true},
                            {"restartCount", 0},
                            {"image", c.value("image", "")},
                            {"imageID", ""},
                            {"started", true},
                            {"state", {{"running", {{"startedAt", started}}}}}});
    patch_status(ns, name,
                 {{"phase", "Running"},
                  {"hostIP", "127.0.0.1"},
                  {"podIP", "127.0.0.1"},
                  {"startTime", started},
                  {"conditions", json::array({{{"type", "Initialized"}, {"status", "True"}},
                                              {{"type", "Ready"}, {"status", "True"}},
                                              {{"type", "ContainersReady"}, {"status", "True"}},
                                              {{"type", "PodScheduled"}, {"status", "True"}}})},
                  {"containerStatuses", containers}});
  }

  const kube::KubeClient& client_;
  Options o_;
  std::set<std::string> names_;
  kube::Informer* pods_ = nullptr;
  kube::WorkQueue queue_{std::chrono::milliseconds(100), std::chrono::milliseconds(5000)};
  std::mutex mu_;
  std::map<std::string, Admitted> admitted_;  // GUARDED_BY(mu_): the pods holding their node's GPUs
};

int run(int argc, char** argv) {
  Options o;
  Flags flags("tessera-simulated-nodes",
              "usage: tessera-simulated-nodes --kubeconfig FILE --nodes N [--gpus G] [--zones Z] [--cpus C] [--memory "
              "BYTES]\n");
  flags.text("--kubeconfig", &o.kubeconfig)
      .integer("--nodes", &o.nodes, 0, 100'000)
      .integer("--gpus", &o.gpus, 0, 1024)
      .integer("--zones", &o.zones, 1, 1024)
      .integer("--cpus", &o.cpus, 0, 1'000'000)
      .integer("--memory", &o.memory, 0, std::numeric_limits<int64_t>::max());
  if (!flags.parse(argc, argv)) return 0;
  if (o.kubeconfig.empty()) throw ConfigError("--kubeconfig", "required");
  set_log_tag("simulated-nodes");
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGPIPE, SIG_IGN);
  kube::KubeClient client(kube::KubeConfig::from_file(o.kubeconfig));
  SimulatedNodes nodes(client, o);
  nodes.register_nodes();
  nodes.run();
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::run_command("tessera-simulated-nodes", [&] { return tessera::run(argc, argv); });
}
