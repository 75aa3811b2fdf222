// Collective statistics: bandwidth conventions, latency, skew, straggler attribution and clock uncertainty.
#include <gtest/gtest.h>

#include "test_file.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/run_info.h"

namespace tpscope::analysis {
namespace {

using testing::newWriter;
using testing::openReader;
using testing::testDir;

TEST(BusBandwidth, NcclTestsFactors) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor("all_reduce", 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("all_gather", 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("reduce_scatter", 2), 0.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("broadcast", 8), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("barrier", 8), 0.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("all_reduce", 1), 0.0);
}

tracedb::CollectiveRow rec(int rank, int64_t seq, const char* op, int64_t bytes, int64_t enq, int64_t end) {
  tracedb::CollectiveRow c;
  c.rank = rank;
  c.group = "tp-0";
  c.seq = seq;
  c.op = op;
  c.dtype = "float32";
  c.bytes = bytes;
  c.numel = bytes / 4;
  c.step = 0;
  c.enqueueNs = enq;
  c.startNs = enq;
  c.endNs = end;
  c.state = tracedb::CollectiveState::Completed;
  return c;
}

void writeTwoRanks(const std::filesystem::path& path, int64_t uncertaintyNs) {
  auto w = newWriter(path);
  for (int r = 0; r < 2; ++r) {
    tracedb::RankInfo ri;
    ri.rank = r;
    ri.clockUncertaintyNs = uncertaintyNs;
    ASSERT_TRUE(w->putRank(ri));
  }
  ASSERT_TRUE(w->putGroup({"tp-0", {0, 1}, "gloo"}));
  // seq 1: rank 1 arrives 600 ns late; the transfer takes 400 ns.
  ASSERT_TRUE(w->upsertCollective(rec(0, 1, "all_reduce", 4000, 0, 1000)));
  ASSERT_TRUE(w->upsertCollective(rec(1, 1, "all_reduce", 4000, 600, 1000)));
  // seq 2: all_gather of 1000-byte shards (message 2000 bytes); rank 1 late by 100 ns; transfer 200 ns.
  ASSERT_TRUE(w->upsertCollective(rec(0, 2, "all_gather", 1000, 2000, 2300)));
  ASSERT_TRUE(w->upsertCollective(rec(1, 2, "all_gather", 1000, 2100, 2300)));
  ASSERT_TRUE(w->close());
}

TEST(Collectives, LatencySkewAndBandwidth) {
  const auto path = testDir() / "c.db";
  writeTwoRanks(path, 10);
  auto r = openReader(path);
  auto info = loadRunInfo(*r);
  ASSERT_TRUE(info) << info.error();
  auto ca = analyzeCollectives(*r, *info);
  ASSERT_TRUE(ca) << ca.error();
  ASSERT_EQ(ca->stats.size(), 2u);
  const CollectiveStats& ag = ca->stats[0];  // by group, op: all_gather first
  const CollectiveStats& ar = ca->stats[1];
  EXPECT_EQ(ar.op, "all_reduce");
  EXPECT_EQ(ar.count, 1);
  EXPECT_EQ(ar.bytes, 4000);
  EXPECT_EQ(ar.latencyNs, 400);
  EXPECT_EQ(ar.totalNs, 700);  // mean of 1000 and 400
  EXPECT_EQ(ar.maxSkewNs, 600);
  EXPECT_DOUBLE_EQ(ar.algbwGbps, 10.0);  // 4000 bytes / 400 ns = 1e10 bytes/s
  EXPECT_DOUBLE_EQ(ar.busbwGbps, 10.0);  // × 2(n−1)/n = 1 for n = 2
  EXPECT_EQ(ag.op, "all_gather");
  EXPECT_EQ(ag.bytes, 2000);
  EXPECT_EQ(ag.latencyNs, 200);
  EXPECT_DOUBLE_EQ(ag.algbwGbps, 10.0);
  EXPECT_DOUBLE_EQ(ag.busbwGbps, 5.0);

  const StragglerReport& s = ca->stragglers;
  EXPECT_EQ(s.decided, 2);
  EXPECT_EQ(s.undecided, 0);
  ASSERT_EQ(s.ranks.size(), 2u);
  EXPECT_EQ(s.ranks[0].rank, 1);
  EXPECT_EQ(s.ranks[0].lastCount, 2);
  EXPECT_EQ(s.ranks[0].causedWaitNs, 700);
  EXPECT_EQ(s.ranks[1].rank, 0);
  EXPECT_EQ(s.ranks[1].waitedNs, 700);
  ASSERT_FALSE(ca->worst.empty());
  EXPECT_EQ(ca->worst[0].seq, 1);
  EXPECT_EQ(ca->worst[0].lastRank, 1);
}

TEST(Collectives, SkewWithinClockUncertaintyIsUndecided) {
  const auto path = testDir() / "u.db";
  writeTwoRanks(path, 200);  // 400 ns together: seq 2's 100 ns skew is undecided, seq 1's 600 ns is not
  auto r = openReader(path);
  auto info = loadRunInfo(*r);
  ASSERT_TRUE(info) << info.error();
  auto ca = analyzeCollectives(*r, *info);
  ASSERT_TRUE(ca) << ca.error();
  EXPECT_EQ(ca->stragglers.decided, 1);
  EXPECT_EQ(ca->stragglers.undecided, 1);
  EXPECT_EQ(ca->stragglers.ranks[0].causedWaitNs, 600);
}

// Four TP ranks; rank 2 starts every step late (as `--inject slow` does): it is last at the first collective of each
// step by 100 µs, and at the others the last arriver is whoever happens to be (1 µs late). Rank 2 is last at 40 % of
// the collectives — below the 50 % that makes a straggler in a pair — but nearly all the waiting is on it.
TEST(Collectives, StragglerAmongFourIsNamedByTheWaitingItCauses) {
  const auto path = testDir() / "four.db";
  {
    auto w = newWriter(path);
    for (int r = 0; r < 4; ++r) {
      tracedb::RankInfo ri;
      ri.rank = r;
      ri.clockUncertaintyNs = 10;
      ASSERT_TRUE(w->putRank(ri));
    }
    ASSERT_TRUE(w->putGroup({"tp-0", {0, 1, 2, 3}, "gloo"}));
    const int lastOf[10] = {2, 0, 1, 2, 3, 0, 2, 1, 3, 2};
    for (int64_t seq = 1; seq <= 10; ++seq) {
      const int last = lastOf[seq - 1];
      const int64_t t0 = seq * 1'000'000, late = last == 2 ? 100'000 : 1'000;
      for (int r = 0; r < 4; ++r)
        ASSERT_TRUE(w->upsertCollective(rec(r, seq, "all_reduce", 4096, t0 + (r == last ? late : 0), t0 + late + 500)));
    }
    ASSERT_TRUE(w->close());
  }
  auto r = openReader(path);
  const DiagnoseResult d = diagnose(*r);
  std::vector<const Finding*> stragglers;
  for (const auto& f : d.findings)
    if (f.kind == FindingKind::Straggler) stragglers.push_back(&f);
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(stragglers[0]->rank, 2);
}

}  // namespace
}  // namespace tpscope::analysis
