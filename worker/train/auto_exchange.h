// The gang's gradient exchange over a run (ExchangeSchedule) and communication.strategy auto's
// choice of it (AutoExchange).
//
// ExchangeSchedule: one strategy, or hybrid's sparse strategy until the switch step and its dense
// one from that step on. Every rank holds the same schedule: the switch step is the configured
// epoch's first step, or the controller's choice, which every rank learns before that step.
//
// AutoExchange: the gang measures its links and the sparse exchanges' CPU costs at the start and a
// step's compute over its first steps (GangCalibration), then takes the exchange the cost model
// chooses: the controller's (rank 0 reports the calibration with its heartbeat; the choice comes
// back to every rank, to apply from a step they all reach), or without a controller every rank's own
// from the same figures. When the links change, they are measured again and the exchange chosen
// again. What an exchange it replaces (or a checkpoint) still owes, the error-feedback residuals, is
// added into the buckets of the next step, so nothing is lost.
//
// Both are used by the training thread alone; owes() and add_owed() also by the communication
// thread while a step's buckets are in flight (the training thread clears them only after).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "worker/comm/exchange.h"
#include "worker/train/calibration.h"
#include "worker/train/control_agent.h"
#include "worker/train/job_config.h"

namespace tessera {

struct ExchangeSchedule {
  std::unique_ptr<GradientExchange> sparse;  // before the switch step (the only one without a dense)
  std::unique_ptr<GradientExchange> dense;   // from the switch step on; null: a single strategy
  int64_t switch_step = -1;                  // -1: not chosen yet
  bool flushed_residuals = false;            // the dense phase has sent what the sparse one owed

  bool dense_phase(int64_t step) const { return dense && switch_step >= 0 && step >= switch_step; }
  GradientExchange& at(int64_t step) const { return dense_phase(step) ? *dense : *sparse; }
};

class AutoExchange {
 public:
  // groups: the world's communicators (the calibration's collectives); exchange_groups and
  // buckets_on: where the chosen exchanges run (NCCL's groups and device memory, or the host's).
  // bucket_sizes and cost_layers: the job's gradient buckets and the model's layers, in the cost
  // model's terms.
  AutoExchange(const JobConfig& config, CommGroups& groups, CommGroups& exchange_groups, Device buckets_on,
               std::vector<size_t> bucket_sizes, std::vector<cost::LayerCost> cost_layers);

  // Measures the links and the sparse exchanges' CPU costs (collective: every rank calls it), keeping
  // the step's compute measured before.
  void calibrate_links();
  // A step of the run has ended (`run_step`: 0 for the run's first), its compute (forward, backward,
  // update) `compute_s`: the median of the second to fourth steps, the mean over the ranks
  // (collective at the fourth). True when that completed the calibration.
  bool add_step_compute(int64_t run_step, double compute_s);
  // The links changed (every rank learns it at the same step): measured again (collective). True
  // when they measure unlike before (beyond a factor of 2), and the exchange is to be chosen again;
  // otherwise the earlier figures stand.
  bool remeasure_links(int rank);
  bool calibrated() const { return calibration_.compute_s > 0; }

  // For rank 0's next heartbeat: the calibration once complete and not yet reported, else null.
  const GangCalibration* take_report();
  // The controller's latest choice, to take from its step on (an older version is ignored).
  void offer(const ControlAgent::ExchangePlan& plan);
  // A gang without a controller: every rank chooses the same exchange from the same calibration,
  // from `step`; a hybrid choice with no switch step yet takes the configured epoch's. Returns why.
  std::string choose_here(int64_t step, ExchangeSchedule& schedule, int64_t steps_per_epoch, int64_t total_steps,
                          int rank);
  // Takes the choice due at `step`, if any: builds its exchanges into `schedule`, and owes what the
  // sparse exchange it replaces still holds.
  void apply_due(int64_t step, ExchangeSchedule& schedule, int rank);

  // Owes `values` at `offset` of bucket `b` to the next step (a checkpoint's residuals).
  void owe(int b, size_t offset, std::vector<float> values) { owed_[b].push_back({offset, std::move(values)}); }
  bool owes() const { return !owed_.empty(); }
  // Adds what is owed to bucket `b` into it (in device memory when `on_device`).
  void add_owed(int b, std::span<float> bucket, bool on_device) const;
  // The step's buckets are done: what was owed has gone with them.
  void clear_owed() { owed_.clear(); }

  // The choices taken so far (0: none), and the last one by name ("" before the first).
  int64_t taken_choice() const { return taken_choice_; }
  const std::string& chosen() const { return chosen_; }

 private:
  const JobConfig& config_;
  CommGroups& groups_;
  CommGroups& exchange_groups_;
  Device buckets_on_;
  std::vector<size_t> bucket_sizes_;
  std::vector<cost::LayerCost> cost_layers_;
  GangCalibration calibration_;
  std::vector<double> compute_samples_;  // the first steps' compute, seconds
  bool reported_ = false;
  std::optional<ControlAgent::ExchangePlan> pending_;  // received (or chosen here), until its step
  int64_t received_version_ = 0;
  int64_t taken_choice_ = 0;
  std::string chosen_;
  // bucket -> (offset in the bucket, entries) owed to the next step
  std::map<int, std::vector<std::pair<size_t, std::vector<float>>>> owed_;
};

}  // namespace tessera
