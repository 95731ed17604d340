// The alpha-beta cost model of the gradient exchanges and of a training step: one implementation,
// used by the operator and `tessera plan` to predict each strategy's step, and by the emulated
// cluster's benchmarks (bench/cluster/cost_model.py calls it through cost_model_c.cc), which
// calibrate it and check it against every measured exchange and step.
//
// A message of b bytes crossing a node's link costs alpha + b * wire of wire time; every byte sent
// also costs CPU time (cpu_intra through loopback inside a node, cpu_inter through the network
// between nodes). Every collective is a ring (as in worker/comm/gloo): p members, p - 1 steps each
// way; in a ring over ranks ordered node by node every step crosses each node's link once, and
// rings running side by side (torus, hitopk: one per local rank) share their node's link: r of them
// take max(1, r * link_sharing) times one ring's wire time per byte (1: they only take turns; below
// 1 where a ring alone leaves the link idle between its steps and the others fill the gaps). With n
// ranks on each of m nodes (N = nm), a bucket of S floats, density d, values of v bytes on the wire
// (4: fp32; 2: bf16, communication.gradientPrecision), k = dS pairs of p = 4 + v bytes:
//
//   dense   a world ring: 2(N-1) steps of vS/N bytes
//   torus   2(n-1) loopback steps of vS/n bytes; 2(m-1) steps of vS/(nm) bytes across, n rings per link
//           (with n = 1 the ring across nodes alone, in place)
//   topk    sel(S); a world ring of N-1 steps of pk bytes; add(Nk)
//   hitopk  n-1 loopback steps of 4S/n bytes (fp32 always); sel(S/n); m-1 steps of pdS/n bytes across
//           (n rings per link); n-1 loopback steps of pmdS/n bytes; add(mdS)
//
// The phases (between semicolons) run one after the other, as in the code: nothing is sent before
// the selection ends. Two resources bound each phase: the wire of each node's link and the CPU.
// Where the ranks share a machine's cores (`cores` > 0: the emulated cluster), a rank's CPU work
// takes P/C times as long with P processes on C cores (the selection a calibrated share of that).
// A phase takes the longer of the two; where the wire is the longer, the share of the CPU work that
// does not hide behind it (1 - hidden) adds on. The sparse strategies' CPU work besides the
// selection (the reduce-scatter's copies and sums, the pairs' messages, zeroing the bucket and the
// scatter-add) takes `sparse_work` times the count above (calibrated; the count prices their bytes at
// a dense ring's cost, half of whose steps only copy, and every pass as a read-only stream).
//
// A training step is its compute, a fixed rest and the exposed exchange, each exchange taking as
// long inside a step as alone. Every bucket is copied into the flat bucket and
// scaled back out (four streams over it). Under momentum correction the copy in also reads and
// writes the velocity (u := m u + g, the bucket := u: two more streams), a sparse exchange's sum is
// read once more to restart the velocity of what was sent (one more). The compute then takes one
// stream fewer than the `compute_s` measured without it: the update keeps no momentum buffer (it
// reads w and g and writes w, two streams fewer than with the buffer), and the step's gradients start
// from the weight decay (g := weightDecay x w, which reads w: one stream more than zeroing them).
// Without overlap all of it is exposed. With overlap the buckets (reverse parameter order, at most
// bucket_bytes each) are sent one after the other as the backward pass (2/3 of the compute, spread
// over the layers by their FLOPs) finishes them, at `overlap_pace` of their speed while the pass
// runs; what runs past its end is exposed.
// Where the ranks share the cores, an overlapped step is never shorter than its compute and the CPU
// work its exchanges hold the cores for: `busy_share` of their modelled CPU work (a byte's CPU cost
// comes from 2 processes on 2 cores, which wait on their sockets part of that time; more processes
// fill those waits), and the copies.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::cost {

enum class Strategy { kDense, kTorus, kTopk, kHitopk };

