// Optimisers, learning-rate schedules and gradient clipping. An optimiser keeps per-parameter state
// (momentum, Adam moments) that is part of a checkpoint: state() lists it by name.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/nn/layer.h"

namespace tessera {

struct OptimizerConfig {
  std::string name = "sgd";   // sgd | adam | adamw | lars
  double momentum = 0.9;      // sgd, lars
  bool nesterov = false;      // sgd
  double weight_decay = 0.0;  // on parameters with Param::decay: L2 (adamw: decoupled, w *= 1 - lr * wd)
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  double trust = 0.001;                           // lars trust coefficient
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update with learning rate `lr` from the gradients in params (not cleared).
  virtual void step(const std::vector<Param*>& params, double lr) = 0;
  // Named state tensors, created on first use of each parameter (for checkpoints).
  std::map<std::string, Tensor>& state() { return state_; }
  int64_t steps() const { return steps_; }
  void set_steps(int64_t s) { steps_ = s; }

 protected:
  Tensor& slot(const Param& p, const char* slot);
  std::map<std::string, Tensor> state_;
  int64_t steps_ = 0;
};

// Throws ConfigError on training.optimizer.* for unknown names or out-of-range values.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config);

struct ScheduleConfig {
  double base_lr = 0.01;
  int64_t warmup_steps = 0;         // linear from base_lr / warmup_steps... to base_lr
  std::string decay = "none";       // none | step | cosine | poly
  int64_t total_steps = 1;          // end of the decay
  std::vector<int64_t> milestones;  // step decay: multiply by gamma at each
  double gamma = 0.1;
  double power = 2.0;   // poly
  double min_lr = 0.0;  // cosine and poly floor
};

// The learning rate at `step` (0-based). Throws ConfigError on training.schedule.* when invalid.
double learning_rate(const ScheduleConfig& s, int64_t step);
void validate(const ScheduleConfig& s);

// Scales all gradients so their global L2 norm is at most max_norm; returns the norm before.
double clip_grad_norm(const std::vector<Param*>& params, double max_norm);

}  // namespace tessera
