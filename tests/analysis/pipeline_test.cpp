// The pipeline bubble (analysis/pipeline.h) on a hand-built two-stage 1F1B step whose every interval is known:
// warm-up/cool-down, a steady-state wait on a late send, transfers, a send wait; and report --json's object.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_file.h"
#include "tpscope/report/json_output.h"
#include "tpscope/analysis/pipeline.h"
#include "tpscope/analysis/report.h"

namespace tpscope::analysis {
namespace {

using report::reportToJson;

using testing::newWriter;
using testing::openReader;
using testing::testDir;

constexpr int64_t kUs = 1000;  // the scenario's unit: 1 µs

// p = 2, m = 2, 1F1B. Times in µs (rank 0 = stage 0, rank 1 = stage 1):
//   rank 0  F0 [0,10]  F1 [10,48] (slow)  recv grad0 [48,49]  B0 [49,69]  recv grad1 [69,82]  B1 [82,102]
//   rank 1  recv act0 [0,12]  F0 [12,22]  B0 [22,42]  recv act1 [42,50]  F1 [50,60]  B1 [60,80]  send wait [80,81]
// Sends posted: act0 at 10, act1 at 48 (rank 0); grad0 at 42, grad1 at 80 (rank 1). Window: [0, 102].
// With `tpWait`, 28 of rank 0's F1 are a TP all-reduce [15,43] (waiting on a TP peer), not its own compute.
void writeScenario(const std::filesystem::path& path, bool tpWait = false) {
  auto w = newWriter(path);
  ASSERT_TRUE(w);
  for (int r = 0; r < 2; ++r) {
    tracedb::RankInfo ri;
    ri.rank = r;
    ri.worldSize = 2;
    ASSERT_TRUE(w->putRank(ri));
  }
  ASSERT_TRUE(w->setMeta("pipeline", R"({"schedule":"1f1b","stages":2,"microbatches":2,"virtual_stages":1,)"
                                     R"("stage_layers":[1,1],"stage_of_rank":[0,1]})"));
  auto span = [&](int rank, const char* name, tracedb::SpanKind kind, int64_t b, int64_t e) {
    auto id = w->intern(name);
    ASSERT_TRUE(id.isOk());
    tracedb::SpanRow s;
    s.rank = rank;
    s.kind = kind;
    s.name = *id;
    s.beginNs = b * kUs;
    s.durNs = (e - b) * kUs;
    s.step = 1;
    ASSERT_TRUE(w->addSpan(s));
  };
  using K = tracedb::SpanKind;
  span(0, "forward mb 0", K::Compute, 0, 10);
  span(0, "forward mb 1", K::Compute, 10, 48);
  span(0, "backward mb 0", K::Compute, 49, 69);
  span(0, "backward mb 1", K::Compute, 82, 102);
  span(1, "forward mb 0", K::Compute, 12, 22);
  span(1, "backward mb 0", K::Compute, 22, 42);
  span(1, "forward mb 1", K::Compute, 50, 60);
  span(1, "backward mb 1", K::Compute, 60, 80);
  span(1, "send wait", K::Comm, 80, 81);
  span(1, "attention forward", K::Compute, 12, 17);  // nested inside a pass: not a pass
  auto p2p = [&](int rank, const char* group, int64_t seq, const char* op, int64_t enq, int64_t end) {
    tracedb::CollectiveRow c;
    c.rank = rank;
    c.group = group;
    c.seq = seq;
    c.op = op;
    c.dtype = "float32";
    c.bytes = 4096;
    c.numel = 1024;
    c.step = 1;
    c.enqueueNs = enq * kUs;
    c.startNs = enq * kUs;
    c.endNs = end * kUs;
    c.state = tracedb::CollectiveState::Completed;
    ASSERT_TRUE(w->upsertCollective(c));
  };
  p2p(0, "p2p-0-1", 1, "send", 10, 10);
  p2p(1, "p2p-0-1", 1, "recv", 0, 12);
  p2p(0, "p2p-0-1", 2, "send", 48, 48);
  p2p(1, "p2p-0-1", 2, "recv", 42, 50);
  p2p(1, "p2p-1-0", 1, "send", 42, 42);
  p2p(0, "p2p-1-0", 1, "recv", 48, 49);
  p2p(1, "p2p-1-0", 2, "send", 80, 81);
  p2p(0, "p2p-1-0", 2, "recv", 69, 82);
  if (tpWait) p2p(0, "tp-0", 1, "all_reduce", 15, 43);
  ASSERT_TRUE(w->close());
}

TEST(PipelineBubble, KnownSplitOfEveryIdleInterval) {
  const auto path = testDir() / "pp.db";
  writeScenario(path);
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  auto rep = analyzePipeline(*reader);
  ASSERT_TRUE(rep.isOk()) << rep.error();
  ASSERT_TRUE(rep->present);
  EXPECT_EQ(rep->schedule, "1f1b");
  EXPECT_EQ(rep->stages, 2);
  EXPECT_EQ(rep->microbatches, 2);
  EXPECT_NEAR(rep->analyticBubblePct, 100.0 / 3, 1e-9);
  ASSERT_EQ(rep->perStage.size(), 2u);
  const double w = 102;
  const auto& s0 = rep->perStage[0];
  EXPECT_EQ(s0.ranks, std::vector<int>{0});
  EXPECT_DOUBLE_EQ(s0.stepNs, 102 * kUs);
  EXPECT_DOUBLE_EQ(s0.computeNs, 88 * kUs);
  // Idle 14: transfers [48,49] and [80,82] (grad1 was posted at 80), the rest [69,80] falls after the last
  // forward (ended 48): cool-down.
  EXPECT_NEAR(s0.transferPct, 100 * 3 / w, 1e-9);
  EXPECT_NEAR(s0.warmupCooldownPct, 100 * 11 / w, 1e-9);
  EXPECT_NEAR(s0.dependencyWaitPct, 0, 1e-9);
  EXPECT_NEAR(s0.bubblePct, 100 * 14 / w, 1e-9);
  const auto& s1 = rep->perStage[1];
  EXPECT_DOUBLE_EQ(s1.computeNs, 60 * kUs);
  // Idle 42: transfers [10,12], [48,50] and the send wait [80,81]; warm-up [0,10] (before B0 at 22) and cool-down
  // [81,102] (after F1 ended at 60); the steady-state wait [42,48] for act1, posted late at 48: dependency.
  EXPECT_NEAR(s1.transferPct, 100 * 5 / w, 1e-9);
  EXPECT_NEAR(s1.warmupCooldownPct, 100 * 31 / w, 1e-9);
  EXPECT_NEAR(s1.dependencyWaitPct, 100 * 6 / w, 1e-9);
  EXPECT_NEAR(s1.bubblePct, 100 * 42 / w, 1e-9);
  EXPECT_EQ(rep->longestStage, 0);
  EXPECT_DOUBLE_EQ(s0.ownComputeNs, 88 * kUs);  // no collective inside its passes
  EXPECT_NEAR(rep->longestOverMeanPct, 100 * (88.0 / 74.0 - 1), 1e-9);

  // Stage 0 computes 88 µs against a mean of 74: 18.9 % more, an info-level stage_imbalance naming it.
  const auto findings = pipelineFindings(*rep);
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].kind, FindingKind::StageImbalance);
  EXPECT_EQ(findings[0].severity, Severity::Info);
  EXPECT_EQ(findings[0].rank, 0);
  EXPECT_EQ(findingKindName(findings[0].kind), "stage_imbalance");
  EXPECT_NE(findings[0].message.find("pipeline stage 0 is the longest: 18.9 %"), std::string::npos)
      << findings[0].message;
  // 30 % longer is a warning only where the other stage waits on it for 5 % of the pipeline time or more.
  PipelineReport uneven = *rep;
  uneven.longestOverMeanPct = 30;
  uneven.perStage[1].dependencyWaitPct = 1;
  EXPECT_EQ(pipelineFindings(uneven).at(0).severity, Severity::Info);
  uneven.perStage[1].dependencyWaitPct = 8;
  EXPECT_EQ(pipelineFindings(uneven).at(0).severity, Severity::Warning);
  // Stage 0's excess over the mean is 14 µs per step. Where stage 1's rank waits longer than that for a CPU per step
  // (the recorder's run delay), the excess is the host's scheduling noise: info, said. A shorter wait changes
  // nothing, nor does a wait on the longest stage's own rank.
  const auto noisy = pipelineFindings(uneven, {{0, 1.0 * kUs}, {1, 20.0 * kUs}});
  EXPECT_EQ(noisy.at(0).severity, Severity::Info);
  ASSERT_FALSE(noisy.at(0).details.empty());
  EXPECT_NE(noisy.at(0).details.back().find("within that scheduling noise"), std::string::npos);
  EXPECT_EQ(pipelineFindings(uneven, {{0, 1.0 * kUs}, {1, 10.0 * kUs}}).at(0).severity, Severity::Warning);
  EXPECT_EQ(pipelineFindings(uneven, {{0, 50.0 * kUs}}).at(0).severity, Severity::Warning);

