// Silent data corruption (issue #15): real `tpscope capture` runs of tpscope-train over loopback Gloo with one bit
// flipped on one rank (--inject bitflip), and healthy runs under every engine option, which must raise nothing.
#include <gtest/gtest.h>

#include <fstream>

#include "capture_test_util.h"

namespace tpscope::capture_test {
namespace {

// The silent_corruption alerts: rank, step, layer, param (ordered by rank).
std::vector<std::vector<std::string>> sdcAlerts(const fs::path& dir) {
  Db db(dir / "run.db");
  return db.rows("SELECT rank, step, layer, param FROM alerts WHERE kind = 'silent_corruption' ORDER BY rank");
}

TEST(Sdc, TpReplicatedFlipIsFoundOnTheExactRankAndStep) {
  const auto dir = testDir("sdc_tp_replicated");
  const RunResult r = capture(dir, 4, 2, 2, 6,
                              {"--inject", "bitflip:rank=2,step=3,tensor=layers.1.ln1.weight", "--health",
                               "replica.every=5", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;  // warn: training goes on
  const auto alerts = sdcAlerts(dir);
  ASSERT_EQ(alerts.size(), 1u) << r.output;
  EXPECT_EQ(alerts[0], (std::vector<std::string>{"2", "3", "1", "layers.1.ln1.weight"}));
  const Diagnosis d = diagnose(dir / "run.db");
  const auto sdc = d.ofKind("silent_corruption", "critical");
  ASSERT_EQ(sdc.size(), 1u) << d.summary();
  EXPECT_EQ(sdc[0].rank, 2) << d.summary();
  EXPECT_EQ(sdc[0].step, 3) << d.summary();
  EXPECT_EQ(sdc[0].layer, 1) << d.summary();
  EXPECT_EQ(sdc[0].numbers.at("check_step"), "5") << d.summary();
  EXPECT_EQ(sdc[0].numbers.at("copies"), "4") << d.summary();
}

TEST(Sdc, FlippedAllReduceResultIsFoundOnItsRank) {
  // TP=1 x DP=3: the first backward all-reduce is a DP gradient bucket; rank 1's update then differs.
  const auto dir = testDir("sdc_allreduce");
  const RunResult r = capture(dir, 3, 1, 3, 4,
                              {"--inject", "bitflip:rank=1,step=2,tensor=allreduce,phase=bwd", "--health",
                               "replica.every=4", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string log = readFile(dir / "logs" / "rank-1.log");
  EXPECT_NE(log.find("of the result of all-reduce"), std::string::npos) << log;
  const Diagnosis d = diagnose(dir / "run.db");
  const auto sdc = d.ofKind("silent_corruption");
  ASSERT_EQ(sdc.size(), 1u) << d.summary();
  EXPECT_EQ(sdc[0].rank, 1) << d.summary();
  EXPECT_EQ(sdc[0].step, 2) << d.summary();  // the reduced bucket feeds replicated tensors: dated exactly
}

TEST(Sdc, DpReplicaFlipIsFoundOnItsRankWithinTheCheckWindow) {
  const auto dir = testDir("sdc_dp_replica");
  const RunResult r = capture(dir, 3, 1, 3, 4,
                              {"--inject", "bitflip:rank=0,step=2,tensor=layers.0.mlp.fc1.weight,bit=12", "--health",
                               "replica.every=4", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  const auto alerts = sdcAlerts(dir);
  ASSERT_EQ(alerts.size(), 1u) << r.output;
  EXPECT_EQ(alerts[0], (std::vector<std::string>{"0", "4", "0", "layers.0.mlp.fc1.weight"}));
  const Diagnosis d = diagnose(dir / "run.db");
  const auto sdc = d.ofKind("silent_corruption");
  ASSERT_EQ(sdc.size(), 1u) << d.summary();
  EXPECT_EQ(sdc[0].rank, 0) << d.summary();
  EXPECT_EQ(sdc[0].numbers.at("earliest_step"), "1") << d.summary();
}

TEST(Sdc, TwoCopiesWithoutMajorityNameBothSuspects) {
  const auto dir = testDir("sdc_pair");
  const RunResult r = capture(dir, 2, 2, 1, 3,
                              {"--inject", "bitflip:rank=1,step=2", "--health", "replica.every=3",
                               "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(sdcAlerts(dir).size(), 2u) << r.output;  // each suspect raises its own
  const Diagnosis d = diagnose(dir / "run.db");
  const auto sdc = d.ofKind("silent_corruption");
  ASSERT_EQ(sdc.size(), 1u) << d.summary();
  EXPECT_EQ(sdc[0].rank, -1) << d.summary();
  EXPECT_EQ(sdc[0].ranks, (std::vector<int>{0, 1})) << d.summary();
  EXPECT_EQ(sdc[0].step, 2) << d.summary();
  EXPECT_NE(sdc[0].message.find("no majority"), std::string::npos) << d.summary();
}

// The same two copies, but the flip (bit 30: the exponent's top bit) makes rank 1's copy of the position embedding
// overflow its layer norm at the next step: the NaN is born on rank 1 (its partial sums before layer 0's all-reduce)
// and reaches rank 0 through it. That names the copy that moved — rank 1's — where two copies alone cannot.
TEST(Sdc, TwoCopiesAndTheNanOneOfThemMadeNameThatCopy) {
  const auto dir = testDir("sdc_pair_nan");
  const RunResult r = capture(dir, 2, 2, 1, 4, {"--inject", "bitflip:rank=1,step=2,bit=30", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  const Diagnosis d = diagnose(dir / "run.db");
  const auto sdc = d.ofKind("silent_corruption");
  ASSERT_EQ(sdc.size(), 1u) << d.summary();
  EXPECT_EQ(sdc[0].rank, 1) << d.summary();
  EXPECT_EQ(sdc[0].ranks, (std::vector<int>{1})) << d.summary();
  EXPECT_EQ(sdc[0].step, 2) << d.summary();
  EXPECT_NE(sdc[0].message.find("rank 1's copy of position moved from step 2"), std::string::npos) << d.summary();
  const auto origin = d.ofKind("nan_origin");
  ASSERT_EQ(origin.size(), 1u) << d.summary();
  EXPECT_EQ(origin[0].rank, 1) << d.summary();
}

TEST(Sdc, StopPolicyStopsBeforeTheCorruptedStateIsCheckpointed) {
  const auto dir = testDir("sdc_stop");
  const fs::path ckpt = dir / "ckpt";
  const fs::path config = configWith(dir, {{"checkpoint_dir", ckpt.string()}, {"save_every", 3}});
  const RunResult r = run(withConfig(captureArgv(dir, 2, 2, 1, 8,
                                                 {"--inject", "bitflip:rank=0,step=4", "--health", "replica=stop",
                                                  "--hang-timeout", "60"}),
                                     config),
                          captureLog(dir));
  ASSERT_EQ(r.status, 5) << r.output;
  // The check forced by the step-6 checkpoint (replica.every is 10, the run 8 steps) found the step-4 flip: the
  // last checkpoint is the healthy step 3.
  EXPECT_TRUE(fs::exists(ckpt / "step-000003" / "manifest.json")) << r.output;
  EXPECT_EQ(readFile(ckpt / "latest"), "step-000003\n");
  EXPECT_FALSE(fs::exists(ckpt / "step-000006")) << r.output;
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT max(step) FROM step_stats"), 5);  // step 6 never completed
  EXPECT_EQ(db.integer("SELECT count(*) FROM alerts WHERE kind = 'silent_corruption' AND step = 4"), 2);
}

// Pipeline stages hold different tensors: each stage's TP x DP ranks are the copies that vote (rows of other widths
// share one all-gather). TP = 1 x PP = 2 x DP = 3: rank 1 (stage 0) holds one of three copies of the position
// embedding; stage 1 (ranks 3-5) is fed rank 1's activations, but its DP all-reduce keeps its copies identical.
TEST(Sdc, PipelineStagesVoteOnTheirOwnCopies) {
  const auto dir = testDir("sdc_pipeline");
  const RunResult r = capture(dir, 6, 1, 3, 6,
                              {"--pp", "2", "--microbatches", "2", "--inject", "bitflip:rank=1,step=2,tensor=position",
                               "--health", "replica.every=5", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  const auto alerts = sdcAlerts(dir);
  ASSERT_EQ(alerts.size(), 1u) << r.output;
  EXPECT_EQ(alerts[0], (std::vector<std::string>{"1", "2", "-1", "position"}));
  const Diagnosis d = diagnose(dir / "run.db");
  const auto sdc = d.ofKind("silent_corruption");
  ASSERT_EQ(sdc.size(), 1u) << d.summary();
  EXPECT_EQ(sdc[0].rank, 1) << d.summary();
  EXPECT_EQ(sdc[0].numbers.at("copies"), "3") << d.summary();
}

// Under replica=stop the stage that found corruption and the stage that did not stop together (one MAX all-reduce):
// no stage is left waiting on a neighbour that stopped.
TEST(Sdc, StopPolicyStopsEveryPipelineStage) {
  const auto dir = testDir("sdc_pipeline_stop");
  const RunResult r = capture(dir, 6, 1, 3, 8,
                              {"--pp", "2", "--microbatches", "2", "--inject", "bitflip:rank=4,step=2,tensor=ln_final.weight",
                               "--health", "replica=stop,replica.every=3", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 5) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string log = readFile(dir / "logs" / ("rank-" + std::to_string(rank) + ".log"));
    EXPECT_NE(log.find("found on another pipeline stage"), std::string::npos) << "rank " << rank << ":\n" << log;
  }
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT max(step) FROM step_stats"), 2);  // the check after step 3's update stopped every rank
}

// A flip of a tensor the target rank's stage does not hold is refused by that rank (exit 2, the name in the message);
// the ranks of the other stages, whose peers are gone, end without a crash of their own.
TEST(Sdc, FlipOfATensorTheStageDoesNotHoldIsRefused) {
  const auto dir = testDir("sdc_pipeline_refused");
  const RunResult r = capture(dir, 4, 1, 2, 4,
                              {"--pp", "2", "--microbatches", "2", "--inject", "bitflip:rank=0,step=2,tensor=ln_final.weight",
                               "--hang-timeout", "60"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("the model has no parameter 'ln_final.weight'"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("SIGSEGV"), std::string::npos) << r.output;
  const Diagnosis d = diagnose(dir / "run.db");
  EXPECT_TRUE(d.ofKind("crash", "critical").empty()) << d.summary();
}

// Healthy runs: nothing in the fingerprinted state differs, under every option, checked every step.
void expectHealthy(const std::string& name, const nlohmann::json& options) {
  const auto dir = testDir(name);
  const fs::path config = configWith(dir, options);
  const RunResult r = run(withConfig(captureArgv(dir, 4, 2, 2, 6, {"--health", "replica.every=1", "--hang-timeout",
                                                                   "60"}),
                                     config),
                          captureLog(dir));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(sdcAlerts(dir).size(), 0u) << r.output;
  Db db(dir / "run.db");
  // The check ran at every step on every rank: one all-gather each.
  EXPECT_EQ(db.integer("SELECT count(*) FROM collectives WHERE op = 'all_gather' AND callsite LIKE "
                       "'%replica check%'"),
            4 * 6);
  const Diagnosis d = diagnose(dir / "run.db");
  EXPECT_TRUE(d.ofKind("silent_corruption").empty()) << d.summary();
  EXPECT_TRUE(d.ofKind("replica_divergence").empty()) << d.summary();
}

TEST(Sdc, HealthyBf16WithCheckpointingZero1AndSequenceParallelRaisesNothing) {
  expectHealthy("sdc_healthy_bf16",
                {{"bf16", true}, {"activation_checkpointing", true}, {"zero1", true}, {"sequence_parallel", true}});
}

TEST(Sdc, HealthyFp32RaisesNothing) { expectHealthy("sdc_healthy_fp32", nlohmann::json::object()); }

}  // namespace
}  // namespace tpscope::capture_test
