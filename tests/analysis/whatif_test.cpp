// What-if (analysis/whatif.h) on runs whose answers are known: a hand-built 2-rank all-reduce where rank 1 computes
// 30 ms longer, a point-to-point message, and the simulated TP×DP runs of support/test_runs with and without a
// straggler. The expected figures are worked out here from the scenario, not read back from the analysis.
#include "tpscope/analysis/whatif.h"

#include <gtest/gtest.h>

#include <climits>
#include <nlohmann/json.hpp>

#include "tpscope/analysis/breakdown.h"
#include "test_file.h"
#include "test_runs.h"

namespace tpscope::analysis {
namespace {

using testing::newWriter;
using testing::openReader;
using testing::testDir;

constexpr int64_t kMs = 1'000'000;

const WhatIfChange* find(const WhatIfReport& r, WhatIfChangeKind kind) {
  for (const auto& ch : r.changes)
    if (ch.kind == kind) return &ch;
  return nullptr;
}

struct Writer2 {
  std::unique_ptr<tracedb::Writer> w;
  void span(int rank, const char* name, tracedb::SpanKind kind, int64_t b, int64_t e, int step) {
    auto id = w->intern(name);
    ASSERT_TRUE(id.isOk());
    tracedb::SpanRow s;
    s.rank = rank;
    s.kind = kind;
    s.name = *id;
    s.beginNs = b;
    s.durNs = e - b;
    s.step = step;
    ASSERT_TRUE(w->addSpan(s));
  }
  void record(int rank, const char* group, int64_t seq, const char* op, int64_t enq, int64_t end, int step,
              int64_t bytes = 4096) {
    tracedb::CollectiveRow c;
    c.rank = rank;
    c.group = group;
    c.seq = seq;
    c.op = op;
    c.dtype = "float32";
    c.bytes = bytes;
    c.numel = bytes / 4;
    c.step = step;
    c.enqueueNs = enq;
    c.startNs = enq;
    c.endNs = end;
    c.state = tracedb::CollectiveState::Completed;
    ASSERT_TRUE(w->upsertCollective(c));
  }
};

// Steps 0..3, each 50 ms apart (in ms from the step's start s):
//   rank 0  compute [s, s+10]  all_reduce [s+10, s+42]  compute [s+42, s+47]
//   rank 1  compute [s, s+40]  all_reduce [s+40, s+42]  compute [s+42, s+47]
// The all-reduce (4 MB) completes when rank 1 arrives (s+40) plus its transfer, 2 ms. Step windows [s, s+47].
void writeAllReduceRun(const std::filesystem::path& path) {
  Writer2 x{newWriter(path)};
  ASSERT_TRUE(x.w);
  for (int r = 0; r < 2; ++r) {
    tracedb::RankInfo ri;
    ri.rank = r;
    ri.worldSize = 2;
    ri.tpSize = 2;
    ri.tpRank = r;
    ASSERT_TRUE(x.w->putRank(ri));
  }
  ASSERT_TRUE(x.w->putGroup({"tp-0", {0, 1}, "gloo"}));
  for (int step = 0; step < 4; ++step) {
    const int64_t s = 50 * kMs * step;
    for (int r = 0; r < 2; ++r) {
      const int64_t arrive = s + (r == 0 ? 10 : 40) * kMs;
      x.span(r, "train step", tracedb::SpanKind::Step, s, s + 47 * kMs, step);
      x.span(r, "forward", tracedb::SpanKind::Compute, s, arrive, step);
      x.span(r, "all_reduce", tracedb::SpanKind::Comm, arrive, s + 42 * kMs, step);
      x.record(r, "tp-0", step + 1, "all_reduce", arrive, s + 42 * kMs, step, 4'000'000);
      x.span(r, "backward", tracedb::SpanKind::Compute, s + 42 * kMs, s + 47 * kMs, step);
    }
  }
  ASSERT_TRUE(x.w->close());
}

TEST(WhatIf, RemovingTheStragglerSavesExactlyTheWait) {
  const auto path = testDir() / "ar.db";
  writeAllReduceRun(path);
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  auto r = analyzeWhatIf(*reader);
  ASSERT_TRUE(r.isOk()) << r.error();
  EXPECT_EQ(r->steps, 3);  // step 0 left out
  EXPECT_EQ(r->firstStep, 1);
  EXPECT_FALSE(r->device);
  EXPECT_DOUBLE_EQ(r->measuredStepNs, 47.0 * kMs);
  EXPECT_DOUBLE_EQ(r->replayedStepNs, 47.0 * kMs);  // the model holds every dependency of this run
  EXPECT_EQ(r->boundBlocks, 8);
  EXPECT_EQ(r->unboundBlocks, 0);
  EXPECT_EQ(r->forced, 0);

  // Rank 1 at rank 0's 10 ms: the all-reduce completes at s+12, the step at s+17: 30 ms saved, the wait.
  const WhatIfChange* straggler = find(*r, WhatIfChangeKind::Straggler);
  ASSERT_NE(straggler, nullptr);
  EXPECT_EQ(straggler->rank, 1);
  EXPECT_DOUBLE_EQ(straggler->savingNs, 30.0 * kMs);
  EXPECT_DOUBLE_EQ(straggler->predictedStepNs, 17.0 * kMs);
  EXPECT_EQ(straggler->ranks, std::vector<int>{1});

  // The transfer hidden: 2 ms, on the critical path of rank 1 (the last arriver, where it was measured).
  const WhatIfChange* comm = find(*r, WhatIfChangeKind::CommOverlapped);
  ASSERT_NE(comm, nullptr);
  EXPECT_DOUBLE_EQ(comm->savingNs, 2.0 * kMs);
  EXPECT_EQ(comm->ranks, std::vector<int>{1});
  EXPECT_EQ(find(*r, WhatIfChangeKind::StageImbalance), nullptr);   // no pipeline
  EXPECT_EQ(find(*r, WhatIfChangeKind::CollectiveBusbw), nullptr);  // no --busbw

  // The median step's path: rank 1's 40 ms, the 2 ms transfer, then 5 ms of compute (47 in all).
  ASSERT_EQ(r->criticalPath.size(), 3u);
  EXPECT_EQ(r->criticalPath[0].rank, 1);
  EXPECT_EQ(r->criticalPath[0].kind, "compute");
  EXPECT_EQ(r->criticalPath[0].durNs, 40 * kMs);
  EXPECT_EQ(r->criticalPath[1].kind, "transfer");
  EXPECT_EQ(r->criticalPath[1].what, "tp-0 all_reduce");
  EXPECT_EQ(r->criticalPath[1].durNs, 2 * kMs);
  EXPECT_EQ(r->criticalPath[2].durNs, 5 * kMs);
  EXPECT_EQ(r->criticalPathNs, 47 * kMs);

  // Where it lies (the median step of three equal ones: step 2, s = 100 ms): rank 1's forward [s, s+40], its
  // all-reduce's transfer [s+40, s+42] measured on rank 1, then [s+42, s+47] — on the trace's own clock.
  EXPECT_EQ(r->criticalStep, 2);
  const int64_t s = 100 * kMs;
  EXPECT_EQ(r->criticalPath[0].startNs, s);
  EXPECT_EQ(r->criticalPath[0].endNs, s + 40 * kMs);
  EXPECT_EQ(r->criticalPath[0].thread, 0);
  EXPECT_EQ(r->criticalPath[1].rank, 1);
  EXPECT_EQ(r->criticalPath[1].startNs, s + 40 * kMs);
  EXPECT_EQ(r->criticalPath[1].endNs, s + 42 * kMs);
  EXPECT_EQ(r->criticalPath[2].startNs, s + 42 * kMs);
  EXPECT_EQ(r->criticalPath[2].endNs, s + 47 * kMs);
  const auto j = nlohmann::json::parse(whatIfToJson(*r, "ar.db"));
  EXPECT_EQ(j["critical_path"][1]["start_ns"], s + 40 * kMs);
  EXPECT_EQ(j["critical_path"][1]["end_ns"], s + 42 * kMs);
  EXPECT_EQ(j["critical_path"][1]["thread"], 0);
  EXPECT_EQ(criticalPathSummary(*r), "critical path of step 2: 47.000 ms, compute 45.000 ms, transfer 2.000 ms");

  // Asked for the path of a step the timeline shows: the median of those measured (step 0 is not: the warm-up).
  WhatIfOptions o;
  o.pathSteps = {0, 1};
  auto one = analyzeWhatIf(*reader, o);
  ASSERT_TRUE(one.isOk()) << one.error();
  EXPECT_EQ(one->criticalStep, 1);
  ASSERT_FALSE(one->criticalPath.empty());
  EXPECT_EQ(one->criticalPath.front().startNs, 50 * kMs);
  o.pathSteps = {0};  // none measured: the median of every measured step
  auto any = analyzeWhatIf(*reader, o);
  ASSERT_TRUE(any.isOk());
  EXPECT_EQ(any->criticalStep, 2);
}

TEST(WhatIf, BusBandwidthSetsTheTransfer) {
  const auto path = testDir() / "ar.db";
  writeAllReduceRun(path);
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  // 4 MB all-reduce over 2 ranks: busbw = algbw · 2(n−1)/n = algbw, so at 4 GB/s it takes 1 ms (1 ms saved) and at
  // 1 GB/s 4 ms (2 ms lost).
  for (auto [gbps, saving] : {std::pair{4.0, 1.0}, std::pair{1.0, -2.0}}) {
    WhatIfOptions o;
    o.busbwGbps = gbps;
    auto r = analyzeWhatIf(*reader, o);
    ASSERT_TRUE(r.isOk()) << r.error();
    const WhatIfChange* bw = find(*r, WhatIfChangeKind::CollectiveBusbw);
    ASSERT_NE(bw, nullptr);
    EXPECT_EQ(bw->collective, "tp:all_reduce");
    EXPECT_NEAR(bw->savingNs, saving * kMs, 1.0) << gbps;
  }
  WhatIfOptions other;
  other.busbwGbps = 4.0;
  other.collective = "dp:all_reduce";
  auto r = analyzeWhatIf(*reader, other);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(find(*r, WhatIfChangeKind::CollectiveBusbw), nullptr);
  ASSERT_FALSE(r->notes.empty());
  EXPECT_NE(r->notes.back().find("dp:all_reduce"), std::string::npos);
}

// The same scenario on GPU streams (device lanes, as a Kineto import gives them): per step, stream 7 of each rank runs
// a kernel (10 ms on rank 0, 40 ms on rank 1), the NCCL kernel of the all-reduce (rank 0's from s+10 waiting, rank 1's
// [s+40, s+42]) and a 5 ms kernel; the host thread holds only the step spans. Rank 1's stream is also 0.5 ms ahead of
// rank 0's clock (Kineto records no alignment): the replay moves it back on the NCCL kernels' common end.
TEST(WhatIf, DeviceLanesStragglerOnTheStreams) {
  const auto path = testDir() / "gpu.db";
  {
    Writer2 x{newWriter(path)};
    ASSERT_TRUE(x.w);
    ASSERT_TRUE(x.w->putGroup({"tp-0", {0, 1}, "nccl"}));
    for (int r = 0; r < 2; ++r) {
      tracedb::ThreadInfo t;
      t.rank = r;
      t.thread = 7;
      t.kind = std::string(tracedb::thread_kinds::kCudaStream);
      t.name = "stream 7";
      ASSERT_TRUE(x.w->putThread(t));
    }
    for (int step = 0; step < 4; ++step) {
      const int64_t s = 50 * kMs * step;
      for (int r = 0; r < 2; ++r) {
        const int64_t skew = r == 1 ? kMs / 2 : 0;
        const int64_t arrive = s + (r == 0 ? 10 : 40) * kMs + skew;
        x.span(r, "ProfilerStep", tracedb::SpanKind::Step, s + skew, s + 47 * kMs + skew, step);
        auto onStream = [&](const char* name, tracedb::SpanKind kind, int64_t b, int64_t e) {
          auto id = x.w->intern(name);
          ASSERT_TRUE(id.isOk());
          tracedb::SpanRow k;
          k.rank = r;
          k.thread = 7;
          k.kind = kind;
          k.name = *id;
          k.beginNs = b;
          k.durNs = e - b;
          k.step = step;
          ASSERT_TRUE(x.w->addSpan(k));
        };
        onStream("gemm", tracedb::SpanKind::Kernel, s + skew, arrive);
        onStream("ncclDevKernel_AllReduce", tracedb::SpanKind::NcclKernel, arrive, s + 42 * kMs + skew);
        x.record(r, "tp-0", step + 1, "all_reduce", arrive, s + 42 * kMs + skew, step, 4'000'000);
        onStream("gemm", tracedb::SpanKind::Kernel, s + 42 * kMs + skew, s + 47 * kMs + skew);
      }
    }
    ASSERT_TRUE(x.w->close());
  }
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  auto r = analyzeWhatIf(*reader);
  ASSERT_TRUE(r.isOk()) << r.error();
  EXPECT_TRUE(r->device);
  EXPECT_DOUBLE_EQ(r->measuredStepNs, 47.0 * kMs);
  EXPECT_DOUBLE_EQ(r->replayedStepNs, 47.0 * kMs);
  EXPECT_EQ(r->boundBlocks, 8);
  const WhatIfChange* straggler = find(*r, WhatIfChangeKind::Straggler);
  ASSERT_NE(straggler, nullptr);
  EXPECT_EQ(straggler->rank, 1);
  EXPECT_DOUBLE_EQ(straggler->savingNs, 30.0 * kMs);
  ASSERT_FALSE(r->criticalPath.empty());
  EXPECT_EQ(r->criticalPath.front().what, "stream 7");
  // Placed on the stream's own clock again (the replay moved rank 1 back by its 0.5 ms): rank 1's gemm of step 2.
  EXPECT_EQ(r->criticalPath.front().rank, 1);
  EXPECT_EQ(r->criticalPath.front().thread, 7);
  EXPECT_EQ(r->criticalPath.front().startNs, 100 * kMs + kMs / 2);
  EXPECT_EQ(r->criticalPath.front().endNs, 140 * kMs + kMs / 2);
}

// One message, steps 0..3 each 20 ms apart (ms from s): rank 0 computes [s, s+10], posts the send at s+10 and waits
// for it [s+10, s+12]; rank 1 waits in recv [s, s+12] (posted at s), then computes [s+12, s+17]. The receive ends
// when the send is posted plus the 2 ms transfer, measured on the receiver.
TEST(WhatIf, ReceiveWaitsForItsSend) {
  const auto path = testDir() / "p2p.db";
  {
    Writer2 x{newWriter(path)};
    ASSERT_TRUE(x.w);
    for (int step = 0; step < 4; ++step) {
      const int64_t s = 20 * kMs * step;
      x.span(0, "step", tracedb::SpanKind::Step, s, s + 12 * kMs, step);
      x.span(0, "forward mb 0", tracedb::SpanKind::Compute, s, s + 10 * kMs, step);
      x.span(0, "send wait", tracedb::SpanKind::Comm, s + 10 * kMs, s + 12 * kMs, step);
      x.record(0, "p2p-0-1", step + 1, "send", s + 10 * kMs, s + 12 * kMs, step);
      x.span(1, "step", tracedb::SpanKind::Step, s, s + 17 * kMs, step);
      x.span(1, "recv", tracedb::SpanKind::Comm, s, s + 12 * kMs, step);
      x.record(1, "p2p-0-1", step + 1, "recv", s, s + 12 * kMs, step);
      x.span(1, "forward mb 0", tracedb::SpanKind::Compute, s + 12 * kMs, s + 17 * kMs, step);
    }
    ASSERT_TRUE(x.w->close());
  }
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  auto r = analyzeWhatIf(*reader);
  ASSERT_TRUE(r.isOk()) << r.error();
  EXPECT_DOUBLE_EQ(r->measuredStepNs, 14.5 * kMs);  // (12 + 17) / 2
  EXPECT_DOUBLE_EQ(r->replayedStepNs, 14.5 * kMs);
  // Without the transfer both ranks are released at s+10: steps of 10 and 15 ms.
  const WhatIfChange* comm = find(*r, WhatIfChangeKind::CommOverlapped);
  ASSERT_NE(comm, nullptr);
  EXPECT_DOUBLE_EQ(comm->savingNs, 2.0 * kMs);
  // The path of rank 1's step: rank 0's 10 ms of compute, the transfer, rank 1's 5 ms.
  ASSERT_EQ(r->criticalPath.size(), 3u);
  EXPECT_EQ(r->criticalPath[0].rank, 0);
  EXPECT_EQ(r->criticalPath[0].durNs, 10 * kMs);
  EXPECT_EQ(r->criticalPath[1].what, "p2p-0-1 send");
  EXPECT_EQ(r->criticalPath[2].rank, 1);
  // The JSON contract.
  const auto j = nlohmann::json::parse(whatIfToJson(*r, "p2p.db"));
  EXPECT_EQ(j["measured_step_ms"], 14.5);
  EXPECT_EQ(j["replayed_step_ms"], 14.5);
  ASSERT_TRUE(j["changes"].is_array());
  bool sawComm = false;
  for (const auto& ch : j["changes"])
    if (ch["change"] == "comm_overlapped") {
      sawComm = true;
      EXPECT_EQ(ch["saving_ms"], 2.0);
      EXPECT_EQ(ch["predicted_step_ms"], 12.5);
    }
  EXPECT_TRUE(sawComm);
  EXPECT_EQ(j["critical_path"].size(), 3u);
}

// The simulated TP=2 × DP=2 run: every collective completes at its last arrival plus a fixed transfer, as the model
// says. Rank 1's data loading is 2 ms longer every step; every rank waits for it at the first TP all-reduce and the
// DP all-reduce joins the groups, so removing it saves exactly 2 ms per step.
TEST(WhatIf, SimulatedStragglerIsFoundAndItsDelaySaved) {
  const auto path = testDir() / "sim.db";
  testing::RunSpec spec;
  spec.stragglerRank = 1;
  spec.stragglerDelayNs = 2 * kMs;
  ASSERT_TRUE(testing::writeRun(path, spec));
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  auto r = analyzeWhatIf(*reader);
  ASSERT_TRUE(r.isOk()) << r.error();
  EXPECT_EQ(r->steps, spec.steps - 1);
  EXPECT_NEAR(r->replayedStepNs, r->measuredStepNs, 1.0);
  const WhatIfChange* straggler = find(*r, WhatIfChangeKind::Straggler);
  ASSERT_NE(straggler, nullptr);
  EXPECT_EQ(straggler->rank, 1);
  EXPECT_NEAR(straggler->savingNs, 2.0 * kMs, 1.0);
  EXPECT_EQ(straggler->ranks, std::vector<int>{1});

  // The same run without the straggler: nothing to remove, and its measured step is the prediction.
  const auto cleanPath = testDir() / "clean.db";
  spec.stragglerRank = -1;
  ASSERT_TRUE(testing::writeRun(cleanPath, spec));
  auto clean = openReader(cleanPath);
  ASSERT_TRUE(clean);
  auto c = analyzeWhatIf(*clean);
  ASSERT_TRUE(c.isOk()) << c.error();
  EXPECT_NEAR(c->measuredStepNs, straggler->predictedStepNs, 1.0);
  const WhatIfChange* none = find(*c, WhatIfChangeKind::Straggler);
  EXPECT_TRUE(none == nullptr || none->savingNs < 1.0);
}

// The critical path of the simulated straggler run, placed for drawing over the timeline: its segments follow each
// other in time inside the critical step's window (over the ranks' windows of that step), each at least as long as it
// counts, and together they are the path's total.
TEST(WhatIf, CriticalPathLiesInItsStepInTimeOrder) {
  const auto path = testDir() / "sim-path.db";
  testing::RunSpec spec;
  spec.stragglerRank = 1;
  ASSERT_TRUE(testing::writeRun(path, spec));
  auto reader = openReader(path);
  ASSERT_TRUE(reader);
  auto r = analyzeWhatIf(*reader);
  ASSERT_TRUE(r.isOk()) << r.error();
  auto breakdown = computeBreakdown(*reader);
  ASSERT_TRUE(breakdown.isOk());
  int64_t begin = INT64_MAX, end = INT64_MIN;
  for (const auto& s : breakdown->steps)
    if (s.step == r->criticalStep) {
      begin = std::min(begin, s.beginNs);
      end = std::max(end, s.endNs);
    }
  ASSERT_LT(begin, end) << "critical step " << r->criticalStep;
  ASSERT_GE(r->criticalPath.size(), 3u);
  int64_t sum = 0, previous = begin;
  bool sawTransfer = false;
  for (const auto& seg : r->criticalPath) {
    EXPECT_GE(seg.startNs, previous) << seg.kind << " " << seg.what << " on rank " << seg.rank;
    EXPECT_LE(seg.startNs + seg.durNs, seg.endNs);
    EXPECT_LE(seg.endNs, end);
    EXPECT_GE(seg.thread, 0);
    sawTransfer = sawTransfer || seg.kind == "transfer";
    previous = seg.startNs;
    sum += seg.durNs;
  }
  EXPECT_TRUE(sawTransfer);
  EXPECT_EQ(sum, r->criticalPathNs);
  // The replay matches this run: the path spans the step from its earliest begin to its latest end.
  EXPECT_NEAR(static_cast<double>(r->criticalPathNs), static_cast<double>(end - begin), 1e3);
  EXPECT_EQ(r->criticalPath.front().startNs, begin);
}

}  // namespace
}  // namespace tpscope::analysis
