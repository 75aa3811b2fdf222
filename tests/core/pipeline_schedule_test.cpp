// Pipeline schedules (rules/ pipeline_schedule.h) and the pipeline config keys, without processes: every
// stage's op list, the message pairing, and the known bubble of each schedule on a model clock.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "tpscope/rules/config.h"
#include "tpscope/rules/pipeline_schedule.h"

namespace rules = tpscope::rules;
using rules::PipelineSchedule;

namespace {

// Every stage runs each (micro-batch, chunk) forward once and backward once, backward after forward; every
// receive has exactly one matching send (same pair, same seq) of the same direction and micro-batch.
void expectWellFormed(PipelineSchedule kind, int p, int m, int v) {
  const auto sched = rules::buildPipelineSchedule(kind, p, m, v);
  ASSERT_EQ(static_cast<int>(sched.size()), p);
  const int chunks = kind == PipelineSchedule::Interleaved ? v : 1;
  std::map<std::tuple<int, int, uint64_t>, std::pair<bool, int>> sent;  // (src, dst, seq) -> (forward, mb)
  for (int s = 0; s < p; ++s) {
    ASSERT_EQ(static_cast<int>(sched[s].size()), 2 * m * chunks) << "stage " << s;
    std::set<std::pair<int, int>> forwarded, backwarded;
    for (const auto& op : sched[s]) {
      if (op.forward) {
        EXPECT_TRUE(forwarded.insert({op.microbatch, op.chunk}).second);
      } else {
        EXPECT_TRUE(forwarded.count({op.microbatch, op.chunk})) << "backward before forward, stage " << s;
        EXPECT_TRUE(backwarded.insert({op.microbatch, op.chunk}).second);
      }
      if (op.sendTo >= 0) {
        EXPECT_TRUE(sent.insert({{s, op.sendTo, op.sendSeq}, {op.forward, op.microbatch}}).second);
      }
    }
    EXPECT_EQ(static_cast<int>(backwarded.size()), m * chunks);
  }
  size_t recvs = 0;
  for (int s = 0; s < p; ++s)
    for (const auto& op : sched[s]) {
      if (op.recvFrom < 0) continue;
      ++recvs;
      auto it = sent.find({op.recvFrom, s, op.recvSeq});
      ASSERT_NE(it, sent.end()) << "stage " << s << " receives a message nobody sends";
      EXPECT_EQ(it->second, std::make_pair(op.forward, op.microbatch));
    }
  EXPECT_EQ(recvs, sent.size());
}

// The idle fraction of the busiest schedule run on a model clock, per stage: 1 - busy / makespan.
std::vector<double> simulatedBubble(PipelineSchedule kind, int p, int m, int v, double f, double b) {
  const int chunks = kind == PipelineSchedule::Interleaved ? v : 1;
  const auto sched = rules::buildPipelineSchedule(kind, p, m, v);
  const auto sim = rules::simulatePipeline(sched, std::vector<double>(p * chunks, f / chunks),
                                          std::vector<double>(p * chunks, b / chunks));
  double makespan = 0;
  for (const auto& ops : sim) makespan = std::max(makespan, ops.back().end);
  std::vector<double> out;
  for (const auto& ops : sim) {
    double busy = 0;
    for (const auto& o : ops) busy += o.end - o.begin;
    out.push_back(1.0 - busy / makespan);
  }
  return out;
}

}  // namespace

TEST(PipelineSchedule, EveryScheduleRunsEachPassOnceAndPairsEveryMessage) {
  for (int p : {1, 2, 4})
    for (int m : {1, 4, 8}) {
      expectWellFormed(PipelineSchedule::GPipe, p, m, 1);
      expectWellFormed(PipelineSchedule::OneFOneB, p, m, 1);
    }
  for (int p : {2, 4})
    for (int v : {2, 3}) expectWellFormed(PipelineSchedule::Interleaved, p, 2 * p, v);
}

