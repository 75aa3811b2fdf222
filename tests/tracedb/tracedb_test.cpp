// Writer → reader round trips of every table of trace format v1.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "test_dir.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb {
namespace {

using tpscope::testing::TempDir;

std::unique_ptr<Writer> makeWriter(const std::filesystem::path& p, int64_t epoch = 1'000'000'000) {
  auto w = Writer::create(p, CreateOptions{false, "run-1", epoch, "test"});
  EXPECT_TRUE(w.isOk()) << w.error();
  return std::move(w).value();
}

TEST(TraceDb, SchemaVersionAndMeta) {
  TempDir dir;
  auto w = makeWriter(dir / "a.db");
  ASSERT_TRUE(w->setMeta(meta_keys::kConfig, R"({"layers":2})"));
  ASSERT_TRUE(w->close());

  auto r = Reader::open(dir / "a.db");
  ASSERT_TRUE(r.isOk()) << r.error();
  EXPECT_EQ((*r)->formatVersion(), kFormatVersion);
  auto meta = (*r)->meta();
  ASSERT_TRUE(meta.isOk());
  EXPECT_EQ(meta->at("format"), "tpscope-trace");
  EXPECT_EQ(meta->at("run_id"), "run-1");
  EXPECT_EQ(meta->at("epoch_unix_ns"), "1000000000");
  EXPECT_EQ(meta->at("config"), R"({"layers":2})");
  EXPECT_EQ((*r)->metaValue("nope"), std::nullopt);

  Query version(**r, "PRAGMA user_version", "the version");
  int rows = 0;
  ASSERT_TRUE(version.each([&](Query& q) {
    ++rows;
    EXPECT_EQ(q.i32(0), kFormatVersion);
  }));
  ASSERT_EQ(rows, 1);
}

// A reader that opens a rank file the moment it appears (a poll for progress, `tpscope alerts --follow`) holds a shared
// lock while the writer still sets the file up: the writer waits for it instead of failing to start ("database is
// locked": a rank of the multi-node test once recorded nothing). Repeated creates under a reader polling every ms.
TEST(TraceDb, AReaderOfTheNewFileDoesNotStopTheWriterFromStarting) {
  TempDir dir;
  const auto path = dir / "rank-0.db";
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0};
  std::thread reader([&] {
    while (!stop.load()) {
      sqlite3* db = nullptr;
      if (std::filesystem::exists(path) &&
          sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK &&
          sqlite3_exec(db, "BEGIN; SELECT count(*) FROM sqlite_master;", nullptr, nullptr, nullptr) == SQLITE_OK) {
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
        reads.fetch_add(1);
      }
      sqlite3_close(db);
      std::this_thread::sleep_for(std::chrono::microseconds(700));  // a poller's pause between reads
    }
  });
  int failed = 0;
  std::string error;
  for (int i = 0; i < 500; ++i) {  // without the wait about 1 % of the creates fail here
    auto w = Writer::create(path, CreateOptions{true, "run-1", 1, "test"});
    if (!w.isOk()) {
      ++failed;
      error = w.error();
      continue;
    }
    EXPECT_TRUE((*w)->close());
  }
  stop = true;
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(failed, 0) << error;
}

TEST(TraceDb, RefusesToOverwriteUnlessAsked) {
  TempDir dir;
  makeWriter(dir / "a.db")->close().isOk();
  auto again = Writer::create(dir / "a.db", CreateOptions{});
  ASSERT_FALSE(again.isOk());
  EXPECT_NE(again.error().find("already exists"), std::string::npos) << again.error();
  EXPECT_TRUE(Writer::create(dir / "a.db", CreateOptions{true}).isOk());
  auto missing = Writer::create(dir / "no/such/folder/a.db", CreateOptions{});
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.error().find("does not exist"), std::string::npos) << missing.error();
}

