// `importFlightRecorder` on real PyTorch 2.15 Flight Recorder dumps (fixtures/flight_recorder, written by its
// make_dumps.py: Gloo ranks on loopback, every rank in both forms) and on hand-made dumps of the cases the real
// ones cannot show (older versions, NCCL's P2P and coalesced entries, states, truncated and hostile files). Each
// scenario is checked through what a user reads: the collectives table, and the findings of the desync analysis
// that `tpscope desync` / `diagnose` print.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flight_recorder_value.h"
#include "test_support.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/formats/flight_recorder_import.h"
#include "tpscope/tracedb/reader.h"

namespace tpscope::formats {
namespace {

using namespace tpscope::formats::testing;
using analysis::Finding;
using analysis::FindingKind;
using analysis::Severity;
using nlohmann::json;

fs::path dumps(const std::string& scenario, const std::string& form) {
  return fixture("flight_recorder") / scenario / form;
}

struct Imported {
  std::vector<tracedb::CollectiveRow> collectives;
  std::vector<tracedb::GroupInfo> groups;
  std::vector<Finding> findings;
  std::vector<std::string> errors;
};

Imported importAndDiagnose(const fs::path& dir, const fs::path& out) {
  Imported r;
  auto stats = importFlightRecorder(dir, out);
  EXPECT_TRUE(stats) << (stats ? "" : stats.error());
  if (!stats) return r;
  auto reader = tracedb::Reader::open(out);
  EXPECT_TRUE(reader) << (reader ? "" : reader.error());
  if (!reader) return r;
  auto rows = (*reader)->collectives();
  EXPECT_TRUE(rows);
  if (rows) r.collectives = *rows;
  auto groups = (*reader)->groups();
  if (groups) r.groups = *groups;
  auto diag = analysis::diagnose(**reader);
  r.findings = diag.findings;
  r.errors = diag.errors;
  return r;
}

const tracedb::CollectiveRow* row(const Imported& r, int rank, const std::string& group, int64_t seq) {
  for (const auto& c : r.collectives)
    if (c.rank == rank && c.group == group && c.seq == seq) return &c;
  return nullptr;
}

std::vector<const Finding*> findingsOf(const Imported& r, FindingKind kind) {
  std::vector<const Finding*> out;
  for (const auto& f : r.findings)
    if (f.kind == kind) out.push_back(&f);
  return out;
}

std::string detailsOf(const Finding& f) {
  std::string s = f.message;
  for (const auto& d : f.details) s += "\n" + d;
  return s;
}

class RealDumps : public ::testing::TestWithParam<std::string> {};

TEST_P(RealDumps, HealthyRunHasEveryCollectiveAndNoFinding) {
  ScratchDir dir;
  const Imported r = importAndDiagnose(dumps("healthy", GetParam()), dir / "run.db");
  EXPECT_TRUE(r.errors.empty());
  EXPECT_TRUE(r.findings.empty()) << (r.findings.empty() ? "" : detailsOf(r.findings.front()));
  ASSERT_EQ(r.collectives.size(), 20u);  // 6 in the world group on 3 ranks, 1 all-gather in [0, 1] on 2
  ASSERT_EQ(r.groups.size(), 2u);
  EXPECT_EQ(r.groups[0].name, "0:default_pg");
  EXPECT_EQ(r.groups[0].ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(r.groups[0].backend, "gloo");
  EXPECT_EQ(r.groups[1].name, "1:tp0");
  EXPECT_EQ(r.groups[1].ranks, (std::vector<int>{0, 1}));
  const std::vector<std::string> ops = {"all_reduce", "all_reduce", "all_reduce", "all_to_all", "broadcast", "barrier"};
  for (int rank = 0; rank < 3; ++rank)
    for (int seq = 1; seq <= 6; ++seq) {
      const auto* c = row(r, rank, "0:default_pg", seq);
      ASSERT_NE(c, nullptr) << rank << " " << seq;
      EXPECT_EQ(c->op, ops[seq - 1]);
      EXPECT_EQ(c->state, tracedb::CollectiveState::Completed);  // Gloo: retired without times = finished
      EXPECT_FALSE(c->startNs);                                 // Gloo records no discovery times
      EXPECT_EQ(c->dtype, seq == 6 ? "" : "float32");
    }
  // the coalesced pair (2 + 5 elements) is one row, shape: each tensor's numel
  const auto* coalesced = row(r, 1, "0:default_pg", 3);
  EXPECT_EQ(coalesced->numel, 7);
  EXPECT_EQ(coalesced->shape, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(coalesced->bytes, 28);
  // the uneven all_to_all_single: rank r sends (r + 1) + (r + 2) + (r + 3) elements
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(row(r, rank, "0:default_pg", 4)->numel, 3 * rank + 6);
  EXPECT_EQ(row(r, 0, "1:tp0", 1)->op, "all_gather");
  EXPECT_EQ(row(r, 2, "1:tp0", 1), nullptr);
  // the pickle's stack frames name the caller's line in make_dumps.py; the JSON has none
  const std::string& callsite = row(r, 0, "0:default_pg", 1)->callsite;
  if (GetParam() == "pickle") {
    EXPECT_EQ(callsite.rfind("gloo:all_reduce at healthy (make_dumps.py:", 0), 0u) << callsite;
    // the coalescing manager's __exit__ (contextlib) is library code: the caller's own frame is named
    EXPECT_NE(row(r, 0, "0:default_pg", 3)->callsite.find("at healthy (make_dumps.py:"), std::string::npos)
        << row(r, 0, "0:default_pg", 3)->callsite;
  } else {
    EXPECT_EQ(callsite, "gloo:all_reduce");
  }
}

TEST_P(RealDumps, RankThatSkipsACollectiveIsNamedWithItsLastEntry) {
  ScratchDir dir;
  const Imported r = importAndDiagnose(dumps("skip", GetParam()), dir / "run.db");
  const auto hangs = findingsOf(r, FindingKind::Hang);
  ASSERT_EQ(hangs.size(), 1u);
  const Finding& h = *hangs.front();
  EXPECT_EQ(h.severity, Severity::Critical);
  EXPECT_EQ(h.rank, 2);
  EXPECT_EQ(h.ranks, (std::vector<int>{2}));
  ASSERT_TRUE(h.collective);
  EXPECT_EQ(h.collective->group, "0:default_pg");
  EXPECT_EQ(h.collective->seq, 3);
  EXPECT_EQ(h.collective->op, "all_reduce");
  const std::string text = detailsOf(h);
  EXPECT_NE(text.find("ranks 0, 1 entered it and never completed it"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 never entered it: its last collective is seq 2"), std::string::npos) << text;
  if (GetParam() == "pickle") {
    EXPECT_NE(text.find("gloo:all_reduce at skip (make_dumps.py:"), std::string::npos) << text;
  }
  EXPECT_TRUE(findingsOf(r, FindingKind::Desync).empty());
}

// The one desync finding of a mismatch scenario, at group 0:default_pg seq 2.
const Finding& desyncAtSeq2(const Imported& r) {
  const auto desyncs = findingsOf(r, FindingKind::Desync);
  EXPECT_EQ(desyncs.size(), 1u);
  static const Finding none;
  if (desyncs.empty()) return none;
  const Finding& d = *desyncs.front();
  EXPECT_EQ(d.severity, Severity::Critical);  // it is also where the group is stuck
  EXPECT_EQ(d.collective->group, "0:default_pg");
  EXPECT_EQ(d.collective->seq, 2);
  return d;
}

TEST_P(RealDumps, WrongSizeIsASizeMismatch) {
  ScratchDir dir;
  const Imported r = importAndDiagnose(dumps("wrong_size", GetParam()), dir / "run.db");
  const Finding& d = desyncAtSeq2(r);
  EXPECT_EQ(d.message.rfind("size_mismatch in group 0:default_pg seq 2", 0), 0u) << d.message;
  const std::string text = detailsOf(d);
  EXPECT_NE(text.find("rank 0: all_reduce float32 [4] (16 bytes)"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1: all_reduce float32 [5] (20 bytes)"), std::string::npos) << text;
  EXPECT_EQ(d.rank, 1);  // two ranks, one each: the tie goes to the second variant (desync.h)
  EXPECT_EQ(row(r, 1, "0:default_pg", 2)->numel, 5);
}

TEST_P(RealDumps, WrongDtypeIsADtypeMismatch) {
  ScratchDir dir;
  const Imported r = importAndDiagnose(dumps("wrong_dtype", GetParam()), dir / "run.db");
  const Finding& d = desyncAtSeq2(r);
  EXPECT_EQ(d.message.rfind("dtype_mismatch in group 0:default_pg seq 2", 0), 0u) << d.message;
  const std::string text = detailsOf(d);
  EXPECT_NE(text.find("rank 0: all_reduce float32 [4]"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1: all_reduce float64 [4] (32 bytes)"), std::string::npos) << text;
}

TEST_P(RealDumps, ExtraAllReduceIsATypeMismatchBlamedOnTheRankThatIssuedIt) {
  ScratchDir dir;
  const Imported r = importAndDiagnose(dumps("extra_allreduce", GetParam()), dir / "run.db");
  const Finding& d = desyncAtSeq2(r);
  EXPECT_EQ(d.message.rfind("collective_type_mismatch in group 0:default_pg seq 2: rank 0 disagrees", 0), 0u)
      << d.message;
  EXPECT_EQ(d.rank, 0);
  EXPECT_NE(detailsOf(d).find("rank 0 issued one collective more: its seq 3 is what the others issued at seq 2"),
            std::string::npos)
      << detailsOf(d);
}

TEST_P(RealDumps, MissingDumpIsNamedAndTheRestIsStillDecided) {
  ScratchDir dir;
  fs::create_directories(dir / "in");
  for (const auto& e : fs::directory_iterator(dumps("skip", GetParam())))
    if (e.path().filename().string().find("rank_2") == std::string::npos)
      fs::copy_file(e.path(), dir / "in" / e.path().filename());
  auto stats = importFlightRecorder(dir / "in", dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->missingRanks, (std::vector<int>{2}));  // the world group's pg_config names [0, 1, 2]
  EXPECT_NE(stats->summary().find("missing dumps: rank 2"), std::string::npos) << stats->summary();
  const Imported r = importAndDiagnose(dir / "in", dir / "run2.db");
  const auto crash = findingsOf(r, FindingKind::Crash);
  ASSERT_EQ(crash.size(), 1u);
  EXPECT_EQ(crash.front()->severity, Severity::Warning);
  EXPECT_EQ(crash.front()->ranks, (std::vector<int>{2}));
  EXPECT_NE(detailsOf(*crash.front()).find("group 0:default_pg (ranks 0–2): compared among ranks 0, 1 only"),
            std::string::npos)
      << detailsOf(*crash.front());
  // still decided: ranks 0 and 1 entered seq 3 and never completed it; nobody is said to have skipped it
  const auto hangs = findingsOf(r, FindingKind::Hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs.front()->collective->seq, 3);
  EXPECT_TRUE(hangs.front()->ranks.empty());
}

TEST_P(RealDumps, BothFormsGiveTheSameRows) {
  ScratchDir dir;
  for (const std::string scenario : {"healthy", "skip", "wrong_size", "wrong_dtype", "extra_allreduce"}) {
    const Imported p = importAndDiagnose(dumps(scenario, "pickle"), dir / (scenario + ".p.db"));
    const Imported j = importAndDiagnose(dumps(scenario, "json"), dir / (scenario + ".j.db"));
    ASSERT_EQ(p.collectives.size(), j.collectives.size()) << scenario;
    for (size_t i = 0; i < p.collectives.size(); ++i) {
      const auto &a = p.collectives[i], &b = j.collectives[i];
      // In the mismatch scenarios the last rank dumps after its peer left: its faulty collective fails, and is
      // retired, between its pickle and its JSON dump — the one state the two forms may disagree on.
      const bool raced = scenario.starts_with("wrong_") && a.rank == 1 && a.seq == 2;
      EXPECT_TRUE(a.rank == b.rank && a.group == b.group && a.seq == b.seq && a.op == b.op && a.dtype == b.dtype &&
                  a.shape == b.shape && a.numel == b.numel && (raced || a.state == b.state))
          << scenario << " row " << i;
    }
    EXPECT_EQ(p.findings.size(), j.findings.size()) << scenario;
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, RealDumps, ::testing::Values("pickle", "json"));

// ---- hand-made dumps --------------------------------------------------------------------------------------------

json entry(int64_t record, const std::string& pg, const std::string& desc, int64_t seq, const std::string& name,
           const std::string& state, std::vector<int64_t> dims = {4}) {
  return json{{"record_id", record},
              {"pg_id", 0},
              {"process_group", {pg, desc}},
              {"collective_seq_id", seq},
              {"p2p_seq_id", 0},
              {"op_id", record + 1},
              {"profiling_name", name},
              {"time_created_ns", 1'700'000'000'000'000'000 + record * 1000},
              {"input_sizes", {dims}},
              {"input_dtypes", {"Float"}},
              {"output_sizes", {dims}},
              {"output_dtypes", {"Float"}},
              {"state", state},
              {"time_discovered_started_ns", state == "scheduled" ? 0 : 1'700'000'000'000'000'500 + record * 1000},
              {"time_discovered_completed_ns", state == "completed" ? 1'700'000'000'000'000'900 + record * 1000 : 0},
              {"retired", state == "completed"},
              {"timeout_ms", 600000},
              {"is_p2p", name.find("send") != std::string::npos || name.find("recv") != std::string::npos}};
}

json ncclDump(const std::string& ranks, json entries, const std::string& version = "2.10") {
  json d = {{"version", version},
            {"comm_lib_version", "2.21.5"},
            {"pg_config", {{"0", {{"name", "0"}, {"desc", "default_pg"}, {"ranks", ranks}}}}},
            {"pg_status",
             {{"0",
               {{"last_enqueued_collective", "2"}, {"last_started_collective", "2"}, {"last_completed_collective", "1"}}}}}};
  if (!entries.empty()) d["entries"] = std::move(entries);
  return d;
}

void writeDump(const fs::path& dir, int rank, const json& d) {
  fs::create_directories(dir);
  writeFile(dir / ("nccl_trace_rank_" + std::to_string(rank) + ".json"), d.dump());
}

TEST(FlightRecorderImport, OlderVersionWithNullTimesRanksAsStringAndAStateMismatch) {
  ScratchDir dir;
  // 2.3: no dtypes; times null rather than 0; one rank completed seq 2, the other only scheduled it
  auto old = [](json e) {
    e.erase("input_dtypes");
    e.erase("output_dtypes");
    e.erase("is_p2p");
    if (e["time_discovered_started_ns"] == 0) e["time_discovered_started_ns"] = nullptr;
    if (e["time_discovered_completed_ns"] == 0) e["time_discovered_completed_ns"] = nullptr;
    return e;
  };
  writeDump(dir / "in", 0,
            ncclDump("[0, 1]", {old(entry(0, "0", "default_pg", 1, "nccl:all_reduce", "completed")),
                                old(entry(1, "0", "default_pg", 2, "nccl:all_reduce", "completed"))},
                     "2.3"));
  writeDump(dir / "in", 1,
            ncclDump("[0, 1]", {old(entry(0, "0", "default_pg", 1, "nccl:all_reduce", "completed")),
                                old(entry(1, "0", "default_pg", 2, "nccl:all_reduce", "scheduled"))},
                     "2.3"));
  const Imported r = importAndDiagnose(dir / "in", dir / "run.db");
  ASSERT_EQ(r.collectives.size(), 4u);
  const auto* pending = row(r, 1, "0:default_pg", 2);
  ASSERT_NE(pending, nullptr);
  EXPECT_EQ(pending->state, tracedb::CollectiveState::Scheduled);
  EXPECT_FALSE(pending->startNs);
  EXPECT_FALSE(pending->endNs);
  EXPECT_EQ(pending->dtype, "");
  const auto* done = row(r, 0, "0:default_pg", 2);
  EXPECT_EQ(done->state, tracedb::CollectiveState::Completed);
  EXPECT_EQ(*done->startNs, 1500);  // ns since the earliest time_created_ns
  EXPECT_EQ(*done->endNs, 1900);
  const auto hangs = findingsOf(r, FindingKind::Hang);
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs.front()->collective->seq, 2);
  EXPECT_NE(detailsOf(*hangs.front()).find("rank 1 entered it and never completed it"), std::string::npos);
  EXPECT_TRUE(findingsOf(r, FindingKind::Desync).empty());
}

TEST(FlightRecorderImport, NcclCoalescedGroupIsOneRowAndMatches) {
  ScratchDir dir;
  for (int rank = 0; rank < 2; ++rank) {
    json e = {entry(0, "0", "default_pg", 1, "nccl:all_reduce", "completed"),
              entry(1, "0", "default_pg", 2, "nccl:all_reduce", "scheduled", {2}),
              entry(2, "0", "default_pg", 2, "nccl:all_reduce", "scheduled", {6}),
              entry(3, "0", "default_pg", 2, "nccl:coalesced", "completed", {})};
    e[3]["input_sizes"] = json::array();
    e[3]["output_sizes"] = json::array();
    writeDump(dir / "in", rank, ncclDump("[0, 1]", e));
  }
  const Imported r = importAndDiagnose(dir / "in", dir / "run.db");
  ASSERT_EQ(r.collectives.size(), 4u);
  const auto* c = row(r, 1, "0:default_pg", 2);
  EXPECT_EQ(c->op, "all_reduce");
  EXPECT_EQ(c->numel, 8);
  EXPECT_EQ(c->shape, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(c->state, tracedb::CollectiveState::Completed);  // the "coalesced" entry's state is the call's
  EXPECT_TRUE(r.findings.empty()) << (r.findings.empty() ? "" : detailsOf(r.findings.front()));
}

TEST(FlightRecorderImport, P2pPairsAreMatchedAndAPeerMismatchIsNamed) {
  ScratchDir dir;
  // matched: rank 0 sends to 1, rank 1 receives from 0
  writeDump(dir / "ok", 0, ncclDump("[0, 1]", {entry(0, "0", "default_pg", 0, "nccl:send 0->1", "completed")}));
  writeDump(dir / "ok", 1, ncclDump("[0, 1]", {entry(0, "0", "default_pg", 0, "nccl:recv 1<-0", "completed")}));
  const Imported ok = importAndDiagnose(dir / "ok", dir / "ok.db");
  ASSERT_EQ(ok.collectives.size(), 2u);
  EXPECT_EQ(row(ok, 0, "p2p-0-1", 1)->op, "send");
  EXPECT_EQ(row(ok, 1, "p2p-0-1", 1)->op, "recv");
  EXPECT_TRUE(ok.findings.empty()) << (ok.findings.empty() ? "" : detailsOf(ok.findings.front()));
  // mismatched: rank 0 sends to 1, but rank 1 waits for rank 2, which sends nothing
  writeDump(dir / "bad", 0, ncclDump("[0, 1, 2]", {entry(0, "0", "default_pg", 0, "nccl:send 0->1", "scheduled")}));
  writeDump(dir / "bad", 1, ncclDump("[0, 1, 2]", {entry(0, "0", "default_pg", 0, "nccl:recv 1<-2", "scheduled")}));
  writeDump(dir / "bad", 2, ncclDump("[0, 1, 2]", {entry(0, "0", "default_pg", 1, "nccl:all_reduce", "completed")}));
  const Imported bad = importAndDiagnose(dir / "bad", dir / "bad.db");
  bool named = false;
  for (const Finding* h : findingsOf(bad, FindingKind::Hang))
    if (h->collective->group == "p2p-0-1") {
      named = true;
      EXPECT_NE(detailsOf(*h).find("p2p peer mismatch: rank 0 sends to rank 1, which waits to receive from rank 2 "
                                   "instead (group p2p-2-1 seq 1)"),
                std::string::npos)
          << detailsOf(*h);
    }
  EXPECT_TRUE(named);
}

TEST(FlightRecorderImport, RingBufferWrapIsOrderedByRecordIdAndEmptyEntriesAreOmitted) {
  ScratchDir dir;
  // rank 0's ring kept seqs 5-6 (listed out of order), rank 1's seqs 4-6; rank 2 dumped no entries (no key)
  writeDump(dir / "in", 0,
            ncclDump("[0, 1, 2]", {entry(11, "0", "default_pg", 6, "nccl:broadcast", "completed"),
                                   entry(10, "0", "default_pg", 5, "nccl:all_reduce", "completed")}));
  writeDump(dir / "in", 1,
            ncclDump("[0, 1, 2]", {entry(9, "0", "default_pg", 4, "nccl:all_reduce", "completed"),
                                   entry(10, "0", "default_pg", 5, "nccl:all_reduce", "completed"),
                                   entry(11, "0", "default_pg", 6, "nccl:broadcast", "completed")}));
  writeDump(dir / "in", 2, ncclDump("[0, 1, 2]", json::array()));
  auto stats = importFlightRecorder(dir / "in", dir / "run.db");
  ASSERT_TRUE(stats) << stats.error();
  EXPECT_EQ(stats->entries, 5);
  EXPECT_TRUE(stats->missingRanks.empty());
  auto reader = tracedb::Reader::open(dir / "run.db");
  ASSERT_TRUE(reader);
  auto rows = (*reader)->collectives();
  ASSERT_TRUE(rows);
  EXPECT_EQ(rows->size(), 5u);
}

TEST(FlightRecorderImport, BadInputFailsCleanlyAndLeavesNoOutput) {
  ScratchDir dir;
  const std::string good = readFile(dumps("healthy", "pickle") / "nccl_trace_rank_0");
  writeFile(dir / "keep.db", "an earlier output");
  auto refused = [&](const std::string& bytes, const std::string& expected) {
    fs::remove_all(dir / "in");
    fs::create_directories(dir / "in");
    writeFile(dir / "in" / "nccl_trace_rank_0", bytes);
    auto r = importFlightRecorder(dir / "in", dir / "keep.db");
    ASSERT_FALSE(r) << expected;
    EXPECT_NE(r.error().find(expected), std::string::npos) << r.error();
    EXPECT_NE(r.error().find("nccl_trace_rank_0"), std::string::npos) << r.error();  // names the file
    EXPECT_EQ(readFile(dir / "keep.db"), "an earlier output");
    EXPECT_EQ(dir.entries(), (std::vector<std::string>{"in", "keep.db"}));  // no temporary file left
  };
  // a pickle cut anywhere: never a crash, always an error
  for (size_t cut : {size_t{1}, size_t{2}, size_t{3}, good.size() / 3, good.size() / 2, good.size() - 1})
    refused(good.substr(0, cut), "pickle:");
  refused(std::string("\x80\x02}"), "ends before its STOP opcode");
  refused(std::string("\x80\x02") + "cos\nsystem\n(S'true'\ntR.", "opcode 0x63 is not one of plain data");
  refused(std::string("\x80\x09}."), "pickle protocol 9");
  refused(std::string("\x80\x02h\x07."), "memo GET of key 7");
  refused(std::string("\x80\x02]X\xff\xff\xff\x7f"), "runs past the end");
  refused(std::string("\x80\x02") + std::string(200, '(') + "}.", "nest deeper");
  refused("{\"version\": \"2.10\", \"entries\": [", "not JSON");
  refused("{\"entries\": []}", "no 'version' string");
  refused("{\"version\": \"2.10\", \"entries\": [{\"record_id\": 0}]}", "'process_group' is missing");
  refused(std::string("\x80\x02]q\x00" "h\x00" "a.", 9), "not a dict");  // a list appended to itself: a cycle, no crash
  refused("GARBAGE", "neither a pickle");
  refused("", "empty file");
  // a folder without dumps, and two dumps of one rank
  fs::remove_all(dir / "in");
  fs::create_directories(dir / "in");
  writeFile(dir / "in" / "README", "no rank in this name");
  auto none = importFlightRecorder(dir / "in", dir / "out.db");
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().find("no Flight Recorder dumps"), std::string::npos) << none.error();
  writeFile(dir / "in" / "nccl_trace_rank_0", good);
  writeFile(dir / "in" / "nccl_trace_rank_0.json", readFile(dumps("healthy", "json") / "nccl_trace_rank_0.json"));
  auto twice = importFlightRecorder(dir / "in", dir / "out.db");
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.error().find("rank 0 has a dump already"), std::string::npos) << twice.error();
  EXPECT_FALSE(fs::exists(dir / "out.db"));
}

TEST(FlightRecorderPickle, ReadsThePlainTypesOfProtocols2To5) {
  // protocol 4 with a FRAME, SHORT_BINUNICODE, MEMOIZE, BINFLOAT, LONG1, TUPLE2, NEWTRUE, None, BINBYTES
  using namespace std::string_literals;
  const std::string bytes =
      "\x80\x04\x95\x30\x00\x00\x00\x00\x00\x00\x00"  // PROTO 4, FRAME
      "}\x94("                                                // EMPTY_DICT, MEMOIZE, MARK
      "\x8c\x01" "a" "\x94" "G\x3f\xf8\x00\x00\x00\x00\x00\x00"  // "a": 1.5
      "\x8c\x01" "b" "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01"  // "b": 2^64, too big for int64
      "\x8c\x01" "c" "\x8a\x02\x18\xfc"                   // "c": -1000
      "\x8c\x01" "d" "K\x01\x88\x86"                       // "d": (1, True)
      "\x8c\x01" "e" "N"                                     // "e": None
      "\x8c\x01" "f" "C\x02" "xy"                            // "f": b"xy"
      "h\x01" "\x8c\x01" "g" "u."s;                           // the memo's "a" again as a key: "a" -> "g"
  auto tree = fr::parsePickle(bytes, "test");
  ASSERT_TRUE(tree) << tree.error();
  const fr::Value& root = tree->rootValue();
  ASSERT_EQ(root.kind, fr::ValueKind::Dict);
  EXPECT_DOUBLE_EQ(tree->get(root, "a")->d, 1.5);
  EXPECT_TRUE(tree->get(root, "b")->intOverflow);
  EXPECT_EQ(tree->get(root, "c")->i, -1000);
  const fr::Value* d = tree->get(root, "d");
  ASSERT_EQ(d->kind, fr::ValueKind::Tuple);
  EXPECT_EQ(tree->at(d->items[0]).i, 1);
  EXPECT_EQ(tree->at(d->items[1]).kind, fr::ValueKind::Bool);
  EXPECT_EQ(tree->get(root, "e")->kind, fr::ValueKind::None);
  EXPECT_EQ(tree->get(root, "f")->s, "xy");
  EXPECT_EQ(root.items.size(), 14u);  // 7 keys: the memo's "a" is a key once more (the reader keeps the first)
  EXPECT_EQ(tree->get(root, "x"), nullptr);
}

}  // namespace
}  // namespace tpscope::formats
