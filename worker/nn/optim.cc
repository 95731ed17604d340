#include "worker/nn/optim.h"

#include <cmath>

#include "common/error.h"
#include "worker/nn/gpu/ops.h"
#include "worker/nn/kernels.h"

namespace tessera {

Tensor& Optimizer::slot(const Param& p, const char* name) {
  auto [it, inserted] = state_.try_emplace(p.name + "/" + name);
  if (inserted || it->second.shape() != p.value.shape()) it->second = Tensor::zeros(p.value.shape(), p.value.device());
  // State restored from a checkpoint is on the host until the parameter's first step on the device.
  if (it->second.device() != p.value.device()) it->second = it->second.to(p.value.device());
  return it->second;
}

namespace {

class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimizerConfig& c) : c_(c) {}
  void step(const std::vector<Param*>& params, double lr) override {
    ++steps_;
    for (Param* p : params) {
      const float wd = p->decay ? static_cast<float>(c_.weight_decay) : 0.0f;
      const float mu = static_cast<float>(c_.momentum);
      float* w = p->value.data();
      const float* g = p->grad.data();
      const int64_t n = p->value.numel();
      const float rate = static_cast<float>(lr);
      float unused = 0;
      float* v = mu == 0.0f ? nullptr : slot(*p, "momentum").data();
      if (p->value.on_device()) {
        gpu::sgd_update(w, v, g, n, rate, mu, wd, c_.nesterov);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) kernels::sgd_update(w[i], v ? v[i] : unused, g[i], rate, mu, wd, c_.nesterov);
    }
  }

 private:
  OptimizerConfig c_;
};

// Adam; AdamW (decoupled) decays the weight apart from the gradient's moments, w *= 1 - lr * wd
// before the step, as torch.optim.AdamW.
class Adam final : public Optimizer {
 public:
  explicit Adam(const OptimizerConfig& c) : c_(c), decoupled_(c.name == "adamw") {}
  void step(const std::vector<Param*>& params, double lr) override {
    ++steps_;
    const double b1 = c_.beta1, b2 = c_.beta2;
    const double corr1 = 1 - std::pow(b1, static_cast<double>(steps_));
    const double corr2 = 1 - std::pow(b2, static_cast<double>(steps_));
    const kernels::AdamArgs a{static_cast<float>(b1),
                              static_cast<float>(1 - b1),
                              static_cast<float>(b2),
                              static_cast<float>(1 - b2),
                              static_cast<float>(lr * std::sqrt(corr2) / corr1),
                              static_cast<float>(c_.eps * std::sqrt(corr2))};
    for (Param* p : params) {
      float wd = p->decay ? static_cast<float>(c_.weight_decay) : 0.0f;
      float* w = p->value.data();
      const float* g = p->grad.data();
      float* m = slot(*p, "m").data();
      float* v = slot(*p, "v").data();
      const int64_t n = p->value.numel();
      const float keep = decoupled_ ? static_cast<float>(1.0 - lr * wd) : 1.0f;
      if (decoupled_) wd = 0.0f;
      if (p->value.on_device()) {
        if (keep != 1.0f) gpu::scale(w, static_cast<size_t>(n), keep);
        gpu::adam_update(w, m, v, g, n, a, wd);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {
        w[i] *= keep;
        kernels::adam_update(w[i], m[i], v[i], g[i], a, wd);
      }
    }
  }

 private:
  OptimizerConfig c_;
  bool decoupled_;
};

// Layer-wise adaptive rate scaling: each parameter's step is scaled by trust * |w| / (|g| + wd |w|).
// Parameters without weight decay (biases, normalisation) use the plain rate.
class Lars final : public Optimizer {
 public:
  explicit Lars(const OptimizerConfig& c) : c_(c) {}
  void step(const std::vector<Param*>& params, double lr) override {
    ++steps_;
    for (Param* p : params) {
      const float wd = p->decay ? static_cast<float>(c_.weight_decay) : 0.0f;
      float* w = p->value.data();
      const float* g = p->grad.data();
      const int64_t n = p->value.numel();
      double wn = 0, gn = 0;
      if (p->value.on_device()) {
        wn = gpu::sum_squares(w, n);
        gn = gpu::sum_squares(g, n);
      } else {
        for (int64_t i = 0; i < n; ++i) {
          wn += double(w[i]) * w[i];
          gn += double(g[i]) * g[i];
        }
      }
      const float rate =
          static_cast<float>(kernels::lars_rate(lr, c_.trust, c_.weight_decay, p->decay, std::sqrt(wn), std::sqrt(gn)));
      const float mu = static_cast<float>(c_.momentum);
      float* v = slot(*p, "momentum").data();
      if (p->value.on_device()) {
        gpu::lars_update(w, v, g, n, rate, mu, wd);
        continue;
      }
      for (int64_t i = 0; i < n; ++i) kernels::lars_update(w[i], v[i], g[i], rate, mu, wd);
    }
  }

