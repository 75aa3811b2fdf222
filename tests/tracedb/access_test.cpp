// The reads and writes other libraries used to hand-roll in SQL: Query and its read-only form for `tpscope sql`, span
// and collective ranges by id, alerts since an id, the newest step stats and ids, rank-file edits, and the shared
// clock alignment.
#include <gtest/gtest.h>

#include "test_dir.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/tracedb/rank_file.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/run_files.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb {
namespace {

using tpscope::testing::TempDir;

// A rank file with 5 spans, 3 steps and 3 alerts.
void writeSmallRank(const std::filesystem::path& path, int rank, int64_t epoch, int64_t offset) {
  auto w = Writer::create(path, CreateOptions{false, "r1", epoch, "capture"});
  ASSERT_TRUE(w.isOk()) << w.error();
  Writer& wr = **w;
  RankInfo info;
  info.rank = rank;
  info.clockOffsetNs = offset;
  ASSERT_TRUE(wr.putRank(info));
  const uint32_t name = *wr.intern("span");
  for (int i = 0; i < 5; ++i)
    ASSERT_TRUE(wr.addSpan(SpanRow{rank, 0, SpanKind::Compute, name, 100 * i, 10, i, -1, Phase::Forward, {}}));
  EXPECT_EQ(wr.lastRowId(), 5);
  for (int step = 1; step <= 3; ++step) {
    StepStatRow s;
    s.rank = rank;
    s.step = step;
    s.loss = step;
    ASSERT_TRUE(wr.putStepStat(s));
    AlertRow a;
    a.rank = rank;
    a.step = step;
    a.tsNs = 1000 - step;  // later ids, earlier times
    a.kind = "grad_spike";
    ASSERT_TRUE(wr.addAlert(a));
  }
  ASSERT_TRUE(wr.close());
}

TEST(TraceDbAccess, SpansByIdRangeAlertsSinceAndNewest) {
  TempDir dir;
  writeSmallRank(dir / "rank-0.db", 0, 0, 0);
  auto r = Reader::open(dir / "rank-0.db");
  ASSERT_TRUE(r.isOk()) << r.error();
  auto range = (*r)->spanIdRange();
  ASSERT_TRUE(range.isOk());
  EXPECT_EQ(range->first, 1);
  EXPECT_EQ(range->last, 5);
  auto noCollectives = (*r)->collectiveIdRange();
  ASSERT_TRUE(noCollectives.isOk()) << noCollectives.error();
  EXPECT_TRUE(noCollectives->empty());
  std::vector<int> steps;
  ASSERT_TRUE((*r)->forEachSpanInIdRange(2, 4, [&](const SpanRow& s) {
    steps.push_back(s.step);
    return true;
  }));
  EXPECT_EQ(steps, (std::vector<int>{1, 2}));
  auto alerts = (*r)->alertsSince(1);
  ASSERT_TRUE(alerts.isOk());
  ASSERT_EQ(alerts->size(), 2u);
  EXPECT_EQ((*alerts)[0].id, 2);
  EXPECT_EQ((*alerts)[1].id, 3);
  auto latest = (*r)->latestStepStats(2);
  ASSERT_TRUE(latest.isOk());
  ASSERT_EQ(latest->size(), 2u);
  EXPECT_EQ((*latest)[0].step, 3);
  EXPECT_EQ((*latest)[1].step, 2);
  auto ids = (*r)->latestIds();
  ASSERT_TRUE(ids.isOk());
  EXPECT_EQ(ids->span, 5);
  EXPECT_EQ(ids->collective, 0);
}

TEST(TraceDbAccess, CollectiveIdRange) {
  TempDir dir;
  {
    auto w = Writer::create(dir / "rank-0.db", CreateOptions{false, "r1", 0, "capture"});
    ASSERT_TRUE(w.isOk()) << w.error();
    for (int64_t seq = 1; seq <= 3; ++seq) {
      CollectiveRow c;
      c.group = "tp-0";
      c.seq = seq;
      c.op = "all_reduce";
      ASSERT_TRUE((*w)->upsertCollective(c));
    }
    ASSERT_TRUE((*w)->close());
  }
  auto r = Reader::open(dir / "rank-0.db");
  ASSERT_TRUE(r.isOk()) << r.error();
  auto range = (*r)->collectiveIdRange();
  ASSERT_TRUE(range.isOk()) << range.error();
  EXPECT_EQ(range->first, 1);
  EXPECT_EQ(range->last, 3);
}

TEST(TraceDbAccess, QueryErrorsNameTheFile) {
  TempDir dir;
  writeSmallRank(dir / "rank-0.db", 0, 0, 0);
  auto r = Reader::open(dir / "rank-0.db");
  ASSERT_TRUE(r.isOk());
  Query q(**r, "SELECT nope FROM spans", "table 'spans'");
  const Status s = q.each([](Query&) {});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("rank-0.db: cannot read table 'spans'"), std::string::npos) << s.message();
}

