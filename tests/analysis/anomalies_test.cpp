// Gradient spikes: the robust baseline on log10 norms, confirmed against the series' own trend (anomalies.h).
// A norm that grows by decades through warm-up is a trend, not a spike; a 1000x jump is a spike whatever the trend.
#include <gtest/gtest.h>

#include <cmath>

#include "test_file.h"
#include "tpscope/analysis/anomalies.h"
#include "tpscope/analysis/run_info.h"

namespace tpscope::analysis {
namespace {

using testing::newWriter;
using testing::openReader;
using testing::testDir;

// One rank, one parameter whose l2 norm follows `norm(step)`.
template <class Norm>
AnomalyReport analyzeSeries(const std::string& name, int steps, Norm norm) {
  const auto path = testDir() / (name + ".db");
  {
    auto w = newWriter(path);
    tracedb::RankInfo ri;
    ri.rank = 0;
    EXPECT_TRUE(w->putRank(ri));
    for (int s = 0; s < steps; ++s) {
      tracedb::GradStatRow g;
      g.rank = 0;
      g.step = s;
      g.param = "layers.0.ln1.bias";
      g.layer = 0;
      g.l2Norm = norm(s);
      g.maxAbs = g.l2Norm;
      g.numel = 32;
      EXPECT_TRUE(w->addGradStat(g));
    }
    EXPECT_TRUE(w->close());
  }
  auto r = openReader(path);
  auto info = loadRunInfo(*r);
  EXPECT_TRUE(info) << info.error();
  auto a = analyzeAnomalies(*r, *info);
  EXPECT_TRUE(a) << a.error();
  return a ? *a : AnomalyReport{};
}

// A plateau, then the norm climbs half a decade per step and stays up (the way layer-0 norms leave their start in
// the accuracy benchmark's healthy runs). Two steps into the climb the plain median baseline of the flat window says
// 10× and z ≫ 6 — a spike by the old rule; the value does not fall back, so it is a level shift, not a spike.
TEST(GradSpike, ClimbAfterAPlateauIsALevelShiftNotASpike) {
  const auto a = analyzeSeries("plateau_climb", 24, [](int s) {
    const double noise = 1.0 + 0.05 * std::sin(1.7 * s);
    return 1e-4 * std::pow(10.0, s < 12 ? 0.0 : 0.5 * (s - 11)) * noise;
  });
  EXPECT_TRUE(a.gradSpikes.empty()) << a.gradSpikes.size() << " spikes, first at step " << a.gradSpikes[0].step;
}

// Four decades in 30 steps, with ±20 % noise, as warm-up moves norms: a trend, never a spike.
TEST(GradSpike, SteadyGrowthIsATrendNotASpike) {
  const auto a = analyzeSeries("trend", 30, [](int s) {
    const double noise = 1.0 + 0.2 * std::sin(1.7 * s);
    return 1e-4 * std::pow(10.0, s / 7.5) * noise;
  });
  EXPECT_TRUE(a.gradSpikes.empty()) << a.gradSpikes.size() << " spikes, first at step " << a.gradSpikes[0].step;
}

// The same kind of series, flat, with one step 1000x: found, at that step, on that parameter.
TEST(GradSpike, ThousandfoldJumpIsASpikeOnTheTrendToo) {
  for (const double slope : {0.0, 1.0 / 7.5}) {
    const auto a = analyzeSeries(slope > 0 ? "jump_trend" : "jump_flat", 30, [&](int s) {
      const double noise = 1.0 + 0.2 * std::sin(1.7 * s);
      return 1e-3 * std::pow(10.0, slope * s) * noise * (s == 24 ? 1000.0 : 1.0);
    });
    ASSERT_EQ(a.gradSpikes.size(), 1u) << "slope " << slope;
    EXPECT_EQ(a.gradSpikes[0].step, 24);
    EXPECT_EQ(a.gradSpikes[0].param, "layers.0.ln1.bias");
    EXPECT_GE(a.gradSpikes[0].z, 6.0);
  }
}

// Materiality: a tiny parameter (a layer-norm weight, 1e-3) jumps 50× for one step while the rank's big parameter
// (norm 1) holds its rank's total steady: found, but not material, so the finding is info. The same jump on the big
// parameter moves the total 50×: a warning.
TEST(GradSpike, OnlyASpikeThatMovesItsRanksGradientIsAWarning) {
  for (const bool onBig : {false, true}) {
    const auto path = testDir() / (onBig ? "material_big.db" : "material_tiny.db");
    {
      auto w = newWriter(path);
      tracedb::RankInfo ri;
      ri.rank = 0;
      ASSERT_TRUE(w->putRank(ri));
      for (int s = 0; s < 20; ++s)
        for (const bool big : {false, true}) {
          tracedb::GradStatRow g;
          g.step = s;
          g.param = big ? "layers.0.mlp.fc1.weight" : "layers.0.ln1.weight";
          g.layer = 0;
          g.l2Norm = (big ? 1.0 : 1e-3) * (1.0 + 0.1 * std::sin(1.3 * s + big)) * (s == 14 && big == onBig ? 50.0 : 1.0);
          g.maxAbs = g.l2Norm;
          g.numel = 64;
          ASSERT_TRUE(w->addGradStat(g));
        }
      ASSERT_TRUE(w->close());
    }
    auto r = openReader(path);
    auto info = loadRunInfo(*r);
    ASSERT_TRUE(info) << info.error();
    auto a = analyzeAnomalies(*r, *info);
    ASSERT_TRUE(a) << a.error();
    ASSERT_EQ(a->gradSpikes.size(), 1u) << "on the big parameter: " << onBig;
    EXPECT_EQ(a->gradSpikes[0].step, 14);
    EXPECT_EQ(a->gradSpikes[0].material, onBig);
    const auto findings = anomalyFindings(*a, *info);
    ASSERT_EQ(findings.size(), 1u);
    EXPECT_EQ(findings[0].severity, onBig ? Severity::Warning : Severity::Info);
  }
}

}  // namespace
}  // namespace tpscope::analysis
