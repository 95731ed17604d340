// Choosing a job's gradient exchange (spec.communication.strategy: auto) with the cost model
// (common/cost_model.h), from what its gang measured: the links, the CPU costs of a sparse exchange
// and a step's compute.
//
// The candidates are the dense strategies (dense, torus) for the whole of the remaining steps, and
// each sparse strategy (topk, hitopk) at each candidate density for the share of the remaining
// steps the accuracy rule leaves sparse, followed by the fastest dense one (the hybrid schedule).
// The rule: a sparse phase ends by the job's switch epoch, which leaves at least the last half of
// the epochs dense unless the manifest allows more (docs/api.md); once it has passed, only the
// dense strategies are candidates. An option's figure of merit is its mean predicted step over the
// remaining steps. A sparse option is taken only when that mean is below the best dense option's
// by more than `sparse_margin` (the model's error on the emulated cluster is within 15% of a step;
// sparse steps also gain less towards the loss): a near tie goes to the exact exchange.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cost_model.h"

namespace tessera::cost {

struct ChoiceInput {
  std::vector<Bucket> buckets;  // the job's buckets in send order (cost::buckets)
  int nodes = 1, local = 1;     // ranks: nodes x local
  Machine machine;              // the measured links and CPU costs
  double compute_s = 0;         // a step's forward, backward and update, every rank computing
  bool overlap = true;
  int value_bytes = 4;                     // a gradient value on the wire: 4 (fp32) or 2 (bf16)
  double sparse_share = 0;                 // the share of the remaining steps a sparse phase may take, [0, 1]
  bool sparse_allowed = true;              // false: the job allows no sparse phase at all (its switch epoch is 0)
  std::vector<double> densities = {0.01};  // candidate densities of the sparse strategies
  double sparse_margin = 0.05;
  bool measured = true;  // the links were measured (the reason says so), or assumed (tessera plan)
};

// The share of the remaining steps [from, total) that come before sparse_end: what a sparse phase
// may take of them (0 once sparse_end has passed).
double sparse_share(int64_t from, int64_t sparse_end, int64_t total);

struct ExchangeOption {
  bool hybrid = false;  // a sparse phase (`sparse` at `density`), then `dense`
  Strategy sparse = Strategy::kHitopk;
  double density = 1;
  Strategy dense = Strategy::kDense;
  double sparse_step = 0;    // predicted seconds a step of the sparse phase (hybrid only)
  double dense_step = 0;     // ... of the dense phase
  double mean_step = 0;      // over the remaining steps, each phase by its share
  std::string name() const;  // "dense", "torus", "hitopk at density 0.001, then torus"
};

struct ExchangeChoice {
  ExchangeOption chosen;
  std::vector<ExchangeOption> options;  // every candidate, fastest first
  std::string reason;                   // one sentence: the links and the predicted steps
};

// The choice; ConfigError on a field of the input that is not usable (no buckets, a density outside
// (0, 1], a share outside [0, 1], ranks below 1).
ExchangeChoice choose_exchange(const ChoiceInput& in);

// What a gang measured at its start (worker/train/calibration.h), in the model's terms.
struct Calibration {
  int nodes = 1, local = 1;
  Machine machine;              // the links and CPU costs (hidden: 1, the wire and the CPU each bound a phase)
  double compute_s = 0;         // a step's forward, backward and update
  std::vector<Bucket> buckets;  // the job's, in send order
  bool overlap = true;
  int value_bytes = 4;          // a gradient value on the wire (communication.gradientPrecision): 4 or 2
  std::string summary() const;  // one line: the links, the selection, the sharing, the compute
};

// Whether the links between nodes of calibration `now` differ from `before`'s by more than a factor
// of 2 in seconds per byte: a change worth choosing again for (a smaller one is within what the
// watch's probes and a calibration's read of one link vary by).
bool links_changed(const Calibration& before, const Calibration& now);

// The choice for a gang from its calibration, taking effect at step `from` of the job's `total`: a
// sparse phase, at one of `densities`, may last until step `sparse_end`. The controller makes it
// (controller/rendezvous), and so does a gang that runs without one, each rank the same.
ExchangeChoice choose_for(const Calibration& c, int64_t from, int64_t sparse_end, int64_t total,
                          const std::vector<double>& densities, double sparse_margin = 0.05);

}  // namespace tessera::cost