  auto full = buildReport(*reader);
  ASSERT_TRUE(full.isOk()) << full.error();
  const auto j = nlohmann::json::parse(reportToJson(*full, "pp.db"));
  ASSERT_TRUE(j.contains("pipeline"));
  const auto& p = j["pipeline"];
  EXPECT_EQ(p["schedule"], "1f1b");
  EXPECT_EQ(p["stages"], 2);
  EXPECT_EQ(p["microbatches"], 2);
  EXPECT_EQ(p["virtual_stages"], 1);
  EXPECT_NEAR(p["analytic_bubble_pct"].get<double>(), 33.3333, 1e-3);
  EXPECT_EQ(p["longest_stage"], 0);
  ASSERT_EQ(p["per_stage"].size(), 2u);
  for (const char* key : {"stage", "ranks", "step_ns", "compute_ns", "own_compute_ns", "bubble_pct", "warmup_cooldown_pct",
                          "dependency_wait_pct", "transfer_pct"})
    EXPECT_TRUE(p["per_stage"][1].contains(key)) << key;
  EXPECT_NEAR(p["per_stage"][1]["dependency_wait_pct"].get<double>(), 100 * 6 / w, 1e-3);
}

// A stage whose passes are long because it waited inside them on a TP collective is not the longest stage: the
// bubble still counts the pass as busy, but the imbalance compares the stages' own compute.
TEST(PipelineBubble, TpWaitInsideAPassIsNotTheStagesCompute) {
  const auto path = testDir() / "pp_tpwait.db";
  writeScenario(path, true);
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  auto rep = analyzePipeline(*reader);
  ASSERT_TRUE(rep.isOk()) << rep.error();
  ASSERT_EQ(rep->perStage.size(), 2u);
  EXPECT_DOUBLE_EQ(rep->perStage[0].computeNs, 88 * kUs);
  EXPECT_DOUBLE_EQ(rep->perStage[0].ownComputeNs, 60 * kUs);
  EXPECT_DOUBLE_EQ(rep->perStage[1].ownComputeNs, 60 * kUs);
  EXPECT_NEAR(rep->longestOverMeanPct, 0, 1e-9);
  EXPECT_TRUE(pipelineFindings(*rep).empty());
}

