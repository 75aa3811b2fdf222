// Flight-recorder match states on hand-made records.
#include <gtest/gtest.h>

#include "test_file.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/finding.h"

namespace tpscope::analysis {
namespace {

tracedb::CollectiveRow rec(int rank, int64_t seq, const char* op, const char* dtype, int64_t numel,
                           tracedb::CollectiveState state = tracedb::CollectiveState::Completed) {
  tracedb::CollectiveRow c;
  c.rank = rank;
  c.group = "world";
  c.seq = seq;
  c.op = op;
  c.dtype = dtype;
  c.numel = numel;
  c.shape = {numel};
  c.bytes = numel * 4;
  c.enqueueNs = seq * 100;
  c.startNs = c.enqueueNs;
  if (state == tracedb::CollectiveState::Completed) c.endNs = c.enqueueNs + 50;
  c.state = state;
  return c;
}

// A fresh run file with ranks 0 .. n-1.
std::unique_ptr<tracedb::Writer> writerWithRanks(const std::filesystem::path& path, int n) {
  auto w = testing::newWriter(path);
  for (int r = 0; r < n; ++r) {
    tracedb::RankInfo ri;
    ri.rank = r;
    EXPECT_TRUE(w->putRank(ri));
  }
  return w;
}

struct Analyzed {
  bool ok = false;
  RunInfo info;
  DesyncReport report;
};

// The desync report of a file (a failure is a test failure and ok = false).
Analyzed analyzeFile(const std::filesystem::path& path) {
  Analyzed a;
  auto reader = testing::openReader(path);
  auto info = loadRunInfo(*reader);
  EXPECT_TRUE(info) << info.error();
  if (!info) return a;
  auto report = analyzeDesync(*reader, *info);
  EXPECT_TRUE(report) << report.error();
  if (!report) return a;
  a.info = *info;
  a.report = std::move(*report);
  a.ok = true;
  return a;
}

TEST(Desync, MatchStates) {
  const auto path = testing::testDir() / "m.db";
  {
    auto w = writerWithRanks(path, 2);
    ASSERT_TRUE(w->putGroup({"world", {0, 1}, "nccl"}));
    // seq 1: all-to-all with uneven splits and byte packing: legitimate.
    ASSERT_TRUE(w->upsertCollective(rec(0, 1, "all_to_all", "uint8", 400)));
    ASSERT_TRUE(w->upsertCollective(rec(1, 1, "all_to_all", "int32", 96)));
    // seq 2: dtype mismatch; seq 3: type mismatch; seq 4: fully matched.
    ASSERT_TRUE(w->upsertCollective(rec(0, 2, "all_reduce", "float32", 64)));
    ASSERT_TRUE(w->upsertCollective(rec(1, 2, "all_reduce", "bfloat16", 64)));
    ASSERT_TRUE(w->upsertCollective(rec(0, 3, "all_reduce", "float32", 64)));
    ASSERT_TRUE(w->upsertCollective(rec(1, 3, "broadcast", "float32", 64)));
    ASSERT_TRUE(w->upsertCollective(rec(0, 4, "all_reduce", "float32", 64)));
    ASSERT_TRUE(w->upsertCollective(rec(1, 4, "all_reduce", "float32", 64)));
    // seq 5: rank 1 timed out while rank 0 is still waiting: the stuck seq, a state mismatch.
    ASSERT_TRUE(w->upsertCollective(rec(0, 5, "all_reduce", "float32", 64, tracedb::CollectiveState::Started)));
    ASSERT_TRUE(w->upsertCollective(rec(1, 5, "all_reduce", "float32", 64, tracedb::CollectiveState::TimedOut)));
    ASSERT_TRUE(w->close());
  }
  const Analyzed a = analyzeFile(path);
  ASSERT_TRUE(a.ok);
  ASSERT_EQ(a.report.groups.size(), 1u);
  const GroupDesync& g = a.report.groups[0];
  ASSERT_EQ(g.mismatches.size(), 2u);
  EXPECT_EQ(g.mismatches[0].seq, 2);
  EXPECT_EQ(g.mismatches[0].state, MatchState::DtypeMismatch);
  EXPECT_EQ(g.mismatches[1].seq, 3);
  EXPECT_EQ(g.mismatches[1].state, MatchState::CollectiveTypeMismatch);
  ASSERT_TRUE(g.stuckSeq);
  EXPECT_EQ(*g.stuckSeq, 5);
  EXPECT_EQ(g.stuckState, MatchState::StateMismatch);
  EXPECT_TRUE(g.missingRanks.empty());
  EXPECT_EQ(g.waitingRanks, (std::vector<int>{0, 1}));

  const auto findings = desyncFindings(a.report, a.info);
  ASSERT_EQ(findings.size(), 3u);  // the hang at seq 5 and two desyncs
  int hangs = 0, desyncs = 0;
  for (const auto& f : findings) {
    hangs += f.kind == FindingKind::Hang;
    desyncs += f.kind == FindingKind::Desync;
    if (f.kind == FindingKind::Desync) {
      EXPECT_EQ(f.severity, Severity::Error);
    }
  }
  EXPECT_EQ(hangs, 1);
  EXPECT_EQ(desyncs, 2);
}

// TP 2 × DP 2: rank 3 stalls at step 2 before its first backward TP all-reduce (tp-1), so its TP peer waits there and
// its DP peer (rank 1) waits for it at the DP all-reduce (dp-1) that ends backward. Rank 1 got there first by the
// clocks (4 ranks on 2 cores: rank 2 was descheduled), but in rank 3's own program order tp-1 comes first, as its
// step 1 shows: tp-1 is the cause, dp-1 a consequence.
TEST(Desync, TheCauseIsTheStuckCollectiveFirstInTheMissingRanksProgramOrder) {
  const auto path = testing::testDir() / "order.db";
  {
    auto w = writerWithRanks(path, 4);
    ASSERT_TRUE(w->putGroup({"tp-1", {2, 3}, "gloo"}));
    ASSERT_TRUE(w->putGroup({"dp-1", {1, 3}, "gloo"}));
    auto at = [](int rank, const char* group, int64_t seq, int step, const char* callsite, int64_t t, bool done) {
      tracedb::CollectiveRow c = rec(rank, seq, "all_reduce", "float32", 64,
                                     done ? tracedb::CollectiveState::Completed : tracedb::CollectiveState::Started);
      c.group = group;
      c.step = step;
      c.callsite = callsite;
      c.enqueueNs = c.startNs.emplace(t);
      c.endNs.reset();
      if (done) c.endNs = t + 50;
      return c;
    };
    for (int r : {2, 3}) ASSERT_TRUE(w->upsertCollective(at(r, "tp-1", 1, 1, "fc1 backward", 1'000, true)));
    for (int r : {1, 3}) ASSERT_TRUE(w->upsertCollective(at(r, "dp-1", 1, 1, "grad reduce", 5'000, true)));
    ASSERT_TRUE(w->upsertCollective(at(1, "dp-1", 2, 2, "grad reduce", 14'000, false)));
    ASSERT_TRUE(w->upsertCollective(at(2, "tp-1", 2, 2, "fc1 backward", 15'000, false)));
    ASSERT_TRUE(w->close());
  }
  const Analyzed a = analyzeFile(path);
  ASSERT_TRUE(a.ok);
  std::vector<std::string> causes;
  for (const auto& f : desyncFindings(a.report, a.info))
    if (f.kind == FindingKind::Hang && f.severity == Severity::Critical) {
      causes.push_back(f.collective->group);
      EXPECT_EQ(f.ranks, std::vector<int>{3});
    }
  EXPECT_EQ(causes, std::vector<std::string>{"tp-1"});
}

// Two ranks disagree on a size: a tie that the two records cannot decide. Rank 0's call site carried 64 elements a
// step before and now 63; rank 1's carries 64 as before: rank 0 is the odd one (its variant sorts first, so the
// fallback of naming all but the first variant would blame rank 1).
TEST(Desync, ATieBetweenTwoRanksNamesTheOneWhoseSizeChanged) {
  const auto path = testing::testDir() / "tie.db";
  {
    auto w = writerWithRanks(path, 2);
    ASSERT_TRUE(w->putGroup({"world", {0, 1}, "gloo"}));
    for (int r = 0; r < 2; ++r) {
      for (int step = 1; step <= 2; ++step) {
        tracedb::CollectiveRow c = rec(r, step, "all_reduce", "float32", r == 0 && step == 2 ? 63 : 64);
        c.step = step;
        c.callsite = "attention output all-reduce";
        ASSERT_TRUE(w->upsertCollective(c));
      }
    }
    ASSERT_TRUE(w->close());
  }
  const Analyzed a = analyzeFile(path);
  ASSERT_TRUE(a.ok);
  std::vector<const Finding*> desyncs;
  const auto findings = desyncFindings(a.report, a.info);
  for (const auto& f : findings)
    if (f.kind == FindingKind::Desync) desyncs.push_back(&f);
  ASSERT_EQ(desyncs.size(), 1u);
  EXPECT_EQ(desyncs[0]->ranks, std::vector<int>{0});
  EXPECT_EQ(desyncs[0]->collective->seq, 2);
}

}  // namespace
}  // namespace tpscope::analysis