// "dense", "torus", "topk" or "hitopk"; ConfigError on `field` otherwise.
Strategy parse_strategy(std::string_view name, const std::string& field = "strategy");
const char* strategy_name(Strategy s);

// A link rate as tc writes it ("100mbit", "1gbit", "25gbit"; "bps": bytes a second) in bits a
// second; ConfigError on `field` otherwise.
double link_bits_per_second(const std::string& rate, const std::string& field);

struct Machine {
  double alpha_inter = 0, wire_inter = 0;            // seconds per message and per byte on a node's link
  double cpu_inter = 0;                              // CPU seconds per byte sent between nodes
  double alpha_intra = 0, cpu_intra = 0;             // inside a node (loopback or NVLink): per message, per byte
  int cores = 0;                                     // the cores every rank shares; 0: nothing shared
  std::vector<std::pair<double, double>> selection;  // (density, seconds per float of top-k selection)
  double pass = 0;                                   // seconds per float of a streaming pass
  double add = 0;                                    // seconds per random access (a scatter-add of one pair)
  double hidden = 0;        // the share of a link-bound phase's CPU work hidden behind the wire
  double overlap_pace = 1;  // communication's speed while the backward pass holds the cores
  double sel_share = 1;     // the selection's share of the processes' P/C
  double busy_share = 1;    // the share of an exchange's modelled CPU work that holds the cores (overlapped steps)
  double link_sharing = 1;  // each of several rings on a node's link: its wire time per byte, in one ring's
  double sparse_work = 1;   // topk's and hitopk's CPU work besides the selection, in the model's count of it

  double shared_wire(int rings) const;        // the wire time per byte of `rings` side by side, in one ring's
  double slow(int procs) const;               // how much slower CPU work runs with `procs` on the cores
  double sel_slow(int procs) const;           // the same for the selection
  double selection_at(double density) const;  // the calibrated density nearest (in log) to `density`
};

struct ExchangeCost {
  double seconds = 0;  // its time
  double busy = 0;     // how long its CPU work holds this rank's share of the cores
  double select = 0;   // of the time: error feedback and selection (sparse strategies)
};

// One exchange of `floats` at `density` on `nodes` x `local` ranks, each value `value_bytes` (4 or 2)
// on the wire.
ExchangeCost exchange_cost(Strategy s, double floats, double density, int nodes, int local, const Machine& mc,
                           int value_bytes = 4);

// A layer as the step model sees it (forward order): its parameters and forward FLOPs per sample.
struct LayerCost {
  double params = 0, forward_flops = 0;
};

struct Bucket {
  double floats = 0;  // parameters in it
  double ready = 0;   // the fraction of the backward pass done when it is complete
};

constexpr double kBucketBytes = 25 << 20;

// The buckets in send order (last layer first).
std::vector<Bucket> buckets(const std::vector<LayerCost>& layers, double bucket_bytes = kBucketBytes);

struct StepCost {
  double seconds = 0;  // the step: rest + compute + exposed (or the CPU work, if longer)
  double exposed = 0;  // communication past the backward pass's end
  double total = 0;    // all the step's exchanges, in-step
  double select = 0;   // their selection, alone (every bucket's)
};

// `compute_s`: forward + backward + update with every rank computing; `rest_s`: the fixed rest;
// `momentum_correction`: communication.momentumCorrection's passes over every bucket, and its update
// without a momentum buffer, its gradients started from the weight decay (`compute_s` is measured
// without correction).
StepCost step_cost(const std::vector<LayerCost>& layers, Strategy s, double density, int nodes, int local,
                   const Machine& mc, double compute_s, double rest_s, bool overlap, double bucket_bytes = kBucketBytes,
                   bool momentum_correction = false, int value_bytes = 4);
// The same from the buckets (a caller that has them and not the layers).
StepCost step_cost(const std::vector<Bucket>& buckets, Strategy s, double density, int nodes, int local,
                   const Machine& mc, double compute_s, double rest_s, bool overlap, bool momentum_correction = false,
                   int value_bytes = 4);

}  // namespace tessera::cost
