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

#include "controller/local/emulated_network.h"

namespace tessera::bench {

// The exchange on an emulated cloud cluster: the ranks run in its nodes' namespaces.
int cluster(int argc, char** argv) {
  ExchangeRun run;
  std::string rate = "1gbit", delay;
  bool json = false;
  Flags flags("tessera-bench cluster",
              "usage: tessera-bench cluster --strategy S --nodes M --local N --rate R [--delay D] "
              "--size D --density R [--iters I] [--json]\n");
  exchange_flags(flags, &run);
  flags.text("--rate", &rate).text("--delay", &delay).toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  check_exchange(run);
  local::EmulatedNetwork network(netns_program(), run.nodes, rate, delay, "--rate", json);
  run.emulated = true;
  run = run_exchange(run);
  if (json) {
    std::printf(
        "{\"bench\":\"cluster\",\"strategy\":\"%s\",\"nodes\":%d,\"local\":%d,\"rate\":\"%s\",\"delay\":\"%s\","
        "\"size\":%zu,\"density\":%g,\"iters\":%d,\"exchange_ms\":%.3f,\"select_ms\":%.3f,\"bytes_intra\":%.0f,"
        "\"bytes_inter\":%.0f}\n",
        run.strategy.c_str(), run.nodes, run.local, rate.c_str(), delay.c_str(), run.size, run.density, run.iters,
        run.ms(), run.slowest().select_ms, run.mean_intra(), run.mean_inter());
    return 0;
  }
  std::printf(
      "%s on %d emulated nodes x %d processes, links of %s%s, %zu floats, density %g: %.2f ms per exchange "
      "(the slowest rank's median); per rank %.0f B intra, %.0f B inter\n",
      run.strategy.c_str(), run.nodes, run.local, rate.c_str(), delay.empty() ? "" : (" and " + delay).c_str(),
      run.size, run.density, run.ms(), run.mean_intra(), run.mean_inter());
  return 0;
}

// ---- training on the emulated cluster ----

// The models of the training benchmarks: CosmoFlow (32^3, 9.0M parameters) and the large-gradient
// CNN (64^2 images, 25.2M parameters, ResNet-50's gradient volume).

}  // namespace tessera::bench
