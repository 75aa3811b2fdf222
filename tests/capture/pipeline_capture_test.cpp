// A real pipeline-parallel capture (issue #14): `tpscope capture --nproc 4 --tp 2 --pp 2` of tpscope-train, then the
// trace contract checked with SQL straight from run.db — meta 'pipeline', one pass span per (stage, micro-batch,
// direction), every send matched by exactly one recv on (src, dst, seq) with the same bytes — and report --json's
// pipeline object; a healthy pipeline run gets no finding of warning or worse.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "capture_test_util.h"

namespace tpscope::capture_test {
namespace {

TEST(PipelineCapture, TraceCarriesStagesMicrobatchesAndMatchedPointToPoint) {
  const auto dir = testDir("pipeline_tp2_pp2");
  const int steps = 4, m = 4;
  const RunResult r = capture(dir, 4, 2, 1, steps,
                              {"--pp", "2", "--schedule", "1f1b", "--microbatches", std::to_string(m)});
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");
  const auto meta = nlohmann::json::parse(db.value("SELECT value FROM meta WHERE key = 'pipeline'"));
  EXPECT_EQ(meta["schedule"], "1f1b");
  EXPECT_EQ(meta["stages"], 2);
  EXPECT_EQ(meta["microbatches"], m);
  EXPECT_EQ(meta["virtual_stages"], 1);
  EXPECT_EQ(meta["stage_of_rank"], nlohmann::json({0, 0, 1, 1}));  // TP fastest, then DP, then PP
  // Every rank runs each micro-batch's forward and backward once per step.
  for (const char* dir_ : {"forward", "backward"})
    EXPECT_EQ(db.integer(std::string("SELECT count(*) FROM span_view WHERE name LIKE '") + dir_ +
                         " mb %' AND step >= 1"),
              4 * steps * m)
        << dir_;
  EXPECT_EQ(db.integer("SELECT count(DISTINCT name) FROM span_view WHERE name LIKE 'forward mb %'"), m);
  // Point to point: rank r of stage 0 sends activations to rank r + 2 and receives their gradients back; each
  // (group, seq) has exactly one send and one recv, on the pair's two ranks, with the same bytes.
  EXPECT_EQ(db.integer("SELECT count(*) FROM collectives WHERE op = 'send'"), 2 * 2 * steps * m);
  EXPECT_EQ(db.integer("SELECT count(*) FROM collectives WHERE op = 'recv'"), 2 * 2 * steps * m);
  EXPECT_EQ(db.integer("SELECT count(*) FROM collectives s JOIN collectives r ON r.group_name = s.group_name AND "
                       "r.seq = s.seq AND r.op = 'recv' WHERE s.op = 'send' AND s.bytes = r.bytes AND "
                       "s.group_name = 'p2p-' || s.rank || '-' || r.rank AND s.state = 'completed' AND "
                       "r.state = 'completed'"),
            2 * 2 * steps * m);
  // seq counts 1, 2, ... per pair over the whole run.
  EXPECT_EQ(db.value("SELECT group_concat(DISTINCT seq) FROM (SELECT seq FROM collectives WHERE group_name = "
                     "'p2p-0-2' AND op = 'send' ORDER BY seq LIMIT 3)"),
            "1,2,3");
  EXPECT_EQ(db.integer("SELECT bytes FROM collectives WHERE group_name = 'p2p-0-2' AND seq = 1 AND op = 'send'"),
            4 * 32 * 32 * 4);  // [micro_batch 4, seq_len 32, hidden 32] fp32

  const RunResult rep = run({TPSCOPE_BIN, "report", "--json", (dir / "run.db").string()}, dir / "report.json");
  ASSERT_EQ(rep.status, 0) << rep.output;
  const auto j = nlohmann::json::parse(rep.output);
  ASSERT_TRUE(j.contains("pipeline")) << rep.output;
  const auto& p = j["pipeline"];
  EXPECT_NEAR(p["analytic_bubble_pct"].get<double>(), 100.0 / (m + 1), 1e-3);
  ASSERT_EQ(p["per_stage"].size(), 2u);
  EXPECT_EQ(p["per_stage"][1]["ranks"], nlohmann::json({2, 3}));
  for (const auto& s : p["per_stage"]) {
    const double parts = s["warmup_cooldown_pct"].get<double>() + s["dependency_wait_pct"].get<double>() +
                         s["transfer_pct"].get<double>();
    EXPECT_NEAR(s["bubble_pct"].get<double>(), parts, 1e-3);
    EXPECT_GT(s["compute_ns"].get<double>(), 0);
    EXPECT_LT(s["compute_ns"].get<double>(), s["step_ns"].get<double>());
  }

  const Diagnosis d = diagnose(dir / "run.db");
  for (const auto& f : d.findings)
    EXPECT_TRUE(f.severity == "info") << "healthy pipeline run: " << d.summary();
}

// An evidence number of a finding as JSON text; "" when absent.
std::string number(const Finding& f, const std::string& key) {
  auto it = f.numbers.find(key);
  return it == f.numbers.end() ? std::string() : it->second;
}

// A 2-stage, 4-micro-batch capture with `inject` (a hang), which must stop as hung; its one critical pipeline_hang.
Finding pipelineHang(const std::string& name, const std::string& inject, Diagnosis& d) {
  const auto dir = testDir(name);
  const RunResult r = capture(dir, 2, 1, 1, 4,
                              {"--pp", "2", "--microbatches", "4", "--inject", inject, "--hang-timeout", "2", "--grace",
                               "1"});
  EXPECT_EQ(r.status, 3) << r.output;
  d = diagnose(dir / "run.db");
  const auto hangs = d.ofKind("pipeline_hang", "critical");
  EXPECT_EQ(hangs.size(), 1u) << d.summary();
  return hangs.empty() ? Finding{} : hangs[0];
}

// Stage 0 stalls before its first send of step 2 (--inject hang): diagnose names a pipeline_hang — stage 0 never sent
// micro-batch 0's activation to stage 1, on p2p 0 -> 1 seq m + 1 (the first message of the second step).
TEST(PipelineCapture, AStageThatNeverSendsIsNamedByPairSeqStageAndMicrobatch) {
  Diagnosis d;
  const Finding hang = pipelineHang("pipeline_hang", "hang:rank=0,step=2", d);
  EXPECT_EQ(hang.group, "p2p-0-1");
  EXPECT_EQ(hang.seq, 5);
  EXPECT_EQ(number(hang, "microbatch"), "0");
  EXPECT_EQ(number(hang, "stage"), "0");
  EXPECT_EQ(hang.message, "stage 0 (rank 0) never sent micro-batch 0's activation to stage 1 (rank 1): p2p 0 -> 1 seq 5")
      << d.summary();
}

// A NaN born in stage 0's forward crosses to stage 1 in the activation it sends: the origin is stage 0's rank, and
// the spread names the point-to-point pair that carried it (send on p2p-0-1), not the receiving stage.
TEST(PipelineCapture, NanIsTracedAcrossTheStagesItsActivationReaches) {
  const auto dir = testDir("pipeline_nan");
  const RunResult r = capture(dir, 2, 1, 1, 5,
                              {"--pp", "2", "--microbatches", "2", "--inject", "nan:rank=0,step=3,layer=0,phase=fwd"});
  ASSERT_EQ(r.status, 0) << r.output;  // warn: the run goes on
  const Diagnosis d = diagnose(dir / "run.db");
  const auto origins = d.ofKind("nan_origin");
  ASSERT_EQ(origins.size(), 1u) << d.summary();
  EXPECT_EQ(origins[0].rank, 0) << d.summary();
  EXPECT_EQ(origins[0].step, 3) << d.summary();
  EXPECT_EQ(origins[0].layer, 0) << d.summary();
  EXPECT_EQ(origins[0].ranks, std::vector<int>{1}) << d.summary();
  EXPECT_EQ(origins[0].group, "p2p-0-1") << d.summary();
}

// Pipeline placement of a fault: nan:stage=1,...,mb=1 lands on stage 1's first rank (rank 1 here) in micro-batch 1's
// forward pass only; its alert says so, and the diagnosis starts the NaN there.
TEST(PipelineCapture, StageAndMicrobatchPlaceANanInOnePass) {
  const auto dir = testDir("pipeline_nan_stage_mb");
  const RunResult r = capture(dir, 2, 1, 1, 4,
                              {"--pp", "2", "--microbatches", "2", "--inject",
                               "nan:stage=1,step=3,layer=1,phase=fwd,mb=1"});
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream log(dir / "logs" / "rank-1.log");  // the rank's own stderr, where the injector announces itself
  const std::string said((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(said.find("rank 1 step 3: NaN enters the output of layer 1 in the forward pass of micro-batch 1"),
            std::string::npos)
      << said;
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT count(*) FROM alerts WHERE kind = 'nonfinite_activation' AND rank = 1 AND step = 3 "
                       "AND json_extract(evidence, '$.micro_batch') = 1"),
            1);
  EXPECT_EQ(db.integer("SELECT count(*) FROM alerts WHERE kind = 'nonfinite_activation' AND step < 3"), 0);
  const Diagnosis d = diagnose(dir / "run.db");
  const auto origins = d.ofKind("nan_origin");
  ASSERT_EQ(origins.size(), 1u) << d.summary();
  EXPECT_EQ(origins[0].rank, 1) << d.summary();
  EXPECT_EQ(origins[0].step, 3) << d.summary();
  EXPECT_EQ(number(origins[0], "microbatch"), "1") << d.summary();
  EXPECT_NE(origins[0].message.find("of micro-batch 1"), std::string::npos) << d.summary();
}

// hang:stage=0,step=2,mb=2: stage 0 passes micro-batches 0 and 1 of step 2 and stalls at micro-batch 2's first
// message, its activation send: with 4 messages a step on the pair, that is seq 4 + 3 = 7, micro-batch (7 − 1) mod 4.
TEST(PipelineCapture, AHangPlacedInAMicrobatchStallsThatMicrobatchsMessage) {
  Diagnosis d;
  const Finding hang = pipelineHang("pipeline_hang_mb", "hang:stage=0,step=2,mb=2", d);
  EXPECT_EQ(hang.group, "p2p-0-1");
  EXPECT_EQ(hang.seq, 7) << d.summary();
  EXPECT_EQ(number(hang, "microbatch"), "2") << d.summary();
}

// Interleaved 1F1B (2 chunks a stage, so the 4-layer small config): a pair's messages no longer follow the
// micro-batches in order, and the hang is still told by micro-batch — the one the message's records name.
TEST(PipelineCapture, AnInterleavedHangIsToldByTheMicrobatchItsMessageCarries) {
  const auto dir = testDir("pipeline_hang_interleaved");
  auto argv = captureArgv(dir, 2, 1, 1, 4,
                          {"--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2", "--microbatches", "4",
                           "--inject", "hang:stage=0,step=2,mb=2", "--hang-timeout", "2", "--grace", "1"});
  *(std::find(argv.begin(), argv.end(), "--config") + 1) =
      (fs::path(TPSCOPE_TINY_CONFIG).parent_path() / "small.json").string();
  const RunResult r = run(argv, captureLog(dir));
  ASSERT_EQ(r.status, 3) << r.output;
  const Diagnosis d = diagnose(dir / "run.db");
  const auto hangs = d.ofKind("pipeline_hang", "critical");
  ASSERT_EQ(hangs.size(), 1u) << d.summary();
  EXPECT_EQ(hangs[0].group, "p2p-0-1") << d.summary();
  EXPECT_EQ(number(hangs[0], "microbatch"), "2") << d.summary();
  EXPECT_NE(hangs[0].message.find("never sent micro-batch 2's activation"), std::string::npos) << d.summary();
  Db db(dir / "run.db");
  EXPECT_EQ(db.value("SELECT callsite FROM collectives WHERE group_name = 'p2p-0-1' AND seq = " +
                     std::to_string(hangs[0].seq) + " LIMIT 1"),
            "pipeline activation of micro-batch 2 forward recv");
}

// Stage 0 computes 100 ms longer per step (--inject slow on a pipeline rank: spread over its forward passes, as on a
// slower device): diagnose names stage 0 in a stage_imbalance warning — the last stage waits on its activations —
// and, the other stage's waiting being the pipeline's and not a collective's, no straggler warning.
TEST(PipelineCapture, ASlowStageIsNamedAsStageImbalanceNotAsAStraggler) {
  const auto dir = testDir("pipeline_slow");
  const RunResult r = capture(dir, 2, 1, 1, 6,
                              {"--pp", "2", "--microbatches", "4", "--inject", "slow:rank=0,ms=100"});
  ASSERT_EQ(r.status, 0) << r.output;
  const Diagnosis d = diagnose(dir / "run.db");
  const auto imbalance = d.ofKind("stage_imbalance", "warning");
  ASSERT_EQ(imbalance.size(), 1u) << d.summary();
  EXPECT_EQ(imbalance[0].rank, 0) << d.summary();
  EXPECT_EQ(imbalance[0].numbers.at("stage"), "0") << d.summary();
  EXPECT_TRUE(d.ofKind("straggler", "warning").empty()) << d.summary();
  // The delay is inside stage 0's forward pass spans, not a span of its own at the step's start.
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT COUNT(*) FROM spans s JOIN strings n ON n.id = s.name "
                     "WHERE n.value = 'injected slow compute'"),
            0);
}

}  // namespace
}  // namespace tpscope::capture_test
