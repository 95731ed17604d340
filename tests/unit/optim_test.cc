#include "worker/nn/optim.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"

namespace tessera {
namespace {

Param make_param(std::vector<float> w, std::vector<float> g, bool decay = true) {
  Param p{"p", Tensor({static_cast<int64_t>(w.size())}), Tensor({static_cast<int64_t>(g.size())}), decay};
  for (size_t i = 0; i < w.size(); ++i) {
    p.value[i] = w[i];
    p.grad[i] = g[i];
  }
  return p;
}

TEST(OptimTest, SgdMomentumNesterovAndWeightDecay) {
  OptimizerConfig c;
  c.momentum = 0.9;
  c.weight_decay = 0.1;
  auto sgd = make_optimizer(c);
  Param p = make_param({1.0f}, {0.5f});
  std::vector<Param*> ps = {&p};
  sgd->step(ps, 0.1);  // d = 0.5 + 0.1*1 = 0.6; v = 0.6; w = 1 - 0.06
  EXPECT_FLOAT_EQ(p.value[0], 0.94f);
  sgd->step(ps, 0.1);  // d = 0.5 + 0.094 = 0.594; v = 0.54 + 0.594 = 1.134; w = 0.94 - 0.1134
  EXPECT_NEAR(p.value[0], 0.8266f, 1e-6);

  c.nesterov = true;
  c.weight_decay = 0;
  auto nes = make_optimizer(c);
  Param q = make_param({1.0f}, {1.0f});
  std::vector<Param*> qs = {&q};
  nes->step(qs, 0.1);  // v = 1; update = g + mu v = 1.9
  EXPECT_FLOAT_EQ(q.value[0], 0.81f);
  // No decay on parameters that opt out (biases).
  Param b = make_param({1.0f}, {0.0f}, false);
  c.weight_decay = 0.5;
  c.momentum = 0;
  auto plain = make_optimizer(c);
  std::vector<Param*> bs = {&b};
  plain->step(bs, 0.1);
  EXPECT_FLOAT_EQ(b.value[0], 1.0f);
}

TEST(OptimTest, AdamFirstStepMovesByTheLearningRate) {
  OptimizerConfig c;
  c.name = "adam";
  auto adam = make_optimizer(c);
  Param p = make_param({1.0f, -2.0f}, {0.3f, -7.0f});
  std::vector<Param*> ps = {&p};
  adam->step(ps, 0.01);  // bias-corrected m / sqrt(v) = sign(g)
  EXPECT_NEAR(p.value[0], 0.99f, 1e-6);
  EXPECT_NEAR(p.value[1], -1.99f, 1e-6);
  EXPECT_EQ(adam->state().size(), 2u);
  EXPECT_EQ(adam->steps(), 1);
}

// AdamW decays the weight apart from the moments (w *= 1 - lr wd, then the Adam step); a parameter
// without decay (a bias) takes the plain Adam step; adam with the same weightDecay adds it to the
// gradient instead.
TEST(OptimTest, AdamwDecaysTheWeightApartFromTheGradient) {
  OptimizerConfig c;
  c.name = "adamw";
  c.weight_decay = 0.1;
  auto adamw = make_optimizer(c);
  Param p = make_param({1.0f, -2.0f}, {0.3f, -7.0f});
  Param b = make_param({1.0f}, {0.3f});
  b.decay = false;
  std::vector<Param*> ps = {&p, &b};
  adamw->step(ps, 0.01);
  EXPECT_NEAR(p.value[0], 1.0f * (1 - 0.001f) - 0.01f, 1e-6);
  EXPECT_NEAR(p.value[1], -2.0f * (1 - 0.001f) + 0.01f, 1e-6);
  EXPECT_NEAR(b.value[0], 0.99f, 1e-6);
  c.name = "adam";
  auto adam = make_optimizer(c);
  Param q = make_param({1.0f}, {0.0f});  // only the L2 term: g = wd w, whose sign moves w by lr
  std::vector<Param*> qs = {&q};
  adam->step(qs, 0.01);
  EXPECT_NEAR(q.value[0], 0.99f, 1e-6);
}

TEST(OptimTest, LarsScalesByTrustRatio) {
  OptimizerConfig c;
  c.name = "lars";
  c.momentum = 0;
  c.trust = 0.01;
  auto lars = make_optimizer(c);
  Param p = make_param({3.0f, 4.0f}, {0.6f, 0.8f});  // |w| = 5, |g| = 1: local rate 0.05
  std::vector<Param*> ps = {&p};
  lars->step(ps, 1.0);
  EXPECT_NEAR(p.value[0], 3.0f - 0.05f * 0.6f, 1e-6);
  EXPECT_NEAR(p.value[1], 4.0f - 0.05f * 0.8f, 1e-6);
}

TEST(OptimTest, BadConfigurationNamesTheField) {
  auto field = [](OptimizerConfig c) {
    try {
      make_optimizer(c);
    } catch (const ConfigError& e) {
      return e.field();
    }
    return std::string("accepted");
  };
  OptimizerConfig c;
  c.name = "rmsprop";
  EXPECT_EQ(field(c), "training.optimizer.name");
  c = OptimizerConfig{};
  c.momentum = 1.0;
  EXPECT_EQ(field(c), "training.optimizer.momentum");
  c = OptimizerConfig{};
  c.weight_decay = -1;
  EXPECT_EQ(field(c), "training.optimizer.weightDecay");
}

TEST(ScheduleTest, WarmupThenDecays) {
  ScheduleConfig s;
  s.base_lr = 1.0;
  s.warmup_steps = 4;
  s.total_steps = 104;
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(s, 3), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(s, 50), 1.0);
  s.decay = "cosine";
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 1.0);
  EXPECT_NEAR(learning_rate(s, 54), 0.5, 1e-12);
  EXPECT_NEAR(learning_rate(s, 104), 0.0, 1e-12);
  s.decay = "poly";
  s.power = 2;
  EXPECT_NEAR(learning_rate(s, 54), 0.25, 1e-12);
  s.decay = "step";
  s.milestones = {30, 60};
  s.gamma = 0.1;
  EXPECT_NEAR(learning_rate(s, 29), 1.0, 1e-12);
  EXPECT_NEAR(learning_rate(s, 30), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(s, 61), 0.01, 1e-12);
  s.decay = "exponential";
  EXPECT_THROW(validate(s), ConfigError);
}

TEST(ScheduleTest, ClipGradNorm) {
  Param a = make_param({0, 0}, {3, 0}), b = make_param({0}, {4});
  std::vector<Param*> ps = {&a, &b};
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 10.0), 5.0);
  EXPECT_FLOAT_EQ(a.grad[0], 3.0f);
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 1.0), 5.0);
  EXPECT_NEAR(a.grad[0], 0.6f, 1e-6);
  EXPECT_NEAR(b.grad[0], 0.8f, 1e-6);
}

}  // namespace
}  // namespace tessera
