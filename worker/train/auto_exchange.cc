#include "worker/train/auto_exchange.h"

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "worker/core/tensor.h"
#include "worker/nn/gpu/ops.h"

namespace tessera {

AutoExchange::AutoExchange(const JobConfig& config, CommGroups& groups, CommGroups& exchange_groups, Device buckets_on,
                           std::vector<size_t> bucket_sizes, std::vector<cost::LayerCost> cost_layers)
    : config_(config),
      groups_(groups),
      exchange_groups_(exchange_groups),
      buckets_on_(buckets_on),
      bucket_sizes_(std::move(bucket_sizes)),
      cost_layers_(std::move(cost_layers)) {}

void AutoExchange::calibrate_links() {
  size_t largest = 0;
  for (size_t n : bucket_sizes_) largest = std::max(largest, n);
  const auto& cc = config_.communication;
  const double compute = calibration_.compute_s;
  calibration_ = calibrate_gang(groups_, largest, {cc.density}, cc.selector);
  calibration_.compute_s = compute;
  calibration_.buckets = cost::buckets(cost_layers_, static_cast<double>(cc.bucket_bytes));
  calibration_.overlap = cc.overlap;
  calibration_.value_bytes = static_cast<int>(dtype_size(wire_type(cc.gradient_precision)));
}

bool AutoExchange::add_step_compute(int64_t run_step, double compute_s) {
  if (calibrated() || run_step == 0) return false;  // the run's first step warms up
  compute_samples_.push_back(compute_s);
  if (compute_samples_.size() < 3) return false;
  std::sort(compute_samples_.begin(), compute_samples_.end());
  double compute = compute_samples_[1];
  groups_.world->allreduce(&compute, 1, DType::kFloat64, ReduceOp::kSum, Millis(0));
  calibration_.compute_s = compute / groups_.world->size();
  return true;
}

bool AutoExchange::remeasure_links(int rank) {
  const GangCalibration before = calibration_;
  calibrate_links();
  if (!cost::links_changed(before, calibration_)) {
    // the straggler watch's small probes were noise
    if (rank == 0)
      log_info("the links between nodes seemed to change, but measure as before: ", calibration_.summary());
    calibration_ = before;
    return false;
  }
  if (rank == 0) log_info("the links between nodes changed: measured them again (they were: ", before.summary(), ")");
  reported_ = false;  // rank 0 reports it with its next heartbeat
  return true;
}

const GangCalibration* AutoExchange::take_report() {
  if (reported_ || !calibrated()) return nullptr;
  reported_ = true;
  log_info("calibrated the exchange: ", calibration_.summary());
  return &calibration_;
}

void AutoExchange::offer(const ControlAgent::ExchangePlan& plan) {
  if (plan.version <= received_version_ || plan.from_step < 0) return;
  pending_ = plan;
  received_version_ = plan.version;
}

std::string AutoExchange::choose_here(int64_t step, ExchangeSchedule& schedule, int64_t steps_per_epoch,
                                      int64_t total_steps, int rank) {
  const auto& cc = config_.communication;
  // the switch step: the configuration's epoch, or the one the gang has passed already
  const int64_t sparse_end =
      schedule.switch_step >= 0 ? schedule.switch_step : static_cast<int64_t>(cc.switch_at_epoch) * steps_per_epoch;
  const cost::ExchangeChoice c = cost::choose_for(calibration_, step, sparse_end, total_steps, {cc.density});
  pending_ = ControlAgent::ExchangePlan{step, c.chosen.hybrid ? cost::strategy_name(c.chosen.sparse) : "",
                                        c.chosen.density, cost::strategy_name(c.chosen.dense), ++received_version_};
  if (c.chosen.hybrid && schedule.switch_step < 0) schedule.switch_step = sparse_end;
  if (rank == 0)
    log_info("calibrated the exchange: ", calibration_.summary(), "; chose ", c.chosen.name(), ": ", c.reason);
  return c.reason;
}

void AutoExchange::apply_due(int64_t step, ExchangeSchedule& schedule, int rank) {
  if (!pending_ || step < pending_->from_step) return;
  const ControlAgent::ExchangePlan plan = *pending_;
  pending_.reset();
  taken_choice_ = plan.version;
  const auto& cc = config_.communication;
  // What the sparse exchange in use still owes goes with the next step (in the dense phase its
  // residual has gone already).
  if (schedule.sparse && !(schedule.dense && schedule.flushed_residuals))
    for (const auto& [b, r] : schedule.sparse->residuals())
      owe(b, schedule.sparse->residual_offset(bucket_sizes_.at(static_cast<size_t>(b))), r);
  std::unique_ptr<GradientExchange> dense =
      make_exchange(ExchangeConfig{plan.dense, cc.density, cc.selector, buckets_on_, wire_type(cc.gradient_precision)},
                    exchange_groups_);
  if (plan.sparse.empty()) {
    schedule.sparse = std::move(dense);
    schedule.dense.reset();
  } else {
    schedule.sparse = make_exchange(
        ExchangeConfig{plan.sparse, plan.density, cc.selector, buckets_on_, wire_type(cc.gradient_precision)},
        exchange_groups_);
    schedule.dense = std::move(dense);
  }
  schedule.flushed_residuals = false;
  chosen_ = plan.sparse.empty() ? plan.dense
                                : detail::concat(plan.sparse, " at density ", plan.density, ", then ", plan.dense);
  if (rank == 0)
    log_info("exchange from step ", step, ": ",
             plan.sparse.empty()
                 ? plan.dense
                 : detail::concat(plan.sparse, " at density ", plan.density, " until the switch step",
                                  schedule.switch_step >= 0 ? detail::concat(" ", schedule.switch_step) : std::string(),
                                  ", then ", plan.dense),
             " (the controller's choice ", plan.version, ")");
}

void AutoExchange::add_owed(int b, std::span<float> bucket, bool on_device) const {
  const auto it = owed_.find(b);
  if (it == owed_.end()) return;
  for (const auto& [offset, v] : it->second) {
    if (!on_device) {
      for (size_t i = 0; i < v.size(); ++i) bucket[offset + i] += v[i];
      continue;
    }
    Tensor staged(Shape{static_cast<int64_t>(v.size())}, Layout::kPlain, Device::kCuda);
    gpu::copy(staged.data(), Device::kCuda, v.data(), Device::kCpu, v.size() * sizeof(float));
    gpu::add_into(bucket.data() + offset, staged.data(), v.size());
  }
}

}  // namespace tessera
