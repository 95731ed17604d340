#include "bench/bench.h"

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

#include "controller/placement/gang_placer.h"
#include "controller/placement/ring_planner.h"

namespace tessera::bench {

int placement(int argc, char** argv) {
  int workers = 1024, n_nodes = 128, gpus = 8, repeat = 20;
  bool json = false;
  Flags flags("tessera-bench placement",
              "usage: tessera-bench placement --workers W --nodes N [--gpus-per-node G --repeat R] [--json]\n");
  flags.integer("--workers", &workers, 1, 1'000'000)
      .integer("--nodes", &n_nodes, 1, 1'000'000)
      .integer("--gpus-per-node", &gpus, 1, 1024)
      .integer("--repeat", &repeat, 1, 100000)
      .toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  using namespace placement;
  std::vector<NodeInfo> nodes(n_nodes);
  std::mt19937 rng(3);
  for (int i = 0; i < n_nodes; ++i) {
    NodeInfo& n = nodes[i];
    n.name = detail::concat("gpu-", i);
    n.labels = {{"topology.kubernetes.io/zone", detail::concat("zone-", i % 4)},
                {"example.com/rack", detail::concat("rack-", (i / 4) % 4)},
                {"kubernetes.io/hostname", n.name}};
    n.allocatable = {gpus, 96, int64_t{768} << 30};
    if (i % 7 == 3) n.taints = {{"dedicated", "inference", "NoSchedule"}};  // excluded nodes
  }
  GangRequest req;
  req.replicas = workers;
  req.per_pod = {1, 4, int64_t{32} << 30};
  req.topology_keys = {"topology.kubernetes.io/zone", "example.com/rack", "kubernetes.io/hostname"};
  req.tolerations = {{"dedicated", "Equal", "inference", "NoSchedule"}};
  GangPlacer placer;
  std::vector<double> ms;
  PlacementResult r;
  size_t ranks = 0;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = Clock::now();
    r = placer.place(req, nodes);
    if (r.placed) ranks = plan_ring(r.nodes, 1, nodes, req.topology_keys).size();
    ms.push_back(ms_since(t0));
  }
  const double m = median(ms);
  if (json) {
    std::printf(
        "{\"bench\":\"placement\",\"workers\":%d,\"nodes\":%d,\"gpus_per_node\":%d,\"placed\":%s,"
        "\"ranks\":%zu,\"ms\":%.3f}\n",
        workers, n_nodes, gpus, r.placed ? "true" : "false", ranks, m);
  } else {
    std::printf(
        "placing %d one-GPU workers on %d nodes of %d GPUs: %s, %.3f ms (median of %d) including the ring plan\n",
        workers, n_nodes, gpus, r.placed ? "placed" : r.reason.c_str(), m, repeat);
  }
  return r.placed ? 0 : 1;
}

// ---- controller ----

// VmHWM / VmRSS of this process, in MB.

}  // namespace tessera::bench
