// The `tpscope` executable end to end: exit codes, error messages naming the file, read-only SQL, golden text.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "golden.h"
#include "test_runs.h"
#include "tpscope/tracedb/writer.h"

namespace tpscope::cli {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / "tpscope-cli-test" / info->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  // Runs `tpscope ARGS` in the test folder (so that file names in the output are relative and stable), with the
  // environment assignments `env` ("NAME=value ...") where given.
  Outcome tpscope(const std::string& args, const std::string& env = "") {
    const std::string cmd =
        "cd '" + dir_.string() + "' && " + env + " '" TPSCOPE_CLI "' " + args + " >stdout.txt 2>stderr.txt";
    Outcome r;
    const int status = std::system(cmd.c_str());
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(dir_ / "stdout.txt");
    r.err = slurp(dir_ / "stderr.txt");
    return r;
  }

  fs::path make(const std::string& name, const testing::RunSpec& spec = {}) {
    const auto p = dir_ / name;
    const auto s = testing::writeRun(p, spec);
    EXPECT_TRUE(s) << s.message();
    return p;
  }

  void expectGolden(const std::string& name, const std::string& text) {
    EXPECT_TRUE(testing::matchesGolden(TPSCOPE_GOLDEN_DIR, TPSCOPE_ACTUAL_DIR, name, text));
  }

  fs::path dir_;
};

testing::RunSpec nanSpec() {
  testing::RunSpec s;
  s.nanRank = 2;
  s.nanStep = 5;
  s.nanLayer = 1;
  return s;
}

testing::RunSpec hangSpec() {
  testing::RunSpec s;
  s.hangGroup = "tp-0";
  s.hangRank = 1;
  s.hangSeq = 7;
  return s;
}

TEST_F(Cli, UsageErrorsExit2) {
  EXPECT_EQ(tpscope("").rc, 2);
  EXPECT_EQ(tpscope("report").rc, 2);
  EXPECT_EQ(tpscope("frobnicate x").rc, 2);
  EXPECT_EQ(tpscope("diagnose x.db --fail-on fatal").rc, 2);
  const Outcome help = tpscope("--help");
  EXPECT_EQ(help.rc, 0);
  EXPECT_NE(help.out.find("Exit codes"), std::string::npos);
}

TEST_F(Cli, BadFilesAreNamedAndExit2) {
  {
    std::ofstream(dir_ / "empty.db");
    std::ofstream rnd(dir_ / "random.db", std::ios::binary);
    std::mt19937 gen(7);
    for (int i = 0; i < 8192; ++i) rnd.put(static_cast<char>(gen() & 0xff));
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ / "other.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES (1);", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  make("newer.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir_ / "newer.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"missing.db", "no such file"},
      {"empty.db", "empty"},
      {"random.db", "not a database"},
      {"other.db", "not a tpscope trace"},
      {"newer.db", "newer"},
  };
  for (const std::string command : {"report", "diagnose", "desync", "alerts", "sql"}) {
    for (const auto& [file, problem] : cases) {
      const Outcome r = tpscope(command + " " + file + (command == "sql" ? " 'SELECT 1'" : ""));
      EXPECT_EQ(r.rc, 2) << command << " " << file;
      EXPECT_NE(r.err.find(file), std::string::npos) << command << " " << file << ": " << r.err;
      EXPECT_NE(r.err.find(problem), std::string::npos) << command << " " << file << ": " << r.err;
      EXPECT_TRUE(r.out.empty()) << r.out;
    }
  }
  EXPECT_EQ(tpscope("diff healthy.db random.db").rc, 2);
}

