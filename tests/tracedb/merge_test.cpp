// Merge of per-rank files: clock alignment by stored offsets, idempotence, refusals, atomic output.
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <set>
#include <tuple>
#include <vector>

#include "test_dir.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::tracedb {
namespace {

using tpscope::testing::TempDir;

// A rank file whose epoch is `epoch` and whose clock runs `offset` ns behind rank 0 (t_rank0 = t_local + offset).
void writeRank(const std::filesystem::path& path, int rank, int64_t epoch, int64_t offset, const std::string& run = "r1") {
  auto w = Writer::create(path, CreateOptions{false, run, epoch, "capture"});
  ASSERT_TRUE(w.isOk()) << w.error();
  Writer& wr = **w;
  RankInfo info;
  info.rank = rank;
  info.worldSize = 3;
  info.clockOffsetNs = offset;
  info.startNs = 0;
  ASSERT_TRUE(wr.putRank(info));
  ASSERT_TRUE(wr.putGroup(GroupInfo{"world", {0, 1, 2}, "gloo"}));
  // Each rank names its spans differently so string ids differ between files and must be remapped.
  const uint32_t own = *wr.intern("only-rank-" + std::to_string(rank));
  const uint32_t shared = *wr.intern("step");
  ASSERT_TRUE(wr.addSpan(SpanRow{rank, 0, SpanKind::Step, shared, 1000, 500, 1, -1, Phase::None, {}}));
  ASSERT_TRUE(wr.addSpan(SpanRow{rank, 0, SpanKind::Compute, own, 1100, 100, 1, 0, Phase::Forward, {}}));
  CollectiveRow c;
  c.rank = rank;
  c.group = "world";
  c.seq = 1;
  c.op = "all_reduce";
  c.enqueueNs = 1200;
  c.startNs = 1210;
  c.endNs = 1300;
  c.state = CollectiveState::Completed;
  ASSERT_TRUE(wr.upsertCollective(c));
  ASSERT_TRUE(wr.addGradStat(GradStatRow{rank, 1, "w" + std::to_string(rank), 0, 1.0, 1.0, 0, 0, 10}));
  ASSERT_TRUE(wr.addCounter(CounterRow{rank, "loss", 1400, 3.0}));
  AlertRow a;
  a.rank = rank;
  a.tsNs = 1450;
  a.kind = "test";
  a.message = "m";
  ASSERT_TRUE(wr.addAlert(a));
  StepStatRow s;
  s.rank = rank;
  s.step = 1;
  s.beginNs = 1000;
  s.endNs = 1500;
  ASSERT_TRUE(wr.putStepStat(s));
  ASSERT_TRUE(wr.close());
}

TEST(Merge, AlignsClocksByEpochAndOffset) {
  TempDir dir;
  // rank 0: epoch 10 s, offset 0. rank 1: epoch 10 s + 1 µs, clock 300 ns behind. rank 2: epoch 10 s − 2 µs, 50 ns ahead.
  writeRank(dir / "rank-0.db", 0, 10'000'000'000, 0);
  writeRank(dir / "rank-1.db", 1, 10'000'001'000, 300);
  writeRank(dir / "rank-2.db", 2, 9'999'998'000, -50);
  const auto files = rankFiles(dir.path());
  ASSERT_EQ(files.size(), 3u);
  auto stats = merge(files, dir / "run.db");
  ASSERT_TRUE(stats.isOk()) << stats.error();
  EXPECT_EQ(stats->ranks, 3);
  EXPECT_EQ(stats->spans, 6);
  EXPECT_EQ(stats->collectives, 3);

  auto r = Reader::open(dir / "run.db");
  ASSERT_TRUE(r.isOk()) << r.error();
  (void)(*r)->spanCount();
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "run.db-wal")) << "reading a run file leaves no WAL behind";
  EXPECT_EQ((*r)->metaValue("epoch_unix_ns"), "9999998000");  // the earliest epoch
  EXPECT_EQ((*r)->metaValue("clock_aligned"), "1");
  EXPECT_EQ((*r)->metaValue("run_id"), "r1");
  // shift = (epoch_rank − epoch_run) + offset
  const int64_t shift[3] = {2000, 3000 + 300, 0 - 50};
  auto spans = (*r)->spans(SpanQuery{.kind = SpanKind::Step});
  ASSERT_TRUE(spans.isOk());
  ASSERT_EQ(spans->size(), 3u);
  for (const auto& s : *spans) {
    EXPECT_EQ(s.beginNs, 1000 + shift[s.rank]) << "rank " << s.rank;
    EXPECT_EQ((*r)->string(s.name), "step");
  }
  for (int rank = 0; rank < 3; ++rank) {
    auto own = (*r)->spans(SpanQuery{.rank = rank, .kind = SpanKind::Compute});
    ASSERT_TRUE(own.isOk());
    ASSERT_EQ(own->size(), 1u);
    EXPECT_EQ((*r)->string((*own)[0].name), "only-rank-" + std::to_string(rank));
  }
  auto colls = (*r)->collectives(CollectiveQuery{.group = "world"});
  ASSERT_TRUE(colls.isOk());
  ASSERT_EQ(colls->size(), 3u);
  for (const auto& c : *colls) {
    EXPECT_EQ(c.enqueueNs, 1200 + shift[c.rank]);
    EXPECT_EQ(c.endNs, 1300 + shift[c.rank]);
  }
  auto grads = (*r)->gradStats();
  ASSERT_TRUE(grads.isOk());
  ASSERT_EQ(grads->size(), 3u);
  for (const auto& g : *grads) EXPECT_EQ(g.param, "w" + std::to_string(g.rank));
  auto counters = (*r)->counters();
  ASSERT_TRUE(counters.isOk());
  for (const auto& c : *counters) EXPECT_EQ(c.tsNs, 1400 + shift[c.rank]);
  auto alerts = (*r)->alerts();
  ASSERT_TRUE(alerts.isOk());
  ASSERT_EQ(alerts->size(), 3u);
  auto steps = (*r)->stepStats();
  ASSERT_TRUE(steps.isOk());
  for (const auto& s : *steps) EXPECT_EQ(s.endNs, 1500 + shift[s.rank]);
  auto ranks = (*r)->ranks();
  ASSERT_TRUE(ranks.isOk());
  for (const auto& rk : *ranks) EXPECT_EQ(rk.startNs, shift[rk.rank]);

  // Merging a merged file with nothing else changes nothing: offsets are not applied twice.
  const std::vector<std::filesystem::path> again = {dir / "run.db"};
  ASSERT_TRUE(merge(again, dir / "run2.db").isOk());
  auto r2 = Reader::open(dir / "run2.db");
  ASSERT_TRUE(r2.isOk());
  auto spans2 = (*r2)->spans(SpanQuery{.kind = SpanKind::Step});
  ASSERT_TRUE(spans2.isOk());
  ASSERT_EQ(spans2->size(), 3u);
  for (const auto& s : *spans2) EXPECT_EQ(s.beginNs, 1000 + shift[s.rank]);
}

// spans.correlation is a span id within the rank file (a GPU record → its launching host span); merging renumbers
// spans, so the correlation must follow: every kernel still points at the host span it was written against.
TEST(Merge, CorrelationFollowsRenumberedSpans) {
  TempDir dir;
  for (int rank = 0; rank < 2; ++rank) {
    auto w = Writer::create(dir / ("rank-" + std::to_string(rank) + ".db"),
                            CreateOptions{false, "r1", 10'000'000'000, "capture"});
    ASSERT_TRUE(w.isOk()) << w.error();
    Writer& wr = **w;
    RankInfo info;
    info.rank = rank;
    info.worldSize = 2;
    ASSERT_TRUE(wr.putRank(info));
    // Host spans written out of (thread, begin) order, so the merge's renumbering moves them; a kernel lane (thread
    // 65536) whose spans name their host spans by this file's ids (1..3: written first, in this order).
    const char* hosts[] = {"late host", "early host", "middle host"};
    const int64_t begins[] = {9000, 1000, 5000};
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(wr.addSpan(SpanRow{rank, 0, SpanKind::Compute, *wr.intern(hosts[i]), begins[i], 100, 1, -1,
                                     Phase::Forward, {}}));
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(wr.addSpan(SpanRow{rank, 65536, SpanKind::Kernel,
                                     *wr.intern(std::string("kernel of ") + hosts[i]), begins[i] + 50, 500, 1, -1,
                                     Phase::Forward, int64_t{i + 1}}));
    ASSERT_TRUE(wr.close());
  }
  ASSERT_TRUE(merge(rankFiles(dir.path()), dir / "run.db").isOk());
  auto r = Reader::open(dir / "run.db");
  ASSERT_TRUE(r.isOk()) << r.error();
  Query q(**r,
          "SELECT k.rank, kn.value, h.rank, hn.value FROM spans k JOIN strings kn ON kn.id = k.name "
          "LEFT JOIN spans h ON h.id = k.correlation LEFT JOIN strings hn ON hn.id = h.name "
          "WHERE k.kind = 6 ORDER BY k.rank, kn.value",
          "kernels");
  int n = 0;
  ASSERT_TRUE(q.each([&](Query& row) {
    ++n;
    EXPECT_EQ(row.i64(0), row.i64(2)) << "a kernel points at another rank's span";
    EXPECT_EQ(row.text(1), "kernel of " + row.text(3));
  }));
  EXPECT_EQ(n, 6);
}

// The spans of `rank` as (thread, begin, name), by the query `order` of the index the analyses use.
std::vector<std::string> spansBy(const std::filesystem::path& file, int rank, const std::string& order) {
  std::vector<std::string> out;
  auto r = Reader::open(file);
  EXPECT_TRUE(r.isOk()) << r.error();
  if (!r) return out;
  Query q(**r,
          "SELECT s.thread, s.begin_ns, n.value FROM spans s JOIN strings n ON n.id = s.name WHERE s.rank = ? " + order,
          "spans");
  q.bind(1, int64_t{rank});
  EXPECT_TRUE(q.each([&](Query& row) {
    out.push_back(std::to_string(row.i64(0)) + "@" + std::to_string(row.i64(1)) + " " + row.text(2));
  }));
  return out;
}

TEST(Merge, EndSpansAreEachRanksFirstAndNewest) {
  TempDir dir;
  // Rank 0: 700 spans on two threads with many equal begin times, written out of time order; rank 1 (same file):
  // fewer spans than are kept.
  auto w = Writer::create(dir / "rank-0.db", CreateOptions{false, "r1", 1'000, "capture"});
  ASSERT_TRUE(w.isOk()) << w.error();
  Writer& wr = **w;
  for (int rank : {0, 1}) {
    RankInfo info;
    info.rank = rank;
    info.worldSize = 2;
    ASSERT_TRUE(wr.putRank(info));
  }
  struct Written {
    int thread;
    int64_t begin;
    int order;
  };
  std::vector<Written> rank0;
  for (int i = 0; i < 700; ++i) {
    const int thread = i % 3 == 0 ? 1 : 0;
    const int64_t begin = 10'000 - (i * 7919 % 700) / 3 * 10;  // a permutation in threes: ties
    rank0.push_back({thread, begin, i});
    ASSERT_TRUE(wr.addSpan(SpanRow{0, thread, SpanKind::Compute, *wr.intern("s" + std::to_string(i)), begin, 5, 0,
                                   -1, Phase::Forward, {}}));
  }
  for (int i = 0; i < 40; ++i)
    ASSERT_TRUE(wr.addSpan(SpanRow{1, 0, SpanKind::Compute, *wr.intern("r1-" + std::to_string(i)), 100 * i, 5, 0, -1,
                                   Phase::Forward, {}}));
  ASSERT_TRUE(wr.close());
  const std::vector<std::filesystem::path> in = {dir / "rank-0.db"};
  ASSERT_TRUE(merge(in, dir / "run.db").isOk());
  ASSERT_TRUE(merge(in, dir / "ends.db", {MergeSpans::Ends}).isOk());

  // Independently: rank 0's first span and newest kEndSpans by (begin, thread, order written).
  std::sort(rank0.begin(), rank0.end(), [](const Written& a, const Written& b) {
    return std::tie(a.begin, a.thread, a.order) < std::tie(b.begin, b.thread, b.order);
  });
  std::set<std::string> expected;
  auto name = [](const Written& s) {
    return std::to_string(s.thread) + "@" + std::to_string(s.begin) + " s" + std::to_string(s.order);
  };
  expected.insert(name(rank0.front()));
  for (size_t i = rank0.size() - kEndSpans; i < rank0.size(); ++i) expected.insert(name(rank0[i]));
  const auto kept = spansBy(dir / "ends.db", 0, "");
  EXPECT_EQ(std::set<std::string>(kept.begin(), kept.end()), expected);
  EXPECT_EQ(kept.size(), static_cast<size_t>(kEndSpans) + 1);
  EXPECT_EQ(spansBy(dir / "ends.db", 1, "ORDER BY s.id").size(), 40u);

  // The queries the analyses make through the spans_rank_begin index find the same spans in both files.
  for (int rank : {0, 1})
    for (const std::string& order : std::vector<std::string>{"ORDER BY s.begin_ns DESC LIMIT " +
                                                                 std::to_string(kEndSpans),
                                                             "ORDER BY s.begin_ns LIMIT 1",
                                                             "ORDER BY s.begin_ns DESC LIMIT 1"})
      EXPECT_EQ(spansBy(dir / "ends.db", rank, order), spansBy(dir / "run.db", rank, order)) << rank << " " << order;

  // An input with a pipeline layout keeps every span (the pipeline analysis reads its passes).
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir / "rank-0.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "INSERT INTO meta VALUES ('pipeline', '{}')", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  ASSERT_TRUE(merge(in, dir / "pipeline.db", {MergeSpans::Ends}).isOk());
  EXPECT_EQ(spansBy(dir / "pipeline.db", 0, "").size(), 700u);
}

TEST(Merge, IsIdempotent) {
  TempDir dir;
  writeRank(dir / "rank-0.db", 0, 100, 0);
  writeRank(dir / "rank-1.db", 1, 200, 7);
  const auto files = rankFiles(dir.path());
  ASSERT_TRUE(merge(files, dir / "run.db").isOk());
  auto first = Reader::open(dir / "run.db");
  ASSERT_TRUE(first.isOk());
  auto a = (*first)->spans();
  first = Status::error("closed");
  ASSERT_TRUE(merge(files, dir / "run.db").isOk());
  auto second = Reader::open(dir / "run.db");
  ASSERT_TRUE(second.isOk());
  auto b = (*second)->spans();
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].beginNs, (*b)[i].beginNs);
    EXPECT_EQ((*a)[i].rank, (*b)[i].rank);
  }
}

TEST(Merge, RefusesFilesOfDifferentRuns) {
  TempDir dir;
  writeRank(dir / "rank-0.db", 0, 100, 0, "run-A");
  writeRank(dir / "rank-1.db", 1, 100, 0, "run-B");
  auto s = merge(rankFiles(dir.path()), dir / "run.db");
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.error().find("different runs"), std::string::npos) << s.error();
  EXPECT_NE(s.error().find("rank-1.db"), std::string::npos) << s.error();
  EXPECT_FALSE(std::filesystem::exists(dir / "run.db"));
}

TEST(Merge, RefusesDuplicateRanksAndLeavesNoOutput) {
  TempDir dir;
  writeRank(dir / "a.db", 0, 100, 0);
  writeRank(dir / "b.db", 0, 100, 0);
  const std::vector<std::filesystem::path> in = {dir / "a.db", dir / "b.db"};
  auto s = merge(in, dir / "run.db");
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.error().find("rank 0"), std::string::npos) << s.error();
  EXPECT_FALSE(std::filesystem::exists(dir / "run.db"));
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST(Merge, ReportsAnUnreadableInput) {
  TempDir dir;
  writeRank(dir / "rank-0.db", 0, 100, 0);
  { std::ofstream(dir / "rank-1.db") << "garbage that is not sqlite at all, long enough to be read as a header....."; }
  auto s = merge(rankFiles(dir.path()), dir / "run.db");
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.error().find("rank-1.db"), std::string::npos) << s.error();
  EXPECT_FALSE(std::filesystem::exists(dir / "run.db"));
}

TEST(Merge, RankFilesAreOrderedNumerically) {
  TempDir dir;
  for (int r : {10, 2, 1}) writeRank(dir / ("rank-" + std::to_string(r) + ".db"), r, 100, 0);
  { std::ofstream(dir / "rank-x.db") << "x"; }
  { std::ofstream(dir / "notes.txt") << "x"; }
  const auto files = rankFiles(dir.path());
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].filename(), "rank-1.db");
  EXPECT_EQ(files[1].filename(), "rank-2.db");
  EXPECT_EQ(files[2].filename(), "rank-10.db");
}

