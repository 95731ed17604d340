// tessera-bench: benchmarks that report ratios against a baseline measured in the same run.
//
//   tessera-bench topk     --size D --density R [--repeat N] [--json]
//       one streaming pass (memory-bandwidth floor), exact nth_element top-k, MSTopK, and the
//       scatter-add of 4 ranks' selections into a bucket (random read-modify-writes); single thread.
//   tessera-bench exchange --strategy S --nodes M --local N --size D --density R [--iters I] [--json]
//       M x N worker processes over loopback TCP; per-rank time and bytes per link kind per exchange.
//   tessera-bench train    --model cosmoflow --size W [--batch B] [--threads T] [--iters I] [--json]
//       samples/s of forward + backward + update in one process, and conv3d GFLOP/s per layer shape,
//       against PyTorch (bench/torch_cosmoflow.py, same layers, batch and threads) when it is installed.
//   tessera-bench spatial  --model cosmoflow --size W --splits 1,2,4 [--batch B] [--iters I] [--json]
//       one process per spatial rank, one thread each: per-rank peak activation memory, time per
//       sample and halo bytes for each split of D, against the unsplit model in the same run.
//   tessera-bench cache    --remote-mbps R [--size W --samples N --epochs E --batch B --threads T] [--json]
//       trains CosmoFlow from generated HDF5 files with the remote tier throttled to R MB/s, then
//       restarts the worker for one more epoch: per-epoch data-wait fraction, read throughput and
//       hit ratio per cache tier.
//   tessera-bench placement --workers W --nodes N [--gpus-per-node G] [--json]
//       gang placement and ring plan of W one-GPU workers on N nodes in 4 zones x 4 racks.
//   tessera-bench controller --nodes N --jobs J [--pods P] [--gpus-per-node G] [--timeout S] [--json]
//       the operator against the test cluster (scripts/test-cluster.sh) with N simulated nodes: J
//       gangs of P pods created at once; time until all are Running, reconcile latency p50/p99, API
//       requests per job, peak RSS (this process: the operator runs in it).
//   tessera-bench cluster --strategy S --nodes M --local N --rate 1gbit [--delay D] --size D --density R [--json]
//       the exchange on an emulated cloud cluster (tessera-netns: a network namespace per
//       node, links rate-limited with tc), brought up and torn down around the measurement.
//   tessera-bench cluster-train --model cosmoflow|cnn25m --strategy S|hybrid [--overlap on|off] [--peer ddp]
//                [--optimizer sgd|adam|lars] [--lr X] ...
//       training on the emulated cluster: step time, samples/s, exposed and total communication; the
//       PyTorch DDP peer on the same model and samples; --epochs E: validation loss over time, of the
//       weights and data order of --seed S.
//   tessera-bench metrics [--size W] [--epochs E] [--block K] [--scrape-ms M] [--json]
//       the cost of the worker's Prometheus metrics: step time with the exporter (and a scraper)
//       against without, alternating every K steps of one training run.
//   tessera-bench demo
//       every strategy on 2 nodes x 2 processes, side by side (what `make run` shows).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <omp.h>

#include <nlohmann/json.hpp>

#include "testing/fork_ranks.h"
#include "testing/process.h"
#include "worker/models/model.h"
#include "worker/nn/conv.h"
#include "worker/nn/dnnl_util.h"
#include "worker/nn/optim.h"
#include "worker/spatial/layers.h"
#include "controller/kube/client.h"
#include "controller/kube/operator.h"
#include "controller/placement/ring_planner.h"
#include "worker/compress/sparse.h"
#include "worker/data/file_dataset.h"
#include "common/http_server.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/train/trainer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include "worker/comm/exchange.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/compress/topk.h"
#include "common/error.h"
#include "common/log.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// --name value flags; --json and --help are switches.
class Flags {
 public:
  Flags(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-h") a = "--help";
      if (a.rfind("--", 0) != 0) throw ConfigError(a, "unexpected argument (flags are --name value)");
      a.erase(0, 2);
      if (a == "json" || a == "help") {
        values_.insert_or_assign(a, std::string(1, '1'));
      } else if (i + 1 < argc) {
        values_[a] = argv[++i];
      } else {
        throw ConfigError("--" + a, "needs a value");
      }
    }
  }
  bool has(const std::string& k) const { return values_.count(k) > 0; }
  std::string str(const std::string& k, const std::string& def) {
    used_.push_back(k);
    auto it = values_.find(k);
    return it == values_.end() ? def : it->second;
  }
  double num(const std::string& k, double def) {
    std::string v = str(k, "");
    if (v.empty()) return def;
    char* end = nullptr;
    double d = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end) throw ConfigError("--" + k, "'" + v + "' is not a number");
    return d;
  }
  long integer(const std::string& k, long def, long min) {
    double d = num(k, static_cast<double>(def));
    if (d != std::floor(d) || d < static_cast<double>(min))
      throw ConfigError("--" + k, detail::concat(d, " must be an integer >= ", min));
    return static_cast<long>(d);
  }
  // Unknown flags are errors, not silently ignored.
  void check_all_used() const {
    for (const auto& [k, v] : values_)
      if (k != "json" && k != "help" && std::find(used_.begin(), used_.end(), k) == used_.end())
        throw ConfigError("--" + k, "unknown flag for this command");
  }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> used_;
};

std::vector<float> gaussian(size_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(d);
  for (auto& v : x) v = n(rng);
  return x;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- topk ----

// The memory-bandwidth floor: the cheapest useful read of every entry (largest magnitude).
uint32_t streaming_pass(const std::vector<float>& x) {
  uint32_t m = 0;
  for (float v : x) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    m = std::max(m, u & 0x7fffffffu);
  }
  return m;
}

std::vector<float> sorted_magnitudes(const std::vector<float>& x, const std::vector<uint32_t>& idx) {
  std::vector<float> m;
  for (uint32_t i : idx) m.push_back(std::fabs(x[i]));
  std::sort(m.begin(), m.end());
  return m;
}

// The JSON line a Python peer in bench/ prints (`script_and_args` after /usr/bin/python3 bench/), or
// null when it cannot run (python3-torch is not installed).
nlohmann::json python_peer(const std::string& script_and_args) {
  const std::string cmd = detail::concat("/usr/bin/python3 ", TESSERA_SOURCE_DIR, "/bench/", script_and_args, " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return nullptr;
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  if (pclose(p) != 0 || out.empty()) return nullptr;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    return nullptr;
  }
}

