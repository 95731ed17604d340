// tessera-bench: benchmarks that report ratios against a baseline measured in the same run. One
// file per command (bench/<command>.cc); this header holds what several commands share: timing and
// statistics helpers, the Python peers, and the exchange runs of `exchange`, `cluster` and `demo`.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/flags.h"
#include "common/log.h"
#include "testing/random.h"
#include "worker/core/tensor.h"

namespace tessera {
struct JobConfig;
}

namespace tessera::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
using testing::gaussian;
double median(std::vector<double> v);
// The JSON line a Python peer in bench/ prints (`script_and_args` after /usr/bin/python3 bench/), or
// null when it cannot run (python3-torch is not installed).
nlohmann::json python_peer(const std::string& script_and_args);
// Moves this process into the network namespace of emulated node `node` (tessera-netns) and returns
// the node's address.
std::string enter_node(int node);
// A tensor of standard-normal values from `seed`.
Tensor random_tensor(const Shape& s, uint32_t seed);
// A CosmoFlow job reading `samples` generated HDF5 files of size^3 from dir (written by this call).
JobConfig hdf5_job(const std::string& dir, int samples, int size, int batch, int threads);
// The tessera-netns program beside this one.
std::string netns_program();

// ---- exchanges of one bucket among processes: `exchange`, `cluster` and `demo` ----
struct RankResult {
  int rank = 0;
  double ms = 0, select_ms = 0;  // the median exchange, and its error feedback and selection
  uint64_t bytes_intra = 0, bytes_inter = 0;
  size_t selected = 0;
  double rel_error = 0;  // |result - exact sum| / |exact sum| of the first exchange
};

struct ExchangeRun {
  std::string strategy;
  int nodes = 2, local = 2, iters = 5;
  bool emulated = false;  // ranks in the nodes' network namespaces of tessera-netns
  int64_t size = 0;
  double density = 0.001;
  std::vector<RankResult> ranks;
  const RankResult& slowest() const {
    return *std::max_element(ranks.begin(), ranks.end(),
                             [](const RankResult& a, const RankResult& b) { return a.ms < b.ms; });
  }
  double ms() const { return slowest().ms; }
  double mean_inter() const {
    double s = 0;
    for (const auto& r : ranks) s += static_cast<double>(r.bytes_inter);
    return s / ranks.size();
  }
  double mean_intra() const {
    double s = 0;
    for (const auto& r : ranks) s += static_cast<double>(r.bytes_intra);
    return s / ranks.size();
  }
};

// Declares the exchange flags (--strategy --nodes --local --size --density --iters) filling `run`;
// check_exchange() checks them once parsed.
void exchange_flags(Flags& flags, ExchangeRun* run);
void check_exchange(const ExchangeRun& run);
// One process per rank; fills run.ranks.
ExchangeRun run_exchange(ExchangeRun run);
void print_exchange_json(const ExchangeRun& run);

// The commands: each parses its own flags (argv[2..]) and returns the exit status.
int topk(int argc, char** argv);
int exchange(int argc, char** argv);
int demo(int argc, char** argv);
int cluster(int argc, char** argv);
int cluster_train(int argc, char** argv);
int train(int argc, char** argv);
int spatial(int argc, char** argv);
int cache(int argc, char** argv);
int images(int argc, char** argv);
int placement(int argc, char** argv);
int controller(int argc, char** argv);
int metrics(int argc, char** argv);
int cost_layers(int argc, char** argv);

}  // namespace tessera::bench
