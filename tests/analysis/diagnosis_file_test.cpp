// Diagnosis straight from rank files (writeDiagnosisFile, `tpscope diagnose DIR`): the diagnosis file keeps each
// rank's first and newest spans and summaries computed per rank file, and diagnose on it must find exactly what it
// finds on the run file `tpscope merge` writes of the same files — on runs with compound faults and on a healthy
// one, with the files on their own clocks, in one part or several.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "test_file.h"
#include "test_runs.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/report/json_output.h"
#include "tpscope/analysis/summary.h"
#include "tpscope/tracedb/merge.h"
#include "tpscope/tracedb/query.h"

namespace tpscope::analysis {
namespace {

using report::diagnosisToJson;

using testing::RunSpec;

int64_t countSpans(const std::filesystem::path& file) {
  auto reader = testing::openReader(file);
  auto n = reader ? reader->spanCount() : tracedb::Result<int64_t>(tracedb::Status::error("no reader"));
  EXPECT_TRUE(n.isOk());
  return n ? *n : -1;
}

std::string diagnosisJson(const std::filesystem::path& file) {
  auto reader = testing::openReader(file);
  if (!reader) return {};
  const DiagnoseResult result = diagnose(*reader);
  EXPECT_TRUE(result.errors.empty()) << result.errors.front();
  return diagnosisToJson(result, "run");
}

struct Case {
  std::string name;
  RunSpec spec;
};

std::vector<Case> cases() {
  RunSpec base;
  base.tp = 2;
  base.dp = 3;
  base.layers = 3;
  base.steps = 40;  // 28 spans per rank and step: 4 times as many as a diagnosis file keeps
  std::vector<Case> out;
  out.push_back({"healthy", base});
  RunSpec nanAndStraggler = base;  // two faults at once
  nanAndStraggler.nanRank = 3;
  nanAndStraggler.nanStep = 7;
  nanAndStraggler.nanLayer = 1;
  nanAndStraggler.stragglerRank = 4;
  out.push_back({"nan+straggler", nanAndStraggler});
  RunSpec hangAndSpike = base;
  hangAndSpike.hangGroup = "tp-1";
  hangAndSpike.hangRank = 3;
  hangAndSpike.hangSeq = 300;
  hangAndSpike.spikeRank = 0;
  hangAndSpike.spikeStep = 5;
  out.push_back({"hang+spike", hangAndSpike});
  RunSpec crash = base;
  crash.crashRank = 5;
  crash.crashStep = 30;
  crash.lossSpikeStep = 4;
  out.push_back({"crash+loss spike", crash});
  return out;
}

TEST(DiagnosisFile, FindsWhatTheMergedRunFileFinds) {
  const auto dir = testing::testDir();
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto folder = dir / "rank-files";
    std::filesystem::remove_all(folder);
    ASSERT_TRUE(testing::writeRankFiles(folder, c.spec));
    const auto files = tracedb::rankFiles(folder);
    ASSERT_EQ(files.size(), 6u);

    // The reference: the run file as `tpscope merge` writes it, with its summaries.
    const auto merged = dir / "merged.db";
    std::filesystem::remove(merged);
    ASSERT_TRUE(tracedb::merge(files, merged).isOk());
    ASSERT_TRUE(writeRunSummary(merged));
    const std::string expected = diagnosisJson(merged);
    ASSERT_FALSE(expected.empty());

    // One reading thread, and three (files read out of order, written in order).
    for (size_t readers : {size_t{1}, size_t{3}}) {
      SCOPED_TRACE(std::to_string(readers) + " reader(s)");
      const auto digest = dir / ("digest-" + std::to_string(readers) + ".db");
      ASSERT_TRUE(writeDiagnosisFile(files, digest, {readers}));
      // Not a copy of the run file: most spans are left out, and the breakdown comes from the summaries.
      EXPECT_EQ(countSpans(digest), 6 * (tracedb::kEndSpans + 1));
      EXPECT_GT(countSpans(merged), 2 * countSpans(digest));
      EXPECT_EQ(diagnosisJson(digest), expected);
    }
  }
}

TEST(DiagnosisFile, BreakdownEqualsTheOneComputedFromEverySpan) {
  const auto dir = testing::testDir();
  RunSpec spec = cases()[1].spec;
  ASSERT_TRUE(testing::writeRankFiles(dir / "f", spec));
  const auto files = tracedb::rankFiles(dir / "f");
  ASSERT_TRUE(tracedb::merge(files, dir / "merged.db").isOk());  // no summaries: the breakdown scans every span
  ASSERT_TRUE(writeDiagnosisFile(files, dir / "digest.db", {2}));
  auto full = testing::openReader(dir / "merged.db");
  auto digest = testing::openReader(dir / "digest.db");
  ASSERT_TRUE(full && digest);
  auto a = computeBreakdownFromRecords(*full);
  auto b = computeBreakdown(*digest);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_EQ(a->steps.size(), b->steps.size());
  ASSERT_FALSE(a->steps.empty());
  for (size_t i = 0; i < a->steps.size(); ++i) {
    EXPECT_EQ(a->steps[i].rank, b->steps[i].rank);
    EXPECT_EQ(a->steps[i].beginNs, b->steps[i].beginNs) << "step windows on the run's time base";
    EXPECT_EQ(a->steps[i].endNs, b->steps[i].endNs);
    EXPECT_EQ(a->steps[i].time.computeNs, b->steps[i].time.computeNs);
    EXPECT_EQ(a->steps[i].time.exposedCommNs, b->steps[i].time.exposedCommNs);
    EXPECT_EQ(a->steps[i].time.idleNs, b->steps[i].time.idleNs);
  }
}

TEST(DiagnosisFile, ABadRankFileFailsAndLeavesNothing) {
  const auto dir = testing::testDir();
  RunSpec spec = cases()[0].spec;
  ASSERT_TRUE(testing::writeRankFiles(dir / "f", spec));
  auto files = tracedb::rankFiles(dir / "f");
  {
    std::ofstream bad(dir / "f" / "rank-6.db", std::ios::binary);
    bad << "not a trace";
  }
  files.push_back(dir / "f" / "rank-6.db");
  for (size_t readers : {size_t{1}, size_t{3}}) {
    const auto out = dir / "digest.db";
    const tracedb::Status s = writeDiagnosisFile(files, out, {readers});
    ASSERT_FALSE(s);
    EXPECT_NE(s.message().find("rank-6.db"), std::string::npos) << s.message();
    for (const auto& e : std::filesystem::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find("digest"), std::string::npos) << e.path();
  }
  EXPECT_FALSE(writeDiagnosisFile({}, dir / "none.db"));
}

}  // namespace
}  // namespace tpscope::analysis