int cmd_topk(Flags& f) {
  const size_t d = static_cast<size_t>(f.integer("size", 25600000, 1));
  const double density = f.num("density", 0.001);
  const int repeat = static_cast<int>(f.integer("repeat", 5, 1));
  const bool json = f.has("json");
  f.check_all_used();
  const size_t k = topk_count(d, density);
  auto x = gaussian(d, 42);
  std::vector<double> pass, nth, ms;
  std::vector<uint32_t> exact_idx, ms_idx;
  MSTopK selector;
  volatile uint32_t sink = 0;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = Clock::now();
    sink = sink + streaming_pass(x);
    pass.push_back(ms_since(t0));
    t0 = Clock::now();
    exact_topk(x, k, exact_idx);
    nth.push_back(ms_since(t0));
    t0 = Clock::now();
    selector.select(x, k, ms_idx);
    ms.push_back(ms_since(t0));
  }
  const bool exact = sorted_magnitudes(x, exact_idx) == sorted_magnitudes(x, ms_idx);
  // The scatter-add of a sparse all-gather among 4 ranks: 4k pairs at uniformly random indices (the
  // top k of independent gradients) added into a zeroed bucket of d floats, one cache miss each.
  std::vector<SparseEntry> pairs(4 * k);
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> at(0, static_cast<uint32_t>(d - 1));
  for (auto& e : pairs) e = {at(rng), 1.0f};
  std::vector<float> bucket(d);
  std::vector<double> scatter;
  for (int r = 0; r < repeat; ++r) {
    std::fill(bucket.begin(), bucket.end(), 0.0f);
    const auto t0 = Clock::now();
    scatter_add(bucket, pairs);
    scatter.push_back(ms_since(t0));
  }
  const double p = median(pass), n = median(nth), m = median(ms), sc = median(scatter);
  // The peer: torch.topk on as many floats, one thread (null without python3-torch).
  const nlohmann::json peer = python_peer(detail::concat("torch_topk.py --size ", d, " --density ", density, " --repeat ", repeat));
  const double torch_ms = peer.is_object() ? peer.value("torch_topk_ms", 0.0) : 0.0;
  if (json) {
    std::printf("{\"bench\":\"topk\",\"size\":%zu,\"density\":%g,\"k\":%zu,\"repeat\":%d,\"pass_ms\":%.3f,"
                "\"nth_element_ms\":%.3f,\"mstopk_ms\":%.3f,\"mstopk_over_pass\":%.3f,\"mstopk_over_nth_element\":%.4f,"
                "\"passes\":%zu,\"candidates\":%zu,\"exact\":%s,\"scatter_pairs\":%zu,\"scatter_ms\":%.3f",
                d, density, k, repeat, p, n, m, m / p, m / n, selector.last().passes, selector.last().candidates,
                exact ? "true" : "false", pairs.size(), sc);
    if (torch_ms > 0) std::printf(",\"torch_topk_ms\":%.3f,\"mstopk_over_torch_topk\":%.4f", torch_ms, m / torch_ms);
    std::printf("}\n");
  } else {
    std::printf("top-k of %zu floats, k=%zu (density %g), median of %d, one thread\n", d, k, density, repeat);
    std::printf("  streaming pass   %9.3f ms  (%.1f GB/s)\n", p, d * 4 / p / 1e6);
    std::printf("  nth_element      %9.3f ms\n", n);
    std::printf("  MSTopK           %9.3f ms  = %.2fx pass, %.3fx nth_element, %s\n", m, m / p, m / n,
                exact ? "exact" : "NOT the true top-k");
    std::printf("  scatter-add      %9.3f ms  (%zu pairs, %.1f ns each)\n", sc, pairs.size(), sc * 1e6 / pairs.size());
    if (torch_ms > 0) {
      std::printf("  torch.topk       %9.3f ms  (MSTopK %.3fx)\n", torch_ms, m / torch_ms);
    } else {
      std::printf("  torch.topk: not measured (install python3-torch)\n");
    }
  }
  return exact ? 0 : 1;
}

// ---- exchange ----

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
  size_t size = 0;
  double density = 0.001;
  std::vector<RankResult> ranks;
  const RankResult& slowest() const {
    return *std::max_element(ranks.begin(), ranks.end(), [](const RankResult& a, const RankResult& b) { return a.ms < b.ms; });
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

// Moves this process into the network namespace of emulated node `node` (tessera-netns)
// and returns the node's address.
std::string enter_node(int node) {
  const std::string path = detail::concat("/var/run/netns/tessera-n", node);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || setns(fd, CLONE_NEWNET) != 0)
    throw Error(detail::concat("cannot enter ", path, ": ", std::strerror(errno), " (is the emulated cluster up?)"));
  close(fd);
  return detail::concat("10.77.0.", node + 1);
}

// One process per rank; each reports "ms select_ms intra inter selected rel_error" (ms: the median
// exchange; select_ms: the median of its error feedback and selection).
ExchangeRun run_exchange(ExchangeRun run) {
  const int world = run.nodes * run.local;
  const std::string dir = testing::make_temp_dir("tessera-bench");
  auto outcomes = testing::fork_ranks(world, [&](int r, std::string& report) {
    set_log_tag("rank " + std::to_string(r));
    // Emulated: the rank binds its node's address; ranks of a node still meet on it, inside the node.
    const std::string host = run.emulated ? enter_node(r / run.local) : "127.0.0.1";
    FileStore store(dir);
    CommGroups g = connect_groups(store, Topology::grid(run.nodes, run.local), r, gloo_factory(Millis(120000), host));
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
    report = detail::concat(median(ms), " ", median(select_ms), " ", st.bytes.intra, " ", st.bytes.inter, " ", st.selected, " ",
                            den > 0 ? std::sqrt(num / den) : 0.0);
    return 0;
  }, std::chrono::minutes(10));
  std::filesystem::remove_all(dir);
  for (int r = 0; r < world; ++r) {
    if (outcomes[r].exit_code != 0)
      throw Error(detail::concat("exchange bench: rank ", r, " failed (exit ", outcomes[r].exit_code, "): ",
                                 outcomes[r].report));
    RankResult rr;
    rr.rank = r;
    std::istringstream in(outcomes[r].report);
    in >> rr.ms >> rr.select_ms >> rr.bytes_intra >> rr.bytes_inter >> rr.selected >> rr.rel_error;
    run.ranks.push_back(rr);
  }
  return run;
}

void print_exchange_json(const ExchangeRun& run) {
  std::printf("{\"bench\":\"exchange\",\"strategy\":\"%s\",\"nodes\":%d,\"local\":%d,\"size\":%zu,\"density\":%g,"
              "\"iters\":%d,\"ms\":%.3f,\"bytes_intra\":%.0f,\"bytes_inter\":%.0f,\"ranks\":[",
              run.strategy.c_str(), run.nodes, run.local, run.size, run.density, run.iters, run.ms(), run.mean_intra(),
              run.mean_inter());
  for (size_t i = 0; i < run.ranks.size(); ++i) {
    const auto& r = run.ranks[i];
    std::printf("%s{\"rank\":%d,\"ms\":%.3f,\"bytes_intra\":%lu,\"bytes_inter\":%lu,\"selected\":%zu,"
                "\"rel_error\":%.3g}",
                i ? "," : "", r.rank, r.ms, static_cast<unsigned long>(r.bytes_intra),
                static_cast<unsigned long>(r.bytes_inter), r.selected, r.rel_error);
  }
  std::printf("]}\n");
}

ExchangeRun exchange_flags(Flags& f) {
  ExchangeRun run;
  run.strategy = f.str("strategy", "hitopk");
  run.nodes = static_cast<int>(f.integer("nodes", 2, 1));
  run.local = static_cast<int>(f.integer("local", 2, 1));
  run.size = static_cast<size_t>(f.integer("size", 4000000, 0));
  run.density = f.num("density", 0.001);
  run.iters = static_cast<int>(f.integer("iters", 5, 1));
  if (run.nodes * run.local > 64) throw ConfigError("--nodes", "more than 64 local processes");
  // Validate the configuration here, with the same rules the strategies apply.
  if (!(run.density > 0 && run.density <= 1)) throw ConfigError("--density", detail::concat(run.density, " is outside (0, 1]"));
  return run;
}

// tessera-netns's emulated cloud cluster, up for the life of this object: --nodes network
// namespaces whose links run at `rate` (and `delay` where the kernel has netem).
class EmulatedCluster {
 public:
  EmulatedCluster(int nodes, const std::string& rate, const std::string& delay, bool quiet)
      : script_((std::filesystem::canonical("/proc/self/exe").parent_path() / "tessera-netns").string()) {
    for (const std::string* v : {&rate, &delay})
      if (v->find_first_not_of("0123456789.kmgbitpsu") != std::string::npos)
        throw ConfigError(v == &rate ? "--rate" : "--delay", "'" + *v + "' is not a tc rate or time");
    const std::string up = detail::concat(script_, " up --nodes ", nodes, " --rate ", rate,
                                          delay.empty() ? "" : " --delay " + delay, quiet ? " >&2" : "");
    if (std::system(up.c_str()) != 0) throw Error("the emulated cluster did not come up (" + up + ")");
  }
  ~EmulatedCluster() { [[maybe_unused]] int rc = std::system((script_ + " down >&2").c_str()); }
  EmulatedCluster(const EmulatedCluster&) = delete;
  EmulatedCluster& operator=(const EmulatedCluster&) = delete;

