#include "worker/train/calibration.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "common/error.h"
#include "worker/compress/sparse.h"
#include "worker/compress/topk.h"
#include "worker/train/straggler.h"

namespace tessera {
namespace {

constexpr size_t kSmallProbe = size_t{4} << 10, kLargeProbe = size_t{4} << 20;
constexpr int kRepeats = 3;
constexpr uint32_t kIntraTag = 31;  // point-to-point tag of the probe inside a node
constexpr size_t kMaxSelectionFloats = size_t{8} << 20;

using Clock = std::chrono::steady_clock;

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// alpha and seconds per byte from the times of a small and a large message. The small message's time
// is mostly latency; where a wait for a core made it over half the large one's (the gang's start
// shares the cores with its data loaders), at least half of the large one's time is the wire's.
std::pair<double, double> fit(double small_s, double large_s) {
  const double per_byte = std::max((large_s - small_s) / static_cast<double>(kLargeProbe - kSmallProbe),
                                   0.5 * large_s / static_cast<double>(kLargeProbe));
  return {std::max(0.0, small_s - per_byte * static_cast<double>(kSmallProbe)), per_byte};
}

// The machine this process runs on: its boot id, hashed (processes in other namespaces of one
// machine see the same).
int64_t machine_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return static_cast<int64_t>(std::hash<std::string>{}(id)&0x7fffffffffffffffull);
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// The best of kRepeats timed calls.
double best_of(const std::function<void()>& f) {
  double best = INFINITY;
  for (int i = 0; i < kRepeats; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// The sparse exchanges' CPU work per float, on a bucket of `bucket_floats` (at most
// kMaxSelectionFloats): out[i] the selection at densities[i], then a streaming pass, then a
// scatter-add per pair.
void time_sparse_work(size_t bucket_floats, const std::vector<double>& densities, const std::string& selector,
                      double* out) {
  const size_t n = std::max<size_t>(1, std::min(bucket_floats, kMaxSelectionFloats));
  std::vector<float> x(n), acc(n);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& f : x) f = normal(rng);
  MSTopK mstopk;
  std::vector<uint32_t> idx;
  for (size_t i = 0; i < densities.size(); ++i) {
    const size_t k = topk_count(n, densities[i]);
    const double s = best_of([&] {
      if (selector == "exact") exact_topk(x, k, idx);
      else mstopk.select(x, k, idx);
    });
    out[i] = s / static_cast<double>(n);
  }
  // a pass: acc = residual + gradient (three streams count as three passes in the model)
  out[densities.size()] = best_of([&] {
                            for (size_t i = 0; i < n; ++i) acc[i] += x[i];
                          }) /
                          (3.0 * static_cast<double>(n));
  // a scatter-add of pairs at random places
  const size_t pairs = std::max<size_t>(1, topk_count(n, 0.01));
  std::vector<SparseEntry> e(pairs);
  std::uniform_int_distribution<uint32_t> at(0, static_cast<uint32_t>(n - 1));
  for (auto& p : e) p = {at(rng), 1.0f};
  out[densities.size() + 1] = best_of([&] { scatter_add(acc, e); }) / static_cast<double>(pairs);
}

}  // namespace

GangCalibration calibrate_gang(CommGroups& groups, size_t bucket_floats, const std::vector<double>& densities,
                               const std::string& selector) {
  const Topology& t = groups.topology;
  GangCalibration c;
  c.nodes = t.num_nodes();
  c.local = t.world_size() / std::max(1, c.nodes);
  cost::Machine& mc = c.machine;
  mc.hidden = 1.0;  // the wire and the CPU each bound a phase; neither waits for the other
  const auto& me = t.placement(groups.rank);
  // [alpha_inter, wire, cpu_inter, alpha_intra, cpu_intra, selection..., pass, add], summed over the
  // ranks that measured each (one each), then every rank has them
  std::vector<double> v(7 + densities.size(), 0.0);

  // Between nodes: two probe sizes, the slowest pair.
  if (c.nodes > 1) {
    const std::vector<double> small = probe_node_links(groups, kSmallProbe, kRepeats);
    const double cpu0 = process_cpu_seconds();
    const std::vector<double> large = probe_node_links(groups, kLargeProbe, kRepeats);
    const double cpu = process_cpu_seconds() - cpu0;
    const auto [alpha, wire] = fit(slowest_link(small), slowest_link(large));
    if (groups.rank == 0) v[0] = alpha, v[1] = wire;
    // this node's CPU over its exchanges of the large probe: (nodes - 1) partners, kRepeats each
    double node_cpu = me.local_rank == 0 ? cpu / static_cast<double>((c.nodes - 1) * kRepeats * kLargeProbe) : 0.0;
    groups.world->allreduce(&node_cpu, 1, DType::kFloat64, ReduceOp::kMax, Millis(0));
    // the CPU time of the process's threads can add up to more than the wall time; a byte's CPU work
    // is at most its time on the link
    if (groups.rank == 0) v[2] = std::min(node_cpu, wire > 0 ? wire : node_cpu);
  }
  // Inside the first node: its ranks 0 and 1.
  if (c.local > 1 && t.node_index(groups.rank) == 0 && me.local_rank < 2) {
    Communicator& intra = *groups.intra;
    const int peer = 1 - me.local_rank;
    std::vector<char> out(kLargeProbe, 1), in(kLargeProbe);
    auto exchange = [&](size_t bytes) {
      char token = 0, got = 0;
      intra.sendrecv(&token, 1, peer, &got, 1, peer, kIntraTag, Millis(0));
      return best_of([&] { intra.sendrecv(out.data(), bytes, peer, in.data(), bytes, peer, kIntraTag, Millis(0)); });
    };
    const double small = exchange(kSmallProbe), large = exchange(kLargeProbe);
    const auto [alpha, per_byte] = fit(small, large);
    if (me.local_rank == 0) v[3] = alpha, v[4] = per_byte;
  }
  // The sparse exchanges' CPU work, on rank 0.
  if (groups.rank == 0) time_sparse_work(bucket_floats, densities, selector, v.data() + 5);
  groups.world->allreduce(std::span<double>(v));
  mc.alpha_inter = v[0], mc.wire_inter = v[1], mc.cpu_inter = v[2];
  mc.alpha_intra = v[3], mc.cpu_intra = v[4];
  for (size_t i = 0; i < densities.size(); ++i) mc.selection.push_back({densities[i], v[5 + i]});
  mc.pass = v[5 + densities.size()];
  mc.add = v[6 + densities.size()];
  // Shared cores: every rank on one machine.
  int64_t ids[2] = {machine_id(), -machine_id()};
  groups.world->allreduce(ids, 2, DType::kInt64, ReduceOp::kMin, Millis(0));
  if (ids[0] == -ids[1] && t.world_size() > 1) {
    int cores = usable_cores();
    groups.world->allreduce(&cores, 1, DType::kInt32, ReduceOp::kMin, Millis(0));
    mc.cores = cores;
  }
  return c;
}

}  // namespace tessera
