// Health rules on host numbers: each rule fires on the value it is about (and only then), with its evidence, and the
// policies turn into the step actions capture relies on (skip-step, escalation to stop, warn never acts).
#include "tpscope/rules/health_rules.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tpscope::rules {
namespace {

// A probe sink that keeps the alerts it is given (the rules' only output besides the step action).
class AlertSink final : public probes::Sink {
 public:
  struct Kept {
    std::string kind, param, message;
    int step, layer;
    probes::Severity severity;
    nlohmann::json evidence;
    uint64_t ticks;
  };
  std::vector<Kept> alerts;

  probes::ThreadBuffer* acquireThreadBuffer() noexcept override { return nullptr; }
  uint64_t collectiveEnqueued(const probes::CollectiveDesc&, uint64_t) noexcept override { return 0; }
  void collectiveState(uint64_t, probes::CollectiveState, uint64_t) noexcept override {}
  void gradStats(int, std::span<const probes::GradStat>) noexcept override {}
  void stepStat(const probes::StepStat&) noexcept override {}
  void alert(const probes::Alert& a) noexcept override {
    alerts.push_back({std::string(a.kind), std::string(a.param), std::string(a.message), a.step, a.layer,
                      a.severity, nlohmann::json::parse(a.evidence), a.ticks});
  }
  void counter(std::string_view, double, uint64_t) noexcept override {}
  void flush() noexcept override {}
};

class HealthRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    probes::detail::g_sink.store(&sink_);
    probes::detail::g_recording.store(true);
  }
  void TearDown() override {
    probes::detail::g_recording.store(false);
    probes::detail::g_sink.store(nullptr);
  }
  AlertSink sink_;
};

std::vector<probes::GradStat> grads(double scale, int64_t nanAt = -1) {
  std::vector<probes::GradStat> g = {
      {"embedding.weight", -1, 1.0 * scale, 0.1, 0, 0, 100},
      {"layers.0.attention.qkv.weight", 0, 2.0 * scale, 0.2, 0, 0, 100},
      {"layers.1.mlp.fc2.weight", 1, 2.0 * scale, 0.2, 0, 0, 100},
  };
  if (nanAt >= 0) g[static_cast<size_t>(nanAt)].nanCount = 3;
  return g;
}

TEST(RobustBaseline, MedianAndMadOverTheWindow) {
  RobustBaseline b(4);
  for (double v : {10.0, 1.0, 2.0, 3.0, 4.0}) b.add(v);  // 10 falls out of the window
  EXPECT_EQ(b.size(), 4);
  EXPECT_DOUBLE_EQ(b.median(), 2.5);
  EXPECT_DOUBLE_EQ(b.mad(), 1.0);
}

// "First" is backward order (vocabulary/nonfinite_order.h, the analysis' definition too): layer 1's gradients are produced
// before layer 0's, so the rule names layer 1 though layer 0 is affected as well.
TEST_F(HealthRulesTest, NonFiniteGradientNamesTheFirstInBackwardOrderAndActsByPolicy) {
  HealthOptions o;
  o.nonfinite = HealthPolicy::SkipStep;
  HealthRules rules(o);
  auto g = grads(1.0);
  g[2].nanCount = 1;
  g[1].infCount = 2;
  EXPECT_EQ(rules.checkGradients(7, g), StepAction::SkipStep);
  ASSERT_EQ(sink_.alerts.size(), 1u);
  EXPECT_EQ(sink_.alerts[0].kind, "nonfinite_grad");
  EXPECT_EQ(sink_.alerts[0].step, 7);
  EXPECT_EQ(sink_.alerts[0].layer, 1);
  EXPECT_EQ(sink_.alerts[0].param, "layers.1.mlp.fc2.weight");
  EXPECT_EQ(sink_.alerts[0].evidence["params_affected"], 2);
  EXPECT_EQ(sink_.alerts[0].evidence["nan_total"], 1);
  EXPECT_EQ(sink_.alerts[0].evidence["inf_total"], 2);

  HealthRules warnOnly(HealthOptions{});
  EXPECT_EQ(warnOnly.checkGradients(7, g), StepAction::Continue);
  EXPECT_EQ(sink_.alerts.size(), 2u);
  EXPECT_FALSE(HealthOptions{}.needsAgreement());
  EXPECT_TRUE(o.needsAgreement());
}

