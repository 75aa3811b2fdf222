// Live stall diagnosis (analysis/live_stall.h) on hand-built frontiers with known answers: who is blocked where, who
// has not entered, which stall is the cause and which its consequence; and the situations that must stay quiet.
#include <gtest/gtest.h>

#include "tpscope/analysis/live_stall.h"

namespace ta = tpscope::analysis;
namespace td = tpscope::tracedb;

namespace {

constexpr int64_t kS = 1'000'000'000;
constexpr int64_t kNow = 100 * kS;

td::CollectiveRow coll(int rank, const std::string& group, int64_t seq, int64_t enqueueNs, bool done,
                       int64_t numel = 1024, const std::string& op = "all_reduce") {
  td::CollectiveRow c;
  c.rank = rank;
  c.group = group;
  c.seq = seq;
  c.op = op;
  c.dtype = "float32";
  c.numel = numel;
  c.callsite = group + " site " + std::to_string(seq);
  c.step = 5;
  c.enqueueNs = enqueueNs;
  c.startNs = enqueueNs;
  if (done) c.endNs = enqueueNs + 1000;
  c.state = done ? td::CollectiveState::Completed : td::CollectiveState::Started;
  return c;
}

ta::LiveRankState rank(int r, std::vector<td::CollectiveRow> newest, int64_t quietNs, const char* span = "forward") {
  ta::LiveRankState s;
  s.rank = r;
  s.seen = true;
  s.newest = std::move(newest);
  s.quietNs = quietNs;
  td::NamedSpan n;
  n.name = span;
  n.span.step = 5;
  s.lastSpan = n;
  return s;
}

TEST(LiveStall, NamesTheRankThatHasNotEnteredTheCollectiveItsPeerWaitsIn) {
  const std::vector<ta::LiveGroup> groups{{"tp-0", {0, 1}}};
  const std::vector<ta::LiveRankState> ranks{
      rank(0, {coll(0, "tp-0", 53, kNow - 2 * kS, false)}, 2 * kS),
      rank(1, {coll(1, "tp-0", 52, kNow - 2200'000'000, true)}, 1300'000'000, "data loading")};
  const auto stalls = ta::detectStalls(groups, ranks, kNow);
  ASSERT_EQ(stalls.size(), 1u);
  const ta::LiveStall& s = stalls[0];
  EXPECT_EQ(s.kind, ta::StallKind::Waiting);
  EXPECT_EQ(s.group, "tp-0");
  EXPECT_EQ(s.seq, 53);
  ASSERT_EQ(s.blocked.size(), 1u);
  EXPECT_EQ(s.blocked[0].rank, 0);
  EXPECT_EQ(s.blockedNs, 2 * kS);
  ASSERT_EQ(s.missing.size(), 1u);
  EXPECT_EQ(s.missing[0].rank, 1);
  ASSERT_TRUE(s.missing[0].last);
  EXPECT_EQ(s.missing[0].last->seq, 52);
  EXPECT_FALSE(s.secondary());
  const std::string line = ta::stallLine(s);
  EXPECT_NE(line.find("WAITING  tp-0 seq 53 (tp-0 site 53, step 5): rank 0 blocked 2.0 s"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 1 has not entered it (last: seq 52"), std::string::npos) << line;
  EXPECT_NE(line.find("span \"data loading\" step 5, silent 1.3 s"), std::string::npos) << line;
}

TEST(LiveStall, QuietBelowTheThresholdWhileRecordingAndWhenEveryRankComputes) {
  const std::vector<ta::LiveGroup> groups{{"tp-0", {0, 1}}};
  // Blocked 1.0 s only: a late peer, not yet a stall.
  EXPECT_TRUE(ta::detectStalls(groups,
                               std::vector{rank(0, {coll(0, "tp-0", 9, kNow - kS, false)}, kS),
                                           rank(1, {coll(1, "tp-0", 8, kNow - kS, true)}, kS)},
                               kNow)
                  .empty());
  // An async collective open for 3 s on a rank that keeps recording (overlapped with its compute): not blocked.
  EXPECT_TRUE(ta::detectStalls(groups,
                               std::vector{rank(0, {coll(0, "tp-0", 9, kNow - 3 * kS, false)}, kS / 10),
                                           rank(1, {coll(1, "tp-0", 8, kNow - 3 * kS, true)}, 3 * kS)},
                               kNow)
                  .empty());
  // A long step every rank takes together (a checkpoint save): silent for 20 s, but in no collective.
  EXPECT_TRUE(ta::detectStalls(groups,
                               std::vector{rank(0, {coll(0, "tp-0", 9, kNow - 20 * kS, true)}, 20 * kS),
                                           rank(1, {coll(1, "tp-0", 9, kNow - 20 * kS, true)}, 20 * kS)},
                               kNow)
                  .empty());
}

TEST(LiveStall, AWaitOnARankBlockedElsewhereIsTheConsequenceAndComesSecond) {
  // TP 2 × DP 2: rank 0 waits in tp-0 for rank 1; rank 1 waits in dp-1 for rank 3; rank 3 computes, silent.
  const std::vector<ta::LiveGroup> groups{{"tp-0", {0, 1}}, {"tp-1", {2, 3}}, {"dp-0", {0, 2}}, {"dp-1", {1, 3}}};
  const std::vector<ta::LiveRankState> ranks{
      rank(0, {coll(0, "tp-0", 10, kNow - 3 * kS, false), coll(0, "dp-0", 5, kNow - 4 * kS, true)}, 3 * kS),
      rank(1, {coll(1, "tp-0", 9, kNow - 5 * kS, true), coll(1, "dp-1", 5, kNow - 4 * kS, false)}, 4 * kS),
      rank(2, {coll(2, "tp-1", 10, kNow - 5 * kS, true), coll(2, "dp-0", 5, kNow - 4 * kS, true)}, kS / 10),
      rank(3, {coll(3, "tp-1", 10, kNow - 5 * kS, true), coll(3, "dp-1", 4, kNow - 6 * kS, true)}, 4 * kS,
           "optimizer step")};
  const auto stalls = ta::detectStalls(groups, ranks, kNow);
  ASSERT_EQ(stalls.size(), 2u);
  EXPECT_EQ(stalls[0].group, "dp-1");
  EXPECT_EQ(stalls[0].seq, 5);
  ASSERT_EQ(stalls[0].missing.size(), 1u);
  EXPECT_EQ(stalls[0].missing[0].rank, 3);
  EXPECT_FALSE(stalls[0].secondary());
  EXPECT_EQ(stalls[1].group, "tp-0");
  ASSERT_EQ(stalls[1].missing.size(), 1u);
  EXPECT_EQ(stalls[1].missing[0].rank, 1);
  EXPECT_TRUE(stalls[1].secondary());
  EXPECT_NE(ta::stallLine(stalls[1]).find("itself blocked in dp-1 seq 5"), std::string::npos)
      << ta::stallLine(stalls[1]);
}

// Pipeline, seen in bench/live: stage 0 stalls before its backward recv. Its forward sends (p2p-0-1 seq 9) stay
// open in its file — it never waited on them — though stage 1 received them. Stage 1 blocks in its send of seq 9 on
// p2p-1-0. The wait on stage 0 is the cause, not a consequence of a send nobody waits for.
TEST(LiveStall, ARanksOpenSendItsPeerReceivedDoesNotMakeTheWaitOnItAConsequence) {
  const std::vector<ta::LiveGroup> groups{{"p2p-0-1", {0, 1}}, {"p2p-1-0", {1, 0}}};
  const std::vector<ta::LiveRankState> ranks{rank(0,
                                                  {coll(0, "p2p-0-1", 9, kNow - 3 * kS, false, 1024, "send"),
                                                   coll(0, "p2p-1-0", 8, kNow - 4 * kS, true, 1024, "recv")},
                                                  2 * kS),
                                             rank(1,
                                                  {coll(1, "p2p-0-1", 10, kNow - 3 * kS, true, 1024, "recv"),
                                                   coll(1, "p2p-1-0", 9, kNow - 2 * kS, false, 1024, "send")},
                                                  2 * kS)};
  const auto stalls = ta::detectStalls(groups, ranks, kNow);
  ASSERT_EQ(stalls.size(), 1u);
  const ta::LiveStall& s = stalls[0];
  EXPECT_EQ(s.group, "p2p-1-0");
  EXPECT_EQ(s.seq, 9);
  ASSERT_EQ(s.missing.size(), 1u);
  EXPECT_EQ(s.missing[0].rank, 0);
  EXPECT_FALSE(s.missing[0].blockedIn.has_value());
  EXPECT_FALSE(s.secondary());
  EXPECT_EQ(ta::stallLine(s).find("consequence"), std::string::npos) << ta::stallLine(s);
}

TEST(LiveStall, DesyncWhenEveryMemberEnteredWithDifferentSizesStuckWhenTheyAgree) {
  const std::vector<ta::LiveGroup> groups{{"tp-0", {0, 1}}};
  auto desync = ta::detectStalls(groups,
                                 std::vector{rank(0, {coll(0, "tp-0", 7, kNow - 2 * kS, false, 1024)}, 2 * kS),
                                             rank(1, {coll(1, "tp-0", 7, kNow - 2 * kS, false, 2048)}, 2 * kS)},
                                 kNow);
  ASSERT_EQ(desync.size(), 1u);
  EXPECT_EQ(desync[0].kind, ta::StallKind::Desync);
  EXPECT_EQ(desync[0].match, ta::MatchState::SizeMismatch);
  EXPECT_NE(ta::stallLine(desync[0]).find("rank 1 all_reduce float32 numel 2048"), std::string::npos);
  auto stuck = ta::detectStalls(groups,
                                std::vector{rank(0, {coll(0, "tp-0", 7, kNow - 2 * kS, false)}, 2 * kS),
                                            rank(1, {coll(1, "tp-0", 7, kNow - 3 * kS, false)}, 2 * kS)},
                                kNow);
  ASSERT_EQ(stuck.size(), 1u);
  EXPECT_EQ(stuck[0].kind, ta::StallKind::Stuck);
  EXPECT_EQ(stuck[0].blockedNs, 2 * kS);  // since the last of them entered
  EXPECT_EQ(stuck[0].blocked.size(), 2u);
}

TEST(LiveStall, AnExitedPeerAndPeersOnOtherNodes) {
  const std::vector<ta::LiveGroup> groups{{"tp-0", {0, 1, 2, 3}}};
  auto exited = rank(1, {coll(1, "tp-0", 3, kNow - 9 * kS, true)}, 9 * kS);
  exited.exited = true;
  // Ranks 2 and 3 are another node's: no file read for them.
  const auto stalls =
      ta::detectStalls(groups, std::vector{rank(0, {coll(0, "tp-0", 4, kNow - 2 * kS, false)}, 2 * kS), exited},
                       kNow);
  ASSERT_EQ(stalls.size(), 1u);
  ASSERT_EQ(stalls[0].missing.size(), 1u);
  EXPECT_TRUE(stalls[0].missing[0].exited);
  EXPECT_EQ(stalls[0].unwatched, 2);
  const std::string line = ta::stallLine(stalls[0]);
  EXPECT_NE(line.find("rank 1 has exited"), std::string::npos) << line;
  EXPECT_NE(line.find("2 member(s) on other nodes not watched here"), std::string::npos) << line;
}

TEST(LiveStall, TheKeyChangesWithTheSituationNotWithTheWaitsLength) {
  const std::vector<ta::LiveGroup> groups{{"tp-0", {0, 1, 2}}};
  auto at = [&](int64_t now, bool twoEntered) {
    return ta::detectStalls(
        groups,
        std::vector{rank(0, {coll(0, "tp-0", 4, 90 * kS, false)}, now - 90 * kS),
                    rank(1, {coll(1, "tp-0", twoEntered ? 4 : 3, 90 * kS, !twoEntered)}, now - 90 * kS),
                    rank(2, {coll(2, "tp-0", 3, 80 * kS, true)}, now - 80 * kS)},
        now);
  };
  const auto a = at(95 * kS, false), b = at(99 * kS, false), c = at(99 * kS, true);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(a[0].key(), b[0].key());
  EXPECT_NE(b[0].key(), c[0].key());
  EXPECT_EQ(c[0].missing.size(), 1u);
  EXPECT_EQ(c[0].blocked.size(), 2u);
  EXPECT_NE(ta::resumedLine(b[0], 4.0).find("RESUMED  tp-0 seq 4 after 4.0 s: ranks 1, 2 entered it late"),
            std::string::npos)
      << ta::resumedLine(b[0], 4.0);
}

}  // namespace

namespace {

TEST(LiveStall, TheSiteIsTheFirstCollectiveInFlightNotTheLastEntered) {
  // DP gradient buckets: rank 1 launched buckets 0 and 1 (seq 10, 11) and waits; rank 3 entered neither.
  const std::vector<ta::LiveGroup> groups{{"dp-1", {1, 3}}};
  const std::vector<ta::LiveRankState> ranks{
      rank(1, {coll(1, "dp-1", 11, kNow - 2 * kS, false), coll(1, "dp-1", 10, kNow - 2100'000'000, false)}, 2 * kS),
      rank(3, {coll(3, "dp-1", 9, kNow - 3 * kS, true)}, 2 * kS)};
  const auto stalls = ta::detectStalls(groups, ranks, kNow);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].seq, 10);
  EXPECT_EQ(stalls[0].blockedNs, 2 * kS);  // since it entered the last one
}

}  // namespace

namespace {

ta::OpenSpanInfo open(const char* name, int kind, int layer, int64_t beginNs) {
  ta::OpenSpanInfo o;
  o.name = name;
  o.kind = kind;
  o.layer = layer;
  o.beginNs = beginNs;
  return o;
}

// Where a rank that has not entered is, from the spans its recorder says are open: stuck in compute (a compute span
// open ≥ 10 of its median steps), merely inside one (fewer), entering (no span of its own), or unknown (no open spans
// published: nothing is claimed).
TEST(LiveStall, ARankStuckInComputeIsToldFromOneEnteringTheCollective) {
  constexpr int kCompute = 0, kStep = 4, kComm = 1;
  const std::vector<ta::LiveGroup> groups{{"tp-0", {0, 1, 2, 3, 4}}};
  std::vector<ta::LiveRankState> ranks{rank(0, {coll(0, "tp-0", 53, kNow - 3 * kS, false)}, 3 * kS)};
  auto missing = [&](int r, std::vector<ta::OpenSpanInfo> openSpans, int64_t medianStepNs, bool known = true) {
    ta::LiveRankState s = rank(r, {coll(r, "tp-0", 52, kNow - 4 * kS, true)}, 2 * kS);
    s.open = std::move(openSpans);
    s.openKnown = known;
    s.medianStepNs = medianStepNs;
    ranks.push_back(std::move(s));
  };
  // 1: inside layer 3's MLP for 2.5 s, its steps take 40 ms: stuck in compute (the step's own span is not it).
  missing(1, {open("train step", kStep, -1, kNow - 3 * kS), open("mlp forward", kCompute, 3, kNow - 2500'000'000)},
          40'000'000);
  // 2: only the step's span open: between operations, on its way into the collective.
  missing(2, {open("train step", kStep, -1, kNow - 3 * kS)}, 40'000'000);
  // 3: inside a compute span for 1.6 s where its steps take 0.5 s: inside, not stuck. A collective span open inside
  //    it is not its own work.
  missing(3, {open("attention forward", kCompute, 0, kNow - 1600'000'000), open("all_reduce", kComm, 0, kNow - kS)},
          500'000'000);
  // 4: a file without open spans (an older recorder, a Python program): nothing is claimed.
  missing(4, {}, 40'000'000, false);
  const auto stalls = ta::detectStalls(groups, ranks, kNow);
  ASSERT_EQ(stalls.size(), 1u);
  const ta::LiveStall& s = stalls[0];
  ASSERT_EQ(s.missing.size(), 4u);
  EXPECT_EQ(s.missing[0].state, ta::MissingState::Compute);
  EXPECT_TRUE(s.missing[0].stuck);
  EXPECT_EQ(s.missing[0].insideNs, 2500'000'000);
  EXPECT_EQ(s.missing[1].state, ta::MissingState::Entering);
  EXPECT_FALSE(s.missing[1].stuck);
  EXPECT_EQ(s.missing[2].state, ta::MissingState::Compute);
  EXPECT_FALSE(s.missing[2].stuck);
  ASSERT_TRUE(s.missing[2].inside);
  EXPECT_EQ(s.missing[2].inside->name, "attention forward");
  EXPECT_EQ(s.missing[3].state, ta::MissingState::Unknown);
  const std::string line = ta::stallLine(s);
  EXPECT_NE(line.find("rank 1 has not entered it: stuck in compute, inside \"mlp forward\" (layer 3) for 2.5 s (62× "
                      "its median step, 40.000 ms)"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("rank 2 has not entered it: no span of its own open"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 3 has not entered it: inside \"attention forward\" (layer 0) for 1.6 s (3× its median"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("rank 4 has not entered it (last: seq 52"), std::string::npos) << line;
  // A wait on ranks that are only busy with their own work, for less than two of their median steps, is no stall (a
  // pipeline stage in a long pass).
  {
    std::vector<ta::LiveRankState> busy{ranks[0], ranks[3]};
    busy[1].open.pop_back();               // only its own work open (not the collective inside it)
    busy[1].medianStepNs = 1'000'000'000;  // 1.6 s inside, steps of 1 s
    EXPECT_TRUE(ta::detectStalls(std::vector<ta::LiveGroup>{{"tp-0", {0, 3}}}, busy, kNow).empty());
    busy[1].medianStepNs = 700'000'000;  // 2.3 steps: said
    EXPECT_EQ(ta::detectStalls(std::vector<ta::LiveGroup>{{"tp-0", {0, 3}}}, busy, kNow).size(), 1u);
  }
  // A missing rank inside a collective of its own (its innermost open span), not yet seen blocked there: no line yet —
  // in a moment it is either blocked (this wait is then the consequence) or through.
  {
    std::vector<ta::LiveRankState> inColl{ranks[0], ranks[1]};
    inColl[1].open.push_back(open("all_reduce", kComm, 3, kNow - kS));
    EXPECT_TRUE(ta::detectStalls(std::vector<ta::LiveGroup>{{"tp-0", {0, 1}}}, inColl, kNow).empty());
  }
  // The line changes when a rank's place does (inside → stuck), not with the wait's length.
  ranks[3].medianStepNs = 100'000'000;
  const auto later = ta::detectStalls(groups, ranks, kNow);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_TRUE(later[0].missing[2].stuck);
  EXPECT_NE(later[0].key(), s.key());
}

}  // namespace
