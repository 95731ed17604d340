// tessera-node-agent: the test cluster's kubelet stand-in. It registers N nodes with GPU capacity
// and hostname/zone/rack labels, keeps them Ready, and runs every pod bound to them as local
// processes: the containers' command and args (a bare command is looked up in --bin-dir, then on
// PATH; images are not run), their environment (values, the downward-API fields the workers use,
// Secret and ConfigMap keys), and hostPath, emptyDir, configMap and secret volumes as directories
// (a mountPath that is not the directory itself is rewritten in args and env). It admits a pod
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
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "controller/kube/client.h"
#include "controller/kube/informer.h"
#include "controller/kube/leader_election.h"
#include "controller/kube/work_queue.h"
#include "controller/local/process.h"
#include "controller/reconcile/observe.h"
#include "worker/core/error.h"
#include "worker/core/log.h"

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
  std::vector<std::unique_ptr<local::Process>> processes;
  std::vector<std::string> containers, logs, messages;  // messages: terminationMessagePath's file
  std::vector<int> exits;  // -1 while running
  std::string started_at, finished_at;
  std::string reported;    // the phase last written to the API
  bool deleting = false;
};

std::string last_lines(const std::string& file, size_t max_chars) {
  std::ifstream in(file);
  std::string line, out;
  std::vector<std::string> lines;
  while (std::getline(in, line))
    if (!line.empty()) lines.push_back(line);
  for (auto it = lines.rbegin(); it != lines.rend() && out.size() < max_chars; ++it) out = *it + (out.empty() ? "" : "\n") + out;
  return out.size() > max_chars ? out.substr(out.size() - max_chars) : out;
}

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
      for (auto& proc : p->processes) proc->stop(std::chrono::milliseconds(2000));
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
      for (size_t i = 0; i < p->processes.size(); ++i) {
        if (p->exits[i] >= 0) continue;
        if (auto st = p->processes[i]->poll()) p->exits[i] = *st, changed = true;
      }
      if (changed) queue_.add(key);
    }
  }

  std::string resolve_command(const std::string& cmd) const {
    if (cmd.find('/') != std::string::npos) return cmd;
    if (!o_.bin_dir.empty() && fs::exists(fs::path(o_.bin_dir) / cmd)) return (fs::path(o_.bin_dir) / cmd).string();
    const char* path = std::getenv("PATH");
    std::string p = path ? path : "";
    size_t start = 0;
    while (start <= p.size()) {
      const size_t end = p.find(':', start);
      const std::string d = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!d.empty() && fs::exists(fs::path(d) / cmd)) return (fs::path(d) / cmd).string();
      if (end == std::string::npos) break;
      start = end + 1;
    }
    return "";
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
      const fs::path pod_dir = fs::path(o_.dir) / "pods" / (ns + "_" + name + "_" + uid.substr(0, 8));
      fs::create_directories(pod_dir);
      // Volumes as directories.
      std::map<std::string, std::string> volume_dirs;
      for (const auto& v : pod["spec"].value("volumes", json::array())) {
        const std::string vname = v.value("name", "");
        const fs::path vdir = pod_dir / "volumes" / vname;
        if (v.contains("hostPath")) {
          const std::string path = v["hostPath"].value("path", "");
          const std::string type = v["hostPath"].value("type", "");
          if (!fs::exists(path)) {
            if (type == "DirectoryOrCreate") fs::create_directories(path);
            else return fail_pod(pod, "FailedMount", "hostPath " + path + " of volume " + vname + " does not exist");
          }
          volume_dirs[vname] = path;
        } else if (v.contains("emptyDir")) {
          fs::create_directories(vdir);
          volume_dirs[vname] = vdir.string();
        } else if (v.contains("configMap") || v.contains("secret")) {
          const bool secret = v.contains("secret");
          const json& src = secret ? v["secret"] : v["configMap"];
          json data;
          try {
            data = get_data(ns, secret ? "secrets" : "configmaps", src.value(secret ? "secretName" : "name", ""));
          } catch (const kube::ApiError& e) {
            if (e.transient()) throw;
            return fail_pod(pod, "FailedMount", e.what());
          }
          fs::create_directories(vdir);
          std::map<std::string, std::string> items;
          if (src.contains("items"))
            for (const auto& it : src["items"]) items[it.value("key", "")] = it.value("path", "");
          else
            for (auto& [k, val] : data.items()) items[k] = k;
          for (const auto& [k, path] : items) {
            if (!data.contains(k)) return fail_pod(pod, "FailedMount", "key " + k + " is missing from volume " + vname);
            std::ofstream(vdir / path) << data[k].get<std::string>();
          }
          volume_dirs[vname] = vdir.string();
        } else {
          return fail_pod(pod, "FailedMount",
                          "volume " + vname + ": the test node agent mounts only hostPath, emptyDir, configMap and secret volumes");
        }
      }
      for (const auto& c : pod["spec"].value("containers", json::array())) {
        const std::string cname = c.value("name", "");
        // mountPath -> directory, the longest first so nested mounts win.
        std::vector<std::pair<std::string, std::string>> mounts;
        for (const auto& m : c.value("volumeMounts", json::array())) {
          std::string dir = volume_dirs[m.value("name", "")];
          if (m.contains("subPath")) dir += "/" + m.value("subPath", "");
          mounts.push_back({m.value("mountPath", ""), dir});
        }
        std::sort(mounts.begin(), mounts.end(), [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
        auto rewrite = [&](std::string s) {
          for (const auto& [mount, dir] : mounts)
            if (mount != dir && s.rfind(mount, 0) == 0 && (s.size() == mount.size() || s[mount.size()] == '/'))
              return dir + s.substr(mount.size());
          return s;
        };
        std::vector<std::string> argv;
        for (const auto& a : c.value("command", json::array())) argv.push_back(rewrite(a.get<std::string>()));
        for (const auto& a : c.value("args", json::array())) argv.push_back(rewrite(a.get<std::string>()));
        if (argv.empty()) return fail_pod(pod, "CreateContainerError", "container " + cname + " has no command (images are not run here)");
        const std::string exe = resolve_command(argv[0]);
        if (exe.empty()) return fail_pod(pod, "CreateContainerError", "command '" + argv[0] + "' is not in --bin-dir or on PATH");
        argv[0] = exe;
        // The termination message file: a file of the pod's, wherever the container names it.
        const std::string message_path = c.value("terminationMessagePath", "/dev/termination-log");
        const std::string message_file = (pod_dir / (cname + ".termination-log")).string();
        std::vector<std::string> env;
        for (const auto& e : c.value("env", json::array())) {
          std::string value = e.value("value", "");
          if (e.contains("valueFrom")) {
            const json& f = e["valueFrom"];
            if (f.contains("fieldRef")) {
              const std::string fp = f["fieldRef"].value("fieldPath", "");
              if (fp == "metadata.name") value = name;
              else if (fp == "metadata.namespace") value = ns;
              else if (fp == "metadata.uid") value = uid;
              else if (fp == "spec.nodeName") value = node;
              else if (fp == "status.podIP" || fp == "status.hostIP") value = "127.0.0.1";
              else if (fp.rfind("metadata.labels['", 0) == 0) {
                const std::string label = fp.substr(17, fp.size() - 19);
                value = pod["metadata"].value("labels", json::object()).value(label, "");
              }
            } else if (f.contains("secretKeyRef") || f.contains("configMapKeyRef")) {
              const bool secret = f.contains("secretKeyRef");
              const json& ref = secret ? f["secretKeyRef"] : f["configMapKeyRef"];
              json data;
              try {
                data = get_data(ns, secret ? "secrets" : "configmaps", ref.value("name", ""));
              } catch (const kube::ApiError& err) {
                if (err.transient()) throw;
                return fail_pod(pod, "CreateContainerConfigError", err.what());
              }
              if (!data.contains(ref.value("key", "")))
                return fail_pod(pod, "CreateContainerConfigError", "key " + ref.value("key", "") + " not found in " + ref.value("name", ""));
              value = data[ref.value("key", "")].get<std::string>();
            }
          }
          if (e.value("name", "") == "TESSERA_METRICS_ADDR") value = "127.0.0.1:0";  // one network for all pods
          env.push_back(e.value("name", "") + "=" + (value == message_path ? message_file : rewrite(value)));
        }
        const std::string log = (pod_dir / (cname + ".log")).string();
        rp->processes.push_back(std::make_unique<local::Process>(argv, env, log));
        rp->containers.push_back(cname);
        rp->logs.push_back(log);
        rp->messages.push_back(message_file);
        rp->exits.push_back(-1);
      }
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
        std::ifstream in(p.messages[i]);
        std::string m((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (m.size() > 4096) m = m.substr(0, 4096);
        if (m.empty() && p.exits[i] != 0) m = last_lines(p.logs[i], 1024);
        while (!m.empty() && m.back() == '\n') m.pop_back();
        if (!m.empty()) t["message"] = m;
        st = {{"terminated", t}};
      }
      out.push_back({{"name", p.containers[i]}, {"ready", p.exits[i] < 0}, {"restartCount", 0}, {"image", ""}, {"imageID", ""},
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
        for (auto& proc : p->processes) proc->stop(std::chrono::milliseconds(2000));
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
        for (auto& proc : p->processes) proc->terminate();
        for (auto& proc : p->processes) proc->stop(std::chrono::milliseconds(grace * 1000));
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
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a, "needs a value");
      return argv[++i];
    };
    auto number = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end || n < 0) throw ConfigError(a, "'" + v + "' is not a non-negative integer");
      return n;
    };
    if (a == "--help" || a == "-h") {
      std::puts("usage: tessera-node-agent --kubeconfig FILE --nodes N [--first K] [--gpus G] [--zones Z] [--cpus C]\n"
                "                          [--memory BYTES] [--dir DIR] [--bin-dir DIR] [--simulate]");
      return 0;
    } else if (a == "--kubeconfig") o.kubeconfig = value();
    else if (a == "--nodes") o.nodes = static_cast<int>(number());
    else if (a == "--first") o.first = static_cast<int>(number());
    else if (a == "--gpus") o.gpus = static_cast<int>(number());
    else if (a == "--zones") o.zones = std::max(1, static_cast<int>(number()));
    else if (a == "--cpus") o.cpus = static_cast<int>(number());
    else if (a == "--memory") o.memory = number();
    else if (a == "--dir") o.dir = value();
    else if (a == "--bin-dir") o.bin_dir = value();
    else if (a == "--simulate") o.simulate = true;
    else throw ConfigError(a, "unknown flag (see --help)");
  }
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
