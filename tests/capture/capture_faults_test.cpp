// End-to-end: `tpscope capture` launches real tpscope-train ranks over loopback Gloo (tiny config, one thread per rank)
// with an injected fault, and run.db must hold the facts needed to find it; capture's exit status must say what
// happened. Each test is its own ctest entry with a TIMEOUT (tests/capture/CMakeLists.txt).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "capture_test_util.h"

namespace tpscope::capture_test {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Capture, SuccessMergesEveryRankAndExitsZero) {
  const auto dir = testDir("success");
  const RunResult r = capture(dir, 2, 2, 1, 4, {"--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "exit status 0 (success)")) << r.output;
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks"), 2);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE exit_reason = 'ok'"), 2);
  EXPECT_EQ(db.integer("SELECT count(*) FROM step_stats"), 8);  // 4 steps x 2 ranks
  EXPECT_EQ(db.integer("SELECT max(step) FROM step_stats WHERE rank = 1"), 4);
  EXPECT_GT(db.integer("SELECT count(*) FROM collectives WHERE state = 'completed'"), 0);
  EXPECT_EQ(db.value("SELECT value FROM meta WHERE key = 'capture_outcome'"), "success");
  EXPECT_FALSE(contains(r.output, "WAITING") || contains(r.output, "STUCK") || contains(r.output, "DESYNC"))
      << r.output;
  EXPECT_EQ(db.integer("SELECT count(*) FROM alerts WHERE kind = 'stall'"), 0);
  EXPECT_TRUE(std::filesystem::exists(dir / "logs" / "rank-1.log"));
  // Every blocking collective is also a comm span on the thread that waited in it, so the TP all-reduces inside
  // the layers' compute spans count as exposed communication.
  EXPECT_EQ(db.integer("SELECT count(*) FROM span_view WHERE rank = 0 AND kind = 'comm' AND name = 'all_reduce'"),
            db.integer("SELECT count(*) FROM collectives WHERE rank = 0 AND op = 'all_reduce'"));
  EXPECT_GT(db.integer("SELECT count(*) FROM span_view c JOIN span_view p ON p.rank = c.rank AND p.thread = c.thread "
                       "AND p.kind = 'compute' AND p.name = 'attention forward' AND c.begin_ns >= p.begin_ns AND "
                       "c.end_ns <= p.end_ns WHERE c.rank = 0 AND c.kind = 'comm' AND c.phase = 'fwd'"),
            0);
}

TEST(Capture, BadArgumentsExitTwoBeforeStartingAnything) {
  const auto dir = testDir("badargs");
  RunResult r = capture(dir, 2, 2, 1, 2, {"--inject", "nan:rank=1"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "missing step=S")) << r.output;
  r = capture(dir, 2, 2, 1, 2, {"--inject", "nan:rank=5,step=1"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 5 does not exist in a job of 2 ranks")) << r.output;
  r = capture(dir, 4, 3, 1, 2, {});
  EXPECT_EQ(r.status, 2) << r.output;
  r = capture(dir, 2, 2, 1, 2, {"--health", "grad_spike=sometimes"});
  EXPECT_EQ(r.status, 2) << r.output;
  r = run({TPSCOPE_BIN, "capture", "--nproc", "2", "--out", dir.string(), "--config", "/nonexistent.json"},
          dir / "missing-config.log");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "no such file")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "rank-0.db"));  // nothing was started
}

