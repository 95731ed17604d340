// tessera-node-agent: the test cluster's kubelet stand-in. It registers N nodes with GPU capacity
// and hostname/zone/rack labels, keeps them Ready, and runs every pod bound to them as local
// processes, as `tessera run` does (controller/local/pod_runner.h: a bare command is looked up in
// --bin-dir, then on PATH; images are not run). It admits a pod
// only when its node has the GPUs it requests (else the pod fails with OutOfnvidia.com/gpu, as a
// kubelet's admission does), reports phase, conditions and container exit codes through the API,
// and stops the processes of a pod being deleted before it removes the pod. Every pod shares this
// machine's network (there are no pod network namespaces), so the Tessera workers' metrics
// address (TESSERA_METRICS_ADDR) becomes a free loopback port: the workers announce the port they
// got to the controller, which lists it for Prometheus. With --simulate it runs
// nothing: bound pods are marked Running (for scale benchmarks).
//
//   tessera-node-agent --kubeconfig FILE --nodes N [--first K] [--gpus G] [--zones Z] [--cpus C]
//                      [--memory BYTES] [--dir DIR] [--bin-dir DIR] [--simulate]
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "controller/kube/client.h"
#include "controller/kube/informer.h"
#include "controller/kube/leader_election.h"
#include "controller/kube/work_queue.h"
#include "controller/local/pod_runner.h"
#include "common/process.h"
#include "controller/reconcile/observe.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/log.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using kube::json;

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

struct Options {
  std::string kubeconfig, dir = ".node-agent", bin_dir;
  int nodes = 0, first = 0, gpus = 2, zones = 2, cpus = 16;
  int64_t memory = int64_t{64} << 30;
  bool simulate = false;
};

struct RunningPod {
  std::string uid, node, name, ns;
  int gpus = 0;
  std::vector<local::RunningContainer> containers;
  std::vector<int> exits;  // -1 while running
  std::string started_at, finished_at;
  std::string reported;    // the phase last written to the API
  bool deleting = false;
};

class Agent {
 public:
  Agent(const kube::KubeClient& client, Options o) : client_(client), o_(std::move(o)) {
    for (int i = o_.first; i < o_.first + o_.nodes; ++i) names_.insert("node-" + std::to_string(i));
  }

  void register_nodes() {
    for (int i = o_.first; i < o_.first + o_.nodes; ++i) {
      const std::string name = "node-" + std::to_string(i);
      json node = {{"apiVersion", "v1"},
                   {"kind", "Node"},
                   {"metadata",
                    {{"name", name},
                     {"labels",
                      {{"kubernetes.io/hostname", name},
                       {"topology.kubernetes.io/zone", "zone-" + std::to_string(i % o_.zones)},
                       {"topology.tessera.dev/rack", "rack-" + std::to_string(i % o_.zones) + "-" + std::to_string(i / (2 * o_.zones))},
                       {"tessera.dev/test-node", "true"}}}}}};
      try {
        client_.create(kube::core_path("", "nodes"), node);
      } catch (const kube::ApiError& e) {
        if (!e.already_exists()) throw;
      }
      client_.merge_patch(kube::core_path("", "nodes", name) + "/status", node_status());
      // The API server taints a new node not-ready; the node lifecycle controller (not run here)
      // lifts the taint once the node reports Ready.
      client_.merge_patch(kube::core_path("", "nodes", name), {{"spec", {{"taints", nullptr}}}});
    }
    log_info("registered ", o_.nodes, " node(s) of ", o_.gpus, " GPUs", o_.simulate ? " (simulated)" : "");
  }

