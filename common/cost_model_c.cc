// A C interface to the cost model (common/cost_model.h) for bench/cluster/cost_model.py, which loads
// it with ctypes (libtessera_cost_c.so): the benchmarks calibrate and check the one implementation
// the operator uses. Strategy names as parse_strategy takes them; each call returns 0, or -1 with
// the reason in tessera_cost_error().
#include <cstring>
#include <exception>
#include <string>

#include "common/cost_model.h"

namespace {

thread_local std::string last_error;

}  // namespace

extern "C" {

struct TesseraCostMachine {
  double alpha_inter, wire_inter, cpu_inter, alpha_intra, cpu_intra;
  int cores;
  int selections;  // entries of the two arrays below
  const double* selection_density;
  const double* selection_seconds;
  double pass, add, hidden, overlap_pace, sel_share, busy_share, link_sharing, sparse_work;
};

const char* tessera_cost_error() { return last_error.c_str(); }

}  // extern "C"

namespace {

tessera::cost::Machine machine(const TesseraCostMachine& c) {
  tessera::cost::Machine m;
  m.alpha_inter = c.alpha_inter, m.wire_inter = c.wire_inter, m.cpu_inter = c.cpu_inter;
  m.alpha_intra = c.alpha_intra, m.cpu_intra = c.cpu_intra;
  m.cores = c.cores;
  for (int i = 0; i < c.selections; ++i) m.selection.emplace_back(c.selection_density[i], c.selection_seconds[i]);
  m.pass = c.pass, m.add = c.add, m.hidden = c.hidden;
  m.overlap_pace = c.overlap_pace, m.sel_share = c.sel_share, m.busy_share = c.busy_share;
  m.link_sharing = c.link_sharing;
  m.sparse_work = c.sparse_work;
  return m;
}

template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -1;
  }
}

}  // namespace

extern "C" {

// out: seconds, busy, select
int tessera_cost_exchange(const char* strategy, double floats, double density, int nodes, int local,
                          const TesseraCostMachine* mc, double* out) {
  return guarded([&] {
    const auto c = tessera::cost::exchange_cost(tessera::cost::parse_strategy(strategy), floats, density, nodes, local,
                                                machine(*mc));
    out[0] = c.seconds, out[1] = c.busy, out[2] = c.select;
  });
}

// layers: `count` (params, forward FLOPs) pairs in forward order; out: up to `capacity` (floats,
// ready) pairs; returns the number of buckets (more than capacity: call again with room), or -1.
int tessera_cost_buckets(const double* layers, int count, double bucket_bytes, double* out, int capacity) {
  int n = -1;
  const int rc = guarded([&] {
    std::vector<tessera::cost::LayerCost> ls;
    for (int i = 0; i < count; ++i) ls.push_back({layers[2 * i], layers[2 * i + 1]});
    const auto b = tessera::cost::buckets(ls, bucket_bytes);
    n = static_cast<int>(b.size());
    for (int i = 0; i < n && i < capacity; ++i) out[2 * i] = b[i].floats, out[2 * i + 1] = b[i].ready;
  });
  return rc == 0 ? n : -1;
}

// out: seconds, exposed, total, select
int tessera_cost_step(const double* layers, int count, double bucket_bytes, const char* strategy, double density,
                      int nodes, int local, const TesseraCostMachine* mc, double compute_s, double rest_s, int overlap,
                      int momentum_correction, double* out) {
  return guarded([&] {
    std::vector<tessera::cost::LayerCost> ls;
    for (int i = 0; i < count; ++i) ls.push_back({layers[2 * i], layers[2 * i + 1]});
    const auto c =
        tessera::cost::step_cost(ls, tessera::cost::parse_strategy(strategy), density, nodes, local, machine(*mc),
                                 compute_s, rest_s, overlap != 0, bucket_bytes, momentum_correction != 0);
    out[0] = c.seconds, out[1] = c.exposed, out[2] = c.total, out[3] = c.select;
  });
}

}  // extern "C"