TEST(TraceDb, EveryTableRoundTrips) {
  TempDir dir;
  auto w = makeWriter(dir / "a.db");
  ASSERT_TRUE(w->begin());
  RankInfo rank;
  rank.rank = 3;
  rank.host = "node-1";
  rank.pid = 4242;
  rank.worldSize = 4;
  rank.localRank = 3;
  rank.tpRank = 1;
  rank.tpSize = 2;
  rank.dpRank = 1;
  rank.dpSize = 2;
  rank.clockOffsetNs = -1234;
  rank.clockUncertaintyNs = 56;
  rank.startNs = 10;
  rank.endNs = 9000;
  rank.exitReason = "ok";
  ASSERT_TRUE(w->putRank(rank));
  ASSERT_TRUE(w->putThread(ThreadInfo{3, 0, "cpu", "main"}));
  ASSERT_TRUE(w->putThread(ThreadInfo{3, 100, "cuda-stream", "stream 7"}));
  ASSERT_TRUE(w->putGroup(GroupInfo{"tp-1", {2, 3}, "gloo"}));

  auto fwd = w->intern("layer.fwd");
  auto bwd = w->intern("layer.bwd");
  ASSERT_TRUE(fwd.isOk() && bwd.isOk());
  EXPECT_NE(*fwd, *bwd);
  EXPECT_EQ(*w->intern("layer.fwd"), *fwd);  // interned once

  // 100 spans: exercises both the 32-row batch statement and the single-row tail.
  std::vector<SpanRow> spans;
  for (int i = 0; i < 100; ++i) {
    SpanRow s;
    s.rank = 3;
    s.thread = i % 2;
    s.kind = i % 3 == 0 ? SpanKind::Comm : SpanKind::Compute;
    s.name = i % 2 ? *fwd : *bwd;
    s.beginNs = 1000 + i * 10;
    s.durNs = 5 + i;
    s.step = i / 10;
    s.layer = i % 4;
    s.phase = i % 2 ? Phase::Forward : Phase::Backward;
    if (i == 7) s.correlation = 77;
    spans.push_back(s);
  }
  ASSERT_TRUE(w->addSpans(spans));

  CollectiveRow c;
  c.rank = 3;
  c.group = "tp-1";
  c.seq = 5;
  c.op = "all_reduce";
  c.dtype = "float32";
  c.shape = {4, 128, 256};
  c.numel = 4 * 128 * 256;
  c.bytes = c.numel * 4;
  c.callsite = "layer 0 attention output RowParallel forward all-reduce";
  c.step = 2;
  c.layer = 0;
  c.phase = Phase::Forward;
  c.enqueueNs = 500;
  ASSERT_TRUE(w->upsertCollective(c));
  c.state = CollectiveState::Completed;  // the flight recorder's later state replaces the earlier one
  c.startNs = 510;
  c.endNs = 600;
  ASSERT_TRUE(w->upsertCollective(c));

  ASSERT_TRUE(w->addGradStat(GradStatRow{3, 2, "layers.0.mlp.fc2.weight", 0, 1.5, 0.25, 3, 1, 4096}));
  // The parameter that went bad has a NaN norm: its row must be kept, and read back as NaN.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ASSERT_TRUE(w->addGradStat(GradStatRow{3, 2, "layers.1.mlp.fc2.weight", 1, nan, nan, 7, 0, 4096}));
  StepStatRow st;
  st.rank = 3;
  st.step = 2;
  st.loss = 2.5;
  st.lr = 1e-3;
  st.gradNorm = 0.75;
  st.lossScale = 1;
  st.tokens = 512;
  st.beginNs = 100;
  st.endNs = 900;
  st.skipped = true;
  ASSERT_TRUE(w->putStepStat(st));
  AlertRow a;
  a.rank = 3;
  a.step = 2;
  a.tsNs = 700;
  a.severity = "critical";
  a.kind = "nonfinite_grad";
  a.layer = 0;
  a.param = "layers.0.mlp.fc2.weight";
  a.message = "3 NaN";
  a.evidence = R"({"nan":3})";
  ASSERT_TRUE(w->addAlert(a));
  ASSERT_TRUE(w->addCounter(CounterRow{3, "loss", 900, 2.5}));
  ASSERT_TRUE(w->addRecorderStats(RecorderStatsRow{3, 950, 100, 2, 5, 0, 1, 300, 300, 1200}));
  ASSERT_TRUE(w->commit());
  ASSERT_TRUE(w->close());

  auto r = Reader::open(dir / "a.db");
  ASSERT_TRUE(r.isOk()) << r.error();
  Reader& rd = **r;

  auto ranks = rd.ranks();
  ASSERT_TRUE(ranks.isOk());
  ASSERT_EQ(ranks->size(), 1u);
  const RankInfo& rr = ranks->front();
  EXPECT_EQ(rr.host, "node-1");
  EXPECT_EQ(rr.pid, 4242);
  EXPECT_EQ(rr.tpRank, 1);
  EXPECT_EQ(rr.dpSize, 2);
  EXPECT_EQ(rr.clockOffsetNs, -1234);
  EXPECT_EQ(rr.clockUncertaintyNs, 56);
  EXPECT_EQ(rr.endNs, 9000);
  EXPECT_EQ(rr.exitReason, "ok");

  auto threads = rd.threads();
  ASSERT_TRUE(threads.isOk());
  ASSERT_EQ(threads->size(), 2u);
  EXPECT_EQ((*threads)[1].kind, "cuda-stream");

  auto groups = rd.groups();
  ASSERT_TRUE(groups.isOk());
  ASSERT_EQ(groups->size(), 1u);
  EXPECT_EQ((*groups)[0].ranks, (std::vector<int>{2, 3}));

  auto back = rd.spans();
  ASSERT_TRUE(back.isOk()) << back.error();
  ASSERT_EQ(back->size(), spans.size());
  for (size_t i = 0; i < spans.size(); ++i) {  // ordered by (rank, begin_ns) == insertion order here
    const SpanRow& x = spans[i];
    const SpanRow& y = (*back)[i];
    EXPECT_EQ(x.thread, y.thread);
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(rd.string(y.name), i % 2 ? "layer.fwd" : "layer.bwd");
    EXPECT_EQ(x.beginNs, y.beginNs);
    EXPECT_EQ(x.durNs, y.durNs);
    EXPECT_EQ(x.step, y.step);
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.phase, y.phase);
    EXPECT_EQ(x.correlation, y.correlation);
  }
  auto window = rd.spans(SpanQuery{.rank = 3, .thread = 1, .fromNs = 1200, .toNs = 1300});
  ASSERT_TRUE(window.isOk());
  for (const auto& s : *window) {
    EXPECT_EQ(s.thread, 1);
    EXPECT_GT(s.endNs(), 1200);
    EXPECT_LT(s.beginNs, 1300);
  }
  EXPECT_EQ(window->size(), 6u);  // odd i with 1200 < end and begin < 1300: i = 19, 21, ..., 29
  EXPECT_EQ(*rd.spanCount(), 100);
  auto range = rd.timeRange();
  ASSERT_TRUE(range.isOk());
  EXPECT_EQ(range->beginNs, 500);  // the collective's enqueue
  EXPECT_EQ(range->endNs, 1000 + 99 * 10 + 5 + 99);

  auto colls = rd.collectives();
  ASSERT_TRUE(colls.isOk());
  ASSERT_EQ(colls->size(), 1u);
  const CollectiveRow& cc = colls->front();
  EXPECT_EQ(cc.state, CollectiveState::Completed);
  EXPECT_EQ(cc.shape, (std::vector<int64_t>{4, 128, 256}));
  EXPECT_EQ(cc.bytes, 4 * 128 * 256 * 4);
  EXPECT_EQ(cc.endNs, 600);
  EXPECT_EQ(cc.callsite, c.callsite);

  auto grads = rd.gradStats();
  ASSERT_TRUE(grads.isOk());
  ASSERT_EQ(grads->size(), 2u);
  EXPECT_EQ((*grads)[0].param, "layers.0.mlp.fc2.weight");
  EXPECT_EQ((*grads)[0].nanCount, 3);
  EXPECT_DOUBLE_EQ((*grads)[0].l2Norm, 1.5);
  EXPECT_EQ((*grads)[1].param, "layers.1.mlp.fc2.weight");
  EXPECT_TRUE(std::isnan((*grads)[1].l2Norm));
  EXPECT_TRUE(std::isnan((*grads)[1].maxAbs));
  EXPECT_EQ((*grads)[1].nanCount, 7);

  auto steps = rd.stepStats();
  ASSERT_TRUE(steps.isOk());
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ((*steps)[0].loss, 2.5);
  EXPECT_TRUE((*steps)[0].skipped);

  auto alerts = rd.alerts();
  ASSERT_TRUE(alerts.isOk());
  ASSERT_EQ(alerts->size(), 1u);
  EXPECT_EQ((*alerts)[0].kind, "nonfinite_grad");
  EXPECT_EQ((*alerts)[0].evidence, R"({"nan":3})");

  auto counters = rd.counters();
  ASSERT_TRUE(counters.isOk());
  ASSERT_EQ(counters->size(), 1u);
  EXPECT_EQ((*counters)[0].name, "loss");

  auto rs = rd.recorderStats();
  ASSERT_TRUE(rs.isOk());
  ASSERT_EQ(rs->size(), 1u);
  EXPECT_EQ((*rs)[0].spansDropped, 2);
}