TEST(PipelineSchedule, OneFOneBWarmsUpWithStagesLeftForwards) {
  const auto s = rules::buildPipelineSchedule(PipelineSchedule::OneFOneB, 4, 8, 1);
  for (int stage = 0; stage < 4; ++stage) {
    int leading = 0;
    while (s[stage][leading].forward) ++leading;
    EXPECT_EQ(leading, 4 - stage) << "stage " << stage << ": p-s-1 warm-up forwards, then the first steady one";
  }
  // The last stage alternates from the start: F0 B0 F1 B1 ...
  EXPECT_TRUE(s[3][0].forward && !s[3][1].forward && s[3][1].microbatch == 0);
  // Messages on the pair 0 -> 1 are the forward activations in micro-batch order, seq 1, 2, ...
  EXPECT_EQ(s[0][0].sendTo, 1);
  EXPECT_EQ(s[0][0].sendSeq, 1u);
  EXPECT_EQ(s[1][0].recvFrom, 0);
  EXPECT_EQ(s[1][0].recvSeq, 1u);
}

// Balanced stages, free communication: the measured idle fraction of every stage is the analytic bubble,
// (p-1)/(m+p-1), for GPipe and 1F1B, with backward twice the forward as in a real model; interleaving with v chunks
// cuts it to (p-1)/(v·m+p-1).
TEST(PipelineSchedule, SimulatedBubbleEqualsTheAnalyticFormula) {
  for (auto kind : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB})
    for (int p : {2, 4})
      for (int m : {4, 8, 16}) {
        const double want = rules::analyticBubbleFraction(kind, p, m, 1);
        EXPECT_DOUBLE_EQ(want, double(p - 1) / (m + p - 1));
        for (double bubble : simulatedBubble(kind, p, m, 1, 1.0, 2.0))
          EXPECT_NEAR(bubble, want, 1e-12) << rules::pipelineScheduleName(kind) << " p=" << p << " m=" << m;
      }
  for (int p : {2, 4})
    for (int v : {2, 4}) {
      const int m = 2 * p;
      const double want = rules::analyticBubbleFraction(PipelineSchedule::Interleaved, p, m, v);
      EXPECT_DOUBLE_EQ(want, double(p - 1) / (v * m + p - 1));
      for (double bubble : simulatedBubble(PipelineSchedule::Interleaved, p, m, v, 1.0, 1.0))
        EXPECT_NEAR(bubble, want, 1e-12) << "interleaved p=" << p << " v=" << v;
    }
}

TEST(PipelineSchedule, ConfigChecksTheLayoutWithClearErrors) {
  rules::TrainConfig c;
  c.layers = 4;
  c.corpus = TPSCOPE_SAMPLES_DIR "/corpus";
  EXPECT_NO_THROW(c.validate(1, 1, 4));
  EXPECT_EQ(c.stageLayers(4), (std::vector<int64_t>{1, 1, 1, 1}));
  c.layers = 5;
  EXPECT_EQ(c.stageLayers(2), (std::vector<int64_t>{3, 2}));
  c.set("pp_layers", "[1, 4]");
  EXPECT_EQ(c.stageLayers(2), (std::vector<int64_t>{1, 4}));
  auto message = [&](int pp) {
    try {
      c.validate(1, 1, pp);
    } catch (const rules::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(2), "no error");
  EXPECT_NE(message(4).find("pp_layers has 2 entries"), std::string::npos) << message(4);
  c.set("pp_layers", "[2, 2]");
  EXPECT_NE(message(2).find("pp_layers sums to 4 but layers = 5"), std::string::npos) << message(2);
  c.set("pp_layers", "[]");
  c.set("schedule", "zigzag");
  EXPECT_NE(message(2).find("schedule = \"zigzag\""), std::string::npos) << message(2);
  c.set("schedule", "interleaved");
  c.set("grad_accum", "3");
  EXPECT_NE(message(2).find("divisible by pp = 2"), std::string::npos) << message(2);
  c.set("schedule", "1f1b");
  c.set("virtual_stages", "2");
  EXPECT_NE(message(2).find("needs schedule = \"interleaved\""), std::string::npos) << message(2);
  c.set("virtual_stages", "1");
  EXPECT_NE(message(8).find("fewer than pp x virtual_stages = 8"), std::string::npos) << message(8);
}
