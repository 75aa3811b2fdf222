// Run-file summaries (issue #17): a file with summaries must give exactly what the records give — the breakdown,
// the phase profile and every finding — and a file whose summaries are stale, of another definition or absent must
// be read from its records.
#include "tpscope/analysis/summary.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>

#include "test_file.h"
#include "test_runs.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/report.h"
#include "tpscope/report/json_output.h"

namespace tpscope::analysis {
namespace {

using report::diagnosisToJson;
using report::reportToJson;

std::unique_ptr<tracedb::Reader> openRun(const std::filesystem::path& p) {
  auto r = tracedb::Reader::open(p);
  EXPECT_TRUE(r.isOk()) << r.error();
  return r ? std::move(*r) : nullptr;
}

void expectSameShares(const TimeShares& a, const TimeShares& b, const std::string& where) {
  EXPECT_EQ(a.stepNs, b.stepNs) << where;
  EXPECT_EQ(a.computeNs, b.computeNs) << where;
  EXPECT_EQ(a.commNs, b.commNs) << where;
  EXPECT_EQ(a.exposedCommNs, b.exposedCommNs) << where;
  EXPECT_EQ(a.otherNs, b.otherNs) << where;
  EXPECT_EQ(a.idleNs, b.idleNs) << where;
  EXPECT_EQ(a.memcpyNs, b.memcpyNs) << where;
  EXPECT_EQ(a.idleHostWaitNs, b.idleHostWaitNs) << where;
  EXPECT_EQ(a.idleKernelWaitNs, b.idleKernelWaitNs) << where;
  EXPECT_EQ(a.idleOtherNs, b.idleOtherNs) << where;
}

void expectSameBreakdown(const Breakdown& a, const Breakdown& b) {
  EXPECT_EQ(a.source, b.source);
  expectSameShares(a.run, b.run, "run");
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t i = 0; i < a.ranks.size(); ++i) {
    EXPECT_EQ(a.ranks[i].rank, b.ranks[i].rank);
    EXPECT_EQ(a.ranks[i].lanes, b.ranks[i].lanes);
    EXPECT_EQ(a.ranks[i].source, b.ranks[i].source);
    EXPECT_EQ(a.ranks[i].steps, b.ranks[i].steps);
    expectSameShares(a.ranks[i].time, b.ranks[i].time, "rank " + std::to_string(a.ranks[i].rank));
  }
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].rank, b.steps[i].rank);
    EXPECT_EQ(a.steps[i].step, b.steps[i].step);
    EXPECT_EQ(a.steps[i].beginNs, b.steps[i].beginNs);
    EXPECT_EQ(a.steps[i].endNs, b.steps[i].endNs);
    expectSameShares(a.steps[i].time, b.steps[i].time, "step " + std::to_string(a.steps[i].step));
  }
}

std::string profileText(tracedb::Reader& r) {
  auto report = buildReport(r);
  EXPECT_TRUE(report.isOk()) << report.error();
  if (!report) return {};
  auto p = profilePhases(r, *report);
  EXPECT_TRUE(p.isOk()) << p.error();
  std::string out;
  if (p)
    for (const auto& t : p->phases) out += t.kind + "/" + t.phase + "=" + std::to_string(t.nsPerRankStep) + "\n";
  return out + reportToJson(*report, "run.db");
}