TEST(TraceDb, ReaderIsReadOnly) {
  TempDir dir;
  makeWriter(dir / "a.db")->close().isOk();
  auto r = Reader::open(dir / "a.db");
  ASSERT_TRUE(r.isOk());
  EXPECT_FALSE(Query(**r, "DELETE FROM meta", "meta").each([](Query&) {}).isOk());
  EXPECT_FALSE(Query(**r, "CREATE TABLE x(a)", "the schema").each([](Query&) {}).isOk());
  EXPECT_EQ((*r)->meta()->at("format"), "tpscope-trace");
}

TEST(TraceDb, ViewsResolveNames) {
  TempDir dir;
  auto w = makeWriter(dir / "a.db");
  SpanRow s;
  s.name = *w->intern("attention.fwd");
  s.kind = SpanKind::Compute;
  s.phase = Phase::Forward;
  s.beginNs = 10;
  s.durNs = 5;
  ASSERT_TRUE(w->addSpan(s));
  ASSERT_TRUE(w->close());
  auto r = Reader::open(dir / "a.db");
  ASSERT_TRUE(r.isOk());
  Query q(**r, "SELECT name, kind, phase, end_ns FROM span_view", "span_view");
  int rows = 0;
  ASSERT_TRUE(q.each([&](Query& row) {
    ++rows;
    EXPECT_EQ(row.text(0), "attention.fwd");
    EXPECT_EQ(row.text(1), "compute");
    EXPECT_EQ(row.text(2), "fwd");
    EXPECT_EQ(row.i64(3), 15);
  }));
  ASSERT_EQ(rows, 1);
}

}  // namespace
}  // namespace tpscope::tracedb