TEST_F(Cli, SqlRunsReadOnlyQueriesAndRefusesWrites) {
  make("run.db");
  const Outcome ok = tpscope("sql run.db 'SELECT rank, count(*) AS n FROM spans GROUP BY rank ORDER BY rank'");
  ASSERT_EQ(ok.rc, 0) << ok.err;
  EXPECT_NE(ok.out.find("rank  n"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("(4 rows)"), std::string::npos) << ok.out;
  const Outcome json = tpscope("sql run.db 'SELECT count(*) AS n FROM collectives' --json");
  ASSERT_EQ(json.rc, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)[0]["n"], 4 * 8 * 9);  // 4 ranks × 8 steps × (8 TP + 1 DP)
  for (const std::string q : {"DELETE FROM spans", "INSERT INTO meta VALUES (1, 2)", "DROP TABLE spans",
                              "UPDATE spans SET rank = 9", "CREATE TABLE x(y)", "SELECT 1; DELETE FROM spans",
                              "ATTACH 'other.db' AS o", "PRAGMA user_version = 5"}) {
    const Outcome r = tpscope("sql run.db \"" + q + "\"");
    EXPECT_EQ(r.rc, 2) << q;
    EXPECT_TRUE(r.err.find("refused") != std::string::npos || r.err.find("only one statement") != std::string::npos)
        << q << ": " << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "other.db"));
  const Outcome after = tpscope("sql run.db 'SELECT count(*) FROM spans' --tsv");
  EXPECT_EQ(after.out, "count(*)\n" + std::to_string(4 * 8 * testing::spansPerRankStep({})) + "\n");
  const Outcome bad = tpscope("sql run.db 'SELECT nope FROM spans'");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("no such column"), std::string::npos) << bad.err;
}

TEST_F(Cli, DiagnoseTextJsonAndFailOn) {
  make("nan.db", nanSpec());
  make("hang.db", hangSpec());
  make("healthy.db");
  const Outcome text = tpscope("diagnose nan.db");
  ASSERT_EQ(text.rc, 0) << text.err;
  expectGolden("diagnose_nan.txt", text.out);
  const Outcome json = tpscope("diagnose hang.db --json");
  ASSERT_EQ(json.rc, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["file"], "hang.db");
  const auto& first = j["findings"][0];
  EXPECT_EQ(first["kind"], "hang");
  EXPECT_EQ(first["severity"], "critical");
  EXPECT_EQ(first["rank"], 1);
  EXPECT_EQ(first["collective"]["group"], "tp-0");
  EXPECT_EQ(first["collective"]["seq"], 7);
  EXPECT_EQ(tpscope("diagnose hang.db --fail-on critical").rc, 7);
  EXPECT_EQ(tpscope("diagnose healthy.db --fail-on warning").rc, 0);
  EXPECT_EQ(tpscope("diagnose healthy.db --fail-on info").rc, 7);
}

TEST_F(Cli, ReportTextAndJson) {
  testing::RunSpec straggler;
  straggler.stragglerRank = 3;
  make("straggler.db", straggler);
  const Outcome text = tpscope("report straggler.db");
  ASSERT_EQ(text.rc, 0) << text.err;
  expectGolden("report_straggler.txt", text.out);
  const Outcome json = tpscope("report straggler.db --json");
  ASSERT_EQ(json.rc, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["ranks"].size(), 4u);
  for (const char* key : {"rank", "compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns", "comm_overhead_pct"})
    EXPECT_TRUE(j["ranks"][0].contains(key)) << key;
  ASSERT_EQ(j["collectives"].size(), 4u);
  for (const char* key : {"group", "op", "count", "bytes", "total_ns", "algbw_gbps", "busbw_gbps"})
    EXPECT_TRUE(j["collectives"][0].contains(key)) << key;
  EXPECT_EQ(j["stragglers"]["ranks"][0]["rank"], 3);
}

TEST_F(Cli, DesyncOfHang) {
  make("hang.db", hangSpec());
  const Outcome r = tpscope("desync hang.db");
  ASSERT_EQ(r.rc, 0) << r.err;
  expectGolden("desync_hang.txt", r.out);
}