  void heartbeat() {
    for (const auto& name : names_) {
      try {
        client_.merge_patch(kube::core_path("", "nodes", name) + "/status", node_status());
      } catch (const std::exception& e) {
        log_warn("heartbeat of ", name, ": ", e.what());
        return;
      }
    }
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
    auto last_beat = std::chrono::steady_clock::now();
    while (!g_stop) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      poll_processes();
      if (!o_.simulate && std::chrono::steady_clock::now() - last_beat > std::chrono::seconds(10)) {
        heartbeat();
        last_beat = std::chrono::steady_clock::now();
      }
    }
    queue_.shutdown();
    for (auto& t : workers) t.join();
    pods.stop();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [k, p] : running_)
      for (auto& c : p->containers) c.process->stop(std::chrono::milliseconds(2000));
  }

 private:
  json node_status() const {
    const std::string now = kube::micro_time_now().substr(0, 19) + "Z";
    json cap = {{"cpu", std::to_string(o_.cpus)}, {"memory", std::to_string(o_.memory)}, {"pods", "110"},
                {"nvidia.com/gpu", std::to_string(o_.gpus)}};
    return {{"status",
             {{"capacity", cap},
              {"allocatable", cap},
              {"addresses", json::array({{{"type", "InternalIP"}, {"address", "127.0.0.1"}}})},
              {"conditions",
               json::array({{{"type", "Ready"}, {"status", "True"}, {"reason", "KubeletReady"},
                             {"message", "tessera-node-agent is posting ready status"}, {"lastHeartbeatTime", now},
                             {"lastTransitionTime", now}}})}}}};
  }

  void poll_processes() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, p] : running_) {
      bool changed = false;
      for (size_t i = 0; i < p->containers.size(); ++i) {
        if (p->exits[i] >= 0) continue;
        if (auto st = p->containers[i].process->poll()) p->exits[i] = *st, changed = true;
      }
      if (changed) queue_.add(key);
    }
  }

  json get_data(const std::string& ns, const std::string& kind, const std::string& name) const {
    const json obj = client_.get(kube::core_path(ns, kind, name));
    json out = json::object();
    if (obj.contains("data"))
      for (auto& [k, v] : obj["data"].items())
        out[k] = kind == "secrets" ? kube::base64_decode(v.get<std::string>(), "secret " + name) : v.get<std::string>();
    return out;
  }

  // Patches the pod's status; a pod already gone is no error.
  void patch_status(const std::string& ns, const std::string& name, const json& status) {
    const json body = {{"status", status}};
    kube::Response r = client_.request("PATCH", kube::core_path(ns, "pods", name) + "/status", &body,
                                       "application/merge-patch+json");
    if (r.code == 404) return;
    if (r.code / 100 != 2) throw kube::ApiError(r.code, "", "patch pod status " + ns + "/" + name + ": HTTP " + std::to_string(r.code));
  }

  void fail_pod(const json& pod, const std::string& reason, const std::string& message) {
    const std::string ns = pod["metadata"].value("namespace", ""), name = pod["metadata"].value("name", "");
    log_info("pod ", ns, "/", name, " on ", pod["spec"].value("nodeName", ""), " refused: ", reason, ": ", message);
    patch_status(ns, name, {{"phase", "Failed"}, {"reason", reason}, {"message", message}});
  }

  // Starts the pod's containers (or refuses it); REQUIRES: mu_ held.
  void start(const std::string& key, const json& pod) {
    const std::string ns = pod["metadata"].value("namespace", ""), name = pod["metadata"].value("name", "");
    const std::string node = pod["spec"].value("nodeName", ""), uid = pod["metadata"].value("uid", "");
    const int gpus = reconcile::pod_requests(pod).gpu;
    int used = 0;
    for (const auto& [k, p] : running_)
      if (p->node == node && !p->deleting) {
        bool done = !p->exits.empty();
        for (int e : p->exits) done = done && e >= 0;
        if (!done) used += p->gpus;
      }
    if (used + gpus > o_.gpus) {
      fail_pod(pod, "OutOfnvidia.com/gpu",
               detail::concat("Node didn't have enough resource: nvidia.com/gpu, requested: ", gpus, ", used: ", used,
                              ", capacity: ", o_.gpus));
      return;
    }
    auto rp = std::make_unique<RunningPod>();
    rp->uid = uid, rp->node = node, rp->name = name, rp->ns = ns, rp->gpus = gpus;
    rp->started_at = kube::micro_time_now().substr(0, 19) + "Z";
    if (!o_.simulate) {
      local::PodHost host;
      host.pod_dir = (fs::path(o_.dir) / "pods" / (ns + "_" + name + "_" + uid.substr(0, 8))).string();
      host.resolve_command = [this](const std::string& cmd) {
        return local::find_command(cmd, o_.bin_dir.empty() ? std::vector<std::string>{} : std::vector<std::string>{o_.bin_dir});
      };
      host.data = [this, &ns](const std::string& resource, const std::string& object) -> std::optional<json> {
        try {
          return get_data(ns, resource, object);
        } catch (const kube::ApiError& e) {
          if (e.not_found()) return std::nullopt;
          throw;
        }
      };
      host.env_override["TESSERA_METRICS_ADDR"] = "127.0.0.1:0";  // one network for all pods
      try {
        rp->containers = local::start_pod(pod, host);
      } catch (const local::PodStartError& e) {
        return fail_pod(pod, e.reason(), e.what());
      }
      rp->exits.assign(rp->containers.size(), -1);
    }
    log_info("pod ", key, " runs on ", node, o_.simulate ? " (simulated)" : "");
    running_[key] = std::move(rp);
  }

  json container_statuses(const RunningPod& p) const {
    json out = json::array();
    for (size_t i = 0; i < p.containers.size(); ++i) {
      json st;
      if (p.exits[i] < 0) st = {{"running", {{"startedAt", p.started_at}}}};
      else {
        json t = {{"exitCode", p.exits[i]}, {"reason", p.exits[i] == 0 ? "Completed" : "Error"}, {"startedAt", p.started_at},
                  {"finishedAt", p.finished_at.empty() ? p.started_at : p.finished_at}};
        if (p.exits[i] > 128) t["signal"] = p.exits[i] - 128;
        // The termination message file; with FallbackToLogsOnError, the end of a failed container's log.
        const std::string m = local::termination_message(p.containers[i], true, p.exits[i] != 0);
        if (!m.empty()) t["message"] = m;
        st = {{"terminated", t}};
      }
      out.push_back({{"name", p.containers[i].name}, {"ready", p.exits[i] < 0}, {"restartCount", 0}, {"image", ""}, {"imageID", ""},
                     {"started", p.exits[i] < 0}, {"state", st}});
    }
    return out;
  }

  void sync(const std::string& key) {
    const auto pod = pods_->get(key);
    std::unique_lock<std::mutex> lock(mu_);
    auto it = running_.find(key);
    if (!pod || (it != running_.end() && it->second->uid != (*pod)["metadata"].value("uid", ""))) {
      // Gone from the API (or replaced by a new pod of the same name): stop what still runs.
      if (it != running_.end()) {
        auto p = std::move(it->second);
        running_.erase(it);
        lock.unlock();
        for (auto& c : p->containers) c.process->stop(std::chrono::milliseconds(2000));
        lock.lock();
      }
      if (!pod) return;
      it = running_.end();
    }
    const json& meta = (*pod)["metadata"];
    const std::string ns = meta.value("namespace", ""), name = meta.value("name", "");
    if (meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null()) {
      // Graceful deletion: stop the containers, then remove the pod for good.
      std::unique_ptr<RunningPod> p;
      if (it != running_.end()) {
        it->second->deleting = true;
        p = std::move(it->second);
        running_.erase(it);
      }
      lock.unlock();
      if (p) {
        const int grace = std::min<int>(30, meta.value("deletionGracePeriodSeconds", 30));
        for (auto& c : p->containers) c.process->terminate();
        for (auto& c : p->containers) c.process->stop(std::chrono::milliseconds(grace * 1000));
      }
      client_.remove(kube::core_path(ns, "pods", name),
                     {{"gracePeriodSeconds", 0}, {"preconditions", {{"uid", meta.value("uid", "")}}}});
      return;
    }
    const std::string phase = (*pod).contains("status") ? (*pod)["status"].value("phase", "Pending") : "Pending";
    if (it == running_.end()) {
      if (phase != "Pending") return;  // finished, or run by an agent before this one
      start(key, *pod);
      it = running_.find(key);
      if (it == running_.end()) return;  // refused
    }
    RunningPod& p = *it->second;
    bool done = true, ok = true;
    for (int e : p.exits) done = done && e >= 0, ok = ok && e == 0;
    const std::string want = !done || o_.simulate ? "Running" : ok ? "Succeeded" : "Failed";
    if (p.reported == want) return;
    if (done && p.finished_at.empty()) p.finished_at = kube::micro_time_now().substr(0, 19) + "Z";
    const std::string ready = want == "Running" ? "True" : "False";
    json status = {{"phase", want},
                   {"hostIP", "127.0.0.1"},
                   {"podIP", "127.0.0.1"},
                   {"startTime", p.started_at},
                   {"conditions",
                    json::array({{{"type", "Initialized"}, {"status", "True"}},
                                 {{"type", "Ready"}, {"status", ready}},
                                 {{"type", "ContainersReady"}, {"status", ready}},
                                 {{"type", "PodScheduled"}, {"status", "True"}}})},
                   {"containerStatuses", container_statuses(p)}};
    const std::string reported = want;
    lock.unlock();
    patch_status(ns, name, status);
    lock.lock();
    it = running_.find(key);
    if (it != running_.end()) it->second->reported = reported;
    if (want != "Running") log_info("pod ", key, " ", want);
  }

  const kube::KubeClient& client_;
  Options o_;
  std::set<std::string> names_;
  kube::Informer* pods_ = nullptr;
  kube::WorkQueue queue_{std::chrono::milliseconds(100), std::chrono::milliseconds(5000)};
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<RunningPod>> running_;  // GUARDED_BY(mu_)
};