TEST_F(HealthRulesTest, GradientSpikeNeedsWarmupAndIgnoresNoise) {
  HealthOptions o;
  o.gradSpike.warmup = 3;
  HealthRules rules(o);
  // Before warm-up a huge value does not fire.
  EXPECT_EQ(rules.checkGradients(1, grads(1000.0)), StepAction::Continue);
  rules.agree(1, StepAction::Continue);
  EXPECT_TRUE(sink_.alerts.empty());
  for (int step = 2; step <= 6; ++step) {
    EXPECT_EQ(rules.checkGradients(step, grads(1.0 + 0.01 * step)), StepAction::Continue);
    rules.agree(step, StepAction::Continue);
  }
  EXPECT_TRUE(sink_.alerts.empty());  // 1000 entered the baseline once but the median is robust to it
  EXPECT_EQ(rules.checkGradients(7, grads(2.0)), StepAction::Continue);  // 2x: not a spike at factor 10
  rules.agree(7, StepAction::Continue);
  EXPECT_TRUE(sink_.alerts.empty());
  EXPECT_EQ(rules.checkGradients(8, grads(50.0)), StepAction::Continue);  // warn policy: alert, no action
  rules.agree(8, StepAction::Continue);
  ASSERT_EQ(sink_.alerts.size(), 1u);
  EXPECT_EQ(sink_.alerts[0].kind, "grad_spike");
  EXPECT_EQ(sink_.alerts[0].step, 8);
  EXPECT_GT(sink_.alerts[0].evidence["ratio"].get<double>(), 10.0);
  // Under the warn policy a rank's spike is a figure: it sees neither its peers nor the steps after.
  EXPECT_EQ(sink_.alerts[0].severity, probes::Severity::Info);
}

// A policy that acts on a spike makes its alert a warning (the step is skipped on its word).
TEST_F(HealthRulesTest, ASpikeThePolicyActsOnIsAWarning) {
  HealthOptions o;
  o.gradSpike.warmup = 3;
  o.gradSpike.policy = HealthPolicy::SkipStep;
  HealthRules rules(o);
  for (int step = 1; step <= 6; ++step) {
    EXPECT_EQ(rules.checkGradients(step, grads(1.0 + 0.01 * step)), StepAction::Continue);
    rules.agree(step, StepAction::Continue);
  }
  EXPECT_EQ(rules.checkGradients(7, grads(50.0)), StepAction::SkipStep);
  ASSERT_EQ(sink_.alerts.size(), 1u);
  EXPECT_EQ(sink_.alerts[0].severity, probes::Severity::Warning);
}

// A pipeline stage's norm is a part of the model's. Stage 0's jumps 50× at step 8 while the whole model's norm (the
// clip's) moves under 5×: no alert, and the jump is not learned (step 9's ordinary value passes). At step 10 the stage
// jumps again and the whole model's norm to 63: 5.8× its level but 1.6× the largest it has shown (40, at step 8),
// within the run's range: none. At step 11 it reaches 700, 11× the largest value the run has shown (63 now): the
// grad_spike alert. (The rule sees no TP peer: it wants an order of magnitude past the run's range, kRunRangeRatio.)
TEST_F(HealthRulesTest, AStageSpikeAlertsOnlyWhereTheWholeModelsNormMoves) {
  HealthOptions o;
  o.gradSpike.warmup = 3;
  HealthRules rules(o);
  for (int step = 1; step <= 7; ++step) {
    EXPECT_EQ(rules.checkGradients(step, grads(1.0 + 0.01 * step), 10.0 + 0.1 * step), StepAction::Continue);
    rules.agree(step, StepAction::Continue);
  }
  rules.checkGradients(8, grads(50.0), 40.0);
  rules.agree(8, StepAction::Continue);
  EXPECT_TRUE(sink_.alerts.empty());
  rules.checkGradients(9, grads(1.1), 10.5);
  rules.agree(9, StepAction::Continue);
  EXPECT_TRUE(sink_.alerts.empty());
  rules.checkGradients(10, grads(50.0), 63.0);
  rules.agree(10, StepAction::Continue);
  EXPECT_TRUE(sink_.alerts.empty());
  rules.checkGradients(11, grads(50.0), 700.0);
  rules.agree(11, StepAction::Continue);
  ASSERT_EQ(sink_.alerts.size(), 1u);
  EXPECT_EQ(sink_.alerts[0].kind, "grad_spike");
  EXPECT_EQ(sink_.alerts[0].step, 11);
}

