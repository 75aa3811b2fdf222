// Chrome Trace Event export: parsed back and checked against the run file; a golden file for a tiny run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

#include "test_support.h"
#include "tpscope/formats/chrome_export.h"
#include "tpscope/formats/kineto_import.h"
#include "tpscope/tracedb/reader.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::formats {
namespace {

using namespace testing;
using nlohmann::json;
using tracedb::CollectiveState;
using tracedb::Phase;
using tracedb::SpanKind;

// Three ranks, one TP group of two and the world group; a collective that rank 2 never finished; step stats,
// counters and an alert. Fixed run id and epoch: the export must be byte-identical every time.
void writeTinyRun(const fs::path& path) {
  tracedb::CreateOptions options;
  options.runId = "tiny-run";
  options.epochUnixNs = 1700000000000000000;
  options.source = "test";
  auto created = tracedb::Writer::create(path, options);
  ASSERT_TRUE(created) << created.error();
  auto& w = **created;
  ASSERT_TRUE(w.begin());
  for (int r = 0; r < 3; ++r) {
    tracedb::RankInfo info;
    info.rank = r;
    info.host = "node0";
    info.worldSize = 3;
    info.tpRank = r % 2;
    info.tpSize = r < 2 ? 2 : 1;
    ASSERT_TRUE(w.putRank(info));
    ASSERT_TRUE(w.putThread({r, 0, "cpu", "main"}));
    ASSERT_TRUE(w.putThread({r, 10007, "cuda-stream", "stream 7"}));
  }
  ASSERT_TRUE(w.putGroup({"tp-0", {0, 1}, "gloo"}));
  ASSERT_TRUE(w.putGroup({"world", {0, 1, 2}, "gloo"}));
  auto fwd = w.intern("forward \"layer\" 0");
  auto bwd = w.intern("backward");
  auto gemm = w.intern("gemm<float>");
  ASSERT_TRUE(fwd && bwd && gemm);
  for (int r = 0; r < 3; ++r) {
    for (int step = 0; step < 2; ++step) {
      const int64_t base = step * 1'000'000 + r * 1'500;
      tracedb::SpanRow s;
      s.rank = r;
      s.step = step;
      s.layer = 0;
      s.name = *fwd;
      s.kind = SpanKind::Compute;
      s.phase = Phase::Forward;
      s.beginNs = base;
      s.durNs = 300'250;
      ASSERT_TRUE(w.addSpan(s));
      s.name = *bwd;
      s.phase = Phase::Backward;
      s.beginNs = base + 400'000;
      s.durNs = 500'001;
      ASSERT_TRUE(w.addSpan(s));
      s.name = *gemm;
      s.kind = SpanKind::Kernel;
      s.thread = 10007;
      s.beginNs = base + 450'000;
      s.durNs = 100'000;
      s.correlation = 42 + step;
      ASSERT_TRUE(w.addSpan(s));
    }
  }
  auto collective = [&](int rank, std::string group, int64_t seq, int64_t start, std::optional<int64_t> end,
                        CollectiveState state) {
    tracedb::CollectiveRow c;
    c.rank = rank;
    c.group = std::move(group);
    c.seq = seq;
    c.op = "all_reduce";
    c.dtype = "float32";
    c.shape = {4, 256};
    c.numel = 1024;
    c.bytes = 4096;
    c.callsite = "layer0.mlp";
    c.step = 0;
    c.layer = 0;
    c.phase = Phase::Backward;
    c.enqueueNs = start - 1'000;
    if (state != CollectiveState::Scheduled) c.startNs = start;
    c.endNs = end;
    c.state = state;
    ASSERT_TRUE(w.upsertCollective(c));
  };
  collective(0, "tp-0", 0, 300'000, 320'000, CollectiveState::Completed);
  collective(1, "tp-0", 0, 301'500, 320'500, CollectiveState::Completed);
  collective(0, "world", 0, 310'000, 330'000, CollectiveState::Completed);  // overlaps tp-0 #0: second lane
  collective(1, "world", 0, 321'000, 330'200, CollectiveState::Completed);
  collective(2, "world", 0, 329'000, 330'400, CollectiveState::Completed);
  collective(0, "world", 1, 1'400'000, std::nullopt, CollectiveState::Started);  // rank 2 never arrives
  collective(1, "world", 1, 1'401'000, std::nullopt, CollectiveState::Started);
  for (int r = 0; r < 3; ++r)
    for (int step = 0; step < 2; ++step) {
      tracedb::StepStatRow s;
      s.rank = r;
      s.step = step;
      s.loss = 2.5 - step * 0.25;
      s.gradNorm = 1.0 + r * 0.5;
      s.lr = 1e-3;
      if (step == 0) s.endNs = 950'000 + r;  // step 1 has no time: placed at its last span's end
      ASSERT_TRUE(w.putStepStat(s));
    }
  ASSERT_TRUE(w.addCounter({0, "tokens_per_s", 500'000, 1234.5}));
  tracedb::AlertRow a;
  a.rank = 1;
  a.step = 1;
  a.tsNs = 1'500'000;
  a.severity = "error";
  a.kind = "hang";
  a.message = "world #1: rank 2 never entered";
  a.evidence = R"({"group":"world","seq":1})";
  ASSERT_TRUE(w.addAlert(a));
  ASSERT_TRUE(w.commit());
  ASSERT_TRUE(w.close());
}

json exportAndParse(const fs::path& run, const fs::path& out, ChromeExportStats* stats = nullptr) {
  auto result = exportChrome(run, out);
  EXPECT_TRUE(result) << result.error();
  if (!result) return json();
  if (stats) *stats = *result;
  return json::parse(readFile(out));
}

TEST(ChromeExport, TinyRunParsesBackToTheRun) {
  ScratchDir dir;
  writeTinyRun(dir / "run.db");
  ChromeExportStats stats;
  const json doc = exportAndParse(dir / "run.db", dir / "trace.json", &stats);
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc["displayTimeUnit"], "ns");
  const json& events = doc["traceEvents"];
  auto run = tracedb::Reader::open(dir / "run.db");
  ASSERT_TRUE(run);

  std::map<int, std::string> processNames;
  std::map<std::string, int> byPhase;
  int spans = 0, collectives = 0;
  std::map<int64_t, std::vector<json>> flows;
  std::map<std::pair<int, std::string>, int> counters;
  for (const auto& e : events) {
    byPhase[e["ph"].get<std::string>()]++;
    if (e["ph"] == "M" && e["name"] == "process_name") processNames[e["pid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "X" && e["cat"] != "collective") {
      ++spans;
      EXPECT_TRUE(e["args"].contains("step"));
      EXPECT_TRUE(e["args"].contains("layer"));
      EXPECT_TRUE(e["args"].contains("phase"));
    }
    if (e["ph"] == "X" && e["cat"] == "collective") {
      ++collectives;
      for (const char* key : {"group", "seq", "op", "bytes", "shape", "state"}) EXPECT_TRUE(e["args"].contains(key));
    }
    if (e["ph"] == "s" || e["ph"] == "t" || e["ph"] == "f") flows[e["id"].get<int64_t>()].push_back(e);
    if (e["ph"] == "C") counters[{e["pid"].get<int>(), e["name"].get<std::string>()}]++;
  }
  // A process per rank, named and sorted.
  EXPECT_EQ(processNames.size(), 3u);
  EXPECT_EQ(processNames[1], "rank 0 (node0) tp 0/2 dp 0/1");
  EXPECT_EQ(processNames[3], "rank 2 (node0)");
  // Event counts equal the run's.
  auto runCollectives = run.value()->collectives();
  ASSERT_TRUE(runCollectives);
  EXPECT_EQ(spans, *run.value()->spanCount());
  EXPECT_EQ(collectives, static_cast<int>(runCollectives->size()));
  EXPECT_EQ(stats.spans, spans);
  EXPECT_EQ(stats.collectives, collectives);
  // Flows: one per (group, seq) with at least two ranks, through exactly those ranks, "s" first and "f" last.
  std::map<std::pair<std::string, int64_t>, std::set<int>> ranksOf;
  for (const auto& c : *runCollectives) ranksOf[{c.group, c.seq}].insert(c.rank);
  std::set<std::string> linked;
  for (const auto& [id, chain] : flows) {
    ASSERT_GE(chain.size(), 2u);
    EXPECT_EQ(chain.front()["ph"], "s");
    EXPECT_EQ(chain.back()["ph"], "f");
    EXPECT_EQ(chain.back()["bp"], "e");
    const std::string name = chain.front()["name"];
    const auto hash = name.find('#');
    const std::pair<std::string, int64_t> key{name.substr(0, hash), std::stoll(name.substr(hash + 1))};
    std::set<int> pids;
    for (const auto& f : chain) pids.insert(f["pid"].get<int>() - 1);
    EXPECT_EQ(pids, ranksOf[key]) << name;
    EXPECT_EQ(pids.size(), chain.size()) << name;
    EXPECT_TRUE(linked.insert(name).second) << "two flows for " << name;
  }
  EXPECT_EQ(linked, (std::set<std::string>{"tp-0#0", "world#0", "world#1"}));
  EXPECT_EQ(stats.flows, 3);
  // Counters: loss and gradient norm per rank and step; the counters table.
  for (int pid = 1; pid <= 3; ++pid) {
    EXPECT_EQ((counters[{pid, "loss"}]), 2) << pid;
    EXPECT_EQ((counters[{pid, "grad_norm"}]), 2) << pid;
  }
  EXPECT_EQ((counters[{1, "tokens_per_s"}]), 1);
  EXPECT_EQ(byPhase["i"], 1);  // the alert
}

TEST(ChromeExport, TinyRunMatchesTheGoldenFile) {
  ScratchDir dir;
  writeTinyRun(dir / "run.db");
  auto result = exportChrome(dir / "run.db", dir / "trace.json");
  ASSERT_TRUE(result) << result.error();
  const fs::path golden = fs::path(TPSCOPE_FORMATS_GOLDEN) / "tiny_run.chrome.json";
  const std::string actual = readFile(dir / "trace.json");
  const std::string expected = readFile(golden);
  if (actual != expected) {
    const fs::path actualPath = golden.string() + ".actual";
    writeFile(actualPath, actual);
    const std::string diff = "diff -u '" + golden.string() + "' '" + actualPath.string() + "'";
    [[maybe_unused]] int rc = std::system(diff.c_str());
    FAIL() << "export differs from " << golden << "; wrote " << actualPath
           << " (copy it over the golden file if the change is intended)";
  }
}

TEST(ChromeExport, ImportedKinetoRunLinksTheRanks) {
  ScratchDir dir;
  std::vector<fs::path> inputs{fixture("nccl_meta_rank-0.json"), fixture("nccl_meta_rank-1.json")};
  auto imported = importKineto(inputs, dir / "run.db");
  ASSERT_TRUE(imported) << imported.error();
  const json doc = exportAndParse(dir / "run.db", dir / "trace.json");
  int spans = 0, collectives = 0;
  std::map<int64_t, std::set<int>> flowPids;
  std::set<std::string> streams;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") ++(e["cat"] == "collective" ? collectives : spans);
    if (e["ph"] == "s" || e["ph"] == "f") flowPids[e["id"].get<int64_t>()].insert(e["pid"].get<int>());
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["args"]["name"].get<std::string>().rfind("stream", 0) == 0)
      streams.insert(e["args"]["name"]);
  }
  EXPECT_EQ(spans, imported->spans);
  EXPECT_EQ(collectives, imported->collectives);
  ASSERT_EQ(flowPids.size(), 2u);  // broadcast #11 and all-reduce #12
  for (const auto& [id, pids] : flowPids) EXPECT_EQ(pids, (std::set<int>{1, 2}));
  EXPECT_EQ(streams, (std::set<std::string>{"stream 7", "stream 40"}));
}

TEST(ChromeExport, EmptyRunIsAValidEmptyTrace) {
  ScratchDir dir;
  {
    tracedb::CreateOptions options;
    options.runId = "empty";
    auto created = tracedb::Writer::create(dir / "run.db", options);
    ASSERT_TRUE(created) << created.error();
    ASSERT_TRUE((*created)->close());
  }
  ChromeExportStats stats;
  const json doc = exportAndParse(dir / "run.db", dir / "trace.json", &stats);
  ASSERT_TRUE(doc.is_object());
  EXPECT_TRUE(doc["traceEvents"].is_array());
  EXPECT_TRUE(doc["traceEvents"].empty());
  EXPECT_EQ(stats.ranks, 0);
  EXPECT_EQ(doc["otherData"]["run_id"], "empty");
}

TEST(ChromeExport, BadRunOrOutputIsAnErrorWithoutOutput) {
  ScratchDir dir;
  writeFile(dir / "garbage.db", "not a database at all");
  auto missing = exportChrome(dir / "missing.db", dir / "out.json");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("missing.db"), std::string::npos) << missing.error();
  auto garbage = exportChrome(dir / "garbage.db", dir / "out.json");
  ASSERT_FALSE(garbage);
  EXPECT_NE(garbage.error().find("garbage.db"), std::string::npos) << garbage.error();
  EXPECT_FALSE(fs::exists(dir / "out.json"));
  writeTinyRun(dir / "run.db");
  auto noFolder = exportChrome(dir / "run.db", dir / "no" / "out.json");
  ASSERT_FALSE(noFolder);
  EXPECT_NE(noFolder.error().find("does not exist"), std::string::npos) << noFolder.error();
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"garbage.db", "run.db"}));
}

}  // namespace
}  // namespace tpscope::formats
