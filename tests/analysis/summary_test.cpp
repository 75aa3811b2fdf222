// Run-file summaries (issue #17): a file with summaries must give exactly what the records give — the breakdown,
// the phase profile and every finding — and a file whose summaries are stale, of another definition or absent must
// be read from its records.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fstream>
#include <ostream>
#include <string>

#include "test_file.h"
#include "test_runs.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/report/json_output.h"
#include "tpscope/analysis/report.h"
#include "tpscope/analysis/summary.h"

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