 private:
  OptimizerConfig c_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c) {
  if (!(c.momentum >= 0 && c.momentum < 1))
    throw ConfigError("training.optimizer.momentum", detail::concat(c.momentum, " is outside [0, 1)"));
  if (!(c.weight_decay >= 0))
    throw ConfigError("training.optimizer.weightDecay", detail::concat(c.weight_decay, " is negative"));
  if (c.name == "sgd") return std::make_unique<Sgd>(c);
  if (c.name == "adam" || c.name == "adamw") {
    if (!(c.beta1 >= 0 && c.beta1 < 1))
      throw ConfigError("training.optimizer.beta1", detail::concat(c.beta1, " is outside [0, 1)"));
    if (!(c.beta2 >= 0 && c.beta2 < 1))
      throw ConfigError("training.optimizer.beta2", detail::concat(c.beta2, " is outside [0, 1)"));
    return std::make_unique<Adam>(c);
  }
  if (c.name == "lars") {
    if (!(c.trust > 0)) throw ConfigError("training.optimizer.trust", detail::concat(c.trust, " must be positive"));
    return std::make_unique<Lars>(c);
  }
  throw ConfigError("training.optimizer.name",
                    "unknown optimizer '" + c.name + "' (expected sgd, adam, adamw or lars)");
}

void validate(const ScheduleConfig& s) {
  if (!(s.base_lr > 0))
    throw ConfigError("training.optimizer.learningRate", detail::concat(s.base_lr, " must be positive"));
  if (s.warmup_steps < 0) throw ConfigError("training.schedule.warmupEpochs", "must not be negative");
  if (s.decay != "none" && s.decay != "step" && s.decay != "cosine" && s.decay != "poly")
    throw ConfigError("training.schedule.decay",
                      "unknown decay '" + s.decay + "' (expected none, step, cosine or poly)");
  if (!(s.gamma > 0 && s.gamma <= 1))
    throw ConfigError("training.schedule.gamma", detail::concat(s.gamma, " is outside (0, 1]"));
  if (!(s.min_lr >= 0 && s.min_lr <= s.base_lr))
    throw ConfigError("training.schedule.minLearningRate", detail::concat(s.min_lr, " is outside [0, learningRate]"));
}

double learning_rate(const ScheduleConfig& s, int64_t step) {
  if (step < s.warmup_steps) return s.base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  const double span = static_cast<double>(std::max<int64_t>(1, s.total_steps - s.warmup_steps));
  const double t = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  if (s.decay == "step") {
    double lr = s.base_lr;
    for (int64_t m : s.milestones)
      if (step >= m) lr *= s.gamma;
    return lr;
  }
  if (s.decay == "cosine") return s.min_lr + (s.base_lr - s.min_lr) * 0.5 * (1 + std::cos(M_PI * t));
  if (s.decay == "poly") return s.min_lr + (s.base_lr - s.min_lr) * std::pow(1 - t, s.power);
  return s.base_lr;
}

double clip_grad_norm(const std::vector<Param*>& params, double max_norm) {
  double sq = 0;
  for (const Param* p : params) {
    if (p->grad.on_device()) {
      sq += gpu::sum_squares(p->grad.data(), p->grad.numel());
      continue;
    }
    for (float g : p->grad.span()) sq += double(g) * g;
  }
  const double norm = std::sqrt(sq);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-12));
    for (Param* p : params) {
      if (p->grad.on_device()) {
        gpu::scale(p->grad.data(), static_cast<size_t>(p->grad.numel()), scale);
        continue;
      }
      for (float& g : p->grad.span()) g *= scale;
    }
  }
  return norm;
}

}  // namespace tessera