TEST_F(Cli, AlertsInTimeOrder) {
  {
    tracedb::CreateOptions o;
    o.runId = "a";
    auto w = tracedb::Writer::create(dir_ / "alerts.db", o);
    ASSERT_TRUE(w) << w.error();
    tracedb::AlertRow a;
    a.rank = 2;
    a.step = 5;
    a.tsNs = 200;
    a.severity = "critical";
    a.kind = "nonfinite_grad";
    a.layer = 1;
    a.param = "layers.1.mlp.fc1.weight";
    a.message = "3 NaN in the gradient";
    a.evidence = R"({"nan_count": 3})";
    ASSERT_TRUE((*w)->addAlert(a));
    a.rank = 0;
    a.tsNs = 100;
    a.severity = "warning";
    a.kind = "grad_spike";
    a.message = "grad norm 12x the median";
    ASSERT_TRUE((*w)->addAlert(a));
    ASSERT_TRUE((*w)->close());
  }
  const Outcome r = tpscope("alerts alerts.db");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_LT(r.out.find("grad_spike"), r.out.find("nonfinite_grad")) << r.out;
  const Outcome crit = tpscope("alerts alerts.db --min-severity error --json");
  ASSERT_EQ(crit.rc, 0) << crit.err;
  const auto j = nlohmann::json::parse(crit.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["kind"], "nonfinite_grad");
  EXPECT_EQ(j[0]["evidence"]["nan_count"], 3);
}

TEST_F(Cli, MergeRankFilesThenReport) {
  fs::create_directories(dir_ / "cap");
  for (int rank = 0; rank < 2; ++rank) {
    tracedb::CreateOptions o;
    o.runId = "merge-run";
    auto w = tracedb::Writer::create(dir_ / "cap" / ("rank-" + std::to_string(rank) + ".db"), o);
    ASSERT_TRUE(w) << w.error();
    tracedb::RankInfo ri;
    ri.rank = rank;
    ri.worldSize = 2;
    ASSERT_TRUE((*w)->putRank(ri));
    const uint32_t name = *(*w)->intern("fwd");
    ASSERT_TRUE((*w)->addSpan({rank, 0, tracedb::SpanKind::Compute, name, 1000, 500, 0, 0, tracedb::Phase::Forward,
                               std::nullopt}));
    tracedb::CollectiveRow c;
    c.rank = rank;
    c.group = "tp-0";
    c.seq = 1;
    c.op = "all_reduce";
    c.bytes = 1024;
    c.enqueueNs = 1500 + rank * 100;
    c.startNs = c.enqueueNs;
    c.endNs = 1800;
    c.state = tracedb::CollectiveState::Completed;
    ASSERT_TRUE((*w)->upsertCollective(c));
    ASSERT_TRUE((*w)->close());
  }
  const Outcome m = tpscope("merge cap -o run.db");
  ASSERT_EQ(m.rc, 0) << m.err;
  EXPECT_NE(m.out.find("merged 2 ranks"), std::string::npos) << m.out;
  const Outcome r = tpscope("report run.db --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ranks"].size(), 2u);
  fs::create_directories(dir_ / "none");
  const Outcome empty = tpscope("merge none -o x.db");
  EXPECT_EQ(empty.rc, 2);
  EXPECT_NE(empty.err.find("none"), std::string::npos) << empty.err;
  const Outcome bad = tpscope("merge cap/rank-0.db missing.db -o y.db");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("missing.db"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(dir_ / "y.db"));
}

TEST_F(Cli, DiagnoseCaptureFoldersWithoutMerging) {
  testing::RunSpec spec = nanSpec();
  spec.steps = 30;
  spec.stragglerRank = 3;
  ASSERT_TRUE(testing::writeRankFiles(dir_ / "node0", spec));
  // Two nodes' folders: ranks 2 and 3 in the second.
  fs::create_directories(dir_ / "node1");
  for (const char* f : {"rank-2.db", "rank-3.db"}) fs::rename(dir_ / "node0" / f, dir_ / "node1" / f);
  ASSERT_EQ(tpscope("merge node0 node1 -o run.db").rc, 0);
  const Outcome merged = tpscope("diagnose run.db --json");
  ASSERT_EQ(merged.rc, 0) << merged.err;
  fs::create_directories(dir_ / "tmp");
  const std::string tmp = "TMPDIR='" + (dir_ / "tmp").string() + "'";
  // Folders in any order.
  const Outcome direct = tpscope("diagnose node1 node0 --json", tmp);
  ASSERT_EQ(direct.rc, 0) << direct.err;
  EXPECT_TRUE(fs::is_empty(dir_ / "tmp"));  // the diagnosis file is removed
  auto a = nlohmann::json::parse(merged.out), b = nlohmann::json::parse(direct.out);
  EXPECT_EQ(b["file"], "node1 node0");
  a.erase("file");
  b.erase("file");
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a["findings"].empty());
  EXPECT_EQ(tpscope("diagnose run.db").out, tpscope("diagnose node0 node1").out);
  EXPECT_EQ(tpscope("diagnose node0 node1 --fail-on critical").rc, 7);
  // Bad input: named, exit 2, and no diagnosis file left behind.
  fs::create_directories(dir_ / "none");
  const Outcome empty = tpscope("diagnose none");
  EXPECT_EQ(empty.rc, 2);
  EXPECT_NE(empty.err.find("no rank-*.db files"), std::string::npos) << empty.err;
  std::ofstream(dir_ / "node1" / "rank-7.db") << "not a trace";
  const Outcome bad = tpscope("diagnose node0 node1", tmp);
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("rank-7.db"), std::string::npos) << bad.err;
  EXPECT_TRUE(bad.out.empty()) << bad.out;
  EXPECT_TRUE(fs::is_empty(dir_ / "tmp"));
}

