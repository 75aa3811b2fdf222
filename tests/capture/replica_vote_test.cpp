// The replica vote and the SDC incident finder (rules/ replica_vote.h), and the bitflip fault spec.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tpscope/rules/fault_spec.h"
#include "tpscope/rules/replica_vote.h"

namespace rules = tpscope::rules;

namespace {

std::vector<int> ranks(std::initializer_list<int> r) { return r; }

// TP=2 x DP=2: tensors a (replicated), w (sharded), b (replicated); global rank = dp * 2 + tp.
rules::FingerprintLayout layout4() {
  rules::FingerprintLayout l;
  l.worldSize = 4;
  l.tpRankOf = {0, 1, 0, 1};
  l.names = {"a", "w", "b"};
  l.layers = {-1, 0, 1};
  l.replicated = {true, false, true};
  l.historyTensors = {0, 2};
  return l;
}

}  // namespace

TEST(ReplicaVote, MajorityNamesTheOddOneOut) {
  const std::vector<int64_t> v{7, 7, 9, 7};
  const auto r = rules::voteReplicas(v, ranks({0, 1, 2, 3}));
  EXPECT_FALSE(r.agree);
  EXPECT_TRUE(r.majority);
  EXPECT_EQ(r.majorityValue, 7);
  EXPECT_EQ(r.suspects, ranks({2}));
}

TEST(ReplicaVote, TwoCopiesOrAnEvenSplitHaveNoMajority) {
  const std::vector<int64_t> pair{1, 2};
  auto r = rules::voteReplicas(pair, ranks({4, 6}));
  EXPECT_FALSE(r.agree);
  EXPECT_FALSE(r.majority);
  EXPECT_EQ(r.suspects, ranks({4, 6}));
  const std::vector<int64_t> split{1, 1, 2, 2};
  r = rules::voteReplicas(split, ranks({0, 1, 2, 3}));
  EXPECT_FALSE(r.majority);
  EXPECT_EQ(r.suspects.size(), 4u);
  const std::vector<int64_t> same{5, 5, 5};
  EXPECT_TRUE(rules::voteReplicas(same, ranks({0, 1, 2})).agree);
}

TEST(SdcIncident, TheHistoryDatesAReplicatedMismatchToItsFirstStep) {
  const auto l = layout4();
  const std::vector<int> steps{6, 7, 8};
  ASSERT_EQ(rules::fingerprintRowSize(l, steps.size()), 3u * 2 + 3);
  // Rows: history (step 6: a b, step 7: a b, step 8: a b), then a w b now.
  std::vector<std::vector<int64_t>> rows(4, std::vector<int64_t>{10, 20, 11, 21, 12, 22, 12, 30, 22});
  rows[1][1 * 2 + 1] = 99;  // rank 1's b at step 7
  rows[1][2 * 2 + 1] = 98;  // ... still wrong at 8, and its a too
  rows[1][2 * 2 + 0] = 97;
  rows[3][6 + 1] = 31;  // rank 3's shard of w differs from rank 1's too (a later consequence)
  const auto inc = rules::findSdcIncident(l, rows, steps, 8, 5);
  ASSERT_TRUE(inc.has_value());
  EXPECT_EQ(inc->step, 7);
  EXPECT_EQ(inc->earliestStep, 7);
  EXPECT_EQ(inc->checkStep, 8);
  EXPECT_EQ(l.names[inc->tensor], "b");
  EXPECT_TRUE(inc->replicatedTensor);
  EXPECT_TRUE(inc->vote.majority);
  EXPECT_EQ(inc->vote.suspects, ranks({1}));
  EXPECT_EQ(inc->group, ranks({0, 1, 2, 3}));
  EXPECT_EQ(inc->tensorsDisagreeing, 1);
  const std::string msg = rules::describeSdcIncident(l, *inc);
  EXPECT_NE(msg.find("rank 1's copy of b (layer 1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at step 7"), std::string::npos) << msg;
  const auto ev = nlohmann::json::parse(rules::sdcEvidence(l, *inc, "warn"));
  EXPECT_EQ(ev["suspects"], nlohmann::json::array({1}));
  EXPECT_EQ(ev["first_step"], 7);
  EXPECT_EQ(ev["fingerprints"]["1"], "0000000000000063");
  EXPECT_EQ(ev["majority_fingerprint"], "0000000000000015");
}

