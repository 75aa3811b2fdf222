// The root-cause chain on finding sets built by hand: which finding causes which (by evidence, not kind order), how
// each link is sized, the roots' order, an empty chain for a healthy set, and the JSON shape of `chain`.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>

#include "tpscope/analysis/chain.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/report/json_output.h"

namespace tpscope::analysis {
namespace {

using report::diagnosisToJson;

Finding make(FindingKind kind, Severity sev, int rank, int step = -1) {
  Finding f;
  f.kind = kind;
  f.severity = sev;
  f.rank = rank;
  f.step = step;
  f.message = std::string(findingKindName(kind)) + " on rank " + std::to_string(rank);
  return f;
}

Finding hang(Severity sev, const std::string& group, int64_t seq, std::vector<int> missing, bool secondary) {
  Finding f = make(FindingKind::Hang, sev, missing.front());
  f.collective = CollectiveRef{group, seq, "all_reduce"};
  f.ranks = std::move(missing);
  f.number("secondary", int64_t{secondary ? 1 : 0});
  return f;
}

NonFiniteEvent event(const char* source, int rank, int step, int layer, const char* param, const char* phase) {
  NonFiniteEvent e;
  e.source = source;
  e.rank = rank;
  e.step = step;
  e.layer = layer;
  e.param = param;
  e.phase = phase;
  e.nanCount = 1;
  return e;
}

RunInfo layout(std::vector<tracedb::GroupInfo> groups, int64_t endNs) {
  RunInfo info;
  info.groups = std::move(groups);
  std::sort(info.groups.begin(), info.groups.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  info.endNs = endNs;
  return info;
}

// A stuck (group, seq) entered by `entered` at `enqueueNs`.
GroupDesync stuck(const std::string& group, std::vector<int> members, int64_t seq, std::vector<int> entered,
                  int64_t enqueueNs) {
  GroupDesync g;
  g.group = group;
  g.members = std::move(members);
  g.stuckSeq = seq;
  for (int r : entered) {
    MemberRecord m;
    m.rank = r;
    m.enqueueNs = enqueueNs;
    g.stuckRecords.push_back(m);
    g.waitingRanks.push_back(r);
  }
  return g;
}

TEST(Chain, HealthyFindingsMakeNoChain) {
  std::vector<Finding> all = {make(FindingKind::CommOverhead, Severity::Info, -1),
                              make(FindingKind::CommOverhead, Severity::Info, 0)};
  EXPECT_TRUE(buildChain(all).empty());
  EXPECT_TRUE(buildChain({}).empty());
  // An info straggler (significant, not material: a rank sharing its core) with real waiting in its group: its
  // derived links are info too, so a healthy run still has no chain (the accuracy benchmark's healthy runs).
  Finding s = make(FindingKind::Straggler, Severity::Info, 1);
  s.ranks = {0};
  RunInfo info;
  info.groups = {{"tp-0", {0, 1}, "gloo"}};
  CollectiveAnalysis ca;
  ca.stragglers.steps = 10;
  RankStraggling r1;
  r1.rank = 1;
  r1.groups.push_back({"tp-0", 20, 15, 200'000'000, 100'000'000.0, {{3, 20'000'000}}});
  ca.stragglers.ranks = {r1};
  Breakdown b;
  b.steps.resize(20);
  b.run.stepNs = int64_t{20} * 100'000'000;
  EXPECT_TRUE(buildChain({s}, {&info, &b, &ca, nullptr, nullptr}).empty());
}

// The crash of rank 2 causes the hang it is missing from (sized by how long the others sat in it), not the hang
// of tp-1 that rank 3 never entered: that one is a root of its own.
TEST(Chain, CrashCausesOnlyTheHangItIsMissingFrom) {
  std::vector<Finding> all = {make(FindingKind::Crash, Severity::Critical, 2, 3),
                              hang(Severity::Critical, "tp-1", 9, {3}, false),
                              hang(Severity::Error, "tp-0", 12, {2}, true)};
  sortFindings(all);
  const RunInfo info = layout({{"tp-0", {0, 1, 2}, "gloo"}, {"tp-1", {3, 4}, "gloo"}}, 5'000'000'000);
  DesyncReport d;
  d.groups = {stuck("tp-0", {0, 1, 2}, 12, {0, 1}, 2'000'000'000), stuck("tp-1", {3, 4}, 9, {4}, 4'000'000'000)};
  const auto chain = buildChain(all, {&info, nullptr, nullptr, &d, nullptr});
  ASSERT_EQ(chain.size(), 2u);
  // Two critical incidents: in the findings' order (hang sorts before crash).
  const ChainLink& crash = chain[1];
  EXPECT_EQ(crash.kind, "crash");
  EXPECT_EQ(crash.rank, 2);
  ASSERT_EQ(crash.consequences.size(), 1u);
  const ChainLink& h = crash.consequences[0];
  EXPECT_EQ(h.kind, "hang");
  EXPECT_EQ(h.collective->group, "tp-0");
  EXPECT_EQ(h.costNs, 3'000'000'000);  // from the first arrival at tp-0 seq 12 to the end of the run
  EXPECT_EQ(crash.costNs, 3'000'000'000) << "a crash costs the hang it caused";
  EXPECT_EQ(chain[0].kind, "hang");
  EXPECT_EQ(chain[0].collective->group, "tp-1");
  EXPECT_EQ(chain[0].costNs, 1'000'000'000);
  EXPECT_TRUE(chain[0].consequences.empty());
  EXPECT_EQ(chainFindings(chain), (std::vector<int>{0, 1, 2}));
}

// A desync on tp-0 seq 5 causes the hang of tp-0 at that seq and the aborts of tp-0's members whose last
// collective is there; a crash of a rank outside tp-0 is not its consequence.
TEST(Chain, DesyncCausesItsGroupsHangAndAborts) {
  Finding desync = make(FindingKind::Desync, Severity::Error, 1, 2);
  desync.collective = CollectiveRef{"tp-0", 5, "all_reduce"};
  Finding abort0 = make(FindingKind::Crash, Severity::Critical, 0, 2);
  abort0.collective = CollectiveRef{"tp-0", 4, "all_reduce"};
  Finding other = make(FindingKind::Crash, Severity::Critical, 3, 2);
  other.collective = CollectiveRef{"tp-1", 4, "all_reduce"};
  Finding early = make(FindingKind::Crash, Severity::Critical, 1, 0);  // its last collective long before seq 5
  early.collective = CollectiveRef{"tp-0", 1, "all_reduce"};
  std::vector<Finding> all = {desync, abort0, other, early, hang(Severity::Critical, "tp-0", 5, {1}, false)};
  sortFindings(all);
  const RunInfo info = layout({{"tp-0", {0, 1}, "gloo"}, {"tp-1", {2, 3}, "gloo"}}, 0);
  const auto chain = buildChain(all, {&info});
  const ChainLink* root = nullptr;
  for (const auto& r : chain)
    if (r.kind == "desync") root = &r;
  ASSERT_NE(root, nullptr);
  std::vector<std::string> kinds;
  for (const auto& c : root->consequences) kinds.push_back(c.kind + ":" + std::to_string(c.rank));
  std::sort(kinds.begin(), kinds.end());
  // The hang of tp-0 (missing rank 1) hangs under the desync; the early crash of rank 1 is its own cause and takes
  // no hang (the desync named it first).
  EXPECT_EQ(kinds, (std::vector<std::string>{"crash:0", "hang:1"}));
  int roots = 0;
  for (const auto& r : chain) roots += r.kind == "crash" ? 1 : 0;
  EXPECT_EQ(roots, 2) << "rank 3 (tp-1) and rank 1's early crash are roots of their own";
}

// Rank 3 straggles in tp-1 = {2, 3}: rank 2 waits on it (a group_wait link sized by the waiting it caused per
// waiting member and step); held up, rank 2 then arrives last in dp-0 = {0, 2}, which waits on it (a link one
// level down); the step time grows by the lag; rank 2's exposed communication hangs under the straggler, rank 1's
// (not a member of its groups) does not.
TEST(Chain, StragglerSizedByTheWaitingInItsOwnGroups) {
  Finding s = make(FindingKind::Straggler, Severity::Warning, 3);
  s.ranks = {2};
  std::vector<Finding> all = {s, make(FindingKind::CommOverhead, Severity::Info, 2),
                              make(FindingKind::CommOverhead, Severity::Info, 1)};
  sortFindings(all);
  const RunInfo info = layout({{"tp-1", {2, 3}, "gloo"}, {"dp-0", {0, 2}, "gloo"}, {"dp-1", {1, 3}, "gloo"}}, 0);
  CollectiveAnalysis ca;
  ca.stragglers.steps = 10;
  RankStraggling r3;
  r3.rank = 3;
  r3.groups.push_back({"tp-1", 20, 20, 400'000'000, 100'000'000.0, {{45, 30'000'000}, {41, 29'000'000}}});
  r3.groups.push_back({"dp-1", 10, 5, 1'000'000, 1'000'000.0, {{6, 200'000}}});  // no more than chance
  RankStraggling r2;
  r2.rank = 2;
  r2.groups.push_back({"dp-0", 10, 10, 250'000'000, 50'000'000.0, {{7, 25'000'000}}});
  r2.groups.push_back({"tp-1", 20, 0, 0, 100'000'000.0, {}});
  ca.stragglers.ranks = {r3, r2};
  ca.worst.push_back({"tp-1", 45, "all_reduce", 4, 3, 30'000'000, 30'000'000, 1'000});
  Breakdown b;
  b.steps.resize(40);             // 4 ranks × 10 steps
  b.run.stepNs = int64_t{40} * 130'000'000;  // a mean step of 130 ms
  const auto chain = buildChain(all, {&info, &b, &ca, nullptr, nullptr});
  ASSERT_EQ(chain.size(), 1u);
  const ChainLink& root = chain[0];
  EXPECT_EQ(root.kind, "straggler");
  // tp-1: 400 ms of waiting caused (more than the 100 ms chance would give) over 1 waiting member and 10 steps.
  EXPECT_EQ(root.costNs, 400'000'000);
  ASSERT_EQ(root.consequences.size(), 3u);
  const ChainLink& tp = root.consequences[0];
  EXPECT_EQ(tp.kind, "group_wait");
  EXPECT_EQ(tp.collective->group, "tp-1");
  EXPECT_EQ(tp.collective->seq, 45);
  EXPECT_EQ(tp.collective->op, "all_reduce");
  EXPECT_EQ(tp.costNs, 400'000'000);
  EXPECT_EQ(tp.evidence.rows.size(), 2u);
  EXPECT_NE(tp.message.find("rank 2 wait 40.000 ms per step on rank 3"), std::string::npos) << tp.message;
  ASSERT_EQ(tp.consequences.size(), 1u);
  const ChainLink& dp = tp.consequences[0];
  EXPECT_EQ(dp.collective->group, "dp-0");
  EXPECT_EQ(dp.rank, 2);
  EXPECT_EQ(dp.costNs, 250'000'000);  // 250 ms / 1 member / 10 steps = 25 ms per step
  const ChainLink& st = root.consequences[1];
  EXPECT_EQ(st.kind, "step_time");
  EXPECT_NE(st.message.find("+44.4%"), std::string::npos) << st.message;  // 40 / (130 − 40)
  EXPECT_EQ(root.consequences[2].kind, "comm_overhead");
  EXPECT_EQ(root.consequences[2].rank, 2);
}

// A NaN origin's hops nest by who passed the value on; a spike at or after the origin on a rank it reached is its
// consequence, one before it is not; an unexplained second origin is a root of its own.
TEST(Chain, NanOriginCarriesItsSpreadAndLaterSpikes) {
  Finding o = make(FindingKind::NanOrigin, Severity::Critical, 2, 5);
  o.layer = 1;
  o.ranks = {0, 1, 3};
  o.collective = CollectiveRef{"tp-1", 45, "all_reduce"};
  Finding second = make(FindingKind::NanOrigin, Severity::Error, 4, 6);
  std::vector<Finding> all = {o, second, make(FindingKind::GradSpike, Severity::Warning, 0, 6),
                              make(FindingKind::GradSpike, Severity::Warning, 1, 4)};
  sortFindings(all);
  NonFiniteReport nf;
  nf.origin = event("grad_stats", 2, 5, 1, "layers.1.mlp.fc1.weight", "bwd");
  nf.firstPerRank = {event("step_stats", 0, 5, -1, "grad_norm", ""), event("step_stats", 1, 5, -1, "loss", ""),
                     event("grad_stats", 3, 5, 1, "layers.1.mlp.fc2.weight", "bwd")};
  nf.receivers = {0, 1, 3};
  nf.spread = {SpreadHop{{"tp-1", 45, "all_reduce"}, 5, 2, {3}}, SpreadHop{{"dp-0", 6, "all_reduce"}, 5, 2, {0}},
               SpreadHop{{"dp-1", 6, "all_reduce"}, 5, 3, {1}}};
  RunInfo info;
  info.spanExtents = {{0, 0, 0, 7}, {1, 0, 0, 7}};
  const auto chain = buildChain(all, {&info, nullptr, nullptr, nullptr, &nf});
  ASSERT_EQ(chain.size(), 3u);
  const ChainLink& root = chain[0];
  EXPECT_EQ(root.kind, "nan_origin");
  EXPECT_EQ(root.costSteps, 3);  // steps 5, 6, 7
  ASSERT_EQ(root.consequences.size(), 3u);
  EXPECT_EQ(root.consequences[0].kind, "spread");
  EXPECT_EQ(root.consequences[0].collective->group, "tp-1");
  ASSERT_EQ(root.consequences[0].consequences.size(), 1u) << "rank 3 passed it on over dp-1";
  const ChainLink& toRank1 = root.consequences[0].consequences[0];
  EXPECT_EQ(toRank1.collective->group, "dp-1");
  EXPECT_NE(toRank1.message.find("rank 1: loss at step 5"), std::string::npos) << toRank1.message;
  EXPECT_EQ(toRank1.evidence.rows[1].table, "step_stats");
  EXPECT_EQ(root.consequences[1].collective->group, "dp-0");
  EXPECT_EQ(root.consequences[2].kind, "grad_spike");
  EXPECT_EQ(root.consequences[2].rank, 0);
  EXPECT_EQ(chain[1].kind, "nan_origin");
  EXPECT_EQ(chain[1].rank, 4);
  EXPECT_EQ(chain[2].kind, "grad_spike");
  EXPECT_EQ(chain[2].step, 4) << "a spike before the origin is not its consequence";
}

// A bit flip found by the replica check at step 20 (it happened after the check at step 10) is the cause of the NaN
// born on the suspect rank at step 14, of the spike at step 16 and of the next pipeline stage's divergence at step 21
// (rank 3 sends its activations to rank 7); a NaN before the window, or on a rank that holds a good copy, is not its
// consequence.
TEST(Chain, SilentCorruptionCausesWhatTheCorruptedCopyFed) {
  Finding sdc = make(FindingKind::SilentCorruption, Severity::Critical, 3, 20);
  sdc.ranks = {3};
  sdc.number("check_step", int64_t{20}).number("earliest_step", int64_t{11});
  std::vector<Finding> all = {sdc, make(FindingKind::NanOrigin, Severity::Critical, 3, 14),
                              make(FindingKind::GradSpike, Severity::Warning, -1, 16),
                              make(FindingKind::NanOrigin, Severity::Critical, 3, 9),
                              make(FindingKind::LossSpike, Severity::Warning, 1, 18)};
  Finding downstream = make(FindingKind::SilentCorruption, Severity::Critical, -1, 21);  // the next stage, later
  downstream.ranks = {4, 5, 6, 7};
  all.push_back(downstream);
  sortFindings(all);
  const RunInfo info = layout({{"tp-0", {0, 1}, "gloo"}, {"tp-1", {2, 3}, "gloo"}, {"tp-2", {4, 5}, "gloo"},
                               {"tp-3", {6, 7}, "gloo"}, {"p2p-3-7", {3, 7}, "gloo"}},
                              0);
  const auto chain = buildChain(all, {&info});
  const auto root = std::find_if(chain.begin(), chain.end(), [](const ChainLink& l) { return l.kind == "silent_corruption"; });
  ASSERT_NE(root, chain.end());
  std::vector<std::pair<std::string, int>> under;
  std::function<void(const ChainLink&)> walk = [&](const ChainLink& l) {
    for (const auto& c : l.consequences) {
      if (c.finding >= 0) under.emplace_back(c.kind, c.step);
      walk(c);
    }
  };
  walk(*root);
  std::sort(under.begin(), under.end());
  EXPECT_EQ(under, (std::vector<std::pair<std::string, int>>{
                       {"grad_spike", 16}, {"nan_origin", 14}, {"silent_corruption", 21}}));
  EXPECT_EQ(chain.size(), 3u) << "the early NaN and the loss spike on a good copy stay roots of their own";
}

// Time order alone is no link: a later divergence on ranks no process group joins to the first one's suspects, and a
// NaN on a rank that holds a good copy, are incidents of their own.
TEST(Chain, FindingsNothingConnectsAreSeparateIncidents) {
  Finding first = make(FindingKind::SilentCorruption, Severity::Critical, 1, 3);
  first.ranks = {1};
  Finding later = make(FindingKind::SilentCorruption, Severity::Critical, -1, 7);
  later.ranks = {4, 5};
  std::vector<Finding> all = {first, later, make(FindingKind::InfOrigin, Severity::Critical, 0, 6)};
  sortFindings(all);
  const RunInfo info = layout({{"tp-0", {0, 1}, "gloo"}, {"tp-1", {4, 5}, "gloo"}}, 0);
  const auto chain = buildChain(all, {&info});
  ASSERT_EQ(chain.size(), 3u);
  for (const auto& root : chain) EXPECT_TRUE(root.consequences.empty()) << root.kind << " step " << root.step;
}

// A divergence that another analysis found a fault to explain (sdc.h, explainDivergences: numbers cause, cause_rank,
// cause_step) hangs under that fault, never the other way round, and causes nothing of its own.
TEST(Chain, AnExplainedDivergenceHangsUnderItsCause) {
  Finding nan = make(FindingKind::NanOrigin, Severity::Critical, 1, 9);
  nan.ranks = {0};  // its spread reached rank 0
  Finding parted = make(FindingKind::SilentCorruption, Severity::Error, 1, 9);
  parted.ranks = {0, 1};
  parted.number("secondary", int64_t{1})
      .number("cause", std::string("nan_origin"))
      .number("cause_rank", int64_t{1})
      .number("cause_step", int64_t{9});
  std::vector<Finding> all = {parted, nan, make(FindingKind::GradSpike, Severity::Warning, 0, 10)};
  sortFindings(all);
  const auto chain = buildChain(all);
  ASSERT_EQ(chain.size(), 1u);
  EXPECT_EQ(chain[0].kind, "nan_origin");
  ASSERT_EQ(chain[0].consequences.size(), 2u);
  std::vector<std::string> kinds;
  for (const auto& c : chain[0].consequences) {
    kinds.push_back(c.kind);
    EXPECT_TRUE(c.consequences.empty()) << c.kind;
  }
  std::sort(kinds.begin(), kinds.end());
  EXPECT_EQ(kinds, (std::vector<std::string>{"grad_spike", "silent_corruption"}));
}

// Roots with a critical consequence come before a warning root; a finding no rule names stays a root; the chain
// never loops (two crashes and hangs naming each other).
TEST(Chain, RootsOrderedByTheirWorstLinkAndNoCycles) {
  Finding desync = make(FindingKind::Desync, Severity::Error, 1, 2);
  desync.collective = CollectiveRef{"tp-0", 5, "all_reduce"};
  std::vector<Finding> all = {make(FindingKind::Straggler, Severity::Warning, 0), desync,
                              hang(Severity::Critical, "tp-0", 5, {1}, false),
                              make(FindingKind::ReplicaDivergence, Severity::Error, 3, 4)};
  // Listed with the warning first on purpose: the desync's tree holds a critical hang.
  const auto chain = buildChain(all);
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[0].kind, "desync");
  EXPECT_EQ(chain[1].kind, "replica_divergence");
  EXPECT_EQ(chain[2].kind, "straggler");

  std::vector<Finding> loop = {make(FindingKind::Crash, Severity::Critical, 1), make(FindingKind::Crash, Severity::Critical, 2),
                               hang(Severity::Critical, "tp-0", 3, {1, 2}, false)};
  const auto c2 = buildChain(loop);
  EXPECT_EQ(chainFindings(c2), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(c2.size(), 2u);
}

TEST(Chain, JsonShape) {
  DiagnoseResult r;
  r.findings = {make(FindingKind::Crash, Severity::Critical, 2, 3), hang(Severity::Error, "tp-0", 12, {2}, true)};
  RunInfo info = layout({{"tp-0", {0, 1, 2}, "gloo"}}, 10);
  DesyncReport d;
  d.groups = {stuck("tp-0", {0, 1, 2}, 12, {0, 1}, 4)};
  info.spanExtents = {{0, 0, 10, 5}};
  r.chain = buildChain(r.findings, {&info, nullptr, nullptr, &d, nullptr});
  const auto j = nlohmann::json::parse(diagnosisToJson(r, "run.db"));
  ASSERT_TRUE(j["chain"].is_array());
  ASSERT_EQ(j["chain"].size(), 1u);
  const auto& root = j["chain"][0];
  for (const char* key : {"kind", "rank", "step", "layer", "collective", "message", "cost_ns", "cost_steps",
                          "evidence", "consequences"})
    EXPECT_TRUE(root.contains(key)) << key;
  EXPECT_EQ(root["kind"], "crash");
  EXPECT_EQ(root["rank"], 2);
  EXPECT_EQ(root["step"], 3);
  EXPECT_TRUE(root["collective"].is_null());
  EXPECT_EQ(root["cost_ns"], 6);
  EXPECT_EQ(root["cost_steps"], 2);  // steps 4 and 5, which rank 0 ran and rank 2 did not
  const auto& h = root["consequences"][0];
  EXPECT_EQ(h["kind"], "hang");
  EXPECT_EQ(h["collective"]["group"], "tp-0");
  EXPECT_EQ(h["collective"]["seq"], 12);
  EXPECT_EQ(h["cost_ns"], 6);
  EXPECT_EQ(h["cost_steps"], -1);
  EXPECT_TRUE(h["evidence"]["rows"].is_array());
  EXPECT_TRUE(h["evidence"]["numbers"].is_object());
  EXPECT_TRUE(h["consequences"].is_array());
  EXPECT_TRUE(h["consequences"].empty());
  // An empty chain is an empty array, present.
  r.chain.clear();
  EXPECT_TRUE(nlohmann::json::parse(diagnosisToJson(r, "run.db"))["chain"].empty());
}

}  // namespace
}  // namespace tpscope::analysis