TEST_F(Cli, DiagnoseOfFoldersStoppedBySignalLeavesNothing) {
  testing::RunSpec spec;
  spec.tp = 2;
  spec.dp = 32;
  spec.steps = 40;
  ASSERT_TRUE(testing::writeRankFiles(dir_ / "cap", spec));
  const fs::path tmp = dir_ / "tmp";
  fs::create_directories(tmp);
  for (int sig : {SIGTERM, SIGINT}) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setenv("TMPDIR", tmp.c_str(), 1);
      if (!std::freopen("/dev/null", "w", stdout)) ::_exit(126);
      ::execl(TPSCOPE_CLI, "tpscope", "diagnose", (dir_ / "cap").c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Wait until the diagnosis file's folder holds a file, then stop the command.
    bool writing = false;
    for (int i = 0; i < 20000 && !writing; ++i) {
      std::error_code ec;
      for (const auto& d : fs::directory_iterator(tmp, ec))
        if (!fs::is_empty(d.path(), ec)) writing = true;
      if (!writing) ::usleep(500);
    }
    EXPECT_TRUE(writing);
    ::kill(pid, sig);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status;
    EXPECT_TRUE(fs::is_empty(tmp)) << fs::directory_iterator(tmp)->path();
  }
}

TEST_F(Cli, DiffSaysWhatGotSlower) {
  make("a.db");
  testing::RunSpec slow;
  slow.stragglerRank = 3;
  make("b.db", slow);
  const Outcome r = tpscope("diff a.db b.db");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("step time"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("slower"), std::string::npos) << r.out;
  expectGolden("diff_straggler.txt", r.out);
  const Outcome json = tpscope("diff a.db b.db --json");
  ASSERT_EQ(json.rc, 0);
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["entries"][0]["what"], "step time");
  EXPECT_GT(j["entries"][0]["b"].get<double>(), j["entries"][0]["a"].get<double>());
}

#if TPSCOPE_HAVE_FORMATS
TEST_F(Cli, ExportChromeAndRefuseBadInput) {
  make("run.db", hangSpec());
  const Outcome r = tpscope("export run.db --format chrome -o run.json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(slurp(dir_ / "run.json"));
  EXPECT_FALSE(j["traceEvents"].empty());
  std::ofstream(dir_ / "empty.db");
  const Outcome bad = tpscope("export empty.db --format chrome -o out.json");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("empty.db"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "out.json"));
  EXPECT_EQ(tpscope("export run.db --format perfetto -o out.json").rc, 2);
  const Outcome unwritable = tpscope("export run.db -o no/such/dir/out.json");
  EXPECT_EQ(unwritable.rc, 6) << unwritable.err;
}

TEST_F(Cli, ImportKinetoThenReport) {
  std::ofstream(dir_ / "rank0.json") << R"({"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 50.0},
    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 70.0, "dur": 20.0,
     "args": {"Collective name": "allreduce", "In msg nelems": 256, "Out msg nelems": 256, "Group size": 1,
              "dtype": "Float", "Process Group Name": "0", "Process Group Ranks": "[0]", "Seq": 1}}
  ], "distributedInfo": {"rank": 0, "world_size": 1}})";
  const Outcome r = tpscope("import kineto rank0.json -o imported.db");
  ASSERT_EQ(r.rc, 0) << r.err;
  const Outcome rep = tpscope("report imported.db --json");
  ASSERT_EQ(rep.rc, 0) << rep.err;
  EXPECT_EQ(nlohmann::json::parse(rep.out)["ranks"].size(), 1u);
  std::ofstream(dir_ / "garbage.json") << "{ not json";
  const Outcome bad = tpscope("import kineto garbage.json -o g.db");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("garbage.json"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(dir_ / "g.db"));
}

