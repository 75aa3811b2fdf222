// Time breakdown: interval arithmetic, step windows from each source, exact shares on hand-made spans.
#include <gtest/gtest.h>

#include "intervals.h"
#include "test_file.h"
#include "tpscope/analysis/breakdown.h"

namespace tpscope::analysis {
namespace {

using detail::IntervalSet;
using testing::newWriter;
using testing::openReader;
using testing::testDir;
using tracedb::Phase;
using tracedb::SpanKind;
using tracedb::SpanRow;

TEST(IntervalSet, UnionAndWindowMeasures) {
  IntervalSet s({{50, 60}, {0, 10}, {5, 20}, {30, 30}, {40, 45}});
  ASSERT_EQ(s.intervals().size(), 3u);  // [0,20) [40,45) [50,60); the empty one dropped
  EXPECT_EQ(s.total(), 35);
  EXPECT_EQ(s.measure(0, 100), 35);
  EXPECT_EQ(s.measure(15, 42), 7);
  EXPECT_EQ(s.measure(20, 40), 0);
  EXPECT_EQ(s.measure(55, 55), 0);
  EXPECT_EQ(s.measure(-10, 5), 5);
  const IntervalSet t({{10, 52}});
  EXPECT_EQ(s.intersect(t).total(), 10 + 5 + 2);
  EXPECT_EQ(s.unite(t).total(), 60);
  // s \ {[5,8) [15,42) [55,70)} = [0,5) [8,15) [42,45) [50,55)
  const IntervalSet holes({{5, 8}, {15, 42}, {55, 70}});
  const IntervalSet rest = s.subtract(holes);
  ASSERT_EQ(rest.intervals().size(), 4u);
  EXPECT_EQ(rest.intervals()[1], (detail::Interval{8, 15}));
  EXPECT_EQ(rest.total(), 5 + 7 + 3 + 5);
  EXPECT_EQ(s.subtract(IntervalSet()).total(), s.total());
  EXPECT_EQ(s.subtract(IntervalSet({{-5, 100}})).total(), 0);
}

// rank 0, one step [0, 100): compute [0,50) and [60,80) on thread 0; comm [40,70) on thread 1 (overlapping
// compute on [40,50) and [60,70)); data [85,90); nothing in [80,85) and [90,100).
void writeOneStep(tracedb::Writer& w, bool withStepSpan, bool withStepStats) {
  auto n = [&](const char* s) { return *w.intern(s); };
  std::vector<SpanRow> spans = {
      {0, 0, SpanKind::Compute, n("fwd"), 0, 50, 3, 0, Phase::Forward, std::nullopt},
      {0, 0, SpanKind::Compute, n("fwd.inner"), 10, 20, 3, 0, Phase::Forward, std::nullopt},  // nested: counted once
      {0, 0, SpanKind::Compute, n("bwd"), 60, 20, 3, 0, Phase::Backward, std::nullopt},
      {0, 1, SpanKind::Comm, n("all_reduce"), 40, 30, 3, 0, Phase::Forward, std::nullopt},
      {0, 0, SpanKind::Data, n("data"), 85, 5, 3, -1, Phase::Data, std::nullopt},
  };
  if (withStepSpan) spans.push_back({0, 0, SpanKind::Step, n("step"), 0, 100, 3, -1, Phase::None, std::nullopt});
  ASSERT_TRUE(w.addSpans(spans));
  if (withStepStats) {
    tracedb::StepStatRow s;
    s.rank = 0;
    s.step = 3;
    s.beginNs = 0;
    s.endNs = 100;
    ASSERT_TRUE(w.putStepStat(s));
  }
}

TEST(Breakdown, ExactSharesFromStepSpans) {
  const auto path = testDir() / "one.db";
  {
    auto w = newWriter(path);
    writeOneStep(*w, true, false);
    ASSERT_TRUE(w->close());
  }
  auto r = openReader(path);
  auto b = computeBreakdown(*r);
  ASSERT_TRUE(b) << b.error();
  EXPECT_EQ(b->source, StepSource::StepSpans);
  ASSERT_EQ(b->steps.size(), 1u);
  const TimeShares& t = b->steps[0].time;
  EXPECT_EQ(b->steps[0].step, 3);
  EXPECT_EQ(t.stepNs, 100);
  EXPECT_EQ(t.computeNs, 70);
  EXPECT_EQ(t.commNs, 30);
  EXPECT_EQ(t.exposedCommNs, 10);  // [50,60)
  EXPECT_EQ(t.otherNs, 5);         // data
  EXPECT_EQ(t.idleNs, 15);         // [80,85) and [90,100)
  EXPECT_EQ(t.computeNs + t.exposedCommNs + t.otherNs + t.idleNs, t.stepNs);
  EXPECT_DOUBLE_EQ(t.commOverheadPct(), 10.0);
  ASSERT_EQ(b->ranks.size(), 1u);
  EXPECT_EQ(b->ranks[0].time.computeNs, 70);
  EXPECT_EQ(b->run.idleNs, 15);
}

TEST(Breakdown, FallsBackToStepStatsThenSpanSteps) {
  const auto dir = testDir();
  {
    auto w = newWriter(dir / "stats.db");
    writeOneStep(*w, false, true);
    ASSERT_TRUE(w->close());
    auto w2 = newWriter(dir / "spans.db");
    writeOneStep(*w2, false, false);
    ASSERT_TRUE(w2->close());
  }
  auto r1 = openReader(dir / "stats.db");
  auto b1 = computeBreakdown(*r1);
  ASSERT_TRUE(b1) << b1.error();
  EXPECT_EQ(b1->source, StepSource::StepStats);
  EXPECT_EQ(b1->steps.at(0).time.idleNs, 15);

  auto r2 = openReader(dir / "spans.db");
  auto b2 = computeBreakdown(*r2);
  ASSERT_TRUE(b2) << b2.error();
  EXPECT_EQ(b2->source, StepSource::SpanSteps);
  // The extent of the spans of step 3 is [0, 90): the trailing idle time is not part of it.
  EXPECT_EQ(b2->steps.at(0).time.stepNs, 90);
  EXPECT_EQ(b2->steps.at(0).time.idleNs, 5);
}

TEST(Breakdown, CollectiveRecordsCountAsCommunicationAndUnlabelledSpansAsOneWindow) {
  const auto path = testDir() / "coll.db";
  {
    auto w = newWriter(path);
    auto n = *w->intern("k");
    ASSERT_TRUE(w->addSpan({1, 0, SpanKind::Compute, n, 0, 40, -1, -1, Phase::None, std::nullopt}));
    ASSERT_TRUE(w->addSpan({1, 0, SpanKind::Other, n, 90, 10, -1, -1, Phase::None, std::nullopt}));
    tracedb::CollectiveRow c;
    c.rank = 1;
    c.group = "world";
    c.seq = 1;
    c.op = "all_reduce";
    c.enqueueNs = 20;
    c.startNs = 30;
    c.endNs = 60;
    c.state = tracedb::CollectiveState::Completed;
    ASSERT_TRUE(w->upsertCollective(c));
    c.seq = 2;  // never completed: no duration
    c.enqueueNs = 70;
    c.startNs.reset();
    c.endNs.reset();
    c.state = tracedb::CollectiveState::Scheduled;
    ASSERT_TRUE(w->upsertCollective(c));
    ASSERT_TRUE(w->close());
  }
  auto r = openReader(path);
  auto b = computeBreakdown(*r);
  ASSERT_TRUE(b) << b.error();
  EXPECT_EQ(b->source, StepSource::WholeRun);
  ASSERT_EQ(b->steps.size(), 1u);
  const TimeShares& t = b->steps[0].time;
  EXPECT_EQ(t.stepNs, 100);
  EXPECT_EQ(t.computeNs, 40);
  EXPECT_EQ(t.commNs, 30);         // [30, 60) from start_ns
  EXPECT_EQ(t.exposedCommNs, 20);  // [40, 60)
  EXPECT_EQ(t.otherNs, 10);
  EXPECT_EQ(t.idleNs, 30);
}

// A thread blocked in a collective inside a compute span (a TP all-reduce inside "attention forward") is not
// computing: the comm span carves its time out of that thread's compute. The same comm on another thread overlaps.
TEST(Breakdown, CommunicationNestedInComputeOnTheSameThreadIsExposed) {
  const auto path = testDir() / "nested.db";
  {
    auto w = newWriter(path);
    auto n = [&](const char* s) { return *w->intern(s); };
    const std::vector<SpanRow> spans = {
        {0, 0, SpanKind::Step, n("step"), 0, 100, 1, -1, Phase::None, std::nullopt},
        {0, 0, SpanKind::Compute, n("attention forward"), 0, 60, 1, 0, Phase::Forward, std::nullopt},
        {0, 0, SpanKind::Comm, n("all_reduce"), 20, 15, 1, 0, Phase::Forward, std::nullopt},    // blocks thread 0
        {0, 1, SpanKind::Comm, n("all_reduce"), 50, 20, 1, -1, Phase::Backward, std::nullopt},  // thread 1: async
        {0, 0, SpanKind::Compute, n("mlp forward"), 60, 30, 1, 0, Phase::Forward, std::nullopt},
    };
    ASSERT_TRUE(w->addSpans(spans));
    ASSERT_TRUE(w->close());
  }
  auto r = openReader(path);
  auto b = computeBreakdown(*r);
  ASSERT_TRUE(b) << b.error();
  ASSERT_EQ(b->steps.size(), 1u);
  const TimeShares& t = b->steps[0].time;
  EXPECT_EQ(t.stepNs, 100);
  EXPECT_EQ(t.computeNs, 90 - 15);  // [0,20) [35,90)
  EXPECT_EQ(t.commNs, 15 + 20);     // [20,35) [50,70)
  EXPECT_EQ(t.exposedCommNs, 15);   // the nested one; thread 1's is overlapped by [50,70) of thread 0's compute
  EXPECT_EQ(t.idleNs, 10);
  EXPECT_EQ(t.computeNs + t.exposedCommNs + t.otherNs + t.idleNs, t.stepNs);
}

// Rank 0 has GPU streams 10007 and 10008: its time is read there, and the host spans (a "forward" that covers the
// whole step) do not count. Correlations tie each GPU span to its launch on host thread 0.
//   kernel  [100,300)   launched at 10   leading gap [0,100): launched after it began   -> host wait 100
//   nccl    [250,450)   stream 10008     overlaps the kernel on [250,300)              -> exposed 150
//   kernel  [460,600)   launched at 30   gap [450,460) with the kernel queued, < 30 µs -> kernel wait 10
//   memcpy  [650,700)   launched at 620  gap [600,650): launched after it began        -> host wait 50
//   kernel  [100000,100100) launched at 40: gap [700,100000) queued, >= 30 µs          -> other 99300
//   after the last GPU work, [100100,200000)                                          -> other 99900
// Rank 1 declares a stream but runs no GPU work on it (an annotation only): host lanes, the host rules.
TEST(Breakdown, DeviceLanesWhereTheRankHasGpuWork) {
  const auto path = testDir() / "device.db";
  {
    auto w = newWriter(path);
    auto n = [&](const char* s) { return *w->intern(s); };
    for (int stream : {10007, 10008})
      ASSERT_TRUE(w->putThread({0, stream, std::string(tracedb::thread_kinds::kCudaStream), "stream"}));
    ASSERT_TRUE(w->putThread({1, 10007, std::string(tracedb::thread_kinds::kCudaStream), "stream 7"}));
    const std::vector<SpanRow> spans = {
        {0, 0, SpanKind::Step, n("ProfilerStep#1"), 0, 200000, 1, -1, Phase::None, std::nullopt},
        {0, 0, SpanKind::Compute, n("forward"), 0, 200000, 1, -1, Phase::Forward, std::nullopt},
        {0, 0, SpanKind::Other, n("cudaLaunchKernel"), 10, 2, 1, -1, Phase::Forward, 1},
        {0, 0, SpanKind::Other, n("cudaLaunchKernel"), 20, 2, 1, -1, Phase::Forward, 2},
        {0, 0, SpanKind::Other, n("cudaLaunchKernel"), 30, 2, 1, -1, Phase::Forward, 4},
        {0, 0, SpanKind::Other, n("cudaLaunchKernel"), 40, 2, 1, -1, Phase::Forward, 5},
        {0, 0, SpanKind::Other, n("cudaMemcpyAsync"), 620, 2, 1, -1, Phase::Forward, 3},
        {0, 10007, SpanKind::Kernel, n("gemm"), 100, 200, 1, -1, Phase::Forward, 1},
        {0, 10008, SpanKind::NcclKernel, n("ncclDevKernel_AllReduce"), 250, 200, 1, -1, Phase::Forward, 2},
        {0, 10007, SpanKind::Kernel, n("gemm"), 460, 140, 1, -1, Phase::Forward, 4},
        {0, 10007, SpanKind::Memcpy, n("Memcpy HtoD"), 650, 50, 1, -1, Phase::Forward, 3},
        {0, 10007, SpanKind::Kernel, n("gemm"), 100000, 100, 1, -1, Phase::Forward, 5},
        {1, 0, SpanKind::Step, n("ProfilerStep#1"), 0, 100, 1, -1, Phase::None, std::nullopt},
        {1, 0, SpanKind::Compute, n("forward"), 0, 50, 1, -1, Phase::Forward, std::nullopt},
        {1, 10007, SpanKind::Other, n("annotation"), 60, 10, 1, -1, Phase::Forward, std::nullopt},
    };
    ASSERT_TRUE(w->addSpans(spans));
    ASSERT_TRUE(w->close());
  }
  auto r = openReader(path);
  auto b = computeBreakdown(*r);
  ASSERT_TRUE(b) << b.error();
  ASSERT_EQ(b->ranks.size(), 2u);
  EXPECT_EQ(b->ranks[0].lanes, Lanes::Device);
  EXPECT_EQ(b->ranks[1].lanes, Lanes::Host);
  const TimeShares& d = b->ranks[0].time;
  EXPECT_EQ(d.stepNs, 200000);
  EXPECT_EQ(d.computeNs, 200 + 140 + 100);
  EXPECT_EQ(d.commNs, 200);
  EXPECT_EQ(d.overlapNs(), 50);
  EXPECT_EQ(d.exposedCommNs, 150);
  EXPECT_EQ(d.memcpyNs, 50);
  EXPECT_EQ(d.otherNs, 50);  // the memcpy, alone
  EXPECT_EQ(d.idleNs, 200000 - 640);
  EXPECT_EQ(d.idleHostWaitNs, 100 + 50);
  EXPECT_EQ(d.idleKernelWaitNs, 10);
  EXPECT_EQ(d.idleOtherNs, 99300 + 99900);
  EXPECT_EQ(d.computeNs + d.exposedCommNs + d.otherNs + d.idleNs, d.stepNs);
  const TimeShares& h = b->ranks[1].time;
  EXPECT_EQ(h.computeNs, 50);
  EXPECT_EQ(h.otherNs, 10);
  EXPECT_EQ(h.idleNs, 40);
  EXPECT_EQ(h.memcpyNs + h.idleHostWaitNs + h.idleKernelWaitNs + h.idleOtherNs, 0);
}

TEST(Breakdown, EmptyRunHasNoRows) {
  const auto path = testDir() / "empty.db";
  ASSERT_TRUE(newWriter(path)->close());
  auto r = openReader(path);
  auto b = computeBreakdown(*r);
  ASSERT_TRUE(b) << b.error();
  EXPECT_TRUE(b->steps.empty());
  EXPECT_TRUE(b->ranks.empty());
}

}  // namespace
}  // namespace tpscope::analysis
