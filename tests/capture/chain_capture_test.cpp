// The root-cause chain on real captures with two injected faults (issue #15): the root is the injected cause, the
// other findings hang under it or stand as roots of their own, and each cost is checked against an independent
// computation from the run file with SQL.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "capture_test_util.h"

namespace tpscope::capture_test {
namespace {

using Json = nlohmann::json;

struct Chain {
  Json diagnosis;  // the whole diagnose --json output
  const Json& roots() const { return diagnosis["chain"]; }
};

Chain diagnoseChain(const fs::path& runFile) {
  const Diagnosis d = diagnose(runFile);
  EXPECT_EQ(d.status, 0) << d.json;
  Chain c;
  c.diagnosis = Json::parse(d.json);
  return c;
}

// Every finding index the chain holds, and the links of kind `kind` anywhere in it.
void walk(const Json& link, std::set<int>& findings, std::vector<Json>& all) {
  if (link["finding"].get<int>() >= 0) findings.insert(link["finding"].get<int>());
  all.push_back(link);
  for (const auto& c : link["consequences"]) walk(c, findings, all);
}

// Every finding of warning or worse is in the chain, as a root or a consequence.
void expectLoudFindingsInChain(const Chain& c) {
  std::set<int> in;
  std::vector<Json> links;
  for (const auto& r : c.roots()) walk(r, in, links);
  const Json& fs = c.diagnosis["findings"];
  for (size_t i = 0; i < fs.size(); ++i)
    if (fs[i]["severity"] != "info") {
      EXPECT_TRUE(in.count(static_cast<int>(i))) << "not in the chain: " << fs[i].dump() << "\n" << c.roots().dump(1);
    }
}

// The end of the run as run_info.h defines it: the last span end, collective end and step_stats end.
int64_t runEndNs(Db& db) {
  return std::max({db.integer("SELECT max(begin_ns + dur_ns) FROM spans"),
                   db.integer("SELECT max(coalesce(end_ns, start_ns, enqueue_ns)) FROM collectives"),
                   db.integer("SELECT coalesce(max(end_ns), 0) FROM step_stats")});
}

// Rank 1 computes 100 ms longer every step; at step 4 rank 0's layer-1 gradients get a NaN (skip-step). The NaN is
// the root of the first incident; the straggler is a root of its own, and its waiting in tp-0 is what SQL computes
// from the arrivals: Σ over the collectives rank 1 arrived last at of the other's waiting, per step.
TEST(ChainCapture, SlowRankAndNanMakeTwoRootsSizedByTheRecords) {
  const auto dir = testDir("chain_slow_nan");
  const RunResult r = capture(dir, 2, 2, 1, 8,
                              {"--inject", "slow:rank=1,ms=100", "--inject", "nan:rank=0,step=4,layer=1,phase=bwd",
                               "--on-nonfinite", "skip-step", "--hang-timeout", "2", "--grace", "1"});
  ASSERT_EQ(r.status, 0) << r.output;
  const Chain c = diagnoseChain(dir / "run.db");
  ASSERT_GE(c.roots().size(), 2u) << c.diagnosis.dump(1);
  const Json& nan = c.roots()[0];
  EXPECT_EQ(nan["kind"], "nan_origin");
  EXPECT_EQ(nan["rank"], 0);
  EXPECT_EQ(nan["step"], 4);
  EXPECT_EQ(nan["layer"], 1);
  Db db(dir / "run.db");
  const int64_t lastStep = db.integer("SELECT max(step) FROM spans");
  EXPECT_EQ(nan["cost_steps"].get<int64_t>(), lastStep - 4 + 1);
  expectLoudFindingsInChain(c);

  const Json* straggler = nullptr;
  for (const auto& root : c.roots())
    if (root["kind"] == "straggler") straggler = &root;
  ASSERT_NE(straggler, nullptr) << c.roots().dump(1);
  EXPECT_EQ((*straggler)["rank"], 1);
  const Json* wait = nullptr;
  bool stepTime = false;
  for (const auto& l : (*straggler)["consequences"]) {
    if (l["kind"] == "group_wait" && l["collective"]["group"] == "tp-0") wait = &l;
    stepTime = stepTime || l["kind"] == "step_time";
  }
  ASSERT_NE(wait, nullptr) << straggler->dump(1);
  EXPECT_TRUE(stepTime) << straggler->dump(1);

  // Independently: per tp-0 collective with both arrivals, the waiting and who was last (ties: the lower rank, as
  // the analysis breaks them); undecided when the skew is within the two ranks' clock uncertainty.
  std::map<int, int64_t> uncertainty;
  for (const auto& row : db.rows("SELECT rank, coalesce(clock_uncertainty_ns, 0) FROM ranks"))
    uncertainty[std::stoi(row[0])] = std::stoll(row[1]);
  const auto rows = db.rows("SELECT a.enqueue_ns, b.enqueue_ns FROM collectives a JOIN collectives b ON "
                            "a.group_name = b.group_name AND a.seq = b.seq WHERE a.group_name = 'tp-0' AND a.rank = 0 "
                            "AND b.rank = 1");
  ASSERT_FALSE(rows.empty());
  double caused = 0;
  for (const auto& row : rows) {
    const int64_t a0 = std::stoll(row[0]), a1 = std::stoll(row[1]);
    const int64_t w = std::abs(a1 - a0);
    if (w <= uncertainty[0] + uncertainty[1]) continue;
    if (a1 > a0) caused += static_cast<double>(w);
  }
  const double steps = static_cast<double>(db.integer("SELECT count(DISTINCT step) FROM collectives WHERE step >= 0"));
  const double perStep = caused / steps;  // one waiting member
  const Json& numbers = (*wait)["evidence"]["numbers"];
  EXPECT_NEAR(numbers["wait_per_member_per_step_ns"].get<double>(), perStep, 0.01 * perStep) << wait->dump(1);
  EXPECT_NEAR(static_cast<double>((*wait)["cost_ns"].get<int64_t>()), perStep * steps, 0.01 * perStep * steps);
  EXPECT_GT(perStep, 50e6) << "rank 1 is 100 ms late per step: rank 0 waits most of it";
}

// Rank 1 dies at step 3; rank 0 then waits in tp-0 for a collective rank 1 never enters, until Gloo fails it.
// The crash is the root; the hang hangs under it, sized by the time from the first arrival at the stuck collective
// to the end of the run.
TEST(ChainCapture, CrashIsTheRootOfTheHangItCaused) {
  const auto dir = testDir("chain_crash_hang");
  const RunResult r = capture(dir, 2, 2, 1, 6, {"--inject", "crash:rank=1,step=3", "--hang-timeout", "2", "--grace", "1"});
  ASSERT_EQ(r.status, 4) << "capture reports the crash through its exit status (docs/capture.md)\n" << r.output;
  ASSERT_TRUE(fs::exists(dir / "run.db")) << r.output;
  const Chain c = diagnoseChain(dir / "run.db");
  ASSERT_FALSE(c.roots().empty()) << c.diagnosis.dump(1);
  const Json& crash = c.roots()[0];
  EXPECT_EQ(crash["kind"], "crash") << c.roots().dump(1);
  EXPECT_EQ(crash["rank"], 1);
  expectLoudFindingsInChain(c);
  Db db(dir / "run.db");
  const int64_t stuckSeq = db.integer("SELECT max(seq) FROM collectives WHERE rank = 1 AND group_name = 'tp-0'") + 1;
  const Json* hang = nullptr;
  for (const auto& l : crash["consequences"])
    if (l["kind"] == "hang") hang = &l;
  ASSERT_NE(hang, nullptr) << crash.dump(1);
  EXPECT_EQ((*hang)["collective"]["group"], "tp-0");
  EXPECT_EQ((*hang)["collective"]["seq"].get<int64_t>(), stuckSeq);
  const int64_t firstArrival = db.integer("SELECT min(enqueue_ns) FROM collectives WHERE group_name = 'tp-0' AND seq = " +
                                          std::to_string(stuckSeq));
  // Until the job ended: the ranks' own end where recorded (ranks.end_ns), else the last record.
  const int64_t end = std::max(runEndNs(db), db.integer("SELECT coalesce(max(end_ns), 0) FROM ranks"));
  const double wait = static_cast<double>(end - firstArrival);
  EXPECT_GT(wait, 0);  // Gloo fails rank 0's collective soon after its peer's socket closes
  EXPECT_NEAR(static_cast<double>((*hang)["cost_ns"].get<int64_t>()), wait, 0.01 * wait + 1000);
  EXPECT_GE(crash["cost_ns"].get<int64_t>(), (*hang)["cost_ns"].get<int64_t>());
  const int64_t crashedLast = db.integer("SELECT max(step) FROM spans WHERE rank = 1");
  const int64_t othersLast = db.integer("SELECT max(step) FROM spans WHERE rank = 0");
  ASSERT_GT(othersLast, crashedLast) << "rank 0 began the step rank 1 never reached";
  EXPECT_EQ(crash["cost_steps"].get<int64_t>(), othersLast - crashedLast);
}

// Rank 1 calls an all-reduce of a different size at step 2: Gloo aborts both ranks on it. The desync is the root;
// the aborts (crash findings) and the hang on the mismatched collective are its consequences, none a root.
TEST(ChainCapture, DesyncIsTheRootOfTheAbortsAndHang) {
  const auto dir = testDir("chain_mismatch");
  const RunResult r = capture(dir, 2, 2, 1, 3, {"--inject", "mismatch:rank=1,step=2", "--hang-timeout", "4",
                                                "--grace", "2"});
  ASSERT_TRUE(fs::exists(dir / "run.db")) << r.output;
  const Chain c = diagnoseChain(dir / "run.db");
  ASSERT_FALSE(c.roots().empty()) << c.diagnosis.dump(1);
  const Json& root = c.roots()[0];
  EXPECT_EQ(root["kind"], "desync") << c.roots().dump(1);
  EXPECT_EQ(root["collective"]["group"], "tp-0");
  for (const auto& other : c.roots())
    EXPECT_TRUE(other["kind"] != "crash" && other["kind"] != "hang") << "a consequence as a root: " << other.dump(1);
  expectLoudFindingsInChain(c);
}

}  // namespace
}  // namespace tpscope::capture_test