// import flight-recorder DIR: two ranks' JSON dumps, rank 1 never joins seq 2; desync names it. A truncated pickle
// exits 2 naming the file and leaves no output.
TEST_F(Cli, ImportFlightRecorderThenDesync) {
  fs::create_directories(dir_ / "fr");
  auto entry = [](int seq, const char* state) {
    return nlohmann::json{{"record_id", seq - 1}, {"process_group", {"0", "default_pg"}}, {"collective_seq_id", seq},
                          {"p2p_seq_id", 0}, {"profiling_name", "nccl:all_reduce"},
                          {"time_created_ns", 1700000000000000000 + seq * 1000}, {"input_sizes", {{4}}},
                          {"input_dtypes", {"Float"}}, {"output_sizes", {{4}}}, {"output_dtypes", {"Float"}},
                          {"state", state}, {"time_discovered_started_ns", 0}, {"time_discovered_completed_ns", 0},
                          {"retired", false}, {"is_p2p", false}};
  };
  auto dump = [](nlohmann::json entries) {
    return nlohmann::json{{"version", "2.10"},
                          {"pg_config", {{"0", {{"name", "0"}, {"desc", "default_pg"}, {"ranks", "[0, 1]"}}}}},
                          {"entries", std::move(entries)}};
  };
  std::ofstream(dir_ / "fr" / "nccl_trace_rank_0.json") << dump({entry(1, "completed"), entry(2, "scheduled")});
  std::ofstream(dir_ / "fr" / "nccl_trace_rank_1.json") << dump({entry(1, "completed")});
  const Outcome r = tpscope("import flight-recorder fr -o fr.db");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("imported 2 ranks from 2 Flight Recorder dumps (json, version 2.10)"), std::string::npos)
      << r.out;
  const Outcome d = tpscope("desync fr.db");
  ASSERT_EQ(d.rc, 0) << d.err;
  EXPECT_NE(d.out.find("group 0:default_pg (ranks 0, 1): STUCK at seq 2"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("never entered"), std::string::npos) << d.out;
  fs::create_directories(dir_ / "bad");
  std::ofstream(dir_ / "bad" / "nccl_trace_rank_0", std::ios::binary) << std::string("\x80\x02}(X\x07\x00\x00", 8);
  const Outcome bad = tpscope("import flight-recorder bad -o b.db");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("nccl_trace_rank_0"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(dir_ / "b.db"));
}
#endif

// report --html: one line naming the file on success; a bad run exits 2 and an unwritable output 6, each with one
// error line and no file (nor temporary file) left behind. The page itself is tested in tests/analysis and, in a
// browser, by html_browser_test.
TEST_F(Cli, ReportHtml) {
  make("nan.db", nanSpec());
  const Outcome ok = tpscope("report nan.db --html nan.html");
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(ok.out.rfind("wrote nan.html (", 0), 0u) << ok.out;
  const std::string html = slurp(dir_ / "nan.html");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("nan_origin"), std::string::npos);

  const Outcome bad = tpscope("report missing.db --html missing.html");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("missing.db"), std::string::npos);
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  EXPECT_FALSE(fs::exists(dir_ / "missing.html"));

  const Outcome unwritable = tpscope("report nan.db --html no/such/dir/out.html");
  EXPECT_EQ(unwritable.rc, 6);
  EXPECT_NE(unwritable.err.find("no/such/dir/out.html: cannot create the report"), std::string::npos)
      << unwritable.err;
  EXPECT_EQ(std::count(unwritable.err.begin(), unwritable.err.end(), '\n'), 1) << unwritable.err;
  EXPECT_TRUE(unwritable.out.empty());

  EXPECT_EQ(tpscope("report nan.db --html x.html --json").rc, 2);
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

}  // namespace
}  // namespace tpscope::cli
