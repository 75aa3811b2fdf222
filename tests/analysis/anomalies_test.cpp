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

// Four decades in 30 steps, with ±20 % noise: every step is more than 10x the median of the 20 before it from step
// ~12 on, which a median baseline alone calls a spike; against the trend it is ordinary.
TEST(GradSpike, GrowthThroughWarmupIsATrendNotASpike) {
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

}  // namespace
}  // namespace tpscope::analysis