// An engine that numbers ranks pipeline stage fastest (rank = replica × stages + stage) rather than Megatron's TP,
// then DP, then PP: each rank's pipeline is its place among its stage's ranks, so two replicas running at different
// times each get their own window. Per replica: F [0,10] on stage 0, F [10,20] and B [20,30] on stage 1, B [30,40] on
// stage 0 — a 40 µs window, 20 µs of compute per stage; replica 1 the same 1,000 µs later.
TEST(PipelineBubble, PipelinesFollowStageOfRankWhateverTheRankOrder) {
  const auto path = testDir() / "pp_fastest.db";
  {
    auto w = newWriter(path);
    ASSERT_TRUE(w);
    for (int r = 0; r < 4; ++r) {
      tracedb::RankInfo ri;
      ri.rank = r;
      ri.worldSize = 4;
      ASSERT_TRUE(w->putRank(ri));
    }
    ASSERT_TRUE(w->setMeta("pipeline", R"({"schedule":"gpipe","stages":2,"microbatches":1,"virtual_stages":1,)"
                                       R"("stage_of_rank":[0,1,0,1]})"));
    auto span = [&](int rank, const char* name, int64_t b, int64_t e) {
      auto id = w->intern(name);
      ASSERT_TRUE(id.isOk());
      tracedb::SpanRow s;
      s.rank = rank;
      s.kind = tracedb::SpanKind::Compute;
      s.name = *id;
      s.beginNs = b * kUs;
      s.durNs = (e - b) * kUs;
      s.step = 1;
      ASSERT_TRUE(w->addSpan(s));
    };
    for (int replica = 0; replica < 2; ++replica) {
      const int64_t t = 1000 * replica;
      const int first = 2 * replica, last = 2 * replica + 1;
      span(first, "forward mb 0", t, t + 10);
      span(last, "forward mb 0", t + 10, t + 20);
      span(last, "backward mb 0", t + 20, t + 30);
      span(first, "backward mb 0", t + 30, t + 40);
    }
    ASSERT_TRUE(w->close());
  }
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  auto rep = analyzePipeline(*reader);
  ASSERT_TRUE(rep.isOk()) << rep.error();
  ASSERT_EQ(rep->perStage.size(), 2u);
  EXPECT_EQ(rep->perStage[0].ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(rep->perStage[1].ranks, (std::vector<int>{1, 3}));
  for (const auto& s : rep->perStage) {
    EXPECT_DOUBLE_EQ(s.stepNs, 40 * kUs) << "stage " << s.stage;
    EXPECT_DOUBLE_EQ(s.computeNs, 20 * kUs) << "stage " << s.stage;
    EXPECT_NEAR(s.bubblePct, 50, 1e-9) << "stage " << s.stage;
  }
}

// A hang on a pipeline message (desync's `hang` on "p2p-0-1") is told in pipeline terms: 1F1B with m = 4, seq 5 is
// the first message of the second step on that pair, micro-batch 0's activation, which stage 0 never sent.
TEST(PipelineHang, NamesStageMicrobatchAndDirection) {
  const auto path = testDir() / "hang.db";
  writeScenario(path);  // meta 'pipeline': 1f1b, 2 stages, m = 2, ranks 0 and 1
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  std::vector<Finding> fs(2);
  fs[0].kind = FindingKind::Hang;
  fs[0].severity = Severity::Critical;
  fs[0].collective = CollectiveRef{"p2p-0-1", 3, "recv"};
  fs[0].ranks = {0};
  fs[0].rank = 0;
  fs[0].message = "group p2p-0-1 (ranks 0, 1) seq 3: pipeline activation forward recv";
  fs[1] = fs[0];
  fs[1].collective = CollectiveRef{"p2p-1-0", 4, "send"};
  fs[1].ranks = {0};  // rank 0 never posted the receive of micro-batch 1's gradient
  namePipelineHangs(*reader, fs);
  EXPECT_EQ(fs[0].kind, FindingKind::PipelineHang);
  EXPECT_EQ(fs[0].severity, Severity::Critical);
  EXPECT_EQ(fs[0].message, "stage 0 (rank 0) never sent micro-batch 0's activation to stage 1 (rank 1): p2p 0 -> 1 seq 3");
  EXPECT_EQ(fs[0].details.front(), "group p2p-0-1 (ranks 0, 1) seq 3: pipeline activation forward recv");
  auto number = [](const Finding& f, const char* name) {
    for (const auto& n : f.evidence.numbers)
      if (n.name == name) return n.value;
    return EvidenceValue{std::string("absent")};
  };
  EXPECT_EQ(number(fs[0], "microbatch"), EvidenceValue{int64_t{0}});
  EXPECT_EQ(number(fs[0], "stage"), EvidenceValue{int64_t{0}});
  EXPECT_EQ(number(fs[0], "direction"), EvidenceValue{std::string("activation")});
  EXPECT_EQ(fs[1].message,
            "stage 0 (rank 0) never received micro-batch 1's activation gradient from stage 1 (rank 1): p2p 1 -> 0 seq 4");
  EXPECT_EQ(number(fs[1], "microbatch"), EvidenceValue{int64_t{1}});
  EXPECT_EQ(findingKindName(FindingKind::PipelineHang), "pipeline_hang");
}

TEST(PipelineBubble, AbsentWithoutPipelineMeta) {
  const auto path = testDir() / "plain.db";
  {
    auto w = newWriter(path);
    ASSERT_TRUE(w);
    ASSERT_TRUE(w->close());
  }
  auto reader = openReader(path);
  auto rep = analyzePipeline(*reader);
  ASSERT_TRUE(rep.isOk());
  EXPECT_FALSE(rep->present);
  EXPECT_TRUE(pipelineFindings(*rep).empty());
  auto full = buildReport(*reader);
  ASSERT_TRUE(full.isOk());
  EXPECT_FALSE(nlohmann::json::parse(reportToJson(*full, "plain.db")).contains("pipeline"));
}

}  // namespace
}  // namespace tpscope::analysis
