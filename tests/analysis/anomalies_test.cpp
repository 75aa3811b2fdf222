// Gradient spikes: the robust baseline on log10 norms, confirmed against the series' own trend (anomalies.h).
// A norm that grows by decades through warm-up is a trend, not a spike; a 1000x jump is a spike whatever the trend.
#include "tpscope/analysis/anomalies.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "test_file.h"
#include "tpscope/analysis/run_info.h"

namespace tpscope::analysis {
namespace {

using testing::newWriter;
using testing::openReader;
using testing::testDir;

// The anomaly analysis of the file at `path` and its run info (a failure is the test's).
struct Analyzed {
  RunInfo info;
  AnomalyReport report;
};
Analyzed analyzeFile(const std::filesystem::path& path) {
  auto r = openReader(path);
  auto info = loadRunInfo(*r);
  EXPECT_TRUE(info) << info.error();
  if (!info) return {};
  auto a = analyzeAnomalies(*r, *info);
  EXPECT_TRUE(a) << a.error();
  return {*info, a ? *a : AnomalyReport{}};
}

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
  return analyzeFile(path).report;
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
    const Analyzed a = analyzeFile(path);
    ASSERT_EQ(a.report.gradSpikes.size(), 1u) << "on the big parameter: " << onBig;
    EXPECT_EQ(a.report.gradSpikes[0].step, 14);
    EXPECT_EQ(a.report.gradSpikes[0].material, onBig);
    const auto findings = anomalyFindings(a.report, a.info);
    ASSERT_EQ(findings.size(), 1u);
    EXPECT_EQ(findings[0].severity, onBig ? Severity::Warning : Severity::Info);
  }
}

// A pipeline of two stages: stage 0 (rank 0) holds the embedding (norm 0.05) and a layer-norm weight, stage 1
// (rank 1) the head (norm 2). The embedding jumps 20× at step 14, as its rows do with a batch's rare tokens: stage 0's
// own total moves 20×, the whole model's norm (step_stats.grad_norm, computed here from both stages' squares as the
// clip does) 1.1×: no update changes, info. Without the pipeline meta the two ranks are two parts of one model (TP
// ranks, DP replicas): the reduced norm the update is made of still moves 1.1×, info too. The same jump on the head
// moves the whole model's norm: a warning on stage 1, and on rank 1 without the pipeline.
TEST(GradSpike, AStageSpikeIsAWarningOnlyWhereItMovesTheWholeModelsNorm) {
  struct Case {
    const char* name;
    bool pipeline;
    int spikeRank;
    Severity expected;
  };
  for (const Case& c : {Case{"stage_embedding", true, 0, Severity::Info}, Case{"flat_embedding", false, 0, Severity::Info},
                        Case{"stage_head", true, 1, Severity::Warning}, Case{"flat_head", false, 1, Severity::Warning}}) {
    const auto path = testDir() / (std::string(c.name) + ".db");
    {
      auto w = newWriter(path);
      for (int r = 0; r < 2; ++r) {
        tracedb::RankInfo ri;
        ri.rank = r;
        ri.worldSize = 2;
        ASSERT_TRUE(w->putRank(ri));
      }
      if (c.pipeline) {
        ASSERT_TRUE(w->setMeta(tracedb::meta_keys::kPipeline,
                               R"({"schedule":"1f1b","stages":2,"microbatches":4,"virtual_stages":1,)"
                               R"("stage_layers":[[0],[1]],"stage_of_rank":[0,1]})"));
      }
      for (int s = 0; s < 20; ++s) {
        const double wobble = 1.0 + 0.1 * std::sin(1.3 * s);
        const double jump = s == 14 ? 20.0 : 1.0;
        struct P {
          int rank;
          const char* param;
          int layer;
          double norm;
        };
        const P params[] = {{0, "embedding.weight", -1, 0.05 * wobble * (c.spikeRank == 0 ? jump : 1.0)},
                            {0, "layers.0.ln1.weight", 0, 0.01 * wobble},
                            {1, "head.weight", 1, 2.0 * wobble * (c.spikeRank == 1 ? jump : 1.0)}};
        double sq = 0;
        for (const P& p : params) {
          tracedb::GradStatRow g;
          g.rank = p.rank;
          g.step = s;
          g.param = p.param;
          g.layer = p.layer;
          g.l2Norm = p.norm;
          g.maxAbs = p.norm;
          g.numel = 64;
          ASSERT_TRUE(w->addGradStat(g));
          sq += p.norm * p.norm;
        }
        for (int r = 0; r < 2; ++r) {
          tracedb::StepStatRow st;
          st.rank = r;
          st.step = s;
          st.gradNorm = std::sqrt(sq);
          ASSERT_TRUE(w->putStepStat(st));
        }
      }
      ASSERT_TRUE(w->close());
    }
    const Analyzed a = analyzeFile(path);
    std::vector<Finding> spikes;
    for (Finding& f : anomalyFindings(a.report, a.info))
      if (f.kind == FindingKind::GradSpike && f.rank >= 0) spikes.push_back(std::move(f));
    ASSERT_EQ(spikes.size(), 1u) << c.name;
    EXPECT_EQ(spikes[0].rank, c.spikeRank) << c.name;
    EXPECT_EQ(spikes[0].step, 14) << c.name;
    EXPECT_EQ(spikes[0].severity, c.expected) << c.name << ": " << spikes[0].message;
  }
}