TEST(TraceDbAccess, ReadOnlyQueryRefusesWritesSecondStatementsAndAttach) {
  TempDir dir;
  writeSmallRank(dir / "rank-0.db", 0, 0, 0);
  auto r = Reader::open(dir / "rank-0.db");
  ASSERT_TRUE(r.isOk());
  auto ok = Query::readOnly(**r, "SELECT count(*) AS n FROM spans;  ");
  ASSERT_TRUE(ok.isOk()) << ok.error();
  EXPECT_EQ(ok->columnName(0), "n");
  int64_t n = -1;
  ASSERT_TRUE(ok->each([&](Query& q) { n = q.i64(0); }));
  EXPECT_EQ(n, 5);
  EXPECT_NE(Query::readOnly(**r, "DELETE FROM spans").error().find("refused: the statement would modify"),
            std::string::npos);
  EXPECT_NE(Query::readOnly(**r, "SELECT 1; SELECT 2").error().find("only one statement"), std::string::npos);
  EXPECT_NE(Query::readOnly(**r, "ATTACH 'x.db' AS x").error().find("ATTACH and DETACH"), std::string::npos);
  EXPECT_NE(Query::readOnly(**r, "  ").error().find("the query is empty"), std::string::npos);
}

TEST(TraceDbAccess, MarkRankExitAndAddMeta) {
  TempDir dir;
  writeSmallRank(dir / "rank-0.db", 0, 0, 0);
  ASSERT_TRUE(markRankExit(dir / "rank-0.db", "crash: signal SIGSEGV", "signal SIGSEGV"));
  const std::vector<std::pair<std::string, std::string>> kv{{"capture_outcome", "crash"}, {"capture_health", ""}};
  ASSERT_TRUE(addMeta(dir / "rank-0.db", kv));
  auto r = Reader::open(dir / "rank-0.db");
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ((*r)->ranks()->at(0).exitReason, "crash: signal SIGSEGV");
  EXPECT_EQ((*r)->metaValue(meta_keys::kCaptureExit), "signal SIGSEGV");
  EXPECT_EQ((*r)->metaValue("capture_outcome"), "crash");
  EXPECT_EQ((*r)->metaValue("capture_health"), "");
  const Status missing = markRankExit(dir / "rank-9.db", "ok", "exit 0");
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.message().find("rank-9.db"), std::string::npos);
}

TEST(TraceDbAccess, RunFilesShiftEachRankOnce) {
  TempDir dir;
  writeSmallRank(dir / "rank-0.db", 0, 5'000, 0);
  writeSmallRank(dir / "rank-1.db", 1, 2'000, 70);
  const std::vector<std::filesystem::path> paths{dir / "rank-0.db", dir / "rank-1.db"};
  auto run = openRunFiles(paths);
  ASSERT_TRUE(run.isOk()) << run.error();
  EXPECT_EQ(run->epochUnixNs, 2'000);
  ASSERT_EQ(run->files.size(), 2u);
  EXPECT_EQ(run->files[0].clock.shiftNs(0), 3'000);
  EXPECT_EQ(run->files[1].clock.shiftNs(1), 70);
  EXPECT_EQ(run->files[1].clock.shiftNs(7), 0);  // a rank the file does not list: the epoch difference only
  ASSERT_NE(run->files[0].reader, nullptr);
  auto closed = openRunFiles(paths, /*keepReaders=*/false);
  ASSERT_TRUE(closed.isOk());
  EXPECT_EQ(closed->files[0].reader, nullptr);
  EXPECT_EQ(closed->files[0].ranks.size(), 1u);
}

}  // namespace
}  // namespace tpscope::tracedb
