// One spike definition (vocabulary/spike_baseline.h), two users: the live health rules (rules/, during the run) and
// the anomaly analysis (after it, on the trace). The same series goes through both; on transient spikes they must
// call the same steps spikes. The series is not the shape either was tuned on: a gradient norm that climbs two
// decades through warm-up and then decays, a loss that sits on a plateau and then falls, both with irregular noise,
// and spikes of several sizes — some above one threshold and below the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "test_file.h"
#include "tpscope/analysis/anomalies.h"
#include "tpscope/analysis/run_info.h"
#include "tpscope/vocabulary/alert_kinds.h"
#include "tpscope/vocabulary/spike_baseline.h"
#include "tpscope/rules/health_rules.h"

namespace tpscope {
namespace {

using testing::newWriter;
using testing::openReader;
using testing::testDir;

constexpr int kSteps = 120;
constexpr const char* kParam = "layers.0.mlp.fc1.weight";

// Irregular noise in [-1, 1), the same on every platform (a splitmix64 hash of the step and a stream id).
double noise(int step, uint64_t stream) {
  uint64_t z = static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ULL + stream * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

// The clean gradient norm: 0.05 at step 0, ×10^0.2 a step through a 10-step warm-up, then decaying by 0.7 decades.
double gradTrend(int s) {
  return s < 10 ? 0.05 * std::pow(10.0, 0.2 * s) : 5.0 * std::pow(10.0, -(s - 10) / 150.0);
}

// Gradient spikes: ×50 (above every threshold) and ×8 (above the run-wide norm's 5, below a parameter's 10).
double gradSpikeFactor(int s) {
  if (s == 3) return 50.0;  // inside warm-up: too early for either (fewer values than minHistory)
  if (s == 30 || s == 61 || s == 95) return 50.0;
  if (s == 50 || s == 83) return 8.0;
  return 1.0;
}

double gradNorm(int s) {
  const double f = gradSpikeFactor(s);
  return gradTrend(s) * (f != 1.0 ? f : 1.0 + 0.3 * noise(s, 1));  // ±30 %; a spike on the clean trend
}

// The loss: ln(vocab) on a 6-step plateau, then falling towards 3, ±3 % noise; ×3 at steps 40 and 77, ×1.6 (below
// the ratio 2) at step 100.
double loss(int s) {
  const double clean = s < 6 ? 10.4 : 3.0 + 7.4 * std::exp(-(s - 6) / 25.0);
  if (s == 40 || s == 77) return 3.0 * clean;
  if (s == 100) return 1.6 * clean;
  return clean * (1.0 + 0.03 * noise(s, 2));
}

struct LiveAlerts {
  std::set<int> grad, loss;
};

// A probe sink that keeps the steps of the rules' spike alerts.
class SpikeSink final : public probes::Sink {
 public:
  LiveAlerts* out = nullptr;
  probes::ThreadBuffer* acquireThreadBuffer() noexcept override { return nullptr; }
  uint64_t collectiveEnqueued(const probes::CollectiveDesc&, uint64_t) noexcept override { return 0; }
  void collectiveState(uint64_t, probes::CollectiveState, uint64_t) noexcept override {}
  void gradStats(int, std::span<const probes::GradStat>) noexcept override {}
  void stepStat(const probes::StepStat&) noexcept override {}
  void alert(const probes::Alert& a) noexcept override {
    if (a.kind == vocabulary::alert_kinds::kGradSpike) out->grad.insert(a.step);
    if (a.kind == vocabulary::alert_kinds::kLossSpike) out->loss.insert(a.step);
  }
  void counter(std::string_view, double, uint64_t) noexcept override {}
  void flush() noexcept override {}
};

// Installs `sink` as the probes' sink while in scope (the rules raise their alerts into it).
class Recording {
 public:
  explicit Recording(probes::Sink* sink) {
    probes::detail::g_sink.store(sink);
    probes::detail::g_recording.store(true);
  }
  ~Recording() {
    probes::detail::g_recording.store(false);
    probes::detail::g_sink.store(nullptr);
  }
};

// The live rules over the series, step by step as the trainer calls them (one rank, one parameter: its l2 norm is
// the rank's gradient norm), with the spike thresholds given.
LiveAlerts runLive(double gradFactor, int gradWarmup) {
  rules::HealthOptions o;
  o.gradSpike.factor = gradFactor;
  o.gradSpike.warmup = gradWarmup;
  rules::HealthRules rules(o);
  LiveAlerts alerts;
  SpikeSink sink;
  sink.out = &alerts;
  Recording recording(&sink);
  for (int s = 0; s < kSteps; ++s) {
    const probes::GradStat g{kParam, 0, gradNorm(s), gradNorm(s), 0, 0, 4096};
    auto action = rules.checkGradients(s, std::span<const probes::GradStat>(&g, 1));
    action = std::max(action, rules.checkLoss(s, loss(s)));
    rules.agree(s, action);
  }
  return alerts;
}

// The analysis over a one-rank trace of the same series.
analysis::AnomalyReport runAnalysis(const analysis::AnomalyOptions& options) {
  const auto path = testDir() / "run.db";
  {
    auto w = newWriter(path);
    tracedb::RankInfo ri;
    ri.rank = 0;
    EXPECT_TRUE(w->putRank(ri));
    for (int s = 0; s < kSteps; ++s) {
      tracedb::GradStatRow g;
      g.step = s;
      g.param = kParam;
      g.layer = 0;
      g.l2Norm = g.maxAbs = gradNorm(s);
      g.numel = 4096;
      EXPECT_TRUE(w->addGradStat(g));
      tracedb::StepStatRow st;
      st.step = s;
      st.loss = loss(s);
      st.gradNorm = gradNorm(s);
      EXPECT_TRUE(w->putStepStat(st));
    }
    EXPECT_TRUE(w->close());
  }
  auto r = openReader(path);
  auto info = analysis::loadRunInfo(*r);
  EXPECT_TRUE(info) << info.error();
  auto a = analysis::analyzeAnomalies(*r, *info, options);
  EXPECT_TRUE(a) << a.error();
  return a ? *a : analysis::AnomalyReport{};
}

std::set<int> stepsOf(const std::vector<analysis::Spike>& spikes, int rank) {
  std::set<int> out;
  for (const auto& s : spikes)
    if (s.rank == rank) out.insert(s.step);
  return out;
}

// The statistics themselves, on numbers worked by hand.
TEST(SpikeBaseline, RobustStatisticsKnownAnswers) {
  EXPECT_DOUBLE_EQ(vocabulary::medianOf({5, 1, 3}), 3.0);
  EXPECT_DOUBLE_EQ(vocabulary::medianOf({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(vocabulary::madOf({1, 2, 3, 4, 100}, 3.0), 1.0);  // |dev| = 2 1 0 1 97
  // y = 2x + 1 with one wild point: Theil–Sen ignores it.
  const auto line = vocabulary::theilSen({0, 1, 2, 3, 4, 5, 6}, {1, 3, 5, 70, 9, 11, 13});
  EXPECT_DOUBLE_EQ(line.slope, 2.0);
  EXPECT_DOUBLE_EQ(line.intercept, 1.0);
  // Level: window 10 10 10 12 8 → m 10, MAD 0 floored at 1e-3·10: 20 is 2× and z = 10 / (1.4826·0.01) ≫ 6.
  vocabulary::SpikeWindow w(5, vocabulary::SpikeScale::Level);
  for (double v : {99.0, 10.0, 10.0, 10.0, 12.0, 8.0}) w.add(v);  // 99 falls out of the window of 5
  EXPECT_EQ(w.size(), 5);
  EXPECT_DOUBLE_EQ(w.median(), 10.0);
  EXPECT_DOUBLE_EQ(w.mad(), 0.0);
  const auto v = w.test(6, 20.0, vocabulary::SpikeTest{});
  EXPECT_TRUE(v.tested && v.spike);
  EXPECT_DOUBLE_EQ(v.z, 10.0 / (vocabulary::kMadToSigma * 0.01));
  EXPECT_FALSE(w.test(6, 19.9, vocabulary::SpikeTest{}).spike);  // below 2 × the median
  vocabulary::SpikeTest needsSix;
  needsSix.minHistory = 6;
  EXPECT_FALSE(w.test(6, 1000.0, needsSix).tested);
  // Norm: 1, 10, 100, ... (a decade a step) predicts 10^5 at step 5: 10^5.5 is 3.2× the trend, not 10×; 10^6.5 is.
  vocabulary::SpikeWindow n(20, vocabulary::SpikeScale::Norm);
  for (int s = 0; s < 5; ++s) n.add(std::pow(10.0, s), s);
  vocabulary::SpikeTest tenfold;
  tenfold.ratio = 10;
  EXPECT_FALSE(n.test(5, std::pow(10.0, 5.5), tenfold).spike);
  const auto big = n.test(5, std::pow(10.0, 6.5), tenfold);
  EXPECT_TRUE(big.spike);
  EXPECT_NEAR(big.baseline, 1e5, 1e-6);
  EXPECT_NEAR(big.median, 100.0, 1e-9);
  EXPECT_FALSE(n.usable(0.0));
}

TEST(SpikeAgreement, LiveRulesAndAnalysisCallTheSameStepsSpikes) {
  const analysis::AnomalyOptions options;
  const auto report = runAnalysis(options);
  // The live rules at the analysis' thresholds: a parameter's (ratio 10 after 8 values) and the run-wide norm's
  // (ratio 5 after 5); the loss rule's defaults are the analysis' (ratio 2, z 6, window 20, 5 values).
  const LiveAlerts asParam = runLive(options.paramRatioThreshold, options.paramMinHistory);
  const LiveAlerts asRunWide = runLive(options.normRatioThreshold, options.minHistory);
  ASSERT_EQ(rules::HealthOptions{}.lossSpike.factor, options.ratioThreshold);
  ASSERT_EQ(rules::HealthOptions{}.lossSpike.warmup, options.minHistory);

  // The known answer first (so that two equally wrong answers cannot pass), then the two users against each other.
  const std::set<int> big{30, 61, 95}, all{30, 50, 61, 83, 95}, lossSteps{40, 77};
  EXPECT_EQ(stepsOf(report.gradSpikes, 0), big);
  EXPECT_EQ(stepsOf(report.gradSpikes, -1), all);
  EXPECT_EQ(stepsOf(report.lossSpikes, -1), lossSteps);
  EXPECT_EQ(asParam.grad, stepsOf(report.gradSpikes, 0));
  EXPECT_EQ(asRunWide.grad, stepsOf(report.gradSpikes, -1));
  EXPECT_EQ(asParam.loss, stepsOf(report.lossSpikes, -1));
  EXPECT_EQ(asRunWide.loss, stepsOf(report.lossSpikes, -1));
}

// Where they differ, as the definition says: a jump that stays. The live rules cannot look forward, never learn a
// flagged value, and keep alerting; the analysis sees the values stay up and calls it a level shift, not a spike.
TEST(SpikeAgreement, AJumpThatStaysIsALiveAlertEachStepButNoFinding) {
  rules::HealthOptions o;
  o.lossSpike.policy = rules::HealthPolicy::Off;
  rules::HealthRules rules(o);
  LiveAlerts alerts;
  SpikeSink sink;
  sink.out = &alerts;
  auto recording = std::make_unique<Recording>(&sink);
  const auto path = testDir() / "shift.db";
  auto w = newWriter(path);
  tracedb::RankInfo ri;
  ri.rank = 0;
  ASSERT_TRUE(w->putRank(ri));
  for (int s = 0; s < 40; ++s) {
    const double norm = (s < 20 ? 1.0 : 100.0) * (1.0 + 0.1 * noise(s, 3));
    const probes::GradStat g{kParam, 0, norm, norm, 0, 0, 4096};
    rules.agree(s, rules.checkGradients(s, std::span<const probes::GradStat>(&g, 1)));
    tracedb::GradStatRow row;
    row.step = s;
    row.param = kParam;
    row.layer = 0;
    row.l2Norm = row.maxAbs = norm;
    row.numel = 4096;
    ASSERT_TRUE(w->addGradStat(row));
  }
  recording.reset();
  ASSERT_TRUE(w->close());
  std::set<int> shifted;
  for (int s = 20; s < 40; ++s) shifted.insert(s);
  EXPECT_EQ(alerts.grad, shifted);
  auto r = openReader(path);
  auto info = analysis::loadRunInfo(*r);
  ASSERT_TRUE(info) << info.error();
  auto a = analysis::analyzeAnomalies(*r, *info);
  ASSERT_TRUE(a) << a.error();
  EXPECT_TRUE(a->gradSpikes.empty()) << a->gradSpikes.size() << " spikes, first at step " << a->gradSpikes[0].step;
}

}  // namespace
}  // namespace tpscope