 private:
  std::string script_;
};

// The exchange on an emulated cloud cluster: the ranks run in its nodes' namespaces.
int cmd_cluster(Flags& f) {
  ExchangeRun run = exchange_flags(f);
  const std::string rate = f.str("rate", "1gbit"), delay = f.str("delay", "");
  const bool json = f.has("json");
  f.check_all_used();
  EmulatedCluster cluster(run.nodes, rate, delay, json);
  run.emulated = true;
  run = run_exchange(run);
  if (json) {
    std::printf("{\"bench\":\"cluster\",\"strategy\":\"%s\",\"nodes\":%d,\"local\":%d,\"rate\":\"%s\",\"delay\":\"%s\","
                "\"size\":%zu,\"density\":%g,\"iters\":%d,\"exchange_ms\":%.3f,\"select_ms\":%.3f,\"bytes_intra\":%.0f,"
                "\"bytes_inter\":%.0f}\n",
                run.strategy.c_str(), run.nodes, run.local, rate.c_str(), delay.c_str(), run.size, run.density, run.iters,
                run.ms(), run.slowest().select_ms, run.mean_intra(), run.mean_inter());
    return 0;
  }
  std::printf("%s on %d emulated nodes x %d processes, links of %s%s, %zu floats, density %g: %.2f ms per exchange "
              "(the slowest rank's median); per rank %.0f B intra, %.0f B inter\n",
              run.strategy.c_str(), run.nodes, run.local, rate.c_str(), delay.empty() ? "" : (" and " + delay).c_str(), run.size,
              run.density, run.ms(), run.mean_intra(), run.mean_inter());
  return 0;
}

// ---- training on the emulated cluster ----

// The models of the training benchmarks: CosmoFlow (32^3, 9.0M parameters) and the large-gradient
// CNN (64^2 images, 25.2M parameters, ResNet-50's gradient volume).
JobConfig bench_job(const std::string& model, int world, int batch, int steps_per_epoch, int epochs, int threads) {
  JobConfig job;
  job.workers = world;
  if (model == "cosmoflow") {
    job.model.name = "cosmoflow";
    job.model.input_size = 32;
    job.dataset = SyntheticConfig{"cosmo", 32, 0, 7, 0};
    job.training.optimizer.name = "adam";
    job.training.schedule.base_lr = 2e-4;
  } else if (model == "cnn25m") {
    job.model.name = "cnn2d";
    job.model.input_size = 64;
    job.model.base_channels = 32;
    job.model.hidden = {1536};
    job.dataset = SyntheticConfig{"images", 64, 0, 7, 10};
    job.training.optimizer.name = "sgd";
    job.training.optimizer.momentum = 0.9;
    job.training.schedule.base_lr = 0.01;
  } else {
    throw ConfigError("--model", "'" + model + "': expected cosmoflow or cnn25m");
  }
  job.dataset.samples = static_cast<uint64_t>(batch) * steps_per_epoch;
  job.validation_samples = static_cast<uint64_t>(batch);
  job.training.batch_size = batch;
  job.training.epochs = epochs;
  job.training.threads = threads;
  job.training.log_every_seconds = 1e9;
  job.data.loader_threads = 1;
  return job;
}

struct TrainRun {
  std::string model = "cosmoflow", strategy = "dense", rate = "1gbit", delay;
  int nodes = 2, local = 1, batch = 16, steps = 12, threads = 1;
  int epochs = 0;  // > 0: train that many epochs of `steps` steps and report validation after each
  uint64_t seed = 1;  // the weights' initialisation and the data order (the samples stay the same)
  std::string optimizer;  // empty: the model's own (bench_job); else OptimizerConfig's defaults
  double lr = 0;          // > 0: the base learning rate instead of the model's
  bool overlap = true;
  double density = 0.001;
  // Time to a loss validates on 16 batches (256 samples at batch 16: a steadier loss than one batch).
  uint64_t validation_samples() const { return epochs > 0 ? 16 * static_cast<uint64_t>(batch) : 0; }
};

// The model's own optimizer and learning rate (bench_job's), or those of --optimizer and --lr.
void tune_optimizer(JobConfig& job, const TrainRun& t) {
  if (!t.optimizer.empty()) job.training.optimizer = OptimizerConfig{.name = t.optimizer};  // its defaults: momentum 0.9
  if (t.lr > 0) job.training.schedule.base_lr = t.lr;
}

// The slowest rank's means over the measured steps (each epoch's first two warm up): the step
// (everything it waited for: data, compute, exposed communication), communication exposed and
// total, compute (forward, backward, update); and the bytes a rank sent between nodes per step,
// the mean over the ranks (as the exchange benchmark's): in a world ring only one rank of a node
// sends across, so the slowest rank's own may be 0.
struct TrainResult {
  double step_ms = 0, exposed_ms = 0, total_ms = 0, compute_ms = 0, bytes_inter = 0;
  double select_ms = 0;  // of the communication: error feedback and top-k selection (sparse strategies)
  // Per step, the largest compute of any rank (every collective waits for it), averaged; compute_ms
  // is the reported rank's own.
  double slowest_compute_ms = 0;
  int64_t params = 0;
  nlohmann::json epochs = nlohmann::json::array();  // {epoch, seconds, val_loss, val_metric} (--epochs)
};