int run(int argc, char** argv) {
  Options o;
  Flags flags("tessera-node-agent",
              "usage: tessera-node-agent --kubeconfig FILE --nodes N [--first K] [--gpus G] [--zones Z] [--cpus C]\n"
              "                          [--memory BYTES] [--dir DIR] [--bin-dir DIR] [--simulate]\n");
  flags.text("--kubeconfig", &o.kubeconfig)
      .integer("--nodes", &o.nodes, 0, 100'000)
      .integer("--first", &o.first, 0, 1'000'000)
      .integer("--gpus", &o.gpus, 0, 1024)
      .integer("--zones", &o.zones, 1, 1024)
      .integer("--cpus", &o.cpus, 0, 1'000'000)
      .integer("--memory", &o.memory, 0, std::numeric_limits<int64_t>::max())
      .text("--dir", &o.dir)
      .text("--bin-dir", &o.bin_dir)
      .toggle("--simulate", &o.simulate);
  if (!flags.parse(argc, argv)) return 0;
  if (o.kubeconfig.empty()) throw ConfigError("--kubeconfig", "required");
  set_log_tag("node-agent");
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  signal(SIGPIPE, SIG_IGN);
  fs::create_directories(o.dir);
  kube::KubeClient client(kube::KubeConfig::from_file(o.kubeconfig));
  Agent agent(client, o);
  agent.register_nodes();
  agent.run();
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::run_command("tessera-node-agent", [&] { return tessera::run(argc, argv); });
}
