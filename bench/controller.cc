#include "bench/bench.h"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <atomic>
#include <iostream>

#include "controller/kube/client.h"
#include "controller/kube/operator.h"
#include "controller/rendezvous/rendezvous_service.h"

namespace tessera::bench {

double proc_status_mb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + std::strlen(key) + 1) / 1024.0;
  return 0;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

int controller(int argc, char** argv) {
  int n_nodes = 1000, n_jobs = 100, pods = 8, gpus = 8;
  double limit_s = 300;
  bool json = false;
  Flags flags("tessera-bench controller",
              "usage: tessera-bench controller --nodes N --jobs J [--pods P --gpus-per-node G --timeout S] [--json]\n");
  flags.integer("--nodes", &n_nodes, 1, 100'000)
      .integer("--jobs", &n_jobs, 1, 100'000)
      .integer("--pods", &pods, 1, 100'000)
      .integer("--gpus-per-node", &gpus, 1, 1024)
      .real("--timeout", &limit_s, Interval{0, 86400, true, false})
      .toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  namespace fs = std::filesystem;
  const std::string bin = fs::canonical("/proc/self/exe").parent_path().string();
  const std::string src = TESSERA_SOURCE_DIR;
  const std::string dir = fs::temp_directory_path() / detail::concat("tessera-bench-controller-", getpid());
  const std::string cluster = dir + "/cluster";
  struct Cleanup {
    std::string src, cluster, dir;
    ~Cleanup() {
      [[maybe_unused]] int rc =
          std::system(("bash " + src + "/scripts/test-cluster.sh stop " + cluster + " >/dev/null 2>&1").c_str());
      fs::remove_all(dir);
    }
  } cleanup{src, cluster, dir};
  fs::create_directories(dir);
  std::fprintf(stderr, "starting the test cluster with %d simulated nodes of %d GPUs...\n", n_nodes, gpus);
  const auto t_cluster = Clock::now();
  const std::string start = detail::concat(
      "bash ", src, "/scripts/test-cluster.sh start ", cluster, " --nodes ", n_nodes, " --gpus ", gpus,
      " --zones 4 --simulate ", bin, "/tessera-simulated-nodes >", dir, "/start.log 2>&1 && kubectl --kubeconfig ",
      cluster, "/kubeconfig apply -f ", src, "/crds/ >/dev/null && kubectl --kubeconfig ", cluster,
      "/kubeconfig wait --for condition=established --timeout=60s crd/trainingjobs.tessera.dev >/dev/null");
  if (std::system(start.c_str()) != 0) {
    std::ifstream log(dir + "/start.log");
    std::cerr << log.rdbuf();
    throw Error("the test cluster did not start (scripts/test-cluster.sh; run make cluster-tools first)");
  }
  std::fprintf(stderr, "cluster ready in %.1f s\n", ms_since(t_cluster) / 1000);
  const kube::KubeConfig config = kube::KubeConfig::from_file(cluster + "/kubeconfig");
  kube::KubeClient controller_client(config), user(config);
  kube::OperatorOptions options;
  options.rendezvous_listen = "127.0.0.1:0";
  options.workers = 4;
  options.token_key = new_job_token() + new_job_token();  // 64 random bytes
  kube::KubeOperator op(controller_client, options);
  std::atomic<bool> stop{false};
  op.preflight(stop);
  const double rss_before = proc_status_mb("VmRSS:");
  std::thread running([&] { op.run(stop); });
  while (!op.ready()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t requests_idle = controller_client.requests();
  const auto t0 = Clock::now();
  for (int j = 0; j < n_jobs; ++j) {
    nlohmann::json job = {{"apiVersion", "tessera.dev/v1alpha1"},
                          {"kind", "TrainingJob"},
                          {"metadata", {{"name", detail::concat("scale-", j)}, {"namespace", "default"}}},
                          {"spec",
                           {{"replicas", pods},
                            {"ranksPerReplica", gpus},
                            {"resources", {{"gpu", gpus}}},
                            {"model", {{"name", "cosmoflow"}, {"inputSize", 128}}},
                            {"dataset", {{"format", "synthetic"}}},
                            {"training", {{"epochs", 10}, {"batchSize", pods * gpus}}},
                            {"communication", {{"strategy", "hybrid"}, {"switchAtEpoch", 8}}}}}};
    user.create("/apis/tessera.dev/v1alpha1/namespaces/default/trainingjobs", job);
  }
  const double created_ms = ms_since(t0);
  int running_jobs = 0;
  double all_running_ms = -1;
  while (ms_since(t0) < limit_s * 1000) {
    const auto list = user.get("/apis/tessera.dev/v1alpha1/namespaces/default/trainingjobs");
    running_jobs = 0;
    for (const auto& j : list["items"])
      if (j.contains("status") && j["status"].value("phase", "") == "Running") ++running_jobs;
    if (running_jobs == n_jobs) {
      all_running_ms = ms_since(t0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const auto pod_list = user.get("/api/v1/namespaces/default/pods");
  const size_t n_pods = pod_list["items"].size();
  stop = true;
  running.join();
  const kube::OperatorStats st = op.stats();
  const double p50 = percentile(st.reconcile_seconds, 0.5) * 1000, p99 = percentile(st.reconcile_seconds, 0.99) * 1000;
  const double per_job = static_cast<double>(st.api_requests - requests_idle) / n_jobs;
  const double hwm = proc_status_mb("VmHWM:");
  if (json) {
    std::printf(
        "{\"bench\":\"controller\",\"nodes\":%d,\"jobs\":%d,\"pods_per_job\":%d,\"jobs_running\":%d,\"pods\":%zu,"
        "\"create_ms\":%.1f,\"all_running_ms\":%.1f,\"reconciles\":%lld,\"reconcile_p50_ms\":%.2f,"
        "\"reconcile_p99_ms\":%.2f,\"api_requests_per_job\":%.1f,\"status_conflicts\":%lld,"
        "\"rss_mb_before\":%.1f,\"rss_mb_peak\":%.1f}\n",
        n_nodes, n_jobs, pods, running_jobs, n_pods, created_ms, all_running_ms, static_cast<long long>(st.reconciles),
        p50, p99, per_job, static_cast<long long>(st.status_conflicts), rss_before, hwm);
  } else {
    std::printf(
        "%d/%d gangs of %d pods Running on %d simulated nodes after %.1f s (jobs created in %.1f s); %zu pods\n"
        "reconciles %lld: p50 %.2f ms, p99 %.2f ms; %.1f API requests per job; %lld status conflicts; "
        "RSS %.1f MB before the jobs, peak %.1f MB (this process)\n",
        running_jobs, n_jobs, pods, n_nodes, all_running_ms / 1000, created_ms / 1000, n_pods,
        static_cast<long long>(st.reconciles), p50, p99, per_job, static_cast<long long>(st.status_conflicts),
        rss_before, hwm);
  }
  return running_jobs == n_jobs ? 0 : 1;
}

// GET http://127.0.0.1:port/path; the body's size, or -1.

}  // namespace tessera::bench
