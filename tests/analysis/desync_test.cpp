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

TEST(Desync, MatchStates) {
  const auto path = testing::testDir() / "m.db";
  {
    auto w = testing::newWriter(path);
    for (int r = 0; r < 2; ++r) {
      tracedb::RankInfo ri;
      ri.rank = r;
      ASSERT_TRUE(w->putRank(ri));
    }
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
  auto reader = testing::openReader(path);
  auto info = loadRunInfo(*reader);
  ASSERT_TRUE(info) << info.error();
  auto report = analyzeDesync(*reader, *info);
  ASSERT_TRUE(report) << report.error();
  ASSERT_EQ(report->groups.size(), 1u);
  const GroupDesync& g = report->groups[0];
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

  const auto findings = desyncFindings(*report, *info);
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

}  // namespace
}  // namespace tpscope::analysis