TEST(SdcIncident, AShardedMismatchIsComparedWithinItsDpGroupAndDatedToTheCheckWindow) {
  const auto l = layout4();
  std::vector<std::vector<int64_t>> rows(4, std::vector<int64_t>{12, 22, 12, 30, 22});
  rows[1][2 + 1] = 40;  // w differs between ranks 1 and 3 (tp rank 1); ranks 0 and 2 hold another shard
  rows[0][2 + 1] = 50;
  rows[2][2 + 1] = 50;
  const auto inc = rules::findSdcIncident(l, rows, {10}, 10, 5);
  ASSERT_TRUE(inc.has_value());
  EXPECT_EQ(l.names[inc->tensor], "w");
  EXPECT_FALSE(inc->replicatedTensor);
  EXPECT_EQ(inc->group, ranks({1, 3}));
  EXPECT_FALSE(inc->vote.majority);  // two copies: both are suspects
  EXPECT_EQ(inc->vote.suspects, ranks({1, 3}));
  EXPECT_EQ(inc->step, 10);
  EXPECT_EQ(inc->earliestStep, 6);
  const std::string msg = rules::describeSdcIncident(l, *inc);
  EXPECT_NE(msg.find("no majority among 2 copies"), std::string::npos) << msg;
  EXPECT_NE(msg.find("between steps 6 and 10"), std::string::npos) << msg;
}

TEST(SdcIncident, AgreementIsNoIncident) {
  const auto l = layout4();
  std::vector<std::vector<int64_t>> rows{{1, 2, 1, 3, 2}, {1, 2, 1, 4, 2}, {1, 2, 1, 3, 2}, {1, 2, 1, 4, 2}};
  EXPECT_FALSE(rules::findSdcIncident(l, rows, {3}, 3, 0).has_value());
}

TEST(FaultSpec, BitflipParsesAndRoundTrips) {
  std::string error;
  auto s = rules::parseFaultSpec("bitflip:rank=2,step=7,tensor=layers.0.ln1.weight,bit=30", &error);
  ASSERT_TRUE(s.has_value()) << error;
  EXPECT_EQ(s->kind, rules::FaultKind::Bitflip);
  EXPECT_EQ(s->rank, 2);
  EXPECT_EQ(s->step, 7);
  EXPECT_EQ(s->tensor, "layers.0.ln1.weight");
  EXPECT_EQ(s->bit, 30);
  EXPECT_EQ(rules::parseFaultSpec(rules::formatFaultSpec(*s), &error), s);
  s = rules::parseFaultSpec("bitflip:rank=0,step=1,tensor=allreduce,phase=bwd", &error);
  ASSERT_TRUE(s.has_value()) << error;
  EXPECT_EQ(s->tensor, rules::kBitflipAllReduce);
  EXPECT_EQ(s->bit, -1);
  EXPECT_EQ(rules::formatFaultSpec(*s), "bitflip:rank=0,step=1,tensor=allreduce,phase=bwd");
  EXPECT_FALSE(rules::parseFaultSpec("bitflip:rank=0,step=1,bit=64", &error).has_value());
  EXPECT_NE(error.find("bit=64 must be a bit index from 0 to 63"), std::string::npos) << error;
  EXPECT_FALSE(rules::parseFaultSpec("bitflip:rank=0", &error).has_value());
  EXPECT_NE(error.find("missing step=S"), std::string::npos) << error;
}