// Every row of every table of a trace file as text, table by table, in rowid order (WITHOUT ROWID tables: by key).
std::map<std::string, std::vector<std::string>> dumpTables(const std::filesystem::path& file) {
  std::map<std::string, std::vector<std::string>> out;
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK) << file;
  for (const char* table : {"meta", "strings", "ranks", "threads", "process_groups", "spans", "collectives",
                            "grad_stats", "step_stats", "alerts", "counters", "recorder_stats"}) {
    const bool withoutRowid = std::string(table) == "meta" || std::string(table) == "threads" ||
                              std::string(table) == "process_groups";
    const std::string sql = std::string("SELECT * FROM ") + table + (withoutRowid ? "" : " ORDER BY rowid");
    sqlite3_stmt* st = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sql;
    while (st != nullptr && sqlite3_step(st) == SQLITE_ROW) {
      std::string row;
      for (int c = 0; c < sqlite3_column_count(st); ++c) {
        const auto* v = reinterpret_cast<const char*>(sqlite3_column_text(st, c));
        row += (v ? std::string(v) : "NULL") + "|";
      }
      out[table].push_back(row);
    }
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return out;
}

// The names of the query indexes in a file (not SQLite's own automatic indexes).
std::vector<std::string> dumpNames(const std::filesystem::path& file) {
  std::vector<std::string> out;
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(file.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK) << file;
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL", -1, &st,
                               nullptr),
            SQLITE_OK);
  while (st != nullptr && sqlite3_step(st) == SQLITE_ROW)
    out.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// Rank files with what merge moves or renumbers: epochs and clock offsets that differ, strings in a different order
