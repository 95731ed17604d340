#include "common/cost_model.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "common/error.h"

namespace tessera::cost {

Strategy parse_strategy(std::string_view name, const std::string& field) {
  if (name == "dense") return Strategy::kDense;
  if (name == "torus") return Strategy::kTorus;
  if (name == "topk") return Strategy::kTopk;
  if (name == "hitopk") return Strategy::kHitopk;
  throw ConfigError(field, "'" + std::string(name) + "': expected dense, torus, topk or hitopk");
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kDense: return "dense";
    case Strategy::kTorus: return "torus";
    case Strategy::kTopk: return "topk";
    case Strategy::kHitopk: return "hitopk";
  }
  return "?";
}

double link_bits_per_second(const std::string& rate, const std::string& field) {
  static const std::regex kRate("([0-9]+(\\.[0-9]+)?)([kmg]?)(bit|bps)");
  std::smatch m;
  if (!std::regex_match(rate, m, kRate))
    throw ConfigError(field, "'" + rate + "' is not a link rate such as 100mbit, 1gbit or 25gbit");
  const double unit = m[3] == "k" ? 1e3 : m[3] == "m" ? 1e6 : m[3] == "g" ? 1e9 : 1;
  const double v = std::stod(m[1]) * unit * (m[4] == "bps" ? 8 : 1);
  if (!(v > 0)) throw ConfigError(field, "'" + rate + "' is not a positive rate");
  return v;
}

double Machine::shared_wire(int rings) const { return rings > 1 ? std::max(1.0, rings * link_sharing) : 1.0; }

double Machine::slow(int procs) const { return cores > 0 ? std::max(1.0, static_cast<double>(procs) / cores) : 1.0; }

double Machine::sel_slow(int procs) const { return cores > 0 ? std::max(1.0, sel_share * procs / cores) : 1.0; }

double Machine::selection_at(double density) const {
  double best = 0, distance = INFINITY;
  for (const auto& [d, s] : selection) {
    const double x = std::fabs(std::log(d / density));
    if (x < distance) distance = x, best = s;
  }
  return best;
}

namespace {

// The exchange's phases, each waiting for the one before: the wire seconds on its critical path,
// its single-core CPU seconds, and whether it is the selection.
struct Phase {
  double wire = 0, work = 0;
  bool selection = false;
};

class Phases {
 public:
  // `work`: a factor on the CPU work of every phase but the selection (Machine::sparse_work)
  Phases(int m, int n, const Machine& mc, double work = 1) : m_(m), n_(n), mc_(mc), work_(work), phases_(1) {}
  void next(bool selection = false) { phases_.push_back({0, 0, selection}); }
  // ring steps whose message crosses the node's link, `on_link` rings sharing it
  void inter(double steps, double bytes, int on_link = 1) {
    phases_.back().wire += steps * (mc_.alpha_inter + mc_.shared_wire(on_link) * bytes * mc_.wire_inter);
    phases_.back().work += work_ * steps * bytes * mc_.cpu_inter;
  }
  void intra(double steps, double bytes) {  // loopback: CPU copies
    phases_.back().wire += steps * mc_.alpha_intra;
    phases_.back().work += work_ * steps * bytes * mc_.cpu_intra;
  }
  // a ring over all ranks, node by node: one rank of n sends across, the others through loopback
  void world_ring(double steps, double bytes) {
    if (m_ == 1) return intra(steps, bytes);
    phases_.back().wire += steps * (mc_.alpha_inter + bytes * mc_.wire_inter);
    phases_.back().work += work_ * steps * bytes * (mc_.cpu_inter + (n_ - 1) * mc_.cpu_intra) / n_;
  }
  void cpu(double passes, double pairs) { phases_.back().work += work_ * (mc_.pass * passes + mc_.add * pairs); }
  // error feedback (residual += gradient: three streams), top-k, packing the k pairs and zeroing
  // them in the residual (a random access each): nothing is sent until it is done
  void selection(double floats, double k, double density) {
    next(true);
    phases_.back().work += mc_.selection_at(density) * floats + mc_.pass * 3 * floats + mc_.add * 2 * k;
    next();
  }
  ExchangeCost total() const {
    const int N = m_ * n_;
    const double slow = mc_.slow(N), sel_slow = mc_.sel_slow(N);
    ExchangeCost c;
    for (const Phase& p : phases_) {
      const double b = (p.selection ? sel_slow : slow) * p.work;
      c.seconds += std::max(p.wire + (1 - mc_.hidden) * b, b);
      c.busy += b;
      if (p.selection) c.select += b;
    }
    return c;
  }

 private:
  int m_, n_;
  const Machine& mc_;
  double work_;
  std::vector<Phase> phases_;
};

}  // namespace

