// Collective statistics: bandwidth conventions, latency, skew, straggler attribution and clock uncertainty.
#include <gtest/gtest.h>

#include <cstdlib>
#include <tuple>

#include "analysis_internal.h"
#include "collective_table.h"
#include "test_file.h"
#include "test_runs.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/crash.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/run_info.h"

namespace tpscope::analysis {
namespace {

using testing::newWriter;
using testing::openReader;
using testing::testDir;

// Ranks 0..n-1 with a clock uncertainty, and their group "tp-0".
void putRanksAndGroup(tracedb::Writer& w, int n, int64_t uncertaintyNs) {
  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    tracedb::RankInfo ri;
    ri.rank = r;
    ri.clockUncertaintyNs = uncertaintyNs;
    ASSERT_TRUE(w.putRank(ri));
    members.push_back(r);
  }
  ASSERT_TRUE(w.putGroup({"tp-0", members, "gloo"}));
}

// Large tables are read by worker threads, each a range of row ids with its own dictionary: the joined table is the
// one a single scan gives, text ids included.
TEST(CollectiveTable, WorkersLoadTheTableOneScanLoads) {
  const auto path = testDir() / "run.db";
  testing::RunSpec spec;
  spec.hangGroup = "dp-1";  // a rank that never enters one collective: its group's text appears late
  spec.hangRank = 3;
  spec.hangSeq = 5;
  spec.mismatchGroup = "tp-0";
  spec.mismatchSeq = 3;
  spec.mismatchRank = 1;
  ASSERT_TRUE(testing::writeRun(path, spec));
  auto load = [&](const char* threads) {
    ::setenv("TPSCOPE_ANALYSIS_THREADS", threads, 1);
    auto r = openReader(path);
    auto t = detail::loadCollectives(*r);
    ::unsetenv("TPSCOPE_ANALYSIS_THREADS");
    EXPECT_TRUE(t.isOk()) << t.error();
    return t ? std::move(*t) : detail::CollectiveTable{};
  };
  const detail::CollectiveTable one = load("1"), three = load("3");
  ASSERT_GT(one.rows.size(), 3u);
  EXPECT_EQ(one.text, three.text);
  auto fields = [](const detail::CollectiveRecord& c) {
    return std::tie(c.group, c.rank, c.seq, c.op, c.dtype, c.shape, c.callsite, c.state, c.numel, c.bytes, c.step,
                    c.layer, c.enqueueNs, c.startNs, c.endNs);
  };
  ASSERT_EQ(one.rows.size(), three.rows.size());
  for (size_t i = 0; i < one.rows.size(); ++i) EXPECT_TRUE(fields(one.rows[i]) == fields(three.rows[i])) << "row " << i;
}

// The rows come sorted by (group name, seq, rank) whatever the order they were written in: by one packed integer where
// the values fit 64 bits, by the three-part comparison where a seq spans more.
TEST(CollectiveTable, RowsSortByGroupNameSeqAndRank) {
  for (const int64_t far : {int64_t{9}, INT64_MAX - 1}) {
    const auto path = testDir() / ("far-" + std::to_string(far) + ".db");
    {
      auto w = newWriter(path);
      for (const char* group : {"tp-1", "dp-0", "tp-0"})
        for (const int64_t seq : {far, int64_t{-3}, int64_t{2}})
          for (const int rank : {3, 0, 2}) {
            tracedb::CollectiveRow c;
            c.rank = rank;
            c.group = group;
            c.seq = seq;
            c.op = "all_reduce";
            ASSERT_TRUE(w->upsertCollective(c));
          }
      ASSERT_TRUE(w->close());
    }
    auto r = openReader(path);
    auto t = detail::loadCollectives(*r);
    ASSERT_TRUE(t.isOk()) << t.error();
    ASSERT_EQ(t->rows.size(), 27u);
    std::vector<std::tuple<std::string, int64_t, int>> got, want;
    for (const auto& c : t->rows) got.emplace_back(t->str(c.group), c.seq, c.rank);
    for (const char* group : {"dp-0", "tp-0", "tp-1"})
      for (const int64_t seq : {int64_t{-3}, int64_t{2}, far})
        for (const int rank : {0, 2, 3}) want.emplace_back(group, seq, rank);
    EXPECT_EQ(got, want);
  }
}

// diagnose and report hand the loaded table to the run info and the rank ends instead of scanning the collectives
// again: the same answers as the scans, on a run with a crash (a rank whose records stop early) and one with a hang.
TEST(CollectiveTable, RunInfoAndRankEndsFromTheTableAreTheScansOnes) {
  for (const bool crash : {true, false}) {
    const auto path = testDir() / (crash ? "crash.db" : "hang.db");
    testing::RunSpec spec;
    if (crash) {
      spec.crashRank = 2;
      spec.crashStep = 3;
    } else {
      spec.hangGroup = "tp-0";
      spec.hangRank = 1;
      spec.hangSeq = 7;
    }
    ASSERT_TRUE(testing::writeRun(path, spec));
    auto r = openReader(path);
    auto table = detail::loadCollectives(*r);
    ASSERT_TRUE(table.isOk()) << table.error();
    auto scanned = loadRunInfo(*r);
    auto taken = detail::loadRunInfo(*r, *table);
    ASSERT_TRUE(scanned.isOk() && taken.isOk());
    auto ranks = [](const RunInfo& i) {
      std::vector<int> out;
      for (const auto& ri : i.ranks) out.push_back(ri.rank);
      return out;
    };
    auto groups = [](const RunInfo& i) {
      std::vector<std::pair<std::string, std::vector<int>>> out;
      for (const auto& g : i.groups) out.emplace_back(g.name, g.ranks);
      return out;
    };
    EXPECT_EQ(ranks(*scanned), ranks(*taken));
    EXPECT_EQ(groups(*scanned), groups(*taken));
    EXPECT_EQ(scanned->beginNs, taken->beginNs);
    EXPECT_EQ(scanned->endNs, taken->endNs);
    auto endsScanned = analyzeRankEnds(*r, *scanned);
    auto endsTaken = detail::analyzeRankEnds(*r, *taken, *table);
    ASSERT_TRUE(endsScanned.isOk() && endsTaken.isOk());
    auto fields = [](const RankEnd& e) {
      return std::tie(e.rank, e.lastRecordNs, e.lastStep, e.crashed, e.stoppedEarly);
    };
    ASSERT_EQ(endsScanned->size(), endsTaken->size());
    for (size_t i = 0; i < endsScanned->size(); ++i)
      EXPECT_TRUE(fields((*endsScanned)[i]) == fields((*endsTaken)[i])) << "rank " << (*endsScanned)[i].rank;
    if (crash) {
      EXPECT_TRUE(std::any_of(endsTaken->begin(), endsTaken->end(), [](const RankEnd& e) { return e.stoppedEarly; }));
    }
  }
}

TEST(BusBandwidth, NcclTestsFactors) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor("all_reduce", 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("all_gather", 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("reduce_scatter", 2), 0.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("broadcast", 8), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("barrier", 8), 0.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("all_reduce", 1), 0.0);
}

// nccl-tests' PERFORMANCE.md: gather and scatter move (n−1)/n of the message per rank, send/recv all of it; the
// coalesced and tensor variants of c10d and the backends' own spellings are the same ops.
TEST(BusBandwidth, GatherScatterCoalescedAndPointToPoint) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor("gather", 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("scatter", 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("send", 2), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("recv", 2), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("allreduce_coalesced", 4), 2.0 * 3 / 4);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("all_gather_into_tensor_coalesced", 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("c10d::allreduce_", 2), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("_reduce_scatter_base", 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busBandwidthFactor("gloo:all_reduce", 4), 2.0 * 3 / 4);
  EXPECT_EQ(canonicalOpName("reduce_scatter_tensor"), "reduce_scatter");
  EXPECT_EQ(canonicalOpName("all_to_all_single"), "all_to_all");
  EXPECT_EQ(canonicalOpName("_allgather_base"), "all_gather");
}

// A reduce-scatter the engine emulates with an all-reduce moved what an all-reduce moves: 2(n−1)/n of the message,
// not (n−1)/n. The run says so in meta 'emulated_ops'; without it the op's own factor applies.
TEST(BusBandwidth, EmulatedReduceScatterCountsTheAllReduceUnderneath) {
  for (const bool emulated : {false, true}) {
    const auto path = testDir() / (emulated ? "rs_emulated.db" : "rs_native.db");
    {
      auto w = newWriter(path);
      putRanksAndGroup(*w, 4, 0);
      if (emulated) {
        ASSERT_TRUE(w->setMeta("emulated_ops", "reduce_scatter=all_reduce"));
      }
      for (int r = 0; r < 4; ++r) {
        auto c = [&] {
          tracedb::CollectiveRow x;
          x.rank = r;
          x.group = "tp-0";
          x.seq = 1;
          x.op = "reduce_scatter";
          x.dtype = "float32";
          x.bytes = 4'000'000;  // the whole input: nccl-tests' size of a reduce-scatter
          x.numel = 1'000'000;
          x.enqueueNs = 0;
          x.startNs = 0;
          x.endNs = 1'000'000;  // 1 ms: algbw 4 GB/s
          x.state = tracedb::CollectiveState::Completed;
          return x;
        }();
        ASSERT_TRUE(w->upsertCollective(c));
      }
      ASSERT_TRUE(w->close());
    }
    auto r = openReader(path);
    auto info = loadRunInfo(*r);
    ASSERT_TRUE(info) << info.error();
    auto ca = analyzeCollectives(*r, *info);
    ASSERT_TRUE(ca) << ca.error();
    ASSERT_EQ(ca->stats.size(), 1u);
    EXPECT_NEAR(ca->stats[0].algbwGbps, 4.0, 1e-9);
    EXPECT_NEAR(ca->stats[0].busbwGbps, emulated ? 4.0 * 2 * 3 / 4 : 4.0 * 3 / 4, 1e-9);
    EXPECT_EQ(ca->stats[0].emulatedBy, emulated ? "all_reduce" : "");
  }
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
  putRanksAndGroup(*w, 2, uncertaintyNs);
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
// the collectives — a count of "last" says little — but nearly all the waiting is on it: the weighted test finds it.
TEST(Collectives, StragglerAmongFourIsNamedByTheWaitingItCauses) {
  const auto path = testDir() / "four.db";
  {
    auto w = newWriter(path);
    putRanksAndGroup(*w, 4, 10);
    // Twice the same ten collectives: four costly ones out of ten cannot be told from chance at the run's
    // false-alarm bound (z = 3.4 < 3.5), eight out of twenty can (z = 4.9).
    const int lastOf[10] = {2, 0, 1, 2, 3, 0, 2, 1, 3, 2};
    for (int64_t seq = 1; seq <= 20; ++seq) {
      const int last = lastOf[(seq - 1) % 10];
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

// A healthy pair: who arrives last is a coin flip at each of 400 collectives, the skews vary by 100×. Whatever the
// seed, no straggler is named (the weighted test's p-value stays above the bound), though one rank always "caused
// the most waiting". The test computes the expected waiting independently: Σ w / 2 over the collectives.
TEST(Collectives, ChanceArrivalOrderIsNoStraggler) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u}) {
    const auto path = testDir() / ("coin" + std::to_string(seed) + ".db");
    uint64_t state = seed * 0x9E3779B97F4A7C15ull;
    auto next = [&] {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      return state;
    };
    double sumWait = 0;
    {
      auto w = newWriter(path);
      putRanksAndGroup(*w, 2, 10);
      for (int64_t seq = 1; seq <= 400; ++seq) {
        const int last = static_cast<int>(next() % 2);
        const int64_t skew = 1'000 + static_cast<int64_t>(next() % 100'000), t0 = seq * 1'000'000;
        sumWait += static_cast<double>(skew);
        for (int r = 0; r < 2; ++r)
          ASSERT_TRUE(w->upsertCollective(rec(r, seq, "all_reduce", 4096, t0 + (r == last ? skew : 0), t0 + skew + 500)));
      }
      ASSERT_TRUE(w->close());
    }
    auto r = openReader(path);
    auto info = loadRunInfo(*r);
    ASSERT_TRUE(info) << info.error();
    auto ca = analyzeCollectives(*r, *info);
    ASSERT_TRUE(ca) << ca.error();
    for (const RankStraggling& s : ca->stragglers.ranks) {
      EXPECT_NEAR(s.expectedWaitNs, sumWait / 2, 1e-6 * sumWait) << "seed " << seed;
      EXPECT_GT(s.pValue, 1e-3 / 2) << "seed " << seed << " rank " << s.rank << " z " << s.z;
    }
    const DiagnoseResult d = diagnose(*r);
    for (const auto& f : d.findings) EXPECT_NE(f.kind, FindingKind::Straggler) << "seed " << seed << ": " << f.message;
  }
}

}  // namespace
}  // namespace tpscope::analysis