// per file, spans written out of order with ties, a kernel lane correlated to its host spans, a collective that never
// started (NULL times), a NaN norm (NULL), alerts out of time order, counters, recorder stats, meta of its own; the
// third file holds two ranks.
void writeVariedRanks(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  writeRank(dir / "rank-0.db", 0, 5'000, 0);
  writeRank(dir / "rank-1.db", 1, 3'000, 250);
  auto w = Writer::create(dir / "rank-2.db", CreateOptions{false, "r1", 4'000, "capture"});
  ASSERT_TRUE(w.isOk()) << w.error();
  Writer& wr = **w;
  ASSERT_TRUE(wr.setMeta("pipeline_note", "kept once"));
  for (int rank : {2, 3}) {
    RankInfo info;
    info.rank = rank;
    info.worldSize = 4;
    info.clockOffsetNs = -40 * rank;
    info.startNs = 10;
    info.endNs = 90'000;
    info.exitReason = "ok";
    ASSERT_TRUE(wr.putRank(info));
    ASSERT_TRUE(wr.putThread(ThreadInfo{rank, 1, "cpu", "loader"}));
    for (int i = 0; i < 401; ++i)  // 401: three-way ties in begin time straddle the newest kEndSpans
      ASSERT_TRUE(wr.addSpan(SpanRow{rank, i % 3 == 0 ? 1 : 0, SpanKind::Compute,
                                     *wr.intern("op" + std::to_string(i % 37)), 50'000 - (i * 7919 % 400) / 3 * 10, 5,
                                     i / 40, i % 8, Phase::Forward, {}}));
    for (int64_t host : {1, 2, 3, 399, 400})
      ASSERT_TRUE(wr.addSpan(SpanRow{rank, 65536, SpanKind::Kernel, *wr.intern("kernel"), 60'000 + host, 9, 9, -1,
                                     Phase::Forward, host + (rank - 2) * 400}));
    CollectiveRow c;
    c.rank = rank;
    c.group = "world";
    c.seq = 7;
    c.op = "all_gather";
    c.shape = {4, 2};
    c.enqueueNs = 70'000;
    c.state = CollectiveState::Scheduled;
    ASSERT_TRUE(wr.upsertCollective(c));
    ASSERT_TRUE(wr.addGradStat(GradStatRow{rank, 9, "w", 1, std::nan(""), 2.0, 3, 0, 10}));
    for (int64_t ts : {80'000, 75'000}) {
      AlertRow a;
      a.rank = rank;
      a.tsNs = ts;
      a.kind = "late";
      a.message = std::to_string(ts);
      ASSERT_TRUE(wr.addAlert(a));
    }
    ASSERT_TRUE(wr.addCounter(CounterRow{rank, "sched.run_delay_ns", 81'000, 12.5}));
    RecorderStatsRow stats;
    stats.rank = rank;
    stats.tsNs = 85'000;
    stats.spansWritten = 406;
    ASSERT_TRUE(wr.addRecorderStats(stats));
  }
  ASSERT_TRUE(wr.close());
}

// The output does not depend on the number of reader threads.
TEST(MergeInParallel, WritesWhatMergeWrites) {
  TempDir dir;
  writeVariedRanks(dir / "in");
  const auto files = rankFiles(dir / "in");
  ASSERT_EQ(files.size(), 3u);
  for (MergeSpans spans : {MergeSpans::All, MergeSpans::Ends}) {
    const auto reference = dir / "merge.db";
    ASSERT_TRUE(merge(files, reference, {spans, true, 1}).isOk());
    const auto expected = dumpTables(reference);
    ASSERT_EQ(expected.at("spans").size(), spans == MergeSpans::All ? 2u * 406 + 4 : 2u * (kEndSpans + 1) + 4);
    for (int readers : {1, 2, 5}) {
      SCOPED_TRACE(std::to_string(readers) + " reader(s), " + (spans == MergeSpans::All ? "all spans" : "end spans"));
      const auto out = dir / ("parallel-" + std::to_string(readers) + ".db");
      std::vector<int> seen(files.size(), 0);
      auto stats = merge(files, out, {spans, true, readers}, [&](size_t i, Reader& r, const FileClock& clock) {
        EXPECT_EQ(r.path(), files[i]);
        const std::vector<int64_t> shifts = {2'000, 0, 1'000};  // the run's epoch is rank-1.db's
        EXPECT_EQ(clock.epochShiftNs, shifts[i]);
        ++seen[i];
        return Status::ok();
      });
      ASSERT_TRUE(stats.isOk()) << stats.error();
      EXPECT_EQ(seen, std::vector<int>(files.size(), 1));
      EXPECT_EQ(stats->ranks, 4);
      EXPECT_EQ(stats->spans, static_cast<int64_t>(expected.at("spans").size()));
      const auto got = dumpTables(out);
      for (const auto& [table, rows] : expected) EXPECT_EQ(got.at(table), rows) << table;
    }
  }
}

TEST(MergeInParallel, QueryIndexesAreCreatedByName) {
  TempDir dir;
  writeVariedRanks(dir / "in");
  const auto files = rankFiles(dir / "in");
  ASSERT_TRUE(merge(files, dir / "bare.db", {MergeSpans::Ends, /*indexes=*/false, 2}).isOk());
  auto indexes = [&](const std::filesystem::path& file) {
    std::set<std::string> out;
    for (const std::string& row : dumpNames(file)) out.insert(row);
    return out;
  };
  EXPECT_EQ(indexes(dir / "bare.db"), std::set<std::string>{});
  const std::vector<std::string_view> some = {query_indexes::kSpansStep, query_indexes::kAlertsTs};
  ASSERT_TRUE(createQueryIndexes(dir / "bare.db", some, 2));
  EXPECT_EQ(indexes(dir / "bare.db"), (std::set<std::string>{"alerts_ts", "spans_step"}));
  ASSERT_TRUE(merge(files, dir / "full.db", {MergeSpans::Ends, true, 2}).isOk());
  EXPECT_EQ(indexes(dir / "full.db"), (std::set<std::string>{"spans_rank_begin", "spans_step", "collectives_group_seq",
                                                            "grad_stats_step", "counters_name", "alerts_ts"}));
  EXPECT_EQ(dumpTables(dir / "bare.db"), dumpTables(dir / "full.db")) << "indexes change no row";
}

TEST(MergeInParallel, AFailingInputStopsItAndLeavesNothing) {
  TempDir dir;
  writeVariedRanks(dir / "in");
  const auto files = rankFiles(dir / "in");
  for (int readers : {1, 3}) {
    auto stats = merge(files, dir / "run.db", {MergeSpans::All, true, readers}, [&](size_t i, Reader& r, const FileClock&) {
      return i == 1 ? Status::error(r.path().string() + ": cannot summarise it") : Status::ok();
    });
    ASSERT_FALSE(stats.isOk());
    EXPECT_NE(stats.error().find("rank-1.db: cannot summarise it"), std::string::npos) << stats.error();
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      EXPECT_EQ(e.path().filename().string().find("run.db"), std::string::npos) << e.path();
  }
  // The refusals, on several readers.
  writeRank(dir / "dup.db", 0, 100, 0);
  std::vector<std::filesystem::path> dup = files;
  dup.push_back(dir / "dup.db");
  auto refused = merge(dup, dir / "run.db", {MergeSpans::All, true, 2});
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.error().find("rank 0"), std::string::npos) << refused.error();
  EXPECT_FALSE(merge({}, dir / "run.db", {MergeSpans::All, true, 2}).isOk());
}

}  // namespace
}  // namespace tpscope::tracedb