// Whether a rank's spike is the batch's (docs/diagnosis.md, materiality part 3), on two ranks whose totals and the
// reduced norm jump at step 14 by the same factors: with a TP group {0, 1} (the ranks saw the same batch), a jump on
// both ranks is info and a jump on rank 1 alone a warning; without one (two DP replicas), a jump on a batch whose loss
// is above every loss of the window is info, on an ordinary batch a warning. An independent count: the rank's total
// and the reduced norm move 1000× and 500×, far past part 1 and 2's 5×, so only part 3 decides.
// sp: the config says sequence parallelism, where TP peers hold different parts of the sequence in the layer norms
// and the row-parallel biases (a rare token in one part moves its rank's gradient alone): the peers are no evidence,
// and the loss decides as without peers. descent: the loss starts at 6 and falls to 4 within 8 steps, so the window
// before the spike holds losses above the spike step's; a loss 25 % above the recent steps' is a hard batch still.
TEST(GradSpike, ASpikeTheBatchExplainsIsInfo) {
  struct Case {
    const char* name;
    bool tpGroup;
    bool bothRanks;
    bool hardBatch;
    Severity expected;
    bool sp = false;
    bool descent = false;
  };
  for (const Case& c :
       {Case{"tp_both", true, true, false, Severity::Info}, Case{"tp_one", true, false, false, Severity::Warning},
        Case{"tp_one_hard_batch", true, false, true, Severity::Warning},
        Case{"tp_sp_one_hard_batch", true, false, true, Severity::Info, true},
        Case{"tp_sp_one", true, false, false, Severity::Warning, true},
        Case{"dp_hard_batch", false, false, true, Severity::Info},
        Case{"dp_hard_batch_after_descent", false, false, true, Severity::Info, false, true},
        Case{"dp_ordinary_batch_after_descent", false, false, false, Severity::Warning, false, true},
        Case{"dp_ordinary_batch", false, false, false, Severity::Warning}}) {
    const auto path = testDir() / (std::string("batch_") + c.name + ".db");
    {
      auto w = newWriter(path);
      ASSERT_NO_FATAL_FAILURE(testing::putRankPair(*w, c.tpGroup));
      if (c.sp) {
        ASSERT_TRUE(w->setMeta("config", R"({"layers":1,"sequence_parallel":true})"));
      }
      for (int s = 0; s < 20; ++s) {
        const double wobble = 1.0 + 0.1 * std::sin(1.3 * s);
        const bool spike = s == 14;
        for (int r = 0; r < 2; ++r) {
          const double jump = spike && (r == 1 || c.bothRanks) ? 1000.0 : 1.0;
          tracedb::GradStatRow g;
          g.rank = r;
          g.step = s;
          g.param = "layers.0.mlp.fc1.weight";
          g.layer = 0;
          g.l2Norm = 0.5 * wobble * jump;
          g.maxAbs = g.l2Norm;
          g.numel = 64;
          ASSERT_TRUE(w->addGradStat(g));
          tracedb::StepStatRow st;
          st.rank = r;
          st.step = s;
          st.gradNorm = 0.7 * wobble * (spike ? 500.0 : 1.0);
          st.loss = 4.0 - 0.01 * s + 0.1 * std::sin(2.1 * s) + (spike && c.hardBatch ? 1.3 : 0.0) +
                    (c.descent ? 2.0 * std::max(0.0, 1.0 - s / 8.0) : 0.0);
          ASSERT_TRUE(w->putStepStat(st));
        }
      }
      ASSERT_TRUE(w->close());
    }
    const Analyzed a = analyzeFile(path);
    std::vector<Finding> spikes;
    for (Finding& f : anomalyFindings(a.report, a.info))
      if (f.kind == FindingKind::GradSpike && f.rank == 1) spikes.push_back(std::move(f));
    ASSERT_EQ(spikes.size(), 1u) << c.name;
    EXPECT_EQ(spikes[0].step, 14) << c.name;
    EXPECT_EQ(spikes[0].severity, c.expected) << c.name << ": " << spikes[0].message;
  }
}