ExchangeCost exchange_cost(Strategy s, double S, double d, int m, int n, const Machine& mc, int value_bytes) {
  TESSERA_CHECK(m >= 1 && n >= 1, "cost model: ", m, " nodes x ", n, " ranks");
  const int N = m * n;
  const bool sparse = s == Strategy::kTopk || s == Strategy::kHitopk;
  Phases ph(m, n, mc, sparse ? mc.sparse_work : 1.0);
  TESSERA_CHECK(value_bytes == 4 || value_bytes == 2, "cost model: gradient values of ", value_bytes, " bytes");
  const double k = std::ceil(d * S);
  const double v = value_bytes, pair = 4.0 + value_bytes;  // a value; an (index, value) pair
  switch (s) {
    case Strategy::kDense: ph.world_ring(2.0 * (N - 1), v * S / N); break;
    case Strategy::kTorus:
      // with one rank per node it is the ring across nodes alone, on the gradient in place
      // reduce-scatter inside the node; the shard's all-reduce across nodes (n rings side by side
      // share the link); all-gather inside the node
      if (n > 1) ph.intra(n - 1, v * S / n);
      if (m > 1) {
        if (n > 1) ph.next();
        ph.inter(2.0 * (m - 1), v * S / (n * m), n);
      }
      if (n > 1) {
        if (m > 1) ph.next();
        ph.intra(n - 1, v * S / n);
      }
      break;
    case Strategy::kTopk:
      ph.selection(S, k, d);
      ph.world_ring(N - 1, pair * k);
      ph.next();
      ph.cpu(S, N * k);  // zeroing the bucket, scatter-add
      break;
    case Strategy::kHitopk: {
      const double ks = std::ceil(d * S / n);
      if (n > 1) ph.intra(n - 1, 4.0 * S / n);
      else  // a reduce-scatter of one member is a copy (two streams)
        ph.cpu(2 * S, 0);
      ph.selection(S / n, ks, d);
      if (m > 1) ph.inter(m - 1, pair * ks, n);
      if (n > 1) {
        ph.next();
        ph.intra(n - 1, pair * m * ks);
      }
      ph.next();
      ph.cpu(S, m * n * ks);  // zeroing the bucket, scatter-add
      break;
    }
  }
  return ph.total();
}

std::vector<Bucket> buckets(const std::vector<LayerCost>& layers, double bucket_bytes) {
  std::vector<double> backward;  // FLOPs: twice the forward's (input and weight gradients)
  for (const LayerCost& l : layers) backward.push_back(2 * l.forward_flops);
  if (!backward.empty()) backward[0] = layers[0].forward_flops;  // the first layer computes no input gradient
  double total = 0;
  for (double b : backward) total += b;
  const double cap = std::floor(bucket_bytes / 4);
  std::vector<Bucket> out;
  double used = -1, done = 0;
  for (size_t i = layers.size(); i-- > 0;) {
    done += total > 0 ? backward[i] / total : 1.0 / layers.size();
    if (used < 0 || (used + layers[i].params > cap && used > 0)) {
      out.push_back({});
      used = 0;
    }
    out.back().floats += layers[i].params;
    out.back().ready = done;
    used += layers[i].params;
  }
  return out;
}

StepCost step_cost(const std::vector<LayerCost>& layers, Strategy s, double d, int m, int n, const Machine& mc,
                   double compute_s, double rest_s, bool overlap, double bucket_bytes, bool momentum_correction,
                   int value_bytes) {
  return step_cost(buckets(layers, bucket_bytes), s, d, m, n, mc, compute_s, rest_s, overlap, momentum_correction,
                   value_bytes);
}

StepCost step_cost(const std::vector<Bucket>& bucket_list, Strategy s, double d, int m, int n, const Machine& mc,
                   double compute_s, double rest_s, bool overlap, bool momentum_correction, int value_bytes) {
  const double slow = mc.slow(m * n);
  // the streams over each bucket besides the exchange: the copy in and the scaled copy out; under
  // momentum correction the copy in reads and writes the velocity too, and a sparse exchange's sum
  // is read once more (the mask)
  const bool sparse = s == Strategy::kTopk || s == Strategy::kHitopk;
  const double streams = 4 + (momentum_correction ? 2 + (sparse ? 1 : 0) : 0);
  const double backward = compute_s * 2 / 3;
  double t = 0, cpu = 0, floats = 0;
  StepCost out;
  for (const Bucket& b : bucket_list) {
    floats += b.floats;
    const ExchangeCost e = exchange_cost(s, b.floats, d, m, n, mc, value_bytes);
    const double fuse = slow * mc.pass * streams * b.floats;
    const double c = e.seconds + fuse;
    out.total += c;
    out.select += e.select;
    cpu += mc.busy_share * e.busy + fuse;
    const double start = std::max(t, overlap ? b.ready * backward : backward);
    // While the backward pass runs, the communication thread waits for a core now and then and its
    // link idles meanwhile: it gets `overlap_pace` of its speed until the pass ends.
    const double during = std::min(std::max(backward - start, 0.0), c / mc.overlap_pace);
    t = start + during + (c - during * mc.overlap_pace);
  }
  out.exposed = std::max(0.0, t - backward);
  // under momentum correction the update keeps no momentum buffer (two streams fewer) and the
  // gradients start from the weight decay instead of zero (one more)
  const double compute = compute_s - (momentum_correction ? slow * mc.pass * floats : 0);
  double step = compute + out.exposed;
  if (overlap && mc.cores > 0) step = std::max(step, compute + cpu);
  out.seconds = rest_s + step;
  return out;
}

}  // namespace tessera::cost
