// The stall journal (analysis/stall_journal.h): what capture and `tpscope watch` write is what merge and the viewer
// read back — every field, the evidence, and the time moved from the watcher's clock to the run's; a line that is
// not a journal entry is an error naming it; the journals of a folder (whole job, one node's) go into the run file.
#include "tpscope/analysis/stall_journal.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_file.h"

namespace ta = tpscope::analysis;
namespace td = tpscope::tracedb;
namespace fs = std::filesystem;
using tpscope::testing::openReader;
using tpscope::testing::testDir;

namespace {

td::AlertRow stall(int rank, int64_t tsNs, const std::string& severity, int64_t seq) {
  td::AlertRow a;
  a.rank = rank;
  a.step = 3;
  a.tsNs = tsNs;
  a.severity = severity;
  a.kind = "stall";
  a.layer = -1;
  a.message = "WAITING  tp-0 seq " + std::to_string(seq) + " (embedding forward all-reduce): rank 0 blocked 1.6 s";
  a.evidence = nlohmann::json{{"stall", "waiting"}, {"group", "tp-0"}, {"seq", seq}, {"missing_ranks", {rank}}}.dump();
  return a;
}

std::string readAll(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(StallJournal, ReadsBackWhatWasWrittenOnTheRunsClock) {
  const fs::path dir = testDir();
  const fs::path file = ta::stallJournalPath(dir);
  EXPECT_EQ(file, dir / "stalls.jsonl");
  const std::vector<td::AlertRow> rows = {stall(1, 5'000'000'000, "critical", 53), stall(1, 9'000'000'000, "info", 60)};
  ASSERT_TRUE(ta::writeStallJournal(file, rows, /*epochUnixNs=*/1'000'000'000'000));
  EXPECT_FALSE(fs::exists(file.string() + ".tmp")) << "the temporary file is renamed over the journal";
  // The run's epoch 2 ms later than the watcher's clock: every time 2 ms earlier on the run's.
  auto back = ta::readStallJournal(file, 1'000'002'000'000);
  ASSERT_TRUE(back) << back.error();
  ASSERT_EQ(back->size(), 2u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const td::AlertRow& a = (*back)[i];
    EXPECT_EQ(a.rank, rows[i].rank);
    EXPECT_EQ(a.step, rows[i].step);
    EXPECT_EQ(a.tsNs, rows[i].tsNs - 2'000'000);
    EXPECT_EQ(a.severity, rows[i].severity);
    EXPECT_EQ(a.kind, "stall");
    EXPECT_EQ(a.layer, -1);
    EXPECT_EQ(a.message, rows[i].message);
    EXPECT_EQ(nlohmann::json::parse(a.evidence), nlohmann::json::parse(rows[i].evidence));
  }
  // Rewritten whole: the stall resumed, one line.
  ASSERT_TRUE(ta::writeStallJournal(file, std::vector<td::AlertRow>{rows[1]}, 1'000'000'000'000));
  back = ta::readStallJournal(file, 1'000'000'000'000);
  ASSERT_TRUE(back) << back.error();
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ(back->front().severity, "info");
}

TEST(StallJournal, ALineThatIsNotAnEntryIsAnErrorNamingIt) {
  const fs::path dir = testDir();
  const fs::path file = dir / "stalls.jsonl";
  ASSERT_TRUE(ta::writeStallJournal(file, std::vector<td::AlertRow>{stall(1, 1, "critical", 5)}, 0));
  const std::string good = readAll(file);
  for (const std::string bad : {"{\"rank\": 1}\n", "not json\n",
                                "{\"rank\": \"one\", \"ts_unix_ns\": 1, \"kind\": "
                                "\"stall\", \"severity\": \"info\", \"message\": \"\"}\n"}) {
    std::ofstream(file) << good << bad;
    auto back = ta::readStallJournal(file, 0);
    ASSERT_FALSE(back) << bad;
    EXPECT_NE(back.error().find("line 2"), std::string::npos) << back.error();
  }
  EXPECT_FALSE(ta::readStallJournal(dir / "none.jsonl", 0)) << "a missing file is an error";
}

// A folder with the whole job's journal and one node's (stalls-rank2.jsonl): both go into the run file's alerts, on
// its clock; a folder without a journal adds nothing; other files are not journals.
TEST(StallJournal, AFoldersJournalsGoIntoTheRunFile) {
  const fs::path dir = testDir();
  const fs::path run = dir / "run.db";
  {
    td::CreateOptions o;
    o.overwrite = true;
    o.runId = "t";
    o.epochUnixNs = 1'000'000'000'000;
    auto w = td::Writer::create(run, o);
    ASSERT_TRUE(w) << w.error();
    ASSERT_TRUE((*w)->close());
  }
  auto none = ta::addStallJournal(dir, run);
  ASSERT_TRUE(none) << none.error();
  EXPECT_EQ(*none, 0u);
  std::ofstream(dir / "stalls.txt") << "not a journal";
  ASSERT_TRUE(ta::writeStallJournal(ta::stallJournalPath(dir),
                                    std::vector<td::AlertRow>{stall(1, 7'000, "critical", 9)}, 1'000'000'000'000));
  ASSERT_TRUE(ta::writeStallJournal(ta::stallJournalPath(dir, 2),
                                    std::vector<td::AlertRow>{stall(3, 8'000, "info", 11)}, 1'000'000'001'000));
  EXPECT_EQ(ta::stallJournalsIn(dir), (std::vector<fs::path>{dir / "stalls-rank2.jsonl", dir / "stalls.jsonl"}));
  auto added = ta::addStallJournal(dir, run);
  ASSERT_TRUE(added) << added.error();
  EXPECT_EQ(*added, 2u);
  auto alerts = openReader(run)->alerts();
  ASSERT_TRUE(alerts) << alerts.error();
  ASSERT_EQ(alerts->size(), 2u);
  EXPECT_EQ((*alerts)[0].rank, 1);
  EXPECT_EQ((*alerts)[0].tsNs, 7'000);
  EXPECT_EQ((*alerts)[1].rank, 3);
  EXPECT_EQ((*alerts)[1].tsNs, 9'000) << "node 2's watcher's clock is 1 us after the run's epoch";
}

}  // namespace