// A hard batch moves its own gradient: at step 8 the norm jumps 50× on a batch whose loss (4.6) is above every loss
// of the window (at most 4.2): no alert, nothing learned. At step 9 the same jump on an ordinary batch (loss 4.0):
// the grad_spike alert — a gradient that jumped on its own.
TEST_F(HealthRulesTest, ASpikeOnAHarderBatchThanAnyRecentOneIsTheBatchs) {
  HealthOptions o;
  o.gradSpike.warmup = 3;
  o.lossSpike.warmup = 3;
  HealthRules rules(o);
  for (int step = 1; step <= 7; ++step) {
    const double loss = 4.0 + 0.2 * std::sin(step);
    EXPECT_EQ(rules.checkGradients(step, grads(1.0 + 0.01 * step), 2.0, loss), StepAction::Continue);
    rules.checkLoss(step, loss);
    rules.agree(step, StepAction::Continue);
  }
  rules.checkGradients(8, grads(50.0), 100.0, 4.6);
  rules.checkLoss(8, 4.6);
  rules.agree(8, StepAction::Continue);
  EXPECT_TRUE(sink_.alerts.empty());
  rules.checkGradients(9, grads(50.0), 100.0, 4.0);
  rules.checkLoss(9, 4.0);
  rules.agree(9, StepAction::Continue);
  ASSERT_EQ(sink_.alerts.size(), 1u);
  EXPECT_EQ(sink_.alerts[0].kind, "grad_spike");
  EXPECT_EQ(sink_.alerts[0].step, 9);
}

TEST_F(HealthRulesTest, LossRules) {
  HealthOptions o;
  o.nonfinite = HealthPolicy::Stop;
  o.lossSpike.warmup = 2;
  o.lossSpike.policy = HealthPolicy::SkipStep;
  HealthRules rules(o);
  EXPECT_EQ(rules.checkLoss(1, std::numeric_limits<double>::quiet_NaN()), StepAction::Stop);
  ASSERT_EQ(sink_.alerts.size(), 1u);
  EXPECT_EQ(sink_.alerts[0].kind, "nonfinite_activation");
  rules.agree(1, StepAction::Continue);
  for (int step = 2; step <= 5; ++step) {
    EXPECT_EQ(rules.checkLoss(step, 5.0 - 0.01 * step), StepAction::Continue);
    rules.agree(step, StepAction::Continue);
  }
  EXPECT_EQ(rules.checkLoss(6, 40.0), StepAction::SkipStep);
  EXPECT_EQ(sink_.alerts.back().kind, "loss_spike");
}

TEST_F(HealthRulesTest, NonFiniteActivationNamesTheOutputAndItsTimeAndSilencesTheLossAlert) {
  HealthOptions o;
  o.nonfinite = HealthPolicy::SkipStep;
  o.skipMax = 10;  // no escalation to stop here (tested below)
  HealthRules rules(o);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const ActivationFault fault{1, "layers.1 output", 2, 123456789, nan};
  EXPECT_EQ(rules.checkActivation(4, fault), StepAction::SkipStep);
  EXPECT_EQ(rules.checkLoss(4, nan), StepAction::SkipStep);  // follows from it: acts, no second alert
  ASSERT_EQ(sink_.alerts.size(), 1u);
  const auto& a = sink_.alerts[0];
  EXPECT_EQ(a.kind, "nonfinite_activation");
  EXPECT_EQ(a.step, 4);
  EXPECT_EQ(a.layer, 1);
  EXPECT_EQ(a.param, "layers.1 output");
  EXPECT_EQ(a.ticks, 123456789u);  // when the output was produced, not when the rule ran
  EXPECT_EQ(a.evidence["phase"], "fwd");
  EXPECT_EQ(a.evidence["micro_batch"], 2);
  EXPECT_EQ(a.evidence["value"], "nan");
  EXPECT_EQ(a.evidence["nan_count"], 1);
  rules.agree(4, StepAction::SkipStep);
  // The next bad step of the same run acts without a new alert; a later, separate one alerts again (+Inf this time).
  EXPECT_EQ(rules.checkActivation(5, fault), StepAction::SkipStep);
  EXPECT_EQ(sink_.alerts.size(), 1u);
  rules.agree(5, StepAction::SkipStep);
  rules.agree(6, StepAction::Continue);
  EXPECT_EQ(rules.checkActivation(9, {-1, "output logits", 0, 7, std::numeric_limits<double>::infinity()}),
            StepAction::SkipStep);
  ASSERT_EQ(sink_.alerts.size(), 2u);
  EXPECT_EQ(sink_.alerts[1].evidence["value"], "inf");
  EXPECT_EQ(sink_.alerts[1].evidence["inf_count"], 1);
}