TrainResult run_cluster_training(const TrainRun& t) {
  const int world = t.nodes * t.local;
  const std::string dir = testing::make_temp_dir("tessera-train-bench");
  auto outcomes = testing::fork_ranks(world, [&](int r, std::string& report) {
    set_default_log_level(LogLevel::kWarn);
    set_log_tag("rank " + std::to_string(r));
    const std::string host = enter_node(r / t.local);
    FileStore store(dir);
    CommGroups g = connect_groups(store, Topology::grid(t.nodes, t.local), r, gloo_factory(Millis(300000), host));
    const bool hybrid = t.strategy == "hybrid";
    // Throughput: two epochs of --steps per phase (hybrid: sparse, then dense), timed in the second
    // of each, when the synthetic samples are generated already (as a dataset read from a cache
    // would be). Time to a loss: --epochs of --steps, hybrid dense from its second half of epochs on.
    const bool throughput = t.epochs == 0;
    JobConfig job = bench_job(t.model, world, t.batch, t.steps, throughput ? (hybrid ? 4 : 2) : t.epochs, t.threads);
    if (t.epochs > 0) job.validation_samples = t.validation_samples();
    job.model.seed = t.seed;
    job.training.seed = t.seed;
    tune_optimizer(job, t);
    auto& c = job.communication;
    c.strategy = t.strategy;
    c.density = t.density;
    c.overlap = t.overlap;
    c.switch_at_epoch = throughput ? 2 : std::max(1, t.epochs / 2);
    Trainer trainer(job, &g);
    const auto t_start = Clock::now();
    nlohmann::json epochs = nlohmann::json::array();
    trainer.on_epoch = [&](const EpochRecord& e) {
      if (t.epochs > 0)  // time to a loss; a throughput run's validation is not reported
        epochs.push_back({{"epoch", e.epoch}, {"seconds", ms_since(t_start) / 1e3}, {"val_loss", e.val_loss}, {"val_metric", e.val_metric}});
    };
    std::vector<double> step, exposed, total, select, compute, inter;
    trainer.on_step = [&](const StepRecord& s) {
      // Warm-up: the first two steps of each epoch (allocation, connections, a new phase's
      // buffers); throughput: the first epoch of each phase as well.
      if (s.step % trainer.steps_per_epoch() < 2 || (throughput && s.epoch % 2 == 0)) return;
      step.push_back(1e3 * (s.data_s + s.forward_s + s.backward_s + s.comm_s + s.update_s));
      exposed.push_back(1e3 * s.comm_s);
      total.push_back(1e3 * s.comm_total_s);
      select.push_back(1e3 * s.select_s);
      compute.push_back(1e3 * (s.forward_s + s.backward_s + s.update_s));
      inter.push_back(static_cast<double>(s.bytes_inter));
    };
    trainer.run();
    report = nlohmann::json{{"step", step}, {"exposed", exposed}, {"total", total}, {"select", select}, {"compute", compute}, {"inter", inter}, {"epochs", epochs}}.dump();
    return 0;
  }, std::chrono::minutes(20));
  std::filesystem::remove_all(dir);
  auto mean = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / std::max<size_t>(1, v.size()); };
  TrainResult worst;
  double inter = 0;
  std::vector<double> slowest;  // per measured step, the largest compute of any rank
  for (int r = 0; r < world; ++r) {
    if (outcomes[r].exit_code != 0)
      throw Error(detail::concat("training bench: rank ", r, " failed (exit ", outcomes[r].exit_code, "): ", outcomes[r].report));
    const nlohmann::json j = nlohmann::json::parse(outcomes[r].report);
    const auto compute = j["compute"].get<std::vector<double>>();
    TrainResult x;
    x.step_ms = mean(j["step"].get<std::vector<double>>());
    x.exposed_ms = mean(j["exposed"].get<std::vector<double>>());
    x.total_ms = mean(j["total"].get<std::vector<double>>());
    x.select_ms = mean(j["select"].get<std::vector<double>>());
    x.compute_ms = mean(compute);
    x.bytes_inter = mean(j["inter"].get<std::vector<double>>());
    x.epochs = j["epochs"];
    inter += x.bytes_inter / world;
    slowest.resize(std::max(slowest.size(), compute.size()));
    for (size_t i = 0; i < compute.size(); ++i) slowest[i] = std::max(slowest[i], compute[i]);
    // The job runs at its slowest rank's pace; its communication figures are that rank's.
    if (x.step_ms > worst.step_ms) worst = x;
  }
  worst.bytes_inter = inter;
  worst.slowest_compute_ms = mean(slowest);
  worst.params = make_model(bench_job(t.model, world, t.batch, 1, 1, 1).model)->num_params();
  return worst;
}

// PyTorch DistributedDataParallel (Gloo, default buckets, its overlap) on the same model, data and
// emulated cluster: bench/torch_ddp.py, one process per rank in its node's namespace.
TrainResult run_ddp(const TrainRun& t) {
  const int world = t.nodes * t.local;
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null") != 0)
    throw Error("the PyTorch DDP peer needs python3-torch (make bench-deps)");
  const std::string dir = testing::make_temp_dir("tessera-ddp-bench");
  // The same training samples Tessera trains on, as raw float32: inputs then targets.
  JobConfig job = bench_job(t.model, world, t.batch, t.steps, 1, t.threads);
  {
    auto data = make_synthetic(job.dataset);
    std::ofstream x(dir + "/inputs.f32", std::ios::binary), y(dir + "/targets.f32", std::ios::binary);
    for (uint64_t i = 0; i < data->size(); ++i) {
      Sample s = data->get(i);
      x.write(reinterpret_cast<const char*>(s.input.data()), s.input.numel() * sizeof(float));
      y.write(reinterpret_cast<const char*>(s.target.data()), s.target.numel() * sizeof(float));
    }
  }
  const int port = 29500 + static_cast<int>(getpid() % 1000);
  auto outcomes = testing::fork_ranks(world, [&](int r, std::string& report) {
    enter_node(r / t.local);
    const std::string cmd = detail::concat(
        "GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 ", TESSERA_SOURCE_DIR, "/bench/torch_ddp.py --model ", t.model, " --rank ", r,
        " --world ", world, " --master 10.77.0.1:", port, " --data ", dir, " --batch ", t.batch / world, " --steps ", t.steps,
        " --threads ", t.threads, " 2>", dir, "/ddp-", r, ".log");
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return 1;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof(buf), p)) report.append(buf, n);
    return pclose(p) == 0 ? 0 : 1;
  }, std::chrono::minutes(20));
  std::string failed;
  for (int r = 0; r < world && failed.empty(); ++r)
    if (outcomes[r].exit_code != 0)
      failed = detail::concat("DDP rank ", r, " failed: ", testing::read_file(detail::concat(dir, "/ddp-", r, ".log")));
  std::filesystem::remove_all(dir);
  if (!failed.empty()) throw Error(failed);
  TrainResult worst;
  for (int r = 0; r < world; ++r) {
    const auto j = nlohmann::json::parse(outcomes[r].report);
    TrainResult x;
    x.step_ms = j["step_ms"];
    x.compute_ms = j["compute_ms"];
    x.params = j["params"];
    if (x.step_ms > worst.step_ms) worst = x;
  }
  return worst;
}

// Training throughput on the emulated cluster: Tessera with --strategy (dense, torus, topk, hitopk or
// hybrid: two epochs of each phase) and --overlap, or the PyTorch DDP peer (--peer ddp).
int cmd_cluster_train(Flags& f) {
  TrainRun t;
  t.model = f.str("model", t.model);
  t.strategy = f.str("strategy", t.strategy);
  t.nodes = static_cast<int>(f.integer("nodes", t.nodes, 1));
  t.local = static_cast<int>(f.integer("local", t.local, 1));
  t.batch = static_cast<int>(f.integer("batch", t.batch, 1));
  t.steps = static_cast<int>(f.integer("steps", t.steps, 3));
  t.threads = static_cast<int>(f.integer("threads", t.threads, 1));
  t.density = f.num("density", t.density);
  t.epochs = static_cast<int>(f.integer("epochs", 0, 0));
  const bool seeded = f.has("seed");
  t.seed = static_cast<uint64_t>(f.integer("seed", 1, 1));
  t.rate = f.str("rate", t.rate);
  t.delay = f.str("delay", "");
  const bool tuned = f.has("optimizer") || f.has("lr");
  t.optimizer = f.str("optimizer", "");
  t.lr = f.num("lr", 0);
  const std::string overlap = f.str("overlap", "on"), peer = f.str("peer", "tessera");
  const bool json = f.has("json");
  f.check_all_used();
  if (overlap != "on" && overlap != "off") throw ConfigError("--overlap", "'" + overlap + "': expected on or off");
  t.overlap = overlap == "on";
  if (peer != "tessera" && peer != "ddp") throw ConfigError("--peer", "'" + peer + "': expected tessera or ddp");
  if (peer == "ddp" && t.epochs > 0) throw ConfigError("--epochs", "the DDP peer measures throughput only");
  if (peer == "ddp" && seeded) throw ConfigError("--seed", "the DDP peer measures throughput only");
  if (peer == "ddp" && tuned) throw ConfigError(f.has("lr") ? "--lr" : "--optimizer", "the DDP peer measures throughput only");
  if (f.has("lr") && !(t.lr > 0)) throw ConfigError("--lr", "must be positive");
  JobConfig tuned_job = bench_job(t.model, 1, 1, 1, 1, 1);  // the optimizer the ranks will build
  tune_optimizer(tuned_job, t);
  try {
    make_optimizer(tuned_job.training.optimizer);
  } catch (const ConfigError& e) {
    throw ConfigError("--optimizer", e.problems().front().reason);
  }
  if (t.batch % (t.nodes * t.local))
    throw ConfigError("--batch", detail::concat(t.batch, " does not divide over ", t.nodes * t.local, " ranks"));
  EmulatedCluster cluster(t.nodes, t.rate, t.delay, json);
  const TrainResult r = peer == "ddp" ? run_ddp(t) : run_cluster_training(t);
  const double sps = t.batch / (r.step_ms / 1e3);
  const std::string strategy = peer == "ddp" ? "ddp" : t.strategy;
  if (json) {
    std::printf("%s\n", nlohmann::json{{"bench", "cluster-train"}, {"peer", peer}, {"model", t.model}, {"params", r.params},
                                       {"strategy", strategy}, {"overlap", peer == "ddp" ? true : t.overlap},
                                       {"nodes", t.nodes}, {"local", t.local}, {"rate", t.rate}, {"delay", t.delay},
                                       {"batch", t.batch}, {"threads", t.threads}, {"density", t.density}, {"steps", t.steps},
                                       {"seed", t.seed}, {"optimizer", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(tuned_job.training.optimizer.name)},
                                       {"lr", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(tuned_job.training.schedule.base_lr)}, {"step_ms", r.step_ms}, {"samples_per_second", sps}, {"compute_ms", r.compute_ms},
                                       {"slowest_compute_ms", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(r.slowest_compute_ms)},
                                       {"comm_exposed_ms", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(r.exposed_ms)},
                                       {"comm_total_ms", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(r.total_ms)},
                                       {"select_ms", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(r.select_ms)},
                                       {"bytes_inter", r.bytes_inter}, {"validation_samples", t.validation_samples()},
                                       {"epochs", r.epochs}}.dump().c_str());
    return 0;
  }
  std::printf("%s %s (%lld parameters) on %d emulated nodes x %d ranks, links of %s, global batch %d: %.1f ms per step, "
              "%.1f samples/s; compute %.1f ms",
              peer.c_str(), strategy.c_str(), static_cast<long long>(r.params), t.nodes, t.local, t.rate.c_str(), t.batch,
              r.step_ms, sps, r.compute_ms);
  if (peer == "tessera")
    std::printf(" (the slowest rank's %.1f ms), communication %.1f ms exposed of %.1f ms%s", r.slowest_compute_ms, r.exposed_ms,
                r.total_ms, t.overlap ? " (overlapped)" : "");
  std::printf("\n");
  for (const auto& e : r.epochs)
    std::printf("  epoch %d at %.1f s: validation loss %.5f, metric %.4f\n", e["epoch"].get<int>(), e["seconds"].get<double>(),
                e["val_loss"].get<double>(), e["val_metric"].get<double>());
  return 0;
}

