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

#include "testing/fork_ranks.h"
#include "worker/comm/exchange.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/store.h"

namespace tessera::bench {

// exchange; select_ms: the median of its error feedback and selection).
ExchangeRun run_exchange(ExchangeRun run) {
  const int world = run.nodes * run.local;
  const std::string dir = testing::make_temp_dir("tessera-bench");
  auto outcomes = testing::fork_ranks(
      world,
      [&](int r, std::string& report) {
        set_log_tag("rank " + std::to_string(r));
        // Emulated: the rank binds its node's address; ranks of a node still meet on it, inside the node.
        const std::string host = run.emulated ? enter_node(r / run.local) : "127.0.0.1";
        FileStore store(dir);
        CommGroups g =
            connect_groups(store, Topology::grid(run.nodes, run.local), r, gloo_factory(Millis(120000), host));
        auto ex = make_exchange(ExchangeConfig{run.strategy, run.density, "mstopk"}, g);
        const auto grad = gaussian(run.size, 1000 + r);
        // The exact sum, for the error of one sparse step.
        std::vector<float> exact = grad, x = grad;
        g.world->allreduce(std::span<float>(exact));
        ex->exchange(0, x);  // warm-up, and the error of one step
        double num = 0, den = 0;
        for (size_t i = 0; i < x.size(); ++i) {
          num += (double(x[i]) - exact[i]) * (double(x[i]) - exact[i]);
          den += double(exact[i]) * exact[i];
        }
        std::vector<double> ms, select_ms;
        ExchangeStats st;
        for (int it = 0; it < run.iters; ++it) {
          x = grad;
          g.world->barrier(Millis(0));
          st = ex->exchange(0, x);
          ms.push_back(st.seconds * 1e3);
          select_ms.push_back(st.select_seconds * 1e3);
        }
        report = detail::concat(median(ms), " ", median(select_ms), " ", st.bytes.intra, " ", st.bytes.inter, " ",
                                st.selected, " ", den > 0 ? std::sqrt(num / den) : 0.0);
        return 0;
      },
      std::chrono::minutes(10));
  std::filesystem::remove_all(dir);
  for (int r = 0; r < world; ++r) {
    if (outcomes[r].exit_code != 0)
      throw Error(detail::concat("exchange bench: rank ", r, " failed (exit ", outcomes[r].exit_code,
                                 "): ", outcomes[r].report));
    RankResult rr;
    rr.rank = r;
    std::istringstream in(outcomes[r].report);
    in >> rr.ms >> rr.select_ms >> rr.bytes_intra >> rr.bytes_inter >> rr.selected >> rr.rel_error;
    run.ranks.push_back(rr);
  }
  return run;
}

void print_exchange_json(const ExchangeRun& run) {
  std::printf(
      "{\"bench\":\"exchange\",\"strategy\":\"%s\",\"nodes\":%d,\"local\":%d,\"size\":%zu,\"density\":%g,"
      "\"iters\":%d,\"ms\":%.3f,\"bytes_intra\":%.0f,\"bytes_inter\":%.0f,\"ranks\":[",
      run.strategy.c_str(), run.nodes, run.local, run.size, run.density, run.iters, run.ms(), run.mean_intra(),
      run.mean_inter());
  for (size_t i = 0; i < run.ranks.size(); ++i) {
    const auto& r = run.ranks[i];
    std::printf(
        "%s{\"rank\":%d,\"ms\":%.3f,\"bytes_intra\":%lu,\"bytes_inter\":%lu,\"selected\":%zu,"
        "\"rel_error\":%.3g}",
        i ? "," : "", r.rank, r.ms, static_cast<unsigned long>(r.bytes_intra),
        static_cast<unsigned long>(r.bytes_inter), r.selected, r.rel_error);
  }
  std::printf("]}\n");
}

void exchange_flags(Flags& flags, ExchangeRun* run) {
  run->strategy = "hitopk";
  run->size = 4000000;
  flags.text("--strategy", &run->strategy)
      .integer("--nodes", &run->nodes, 1, 64)
      .integer("--local", &run->local, 1, 64)
      .integer("--size", &run->size, 0, int64_t{1} << 32)
      .real("--density", &run->density, {0, 1, true, false})
      .integer("--iters", &run->iters, 1, 100000);
}

void check_exchange(const ExchangeRun& run) {
  if (run.nodes * run.local > 64) throw ConfigError("--nodes", "more than 64 local processes");
}

// tessera-netns's emulated cloud cluster, up for the life of this object: --nodes network
// namespaces whose links run at `rate` (and `delay` where the kernel has netem).

int exchange(int argc, char** argv) {
  ExchangeRun run;
  bool json = false;
  Flags flags(
      "tessera-bench exchange",
      "usage: tessera-bench exchange --strategy S --nodes M --local N --size D --density R [--iters I] [--json]\n");
  exchange_flags(flags, &run);
  flags.toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  check_exchange(run);
  run = run_exchange(run);
  if (json) {
    print_exchange_json(run);
    return 0;
  }
  std::printf("%s on %d nodes x %d processes, %zu floats, density %g: %.2f ms per exchange (slowest rank)\n",
              run.strategy.c_str(), run.nodes, run.local, run.size, run.density, run.ms());
  for (const auto& r : run.ranks)
    std::printf("  rank %d: %8.2f ms  intra %10lu B  inter %10lu B  selected %zu\n", r.rank, r.ms,
                static_cast<unsigned long>(r.bytes_intra), static_cast<unsigned long>(r.bytes_inter), r.selected);
  return 0;
}

int demo(int argc, char** argv) {
  ExchangeRun base;
  Flags flags("tessera-bench demo", "usage: tessera-bench demo [--nodes M --local N --size D --density R --iters I]\n");
  exchange_flags(flags, &base);
  base.density = 0.01;
  if (!flags.parse(argc, argv, 2)) return 0;
  check_exchange(base);
  std::printf(
      "Tessera gradient exchange: %d nodes x %d worker processes over loopback, a %.1f MB gradient bucket, "
      "density %g for the sparse strategies.\n\n",
      base.nodes, base.local, base.size * 4 / 1e6, base.density);
  std::printf("%-8s %10s %14s %14s %14s %18s\n", "strategy", "ms", "intra MB/rank", "inter MB/rank", "inter vs dense",
              "error of one step");
  double dense_inter = 0;
  for (const char* s : {"dense", "torus", "topk", "hitopk"}) {
    ExchangeRun run = base;
    run.strategy = s;
    run = run_exchange(run);
    if (dense_inter == 0) dense_inter = run.mean_inter();
    std::printf("%-8s %10.2f %14.3f %14.3f %13.4fx %18.3g\n", s, run.ms(), run.mean_intra() / 1e6,
                run.mean_inter() / 1e6, run.mean_inter() / dense_inter, run.ranks[0].rel_error);
    std::fflush(stdout);
  }
  std::printf(
      "\nThe error of one step is what the sparse strategies leave in their error-feedback residuals "
      "for later steps; dense and torus are exact.\n");
  return 0;
}

// ---- train ----

}  // namespace tessera::bench