// Under sequence parallelism, TP peers see the same (gathered) sequence in their sharded parameters and their own parts
// in the layer norms. The pattern of a healthy TP2 x PP2 run's natural spike (seed 190754, step 34): one rank's layer
// norm 2000x, the sharded attention weight 1000x on both peers, the loss as before, the whole model's norm 500x - the
// batch, info on every rank, the finding naming the peer's jump. A fault multiplying one rank's gradients by 1000 moves
// its own parameters alone: a warning, also on top of a batch that moved both peers' 30x (the peer then is info).
TEST(GradSpike, UnderSequenceParallelismAPeersShardedParameterTellsTheBatch) {
  struct Case {
    const char* name;
    double naturalShared;                  // both ranks' sharded parameter at the spike step
    double naturalOwn;                     // rank 0's layer norm (its part of the sequence)
    double injectedRank1;                  // every parameter of rank 1
    std::optional<Severity> rank0, rank1;  // expected; nullopt: no finding on that rank
  };
  for (const Case& c : {Case{"natural", 1000, 2000, 1, Severity::Info, Severity::Info},
                        Case{"injected", 1, 1, 1000, std::nullopt, Severity::Warning},
                        Case{"injected_on_a_hard_batch", 30, 1, 1000, Severity::Info, Severity::Warning}}) {
    const auto path = testDir() / (std::string("sp_peer_") + c.name + ".db");
    {
      auto w = newWriter(path);
      ASSERT_NO_FATAL_FAILURE(testing::putRankPair(*w, true));
      ASSERT_TRUE(w->setMeta("config", R"({"layers":1,"sequence_parallel":true})"));
      for (int s = 0; s < 30; ++s) {
        const bool spike = s == 20;
        double sq = 0;
        for (int r = 0; r < 2; ++r) {
          const double wobble = 1.0 + 0.1 * std::sin(1.3 * s + r);
          const double injected = spike && r == 1 ? c.injectedRank1 : 1.0;
          const double shared = (spike ? c.naturalShared : 1.0) * (r == 1 ? 0.8 : 1.0) * injected;
          const double own = (spike && r == 0 ? c.naturalOwn : 1.0) * injected;
          for (const auto& [param, norm] : {std::pair{"layers.0.attention.qkv.weight", 0.003 * wobble * shared},
                                            std::pair{"layers.0.ln1.bias", 0.0004 * wobble * own}}) {
            tracedb::GradStatRow g;
            g.rank = r;
            g.step = s;
            g.param = param;
            g.layer = 0;
            g.l2Norm = norm;
            g.maxAbs = norm;
            g.numel = 64;
            ASSERT_TRUE(w->addGradStat(g));
            sq += norm * norm;
          }
        }
        for (int r = 0; r < 2; ++r) {
          tracedb::StepStatRow st;
          st.rank = r;
          st.step = s;
          st.gradNorm = std::sqrt(sq) * 100;
          st.loss = 3.3 + 0.1 * std::sin(2.1 * s);
          ASSERT_TRUE(w->putStepStat(st));
        }
      }
      ASSERT_TRUE(w->close());
    }
    const Analyzed a = analyzeFile(path);
    std::optional<Severity> found[2];
    for (const Finding& f : anomalyFindings(a.report, a.info)) {
      if (f.kind != FindingKind::GradSpike || f.rank < 0) continue;
      ASSERT_LT(f.rank, 2);
      EXPECT_EQ(f.step, 20) << c.name << ": " << f.message;
      found[f.rank] = f.severity;
      const bool toldTheBatch = std::any_of(f.details.begin(), f.details.end(), [&](const std::string& d) {
        return d.find("on TP peer rank " + std::to_string(1 - f.rank)) != std::string::npos;
      });
      EXPECT_EQ(toldTheBatch, f.severity == Severity::Info) << c.name << ": " << f.message;
    }
    EXPECT_EQ(found[0], c.rank0) << c.name << ": rank 0";
    EXPECT_EQ(found[1], c.rank1) << c.name << ": rank 1";
  }
}

}  // namespace
}  // namespace tpscope::analysis