int cmd_exchange(Flags& f) {
  ExchangeRun run = exchange_flags(f);
  const bool json = f.has("json");
  f.check_all_used();
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

int cmd_demo(Flags& f) {
  ExchangeRun base = exchange_flags(f);
  if (!f.has("size")) base.size = 4000000;
  if (!f.has("density")) base.density = 0.01;
  f.check_all_used();
  std::printf("Tessera gradient exchange: %d nodes x %d worker processes over loopback, a %.1f MB gradient bucket, "
              "density %g for the sparse strategies.\n\n",
              base.nodes, base.local, base.size * 4 / 1e6, base.density);
  std::printf("%-8s %10s %14s %14s %14s %18s\n", "strategy", "ms", "intra MB/rank", "inter MB/rank",
              "inter vs dense", "error of one step");
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
  std::printf("\nThe error of one step is what the sparse strategies leave in their error-feedback residuals "
              "for later steps; dense and torus are exact.\n");
  return 0;
}

// ---- train ----

Tensor random_tensor(const Shape& s, uint32_t seed) {
  Tensor t(s);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (auto& v : t.span()) v = n(rng);
  return t;
}

// Mean seconds of fn over `iters` calls after one warm-up call.
double time_it(const std::function<void()>& fn, int iters) {
  fn();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
}

// The PyTorch baseline of `train`, or null when python3 with torch is not installed.
nlohmann::json torch_baseline(int size, int batch, int threads, int iters, const std::string& hidden) {
  return python_peer(detail::concat("torch_cosmoflow.py --size ", size, " --batch ", batch, " --threads ", threads,
                                    " --iters ", iters, " --hidden ", hidden));
}

int cmd_train(Flags& f) {
  ModelConfig mc;
  mc.name = f.str("model", "cosmoflow");
  mc.input_size = static_cast<int>(f.integer("size", 64, 4));
  const int batch = static_cast<int>(f.integer("batch", 4, 1));
  const int threads = static_cast<int>(f.integer("threads", 2, 1));
  const int iters = static_cast<int>(f.integer("iters", 5, 1));
  const bool json = f.has("json");
  f.check_all_used();
  omp_set_num_threads(threads);
  auto model = make_model(mc);
  Shape in = {batch};
  for (int64_t d : model->sample_shape()) in.push_back(d);
  Shape tgt = {batch};
  for (int64_t d : model->target_shape()) tgt.push_back(d);
  Tensor x = random_tensor(in, 1), y = random_tensor(tgt, 2);
  if (model->task() != Task::kRegression)
    for (auto& v : y.span()) v = static_cast<float>(static_cast<int>(std::fabs(v) * 3) % 3);
  auto opt = make_optimizer(OptimizerConfig{});
  auto params = model->params();
  double fwd_s = 0, bwd_s = 0, upd_s = 0;  // the step's parts, summed over the timed steps
  int timed = -1;                           // the warm-up step is not counted
  const double step_s = time_it([&] {
    auto t0 = Clock::now();
    for (Param* p : params) p->grad.zero();
    Tensor out = model->forward(x, true);
    auto t1 = Clock::now();
    model->backward(model->loss(out, y).grad);
    auto t2 = Clock::now();
    opt->step(params, 1e-4);
    auto t3 = Clock::now();
    if (++timed > 0) {
      fwd_s += std::chrono::duration<double>(t1 - t0).count();
      bwd_s += std::chrono::duration<double>(t2 - t1).count();
      upd_s += std::chrono::duration<double>(t3 - t2).count();
    }
  }, iters);
  fwd_s /= iters, bwd_s /= iters, upd_s /= iters;
  const double sps = batch / step_s;

  // Conv layer shapes of the model, each timed alone.
  nlohmann::json convs = nlohmann::json::array();
  Shape shape = in;
  for (Layer* l : model->layers()) {
    if (auto* c = dynamic_cast<Conv*>(l); c && c->options().spatial_dims == 3) {
      Conv conv("bench", c->options());
      // In the layout the model's convolutions see (channels-last), so no reorder is timed.
      Tensor xi = dnnl_util::to_layout(random_tensor(shape, 3), Layout::kChannelsLast);
      const double flops = conv.forward_flops(shape);
      const double fwd = time_it([&] { conv.forward(xi, true); }, iters);
      Tensor g = dnnl_util::to_layout(random_tensor(conv.output_shape(shape), 4), Layout::kChannelsLast);
      conv.forward(xi, true);
      const double bwd = time_it([&] { conv.backward(g); }, iters);
      convs.push_back({{"in", c->options().in_channels}, {"out", c->options().out_channels}, {"size", shape[2]},
                       {"fwd_gflops", flops / fwd / 1e9}, {"bwd_gflops", 2 * flops / bwd / 1e9}});
    }
    shape = l->output_shape(shape);
  }

  nlohmann::json out = {{"bench", "train"}, {"model", mc.name}, {"size", mc.input_size}, {"batch", batch},
                        {"threads", threads}, {"samples_per_second", sps}, {"step_ms", step_s * 1e3},
                        {"forward_ms", fwd_s * 1e3}, {"backward_ms", bwd_s * 1e3}, {"update_ms", upd_s * 1e3}};
  nlohmann::json torch = nullptr;
  if (mc.name == "cosmoflow") {
    std::string hidden;
    for (int h : hidden_widths(mc)) hidden += (hidden.empty() ? "" : ",") + std::to_string(h);
    torch = torch_baseline(mc.input_size, batch, threads, iters, hidden);
  }
  out["torch_samples_per_second"] = torch.is_null() ? nlohmann::json(nullptr) : torch["samples_per_second"];
  out["ratio_vs_torch"] = torch.is_null() ? nlohmann::json(nullptr) : nlohmann::json(sps / torch["samples_per_second"].get<double>());
  for (size_t i = 0; i < convs.size(); ++i) {
    if (!torch.is_null() && i < torch["convs"].size()) {
      convs[i]["torch_fwd_gflops"] = torch["convs"][i]["fwd_gflops"];
      convs[i]["torch_bwd_gflops"] = torch["convs"][i]["bwd_gflops"];
    }
  }
  out["convs"] = convs;
  if (json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%s at %d^3, batch %d, %d threads: %.2f samples/s (%.1f ms per step)", mc.name.c_str(), mc.input_size,
              batch, threads, sps, step_s * 1e3);
  if (!torch.is_null())
    std::printf("; PyTorch %s: %.2f samples/s; ratio %.2fx", torch["version"].get<std::string>().c_str(),
                torch["samples_per_second"].get<double>(), out["ratio_vs_torch"].get<double>());
  else
    std::printf("; PyTorch baseline not available (install python3-torch)");
  std::printf("\n  step: forward %.1f ms, backward %.1f ms, update %.1f ms\n", fwd_s * 1e3, bwd_s * 1e3, upd_s * 1e3);
  for (const auto& c : convs) {
    std::printf("  conv3d %3d -> %3d at %3d^3: forward %6.1f GFLOP/s, backward %6.1f GFLOP/s", c["in"].get<int>(),
                c["out"].get<int>(), c["size"].get<int>(), c["fwd_gflops"].get<double>(), c["bwd_gflops"].get<double>());
    if (c.contains("torch_fwd_gflops")) {
      const nlohmann::json& tb = c["torch_bwd_gflops"];  // null: its backward was within the timing noise
      std::printf("   (PyTorch %6.1f / %s)", c["torch_fwd_gflops"].get<double>(),
                  tb.is_number() ? detail::concat(std::round(tb.get<double>() * 10) / 10).c_str() : "n/a");
    }
    std::printf("\n");
  }
  return 0;
}

// ---- spatial ----

int cmd_spatial(Flags& f) {
  ModelConfig mc;
  mc.name = f.str("model", "cosmoflow");
  mc.input_size = static_cast<int>(f.integer("size", 128, 8));
  const int batch = static_cast<int>(f.integer("batch", 1, 1));
  const int iters = static_cast<int>(f.integer("iters", 2, 1));
  const std::string splits_s = f.str("splits", "1,2,4");
  const bool json = f.has("json");
  f.check_all_used();
  if (mc.name != "cosmoflow") throw ConfigError("--model", "spatial parallelism is available for cosmoflow");
  std::vector<int> splits;
  for (size_t pos = 0; pos < splits_s.size();) {
    size_t comma = splits_s.find(',', pos);
    const std::string part = splits_s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end || v < 1) throw ConfigError("--splits", "'" + splits_s + "' is not a list of positive integers");
    splits.push_back(static_cast<int>(v));
    pos = comma == std::string::npos ? splits_s.size() : comma + 1;
  }
  nlohmann::json results = nlohmann::json::array();
  double base_ms = 0, base_mem = 0;
  for (int S : splits) {
    const std::string dir = testing::make_temp_dir("tessera-spatial-bench");
    auto outcomes = testing::fork_ranks(S, [&](int r, std::string& report) {
      omp_set_num_threads(1);
      FileStore store(dir);
      std::unique_ptr<Communicator> comm;
      ModelConfig c = mc;
      if (S > 1) {
        std::vector<int> members(S);
        for (int i = 0; i < S; ++i) members[i] = i;
        GlooCommunicator::Options o;
        o.group = "spatial";
        o.timeout = Millis(600000);
        comm = GlooCommunicator::connect(store, r, members, o);
        c.spatial = SpatialGrid{S, 1, 1};
      }
      auto model = make_model(c, comm.get());
      Shape in = {batch, 4, mc.input_size, mc.input_size, mc.input_size};
      if (const Partition* p = model->input_partition())
        for (int d = 0; d < 3; ++d) in[2 + d] = p->owned(d).size();
      Tensor x = random_tensor(in, 10 + r);
      Tensor y = random_tensor({static_cast<int64_t>(model->held_samples(batch).size()), 4}, 20);
      auto params = model->params();
      auto step = [&] {
        for (Param* p : params) p->grad.zero();
        Tensor out = model->forward(x, true);
        LossResult l = model->loss(out, y);
        if (out.dim(0) == 0) l.grad = Tensor(out.shape());
        model->backward(l.grad);
      };
      auto halo = [&] {
        uint64_t b = 0;
        for (Layer* l : model->layers()) {
          if (auto* dc = dynamic_cast<DistConv*>(l)) b += dc->halo_bytes();
          if (auto* dp = dynamic_cast<DistPool*>(l)) b += dp->halo_bytes();
        }
        return b;
      };
      step();  // warm-up: primitives built, buffers allocated
      const int64_t before = live_tensor_bytes();
      reset_peak_tensor_bytes();
      const uint64_t halo0 = halo();
      if (comm) comm->barrier(Millis(0));
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) step();
      const double ms = ms_since(t0) / iters;
      struct rusage ru;
      getrusage(RUSAGE_SELF, &ru);
      report = detail::concat(ms, " ", peak_tensor_bytes() - before, " ", (halo() - halo0) / iters, " ", ru.ru_maxrss * 1024L);
      return 0;
    }, std::chrono::minutes(10));
    std::filesystem::remove_all(dir);
    double worst_ms = 0, worst_mem = 0, rss = 0;
    uint64_t halo_bytes = 0;
    for (int r = 0; r < S; ++r) {
      if (outcomes[r].exit_code != 0)
        throw Error(detail::concat("spatial bench: rank ", r, " of ", S, " failed: ", outcomes[r].report));
      std::istringstream in(outcomes[r].report);
      double ms, mem, rs;
      uint64_t hb;
      in >> ms >> mem >> hb >> rs;
      worst_ms = std::max(worst_ms, ms);
      worst_mem = std::max(worst_mem, mem);
      rss = std::max(rss, rs);
      halo_bytes = std::max(halo_bytes, hb);
    }
    if (base_ms == 0) {
      base_ms = worst_ms;
      base_mem = worst_mem;
    }
    results.push_back({{"split", S}, {"ms_per_sample", worst_ms / batch}, {"peak_activation_bytes", worst_mem},
                       {"peak_rss_bytes", rss}, {"halo_bytes_per_step", halo_bytes},
                       {"time_vs_first", worst_ms / base_ms}, {"memory_vs_first", worst_mem / base_mem}});
    if (!json)
      std::printf("split %d: %9.1f ms per sample (%.2fx), peak activations %8.1f MB per rank (%.2fx), halo %7.2f MB per "
                  "step, peak RSS %7.1f MB\n",
                  S, worst_ms / batch, worst_ms / base_ms, worst_mem / 1e6, worst_mem / base_mem, halo_bytes / 1e6, rss / 1e6);
  }
  if (json) {
    nlohmann::json out = {{"bench", "spatial"}, {"model", mc.name}, {"size", mc.input_size}, {"batch", batch},
                          {"threads_per_rank", 1}, {"splits", results}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

// ---- cache ----

// CosmoFlow on a generated HDF5 dataset of `samples` size^3 fields in dir (validation: one batch),
// read through the memory cache and an SSD tier in dir/ssd; Adam, quiet.
JobConfig hdf5_job(const std::string& dir, int samples, int size, int batch, int threads) {
  set_default_log_level(LogLevel::kWarn);
  generate_dataset("cosmoflow", samples, size, dir + "/train", 1);
  generate_dataset("cosmoflow", batch, size, dir + "/val", 2);
  JobConfig job;
  job.model.input_size = size;
  job.data.format = "hdf5";
  job.data.path = dir + "/train";
  job.data.validation_path = dir + "/val";
  job.data.cache.ssd_dir = dir + "/ssd";
  job.training.batch_size = batch;
  job.training.threads = threads;
  job.training.log_every_seconds = 1e9;
  job.training.optimizer.name = "adam";
  job.training.schedule.base_lr = 1e-4;
  return job;
}

int cmd_cache(Flags& f) {
  const double mbps = f.num("remote-mbps", 50);
  const int size = static_cast<int>(f.integer("size", 64, 8));
  const int samples = static_cast<int>(f.integer("samples", 32, 1));
  const int epochs = static_cast<int>(f.integer("epochs", 2, 1));
  const int batch = static_cast<int>(f.integer("batch", 4, 1));
  const int threads = static_cast<int>(f.integer("threads", 2, 1));
  const bool json = f.has("json");
  f.check_all_used();
  if (!(mbps > 0)) throw ConfigError("--remote-mbps", "must be positive");
  const std::string dir = testing::make_temp_dir("tessera-cache-bench");
  JobConfig job = hdf5_job(dir, samples, size, batch, threads);
  job.data.remote_mbps = mbps;
  job.data.remote_latency_ms = 2;
  job.data.cache.memory_bytes = int64_t{4} << 30;

  nlohmann::json rows = nlohmann::json::array();
  auto run = [&](int n_epochs, const std::string& label) {
    job.training.epochs = n_epochs;
    Trainer trainer(job, nullptr);
    double wait = 0, total = 0;
    int64_t steps = 0;
    auto t0 = Clock::now();
    TieredCache::Counters before{};
    uint64_t remote_before = 0;
    trainer.on_step = [&](const StepRecord& r) {
      wait += r.data_s;
      total += r.data_s + r.forward_s + r.backward_s + r.comm_s + r.update_s;
      ++steps;
    };
    trainer.on_epoch = [&](const EpochRecord& e) {
      const auto c = trainer.cache()->counters();
      const double secs = ms_since(t0) / 1e3;
      uint64_t served = 0, hits[3];
      for (int t = 0; t < 3; ++t) {
        hits[t] = c.hits[t] - before.hits[t];
        served += hits[t];
      }
      const double bytes = static_cast<double>((c.bytes[0] + c.bytes[1] + c.bytes[2]) -
                                               (before.bytes[0] + before.bytes[1] + before.bytes[2]));
      nlohmann::json row = {{"run", label}, {"epoch", e.epoch}, {"steps", steps}, {"data_wait_fraction", wait / total},
                            {"read_mb_per_s", bytes / 1e6 / secs},
                            {"remote_mb", (trainer.remote_bytes_read() - remote_before) / 1e6},
                            {"hit_ratio_memory", double(hits[0]) / served}, {"hit_ratio_ssd", double(hits[1]) / served},
                            {"hit_ratio_remote", double(hits[2]) / served}, {"epoch_seconds", secs}};
      rows.push_back(row);
      if (!json)
        std::printf("%-9s epoch %d: data wait %5.1f%% of step time, %7.1f MB/s of decoded blocks, %6.1f MB read remotely, hits: "
                    "memory %.2f, SSD %.2f, remote %.2f\n",
                    label.c_str(), e.epoch, 100 * wait / total, bytes / 1e6 / secs, row["remote_mb"].get<double>(),
                    row["hit_ratio_memory"].get<double>(), row["hit_ratio_ssd"].get<double>(),
                    row["hit_ratio_remote"].get<double>());
      before = c;
      remote_before = trainer.remote_bytes_read();
      wait = total = 0;
      steps = 0;
      t0 = Clock::now();
    };
    trainer.run();
  };
  if (!json)
    std::printf("CosmoFlow %d^3 from %d HDF5 samples, remote tier throttled to %.0f MB/s, batch %d, %d threads\n", size,
                samples, mbps, batch, threads);
  run(epochs, "first");
  run(1, "restarted");  // a new worker process: empty memory, the SSD tier from before
  std::filesystem::remove_all(dir);
  if (json) {
    nlohmann::json out = {{"bench", "cache"}, {"remote_mbps", mbps}, {"size", size}, {"samples", samples}, {"epochs", rows}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

// ---- placement ----

int cmd_placement(Flags& f) {
  const int workers = static_cast<int>(f.integer("workers", 1024, 1));
  const int n_nodes = static_cast<int>(f.integer("nodes", 128, 1));
  const int gpus = static_cast<int>(f.integer("gpus-per-node", 8, 1));
  const int repeat = static_cast<int>(f.integer("repeat", 20, 1));
  const bool json = f.has("json");
  f.check_all_used();
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
    std::printf("{\"bench\":\"placement\",\"workers\":%d,\"nodes\":%d,\"gpus_per_node\":%d,\"placed\":%s,"
                "\"ranks\":%zu,\"ms\":%.3f}\n",
                workers, n_nodes, gpus, r.placed ? "true" : "false", ranks, m);
  } else {
    std::printf("placing %d one-GPU workers on %d nodes of %d GPUs: %s, %.3f ms (median of %d) including the ring plan\n",
                workers, n_nodes, gpus, r.placed ? "placed" : r.reason.c_str(), m, repeat);
  }
  return r.placed ? 0 : 1;
}

// ---- controller ----

// VmHWM / VmRSS of this process, in MB.
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

int cmd_controller(Flags& f) {
  const int n_nodes = static_cast<int>(f.integer("nodes", 1000, 1));
  const int n_jobs = static_cast<int>(f.integer("jobs", 100, 1));
  const int pods = static_cast<int>(f.integer("pods", 8, 1));
  const int gpus = static_cast<int>(f.integer("gpus-per-node", 8, 1));
  const double limit_s = f.num("timeout", 300);
  const bool json = f.has("json");
  f.check_all_used();
  namespace fs = std::filesystem;
  const std::string bin = fs::canonical("/proc/self/exe").parent_path().string();
  const std::string src = TESSERA_SOURCE_DIR;
  const std::string dir = fs::temp_directory_path() / detail::concat("tessera-bench-controller-", getpid());
  const std::string cluster = dir + "/cluster";
  struct Cleanup {
    std::string src, cluster, dir;
    ~Cleanup() {
      [[maybe_unused]] int rc = std::system(("bash " + src + "/scripts/test-cluster.sh stop " + cluster + " >/dev/null 2>&1").c_str());
      fs::remove_all(dir);
    }
  } cleanup{src, cluster, dir};
  fs::create_directories(dir);
  std::fprintf(stderr, "starting the test cluster with %d simulated nodes of %d GPUs...\n", n_nodes, gpus);
  const auto t_cluster = Clock::now();
  const std::string start = detail::concat("bash ", src, "/scripts/test-cluster.sh start ", cluster, " --nodes ", n_nodes,
                                           " --gpus ", gpus, " --zones 4 --simulate --agent ", bin, "/tessera-node-agent >",
                                           dir, "/start.log 2>&1 && kubectl --kubeconfig ", cluster, "/kubeconfig apply -f ", src,
                                           "/crds/ >/dev/null && kubectl --kubeconfig ", cluster,
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
    std::printf("{\"bench\":\"controller\",\"nodes\":%d,\"jobs\":%d,\"pods_per_job\":%d,\"jobs_running\":%d,\"pods\":%zu,"
                "\"create_ms\":%.1f,\"all_running_ms\":%.1f,\"reconciles\":%lld,\"reconcile_p50_ms\":%.2f,"
                "\"reconcile_p99_ms\":%.2f,\"api_requests_per_job\":%.1f,\"status_conflicts\":%lld,"
                "\"rss_mb_before\":%.1f,\"rss_mb_peak\":%.1f}\n",
                n_nodes, n_jobs, pods, running_jobs, n_pods, created_ms, all_running_ms, static_cast<long long>(st.reconciles),
                p50, p99, per_job, static_cast<long long>(st.status_conflicts), rss_before, hwm);
  } else {
    std::printf("%d/%d gangs of %d pods Running on %d simulated nodes after %.1f s (jobs created in %.1f s); %zu pods\n"
                "reconciles %lld: p50 %.2f ms, p99 %.2f ms; %.1f API requests per job; %lld status conflicts; "
                "RSS %.1f MB before the jobs, peak %.1f MB (this process)\n",
                running_jobs, n_jobs, pods, n_nodes, all_running_ms / 1000, created_ms / 1000, n_pods,
                static_cast<long long>(st.reconciles), p50, p99, per_job, static_cast<long long>(st.status_conflicts),
                rss_before, hwm);
  }
  return running_jobs == n_jobs ? 0 : 1;
}

// GET http://127.0.0.1:port/path; the body's size, or -1.
long http_get_size(int port, const char* path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  long n = -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = std::string("GET ") + path + " HTTP/1.1\r\nHost: bench\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      n = 0;
      char buf[65536];
      for (ssize_t r; (r = read(fd, buf, sizeof(buf))) > 0;) n += r;
    }
  }
  close(fd);
  return n;
}

// The cost of the worker's metrics, in one training run: the exporter (its updates every step, a
// scraper reading /metrics every --scrape-ms) is on for --block steps, off for the next --block,
// and so on, so drift and the machine's noise fall on both; the median step time of each, and
// the exporter's own work timed directly (updates per step, serialisation per scrape).
int cmd_metrics(Flags& f) {
  const int size = static_cast<int>(f.integer("size", 32, 8));
  const int samples = static_cast<int>(f.integer("samples", 64, 8));
  const int epochs = static_cast<int>(f.integer("epochs", 16, 1));
  const int block = static_cast<int>(f.integer("block", 4, 1));
  const int batch = static_cast<int>(f.integer("batch", 4, 1));
  const int threads = static_cast<int>(f.integer("threads", 2, 1));
  const int scrape_ms = static_cast<int>(f.integer("scrape-ms", 100, 1));
  const bool json = f.has("json");
  f.check_all_used();
  const std::string dir = testing::make_temp_dir("tessera-metrics-bench");
  JobConfig job = hdf5_job(dir, samples, size, batch, threads);
  job.training.epochs = epochs;
  job.checkpoint.path = dir + "/checkpoints";
  job.checkpoint.every_steps = 8;
  Trainer trainer(job, nullptr);
  WorkerMetrics m(WorkerIdentity{"bench", "default", "local-0", "bench-0-0", 0});
  HttpServer http("127.0.0.1:0", "--metrics-addr");
  double observe_s = 0, serialize_s = 0;
  long scrapes = 0;
  http.handle("/metrics", [&] {
    const auto t0 = Clock::now();
    HttpResponse r{200, "text/plain; version=0.0.4", m.text()};
    serialize_s += ms_since(t0) / 1e3;  // scrapes are served one at a time
    return r;
  });
  std::atomic<bool> on{false}, stop{false};
  std::thread scraper([&, port = http.port()] {
    while (!stop) {
      if (on && http_get_size(port, "/metrics") > 0) ++scrapes;
      std::this_thread::sleep_for(std::chrono::milliseconds(scrape_ms));
    }
  });
  std::vector<double> with, without;
  int64_t step = 0;
  trainer.on_step = [&](const StepRecord& r) {
    const auto t0 = Clock::now();
    if (on) m.observe(r, batch, trainer.cache());
    const double took = ms_since(t0) / 1e3;
    if (on) observe_s += took;
    const double s = r.data_s + r.forward_s + r.backward_s + r.comm_s + r.update_s + r.checkpoint_s + took;
    if (step >= 2 * block) (on ? with : without).push_back(s);  // the first blocks warm the cache
    ++step;
    on = (step / block) % 2 == 1;
  };
  trainer.run();
  stop = true;
  scraper.join();
  std::filesystem::remove_all(dir);
  const double a = median(with), b = median(without);
  const double overhead = (a - b) / b;
  const double observe_us = 1e6 * observe_s / std::max<size_t>(1, with.size());
  const double serialize_us = 1e6 * serialize_s / std::max<long>(1, scrapes);
  if (json) {
    std::printf("%s\n", nlohmann::json{{"bench", "metrics"}, {"size", size}, {"batch", batch}, {"threads", threads},
                                        {"steps_with", with.size()}, {"steps_without", without.size()}, {"block", block},
                                        {"scrape_ms", scrape_ms}, {"scrapes", scrapes}, {"step_seconds_with", a},
                                        {"step_seconds_without", b}, {"overhead", overhead}, {"observe_us_per_step", observe_us},
                                        {"serialize_us_per_scrape", serialize_us}, {"observe_fraction_of_step", observe_us / 1e6 / b}}
                              .dump()
                              .c_str());
  } else {
    std::printf("metrics: median step %.2f ms with the exporter (%zu steps, %ld scrapes every %d ms), %.2f ms without (%zu "
                "steps): overhead %+.2f%%; the updates take %.1f us per step (%.4f%% of a step), a scrape's "
                "serialisation %.0f us\n",
                a * 1e3, with.size(), scrapes, scrape_ms, b * 1e3, without.size(), 100 * overhead, observe_us,
                100 * observe_us / 1e6 / b, serialize_us);
  }
  return 0;
}

int usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: tessera-bench <command> [flags]\n"
               "  topk     --size D --density R [--repeat N] [--json]\n"
               "  exchange --strategy %s --nodes M --local N --size D --density R [--iters I] [--json]\n"
               "  train    --model cosmoflow|unet3d|cnn2d --size W [--batch B --threads T --iters I] [--json]\n"
               "  spatial  --model cosmoflow --size W --splits 1,2,4 [--batch B --iters I] [--json]\n"
               "  cache    --remote-mbps R [--size W --samples N --epochs E --batch B --threads T] [--json]\n"
               "  placement --workers W --nodes N [--gpus-per-node G --repeat R] [--json]\n"
               "  controller --nodes N --jobs J [--pods P --gpus-per-node G --timeout S] [--json]\n"
               "  cluster  --strategy S --nodes M --local N --rate R [--delay D] --size D --density R [--iters I] [--json]\n"
               "  cluster-train --model cosmoflow|cnn25m --strategy S|hybrid [--peer ddp] [--overlap on|off] --nodes M --local N\n"
               "           --rate R [--batch B --steps K --threads T --density R --epochs E --seed S]\n"
               "           [--optimizer sgd|adam|lars --lr X] [--json]\n"
               "  metrics  [--size W --samples N --epochs E --block K --batch B --threads T --scrape-ms M] [--json]\n"
               "  demo     [--nodes M --local N --size D --density R --iters I]\n",
               exchange_strategy_names());
  return code;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  if (argc < 2) return usage(2);
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") return usage(0);
  keep_freed_tensor_memory();  // as the worker does
  return run_command("tessera-bench", [&] {
    Flags f(argc, argv, 2);
    if (f.has("help")) return usage(0);
    if (cmd == "topk") return cmd_topk(f);
    if (cmd == "exchange") return cmd_exchange(f);
    if (cmd == "demo") return cmd_demo(f);
    if (cmd == "train") return cmd_train(f);
    if (cmd == "spatial") return cmd_spatial(f);
    if (cmd == "cache") return cmd_cache(f);
    if (cmd == "placement") return cmd_placement(f);
    if (cmd == "controller") return cmd_controller(f);
    if (cmd == "metrics") return cmd_metrics(f);
    if (cmd == "cluster") return cmd_cluster(f);
    if (cmd == "cluster-train") return cmd_cluster_train(f);
    std::fprintf(stderr, "tessera-bench: unknown command '%s'\n", cmd.c_str());
    return usage(2);
  });
}