struct Case {
  const char* name;
  testing::RunSpec spec;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

testing::RunSpec spec(void (*edit)(testing::RunSpec&)) {
  testing::RunSpec s;
  edit(s);
  return s;
}

class SummaryEquivalence : public ::testing::TestWithParam<Case> {};

// The same breakdown, phase profile, report and diagnosis with and without summaries, on runs of several shapes.
TEST_P(SummaryEquivalence, SummariesGiveWhatTheRecordsGive) {
  const auto dir = testing::testDir();
  const auto file = dir / "run.db";
  ASSERT_TRUE(testing::writeRun(file, GetParam().spec));
  std::string profileBefore, diagnosisBefore;
  Breakdown before;
  {
    auto r = openRun(file);
    ASSERT_TRUE(r);
    auto none = tracedb::readSummary(*r, kSummaryVersion);
    ASSERT_TRUE(none.isOk());
    EXPECT_FALSE(none->has_value()) << "a fresh file has no summaries";
    auto b = computeBreakdown(*r);
    ASSERT_TRUE(b.isOk()) << b.error();
    before = std::move(*b);
    profileBefore = profileText(*r);
    diagnosisBefore = diagnosisToJson(diagnose(*r), "run.db");
  }
  ASSERT_TRUE(writeRunSummary(file));
  auto r = openRun(file);
  ASSERT_TRUE(r);
  auto summary = tracedb::readSummary(*r, kSummaryVersion);
  ASSERT_TRUE(summary.isOk()) << summary.error();
  ASSERT_TRUE(summary->has_value()) << "the summaries were written";
  EXPECT_EQ((*summary)->steps.size(), before.steps.size());
  auto after = computeBreakdown(*r);
  ASSERT_TRUE(after.isOk()) << after.error();
  expectSameBreakdown(before, *after);
  EXPECT_EQ(profileText(*r), profileBefore);
  EXPECT_EQ(diagnosisToJson(diagnose(*r), "run.db"), diagnosisBefore);
}

INSTANTIATE_TEST_SUITE_P(
    Runs, SummaryEquivalence,
    ::testing::Values(Case{"healthy", spec([](testing::RunSpec&) {})},
                      Case{"straggler_unindexed", spec([](testing::RunSpec& s) {
                             s.stragglerRank = 3;
                             s.indexed = false;
                           })},
                      Case{"hang", spec([](testing::RunSpec& s) {
                             s.hangGroup = "tp-0";
                             s.hangRank = 1;
                             s.hangSeq = 9;
                           })},
                      Case{"crash_nan", spec([](testing::RunSpec& s) {
                             s.crashRank = 2;
                             s.crashStep = 5;
                             s.nanRank = 1;
                             s.nanStep = 3;
                             s.nanLayer = 1;
                           })},
                      Case{"tp4_no_comm_spans", spec([](testing::RunSpec& s) {
                             s.tp = 4;
                             s.dp = 1;
                             s.commSpans = false;
                           })}),
    [](const auto& info) { return std::string(info.param.name); });

// The breakdown reads a run a rank at a time where each rank's spans are one run of rows (imports, merges), and the
// whole run where ranks interleave: both, split into 1 or 3 scans, give the same breakdown, and the phases equal
// phaseBusyFromRecords' own pass over every span.
TEST(Summary, RankAtATimeAndWholeRunGiveTheSameBreakdown) {
  const auto dir = testing::testDir();
  testing::RunSpec spec;
  spec.stragglerRank = 2;
  spec.commSpans = false;  // the collectives are known by their records alone
  ASSERT_TRUE(testing::writeRun(dir / "written.db", spec));
  // The same spans in another row order (new ids): ranks one after another (in descending rank order), or
  // interleaved in time order.
  auto reorder = [&](const char* name, const char* order) {
    const auto path = dir / name;
    std::filesystem::copy_file(dir / "written.db", path);
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    const std::string sql = std::string(
                                "CREATE TABLE copied AS SELECT * FROM spans; DELETE FROM spans;"
                                " INSERT INTO spans(rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase,"
                                " correlation) SELECT rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase,"
                                " correlation FROM copied ORDER BY ") +
                            order + "; DROP TABLE copied;";
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
    sqlite3_close(db);
    return path;
  };
  const auto byRank = reorder("by_rank.db", "rank DESC, id");
  const auto interleaved = reorder("interleaved.db", "begin_ns, rank");
  auto read = [](const std::filesystem::path& path, const char* threads) {
    ::setenv("TPSCOPE_ANALYSIS_THREADS", threads, 1);
    auto r = openRun(path);
    auto summary = summaryFromRecords(*r);
    auto breakdown = computeBreakdownFromRecords(*r);
    auto phases = phaseBusyFromRecords(*r);
    ::unsetenv("TPSCOPE_ANALYSIS_THREADS");
    EXPECT_TRUE(summary.isOk() && breakdown.isOk() && phases.isOk());
    std::string phaseText, ownPassText;
    for (const auto& p : summary->phases)
      phaseText += std::to_string(p.rank) + "/" + std::to_string(p.kind) + "/" + std::to_string(p.phase) + "=" +
                   std::to_string(p.busyNs) + "\n";
    for (const auto& p : *phases)
      ownPassText += std::to_string(p.rank) + "/" + std::to_string(p.kind) + "/" + std::to_string(p.phase) + "=" +
                     std::to_string(p.busyNs) + "\n";
    EXPECT_EQ(phaseText, ownPassText) << path;
    return std::pair{std::move(*breakdown), phaseText};
  };
  const auto [expected, expectedPhases] = read(interleaved, "1");
  ASSERT_EQ(expected.ranks.size(), 4u);
  ASSERT_FALSE(expectedPhases.empty());
  for (const auto& path : {byRank, interleaved})
    for (const char* threads : {"1", "3"}) {
      SCOPED_TRACE(path.filename().string() + ", threads " + threads);
      const auto [got, gotPhases] = read(path, threads);
      expectSameBreakdown(expected, got);
      EXPECT_EQ(gotPhases, expectedPhases);
    }
}

// Records that change after the summaries were written make them stale: the analyses read the records again.
TEST(Summary, StaleOrForeignSummariesAreIgnored) {
  const auto dir = testing::testDir();
  const auto file = dir / "run.db";
  ASSERT_TRUE(testing::writeRun(file, testing::RunSpec{}));
  ASSERT_TRUE(writeRunSummary(file));
  int64_t computeBefore = 0;
  {
    auto r = openRun(file);
    ASSERT_TRUE(r);
    auto b = computeBreakdown(*r);
    ASSERT_TRUE(b.isOk() && !b->steps.empty());
    computeBefore = b->steps.front().time.computeNs;
    auto other = tracedb::readSummary(*r, kSummaryVersion + 1);
    ASSERT_TRUE(other.isOk());
    EXPECT_FALSE(other->has_value()) << "summaries of another definition are not used";
  }
  // One more long compute span on rank 0, written behind tpscope's back.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(file.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "INSERT INTO spans(rank, thread, kind, name, begin_ns, dur_ns, step, layer, phase) "
                         "SELECT rank, thread, 0, name, begin_ns, dur_ns, step, -1, 1 FROM spans "
                         "WHERE rank = 0 AND kind = 4 ORDER BY begin_ns LIMIT 1",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto r = openRun(file);
  ASSERT_TRUE(r);
  auto stale = tracedb::readSummary(*r, kSummaryVersion);
  ASSERT_TRUE(stale.isOk());
  EXPECT_FALSE(stale->has_value()) << "the span table grew since the summaries were written";
  auto fromRecords = computeBreakdownFromRecords(*r);
  auto used = computeBreakdown(*r);
  ASSERT_TRUE(fromRecords.isOk() && used.isOk());
  expectSameBreakdown(*fromRecords, *used);
  // The new span covers the whole first step of rank 0: the figure read now includes it.
  ASSERT_FALSE(used->steps.empty());
  EXPECT_GT(used->steps.front().time.computeNs, computeBefore);
}

TEST(Summary, ANonTraceFileIsAnErrorNotACrash) {
  const auto dir = testing::testDir();
  const auto file = dir / "notes.db";
  std::ofstream(file) << "not a trace";
  const tracedb::Status s = writeRunSummary(file);
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("notes.db"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tpscope::analysis