TEST_F(HealthRulesTest, ReplicaDivergence) {
  HealthOptions o;
  o.replicaEvery = 5;
  HealthRules rules(o);
  EXPECT_FALSE(rules.replicaCheckDue(4, 2));
  EXPECT_TRUE(rules.replicaCheckDue(5, 2));
  EXPECT_FALSE(rules.replicaCheckDue(5, 1));
  EXPECT_EQ(rules.checkReplicas(5, 1.0, 1.0 + 1e-9, 2), StepAction::Continue);
  EXPECT_TRUE(sink_.alerts.empty());
  EXPECT_EQ(rules.checkReplicas(5, 1.0, 1.01, 2), StepAction::Continue);
  ASSERT_EQ(sink_.alerts.size(), 1u);
  EXPECT_EQ(sink_.alerts[0].kind, "replica_divergence");
}

TEST_F(HealthRulesTest, ASecondSkipWithinTheWindowStops) {
  HealthOptions o;
  o.nonfinite = HealthPolicy::SkipStep;
  o.skipWindow = 5;
  o.skipMax = 1;
  HealthRules rules(o);
  EXPECT_EQ(rules.agree(3, StepAction::SkipStep), StepAction::SkipStep);
  EXPECT_EQ(rules.agree(9, StepAction::SkipStep), StepAction::SkipStep);  // 3 fell out of the window
  EXPECT_EQ(rules.agree(10, StepAction::SkipStep), StepAction::Stop);
  EXPECT_EQ(sink_.alerts.back().kind, "too_many_skipped_steps");
  EXPECT_EQ(rules.agree(11, StepAction::Continue), StepAction::Continue);
}

TEST(HealthOptions, ParsesAndRefuses) {
  std::string error;
  auto o = parseHealthOptions("nonfinite=skip-step,grad_spike=stop,grad_spike.factor=8,loss_spike=off,"
                              "replica.every=5,skip_window=20,skip_max=2",
                              &error);
  ASSERT_TRUE(o.has_value()) << error;
  EXPECT_EQ(o->nonfinite, HealthPolicy::SkipStep);
  EXPECT_EQ(o->gradSpike.policy, HealthPolicy::Stop);
  EXPECT_DOUBLE_EQ(o->gradSpike.factor, 8.0);
  EXPECT_EQ(o->lossSpike.policy, HealthPolicy::Off);
  EXPECT_EQ(o->replicaEvery, 5);
  EXPECT_EQ(o->skipWindow, 20);
  EXPECT_EQ(o->skipMax, 2);
  auto again = parseHealthOptions(formatHealthOptions(*o), &error);
  ASSERT_TRUE(again.has_value()) << error;
  EXPECT_EQ(formatHealthOptions(*again), formatHealthOptions(*o));

  EXPECT_FALSE(parseHealthOptions("nonfinite=maybe", &error));
  EXPECT_NE(error.find("expected off, warn, skip-step or stop"), std::string::npos);
  EXPECT_FALSE(parseHealthOptions("replica=skip-step", &error));
  EXPECT_FALSE(parseHealthOptions("grad_spike.window=0", &error));
  EXPECT_FALSE(parseHealthOptions("colour=blue", &error));
  EXPECT_NE(error.find("unknown key 'colour'"), std::string::npos);
  EXPECT_FALSE(parseHealthOptions("nonfinite", &error));
}

TEST_F(HealthRulesTest, TraceOpsIsTheNonFiniteRulesAndWarns) {
  std::string error;
  auto o = parseHealthOptions("nonfinite=trace-ops", &error);
  ASSERT_TRUE(o.has_value()) << error;
  EXPECT_EQ(o->nonfinite, HealthPolicy::TraceOps);
  EXPECT_FALSE(o->needsAgreement()) << "trace-ops warns: no rank votes";
  EXPECT_NE(formatHealthOptions(*o).find("nonfinite=trace-ops"), std::string::npos);
  EXPECT_FALSE(parseHealthOptions("grad_spike=trace-ops", &error));
  EXPECT_NE(error.find("non-finite rule only"), std::string::npos) << error;
  HealthRules rules(*o);
  EXPECT_EQ(rules.checkGradients(2, grads(1.0, 1)), StepAction::Continue);
  ASSERT_EQ(sink_.alerts.size(), 1u);
  EXPECT_EQ(sink_.alerts[0].kind, "nonfinite_grad");
  EXPECT_EQ(sink_.alerts[0].evidence["policy"], "trace-ops");
}

}  // namespace
}  // namespace tpscope::rules