TEST(Capture, NanOnOneRankIsRecordedAtItsOrigin) {
  const auto dir = testDir("nan");
  const RunResult r = capture(dir, 4, 2, 2, 4, {"--inject", "nan:rank=3,step=2,layer=1", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;  // warn policy: training goes on
  EXPECT_TRUE(contains(r.output, "ALERT CRITICAL nonfinite_grad  rank 3")) << r.output;
  Db db(dir / "run.db");
  // The alert is the rank's own first-hand record: rank 3, step 2, the injected layer-1 parameter.
  const auto alert = db.rows("SELECT rank, step, layer, param FROM alerts WHERE kind = 'nonfinite_grad' ORDER BY step, "
                             "rank LIMIT 1");
  ASSERT_EQ(alert.size(), 1u);
  EXPECT_EQ(alert[0][0], "3");
  EXPECT_EQ(alert[0][1], "2");
  EXPECT_EQ(alert[0][2], "1");
  EXPECT_EQ(alert[0][3], "layers.1.ln1.weight");
  // The analysis names the origin.
  const Diagnosis d = diagnose(dir / "run.db");
  const auto origin = d.ofKind("nan_origin");
  ASSERT_EQ(origin.size(), 1u) << d.summary();
  EXPECT_EQ(origin[0].rank, 3) << d.summary();
  EXPECT_EQ(origin[0].step, 2) << d.summary();
}

// A NaN in the forward pass: layer 0's output on rank 1 of a TP pair. The next layer's row-parallel all-reduce carries
// it to rank 0, whose first bad output is therefore later and higher; the origin is rank 1, layer 0, forward.
TEST(Capture, ForwardNanIsFoundInTheLayerOutputOfTheRankThatMadeIt) {
  const auto dir = testDir("nan_fwd");
  const RunResult r =
      capture(dir, 2, 2, 1, 3, {"--inject", "nan:rank=1,step=2,layer=0,phase=fwd", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");
  const auto first = db.rows(
      "SELECT rank, step, layer, param, json_extract(evidence, '$.phase') FROM alerts "
      "WHERE kind = 'nonfinite_activation' ORDER BY step, ts_ns LIMIT 1");
  ASSERT_EQ(first.size(), 1u) << r.output;
  EXPECT_EQ(first[0], (std::vector<std::string>{"1", "2", "0", "layers.0 output", "fwd"}));
  // Rank 0 saw it only after the all-reduce: in layer 1, behind its attention's all-reduce (the MLP's partial sums).
  EXPECT_EQ(db.value("SELECT param FROM alerts WHERE kind = 'nonfinite_activation' AND rank = 0 AND step = 2"),
            "layers.1 mlp fc2 RowParallel partial sums");
  const Diagnosis d = diagnose(dir / "run.db");
  const auto origin = d.ofKind("nan_origin");
  ASSERT_EQ(origin.size(), 1u) << d.summary();
  EXPECT_EQ(origin[0].rank, 1) << d.summary();
  EXPECT_EQ(origin[0].step, 2) << d.summary();
  EXPECT_EQ(origin[0].layer, 0) << d.summary();
  EXPECT_TRUE(contains(origin[0].message, "first NaN: rank 1")) << d.summary();
  EXPECT_TRUE(contains(origin[0].message, "layers.0 output (fwd)")) << d.summary();
}

// A NaN born inside a layer, before its all-reduce: bit 30 of rank 1's copy of layers.0.ln1.weight flips after step
// 2's update (replica check off: only the NaN analysis speaks). At step 3 the layer norm overflows on rank 1, and the
// attention's row-parallel all-reduce hands the value to rank 0 inside the same layer, so the two ranks' layer-0
// outputs go bad together. What each rank contributes to that all-reduce — its partial sums, noted before it — tells
// them apart: rank 1 is the origin, the all-reduce the carrier, rank 0 a receiver (there was a "second origin").
TEST(Capture, ANanBornInsideALayerIsNamedOnItsRankBeforeTheAllReduce) {
  const auto dir = testDir("nan_inside_layer");
  const RunResult r = capture(dir, 2, 2, 1, 4,
                              {"--inject", "bitflip:rank=1,step=2,bit=30,tensor=layers.0.ln1.weight", "--health",
                               "replica=off", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");
  EXPECT_EQ(db.value("SELECT param FROM alerts WHERE kind = 'nonfinite_activation' AND rank = 1 AND step = 3"),
            "layers.0 attention output RowParallel partial sums");
  EXPECT_NE(db.value("SELECT param FROM alerts WHERE kind = 'nonfinite_activation' AND rank = 0 AND step = 3"),
            "layers.0 attention output RowParallel partial sums");
  const Diagnosis d = diagnose(dir / "run.db");
  const auto origin = d.ofKind("nan_origin");
  ASSERT_EQ(origin.size(), 1u) << "one origin, no second one\n" << d.summary();
  EXPECT_EQ(origin[0].rank, 1) << d.summary();
  EXPECT_EQ(origin[0].step, 3) << d.summary();
  EXPECT_EQ(origin[0].group, "tp-0") << d.summary();  // the carrier: layer 0's attention all-reduce
  EXPECT_TRUE(contains(d.json, "carried by all_reduce tp-0")) << d.json;
}

// The gradient-health row of the bad parameter itself (its NaN norm is stored as NULL: SQLite cannot hold a NaN).
TEST(Capture, NanGradientRowIsStoredAtItsOrigin) {
  const auto dir = testDir("nan_row");
  const RunResult r = capture(dir, 2, 1, 2, 3, {"--inject", "nan:rank=1,step=2,layer=1", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");
  // The first non-finite gradient record: rank 1, step 2, a layer-1 parameter — and no other rank before or then.
  const auto first = db.rows(
      "SELECT rank, step, layer, param FROM grad_view WHERE nan_count > 0 ORDER BY step, rank LIMIT 1");
  ASSERT_EQ(first.size(), 1u) << "no grad_stats row with nan_count > 0 (NaN norms rejected by the writer?)";
  EXPECT_EQ(first[0][0], "1");
  EXPECT_EQ(first[0][1], "2");
  EXPECT_EQ(first[0][2], "1");
  EXPECT_EQ(first[0][3], "layers.1.ln1.weight");
  EXPECT_EQ(db.integer("SELECT count(DISTINCT rank) FROM grad_view WHERE nan_count > 0 AND step <= 2"), 1);
}

TEST(Capture, InfGradientRowIsRecordedAtItsOrigin) {
  const auto dir = testDir("inf");
  const RunResult r = capture(dir, 2, 1, 2, 3, {"--inject", "inf:rank=1,step=2,layer=0", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");
  const auto first = db.rows(
      "SELECT rank, step, layer, param, inf_count FROM grad_view WHERE inf_count > 0 ORDER BY step, rank LIMIT 1");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0][0], "1");
  EXPECT_EQ(first[0][1], "2");
  EXPECT_EQ(first[0][2], "0");
  EXPECT_EQ(first[0][3], "layers.0.ln1.weight");
  EXPECT_EQ(first[0][4], "1");
  EXPECT_EQ(db.integer("SELECT count(DISTINCT rank) FROM grad_view WHERE inf_count > 0 AND step <= 2"), 1);
}

TEST(Capture, SkipStepKeepsTrainingFiniteAfterANan) {
  const auto dir = testDir("skip");
  const RunResult r = capture(dir, 2, 1, 2, 5,
                              {"--inject", "nan:rank=1,step=3", "--on-nonfinite", "skip-step", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");
  // Every rank skipped step 3 and only step 3.
  EXPECT_EQ(db.integer("SELECT count(*) FROM step_stats WHERE skipped = 1"), 2);
  EXPECT_EQ(db.integer("SELECT count(*) FROM step_stats WHERE skipped = 1 AND step = 3"), 2);
  // The model stayed finite: no NaN in any gradient after step 3, every loss finite, the norm too.
  EXPECT_EQ(db.integer("SELECT count(*) FROM grad_view WHERE step > 3 AND (nan_count > 0 OR inf_count > 0)"), 0);
  // ... and every parameter's row is there (a NaN norm would not be stored at all).
  EXPECT_EQ(db.integer("SELECT count(*) FROM grad_stats WHERE step = 5"),
            db.integer("SELECT count(*) FROM grad_stats WHERE step = 1"));
  EXPECT_GT(db.integer("SELECT count(*) FROM grad_stats WHERE step = 1"), 0);
  EXPECT_EQ(db.integer("SELECT count(*) FROM step_stats WHERE step > 3"), 4);
  for (const auto& row : db.rows("SELECT loss FROM step_stats WHERE step > 3")) {
    ASSERT_NE(row[0], "NULL");
    EXPECT_TRUE(std::isfinite(std::stod(row[0]))) << row[0];
  }
}

TEST(Capture, StopPolicyEndsWithTheNonFiniteStatus) {
  const auto dir = testDir("stop");
  const RunResult r = capture(dir, 2, 2, 1, 5,
                              {"--inject", "inf:rank=0,step=2", "--on-nonfinite", "stop", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 5) << r.output;
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT count(*) FROM grad_view WHERE rank = 0 AND step = 2 AND inf_count > 0"), 1);
  EXPECT_EQ(db.integer("SELECT max(step) FROM step_stats"), 1);  // step 2 never completed
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE exit_reason LIKE 'stopped on non-finite%'"), 2);
  EXPECT_EQ(db.value("SELECT value FROM meta WHERE key = 'capture_outcome'"), "stopped on non-finite values");
}

TEST(Capture, HangIsCaughtByTheWatchdogAndTheMissingSeqIsRecorded) {
  const auto dir = testDir("hang");
  const RunResult r = capture(dir, 2, 2, 1, 4, {"--inject", "hang:rank=1,step=2,phase=fwd", "--hang-timeout", "4",
                                                "--grace", "3"});
  ASSERT_EQ(r.status, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "no progress for 4 s")) << r.output;
  Db db(dir / "run.db");
  const int64_t seq0 = db.integer("SELECT max(seq) FROM collectives WHERE rank = 0 AND group_name = 'tp-0'");
  const int64_t seq1 = db.integer("SELECT max(seq) FROM collectives WHERE rank = 1 AND group_name = 'tp-0'");
  EXPECT_EQ(seq1 + 1, seq0) << "rank 1 never entered seq " << seq0;
  EXPECT_EQ(db.value("SELECT state FROM collectives WHERE rank = 0 AND group_name = 'tp-0' AND seq = " +
                     std::to_string(seq0)),
            "started");
  EXPECT_EQ(db.integer("SELECT step FROM collectives WHERE rank = 0 AND group_name = 'tp-0' AND seq = " +
                       std::to_string(seq0)),
            2);
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE exit_reason LIKE 'stopped by capture (hang watchdog%'"), 2);
  const Diagnosis d = diagnose(dir / "run.db");
  bool named = false;
  for (const auto& f : d.ofKind("hang")) named |= f.group == "tp-0" && f.seq == seq0;
  EXPECT_TRUE(named) << "no hang finding on (tp-0, " << seq0 << "):\n" << d.summary();
}

// The live line, seconds after the ranks block and long before the watchdog: TP 2 x DP 2, rank 3 stalls before its
// first collective of step 3. Its TP peer (rank 2) waits in tp-1; the DP peers wait in dp-*; the line names rank 3 as
// the rank that has not entered the collective, at the seq the post-mortem diagnosis names, and run.db keeps it.
TEST(Capture, LiveStallLineNamesTheMissingRankBeforeTheWatchdog) {
  const auto dir = testDir("live-stall");
  const RunResult r = capture(dir, 4, 2, 2, 6, {"--inject", "hang:rank=3,step=3,phase=fwd", "--hang-timeout", "10",
                                                "--grace", "3"});
  ASSERT_EQ(r.status, 3) << r.output;
  Db db(dir / "run.db");
  const int64_t seq = db.integer("SELECT max(seq) FROM collectives WHERE rank = 2 AND group_name = 'tp-1'");
  const std::string line = "WAITING  tp-1 seq " + std::to_string(seq) + " (";
  const size_t at = r.output.find(line);
  ASSERT_NE(at, std::string::npos) << "no live line for tp-1 seq " << seq << ":\n" << r.output;
  const size_t watchdog = r.output.find("no progress for 10 s");
  ASSERT_NE(watchdog, std::string::npos) << r.output;
  EXPECT_LT(at, watchdog) << r.output;
  const std::string waiting = r.output.substr(at, r.output.find('\n', at) - at);
  EXPECT_TRUE(contains(waiting, "rank 2 blocked")) << waiting;
  EXPECT_TRUE(contains(waiting, "rank 3 has not entered it")) << waiting;
  // Rank 3 is named by every line that waits on it, never as blocked itself.
  EXPECT_FALSE(contains(r.output, "rank 3 blocked")) << r.output;
  EXPECT_FALSE(contains(r.output, "RESUMED")) << r.output;
  // The line kept in the folder's stall journal (for `tpscope merge` and the viewer) ...
  EXPECT_TRUE(contains(readFile(dir / "stalls.jsonl"), line)) << readFile(dir / "stalls.jsonl");
  // ... and in run.db: a critical alert of kind stall on rank 3, with its evidence.
  EXPECT_GE(db.integer("SELECT count(*) FROM alerts WHERE kind = 'stall' AND severity = 'critical' AND rank = 3 AND "
                       "json_extract(evidence, '$.group') = 'tp-1' AND json_extract(evidence, '$.seq') = " +
                       std::to_string(seq)),
            1);
  const Diagnosis d = diagnose(dir / "run.db");
  bool named = false;
  for (const auto& f : d.ofKind("hang")) named |= f.group == "tp-1" && f.seq == seq && f.rank == 3;
  EXPECT_TRUE(named) << d.summary();
}

// A rank stuck in compute (rank 1 spins 4 s inside one compute span at the start of step 3) is told live from one
// that never enters the collective: the line names the span it is inside, for how long against its median step, and
// says RESUMED when it comes back (a straggler, not a hang); the alert's evidence says where each missing rank is.
TEST(Capture, LiveStallLineSaysARankIsStuckInCompute) {
  const auto dir = testDir("live-stuck-compute");
  // 30 steps: the job goes on long enough after rank 1 is back for a poll to see it record again (RESUMED).
  const RunResult r = capture(dir, 2, 2, 1, 30, {"--inject", "slow:rank=1,ms=4000,step=3", "--hang-timeout", "30"});
  ASSERT_EQ(r.status, 0) << r.output;
  // The line that says it (under load a first line may say "inside ..." before 10 median steps have passed).
  const size_t stuck =
      r.output.find("rank 1 has not entered it: stuck in compute, inside \"injected slow compute\" for ");
  ASSERT_NE(stuck, std::string::npos) << r.output;
  const size_t at = r.output.rfind('\n', stuck) + 1;
  const std::string waiting = r.output.substr(at, r.output.find('\n', at) - at);
  EXPECT_TRUE(waiting.starts_with("WAITING  tp-0 seq ")) << waiting;
  EXPECT_TRUE(contains(waiting, "its median step")) << waiting;
  EXPECT_TRUE(contains(r.output, "RESUMED")) << r.output;
  Db db(dir / "run.db");
  EXPECT_GE(db.integer("SELECT count(*) FROM alerts WHERE kind = 'stall' AND rank = 1 AND "
                       "json_extract(evidence, '$.missing[0].state') = 'compute' AND "
                       "json_extract(evidence, '$.missing[0].stuck') = 1 AND "
                       "json_extract(evidence, '$.missing[0].inside') = 'injected slow compute'"),
            1);
}

TEST(Capture, CrashStopsTheOthersAndKeepsTheRecords) {
  const auto dir = testDir("crash");
  // A real abort at the start of step 36: rank 1's crash handler dumps what it holds before the process dies.
  const RunResult r = capture(dir, 2, 2, 1, 40, {"--inject", "crash:rank=1,step=36", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 4) << r.output;
  Db db(dir / "run.db");
  EXPECT_EQ(db.value("SELECT exit_reason FROM ranks WHERE rank = 1"), "crash: killed by signal SIGABRT");
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE rank = 0 AND exit_reason NOT LIKE '%crash%'"), 1);
  const int64_t last = db.integer("SELECT max(step) FROM step_stats WHERE rank = 1");
  EXPECT_EQ(last, 35);  // every step it finished, also those after its last periodic flush
  EXPECT_LT(db.integer("SELECT max(step) FROM step_stats WHERE rank = 0"), 37);
  const Diagnosis d = diagnose(dir / "run.db");
  const auto crashed = d.ofKind("crash", "critical");
  ASSERT_EQ(crashed.size(), 1u) << d.summary();
  EXPECT_EQ(crashed[0].rank, 1) << d.summary();
}

TEST(Capture, SigkilledRankKeepsItsFlushedRecords) {
  const auto dir = testDir("sigkill");
  const pid_t capturePid =
      startProcess({TPSCOPE_BIN, "capture", "--nproc", "2", "--tp", "2", "--config", TPSCOPE_TINY_CONFIG, "--steps",
                    "400", "--out", dir.string(), "--hang-timeout", "60"},
                   dir.parent_path() / "sigkill.capture.log");
  // Wait until rank 1 has flushed at least 3 steps, then kill it without warning.
  int64_t pid = -1, steps = 0;
  for (int i = 0; i < 600 && steps < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!std::filesystem::exists(dir / "rank-1.db")) continue;
    Db live(dir / "rank-1.db");
    // The file may exist before its tables do (a rank creating it): not yet, not a failure.
    pid = live.integer("SELECT pid FROM ranks", /*quiet=*/true);
    steps = live.integer("SELECT count(*) FROM step_stats", /*quiet=*/true);
  }
  ASSERT_GE(steps, 3);
  ASSERT_GT(pid, 0);
  ::kill(static_cast<pid_t>(pid), SIGKILL);
  const int status = waitStatus(capturePid);
  const std::string out = readFile(dir.parent_path() / "sigkill.capture.log");
  ASSERT_EQ(status, 4) << out;
  Db db(dir / "run.db");
  EXPECT_GE(db.integer("SELECT count(*) FROM step_stats WHERE rank = 1"), steps);
  EXPECT_EQ(db.value("SELECT exit_reason FROM ranks WHERE rank = 1"), "crash: killed by signal SIGKILL");
  EXPECT_TRUE(contains(out, "rank 1")) << out;
}

TEST(Capture, CtrlCDumpsStopsAndMergesEveryRank) {
  const auto dir = testDir("interrupt");
  const pid_t capturePid =
      startProcess({TPSCOPE_BIN, "capture", "--nproc", "2", "--tp", "2", "--config", TPSCOPE_TINY_CONFIG, "--steps",
                    "2000", "--out", dir.string(), "--hang-timeout", "60"},
                   dir.parent_path() / "interrupt.capture.log");
  int64_t steps = 0;
  for (int i = 0; i < 600 && steps < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!std::filesystem::exists(dir / "rank-0.db")) continue;
    Db live(dir / "rank-0.db");
    steps = live.integer("SELECT count(*) FROM step_stats", /*quiet=*/true);
  }
  ASSERT_GE(steps, 2);
  ::kill(capturePid, SIGINT);  // what a Ctrl-C delivers to capture (the ranks are in their own process groups)
  const int status = waitStatus(capturePid);
  const std::string out = readFile(dir.parent_path() / "interrupt.capture.log");
  ASSERT_EQ(status, 130) << out;
  EXPECT_TRUE(contains(out, "interrupted")) << out;
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks WHERE exit_reason = 'stopped by capture (interrupted)'"), 2);
  EXPECT_GE(db.integer("SELECT count(*) FROM step_stats WHERE rank = 1"), 2);
}

TEST(Capture, SlowRankShowsLongerCompute) {
  const auto dir = testDir("slow");
  const RunResult r = capture(dir, 2, 2, 1, 4, {"--inject", "slow:rank=1,ms=150", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "WAITING")) << "a straggler is not a stall:\n" << r.output;
  Db db(dir / "run.db");
  // Rank 1's compute per step is longer by about the injected 150 ms; rank 0 has no such span.
  EXPECT_EQ(db.integer("SELECT count(*) FROM span_view WHERE name = 'injected slow compute' AND rank = 0"), 0);
  EXPECT_EQ(db.integer("SELECT count(*) FROM span_view WHERE name = 'injected slow compute' AND rank = 1"), 4);
  EXPECT_GE(db.integer("SELECT min(dur_ns) FROM span_view WHERE name = 'injected slow compute'"), 150'000'000);
  // Its TP peer pays for it: rank 0 waits inside the collectives about 150 ms per step longer than rank 1.
  const int64_t w0 = db.integer("SELECT sum(end_ns - enqueue_ns) FROM collectives WHERE rank = 0 AND step > 0");
  const int64_t w1 = db.integer("SELECT sum(end_ns - enqueue_ns) FROM collectives WHERE rank = 1 AND step > 0");
  EXPECT_GT(w0 - w1, 4 * 100'000'000) << "collective ns rank0 " << w0 << " rank1 " << w1;
}

TEST(Capture, DelayedRankArrivesLastAtCollectives) {
  const auto dir = testDir("delay");
  const RunResult r = capture(dir, 2, 2, 1, 3, {"--inject", "delay:rank=0,ms=30", "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");
  // At (nearly) every TP collective rank 0 enqueues after rank 1.
  const int64_t total = db.integer("SELECT count(*) FROM collectives WHERE rank = 0 AND group_name = 'tp-0'");
  const int64_t late = db.integer(
      "SELECT count(*) FROM collectives a JOIN collectives b ON a.group_name = b.group_name AND a.seq = b.seq "
      "WHERE a.rank = 0 AND b.rank = 1 AND a.group_name = 'tp-0' AND a.enqueue_ns > b.enqueue_ns + 20000000");
  ASSERT_GT(total, 0);
  EXPECT_GE(late * 10, total * 9) << late << " of " << total;
}

TEST(Capture, MismatchedShapeIsRecorded) {
  const auto dir = testDir("mismatch");
  const RunResult r = capture(dir, 2, 2, 1, 3, {"--inject", "mismatch:rank=1,step=2", "--hang-timeout", "8",
                                                "--grace", "3"});
  // What Gloo does with it varies: fail the collective (a rank exits 3), block (the watchdog: 3), or — Debian's
  // Gloo — abort the ranks (4). The record is what shows it.
  ASSERT_TRUE(r.status == 3 || r.status == 4) << r.output;
  Db db(dir / "run.db");
  // Rank 1's first collective of step 2 carries one element more than the same call site did a step before.
  const auto bad = db.rows(
      "SELECT a.seq, a.numel, b.numel FROM collectives a JOIN collectives b ON a.rank = b.rank AND "
      "a.group_name = b.group_name AND a.callsite = b.callsite AND b.step = 1 WHERE a.rank = 1 AND a.step = 2 "
      "AND a.group_name = 'tp-0' ORDER BY a.seq LIMIT 1");
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(std::stoll(bad[0][1]), std::stoll(bad[0][2]) + 1);
  // The peer's record of the same (group, seq) has the right size: Gloo aborted it too, and its crash handler dumped
  // the flight recorder first.
  EXPECT_EQ(db.value("SELECT numel FROM collectives WHERE rank = 0 AND group_name = 'tp-0' AND seq = " + bad[0][0]),
            bad[0][2]);
}

// The same in the backward pass: the first all-reduce of step 2's backward (the output head's copy-to-TP).
TEST(Capture, MismatchInTheBackwardPassIsRecordedThere) {
  const auto dir = testDir("mismatch_bwd");
  const RunResult r =
      capture(dir, 2, 2, 1, 3, {"--inject", "mismatch:rank=1,step=2,phase=bwd", "--hang-timeout", "8", "--grace", "3"});
  ASSERT_TRUE(r.status == 3 || r.status == 4) << r.output;
  Db db(dir / "run.db");
  const auto bad = db.rows(
      "SELECT c.seq, c.numel, p.name FROM collectives c JOIN phases p ON p.id = c.phase WHERE c.rank = 1 AND "
      "c.step = 2 AND c.numel <> (SELECT numel FROM collectives o WHERE o.rank = 0 AND o.group_name = c.group_name "
      "AND o.seq = c.seq)");
  ASSERT_EQ(bad.size(), 1u) << r.output;
  EXPECT_EQ(bad[0][2], "bwd");
}

TEST(Capture, GradientSpikeRaisesAnAlert) {
  const auto dir = testDir("spike");
  const RunResult r = capture(dir, 2, 1, 2, 9,
                              {"--inject", "spike:rank=1,step=8,factor=1000", "--health", "grad_spike.warmup=3",
                               "--hang-timeout", "60"});
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT count(*) FROM alerts WHERE kind = 'grad_spike' AND rank = 1 AND step = 8"), 1);
  EXPECT_EQ(db.integer("SELECT count(*) FROM alerts WHERE kind = 'grad_spike' AND rank = 0"), 0);
  EXPECT_TRUE(contains(r.output, "grad_spike")) << r.output;
}

#ifdef TPSCOPE_MINIMAL_TRAINER
TEST(Capture, AnyProgramLinkingTheProbesIsCapturedAfterDashDash) {
  const auto dir = testDir("minimal");
  const RunResult r = run({TPSCOPE_BIN, "capture", "--nproc", "2", "--out", dir.string(), "--hang-timeout", "60",
                           "--", TPSCOPE_MINIMAL_TRAINER, "--steps", "6"},
                          dir.parent_path() / "minimal.capture.log");
  ASSERT_EQ(r.status, 0) << r.output;
  Db db(dir / "run.db");
  EXPECT_EQ(db.integer("SELECT count(*) FROM ranks"), 2);
  EXPECT_EQ(db.integer("SELECT count(*) FROM step_stats"), 12);
  EXPECT_EQ(db.integer("SELECT count(*) FROM grad_view WHERE step = 6"), 8);  // 4 parameters x 2 ranks
  // Each all-reduce is recorded by both ranks under the same (group, seq), completed.
  EXPECT_EQ(db.integer("SELECT count(*) FROM (SELECT seq FROM collectives WHERE group_name = 'world' AND "
                       "state = 'completed' GROUP BY seq HAVING count(DISTINCT rank) = 2)"),
            24);
  EXPECT_EQ(db.integer("SELECT count(*) FROM span_view WHERE name = 'forward' AND rank = 1"), 6);
}
#endif

}  // namespace
}  // namespace tpscope::capture_test
