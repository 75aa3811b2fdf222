// GPU activity on a CPU machine: the correlation logic with synthetic records, the recorder glue end to end with a
// fake source, the "no GPU → one line, host timers only" fallback, and (with CUDA built in) the real CUPTI source's
// fallback on this machine.
// These tests exercise the recorder through the probe macros whatever TPSCOPE_PROBES says for the build (the
// compiled-out case has its own TU), so the macros are on in this file.
#undef TPSCOPE_PROBES_ENABLED
#define TPSCOPE_PROBES_ENABLED 1
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "test_util.h"
#include "tpscope/probes/gpu_activity.h"
#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime.h"
#include "tpscope/tracedb/query.h"
#include "tpscope/tracedb/reader.h"

namespace tp = tpscope::probes;
namespace db = tpscope::tracedb;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// GpuCorrelator alone: host spans and GPU records with hand-picked times (all in file ns).

constexpr int64_t kTid = 4242;    // the launching thread's Linux tid
constexpr uint32_t kThread = 3;   // its dense id

tp::GpuCorrelator makeCorrelator(tp::GpuCorrelator::Options o = {}) {
  return tp::GpuCorrelator([](int64_t tid) -> std::optional<uint32_t> {
    if (tid == kTid) return kThread;
    return std::nullopt;
  }, o);
}

tp::HostSpanRef host(int64_t id, tp::SpanKind kind, int64_t begin, int64_t end, int step = 1, int layer = -1) {
  return tp::HostSpanRef{id, kThread, kind, begin, end, step, static_cast<int16_t>(layer), tp::Phase::Forward};
}

tp::GpuActivity launch(uint32_t corr, int64_t t) {
  tp::GpuActivity a;
  a.kind = tp::GpuActivityKind::Launch;
  a.correlationId = corr;
  a.threadId = kTid;
  a.startNs = t;
  a.endNs = t + 5;
  a.name = "cudaLaunchKernel";
  return a;
}

tp::GpuActivity gpu(uint32_t corr, std::string name, int64_t start, tp::GpuActivityKind kind = tp::GpuActivityKind::Kernel,
                    uint32_t stream = 7) {
  tp::GpuActivity a;
  a.kind = kind;
  a.correlationId = corr;
  a.startNs = start;
  a.endNs = start + 100;
  a.streamId = stream;
  a.name = std::move(name);
  return a;
}

TEST(GpuCorrelator, AKernelGoesToTheInnermostEnclosingHostSpan) {
  auto c = makeCorrelator();
  // Spans arrive in end order: inner (layer 2, 100..200), then outer step (0..1000).
  const tp::HostSpanRef spans[] = {host(10, tp::SpanKind::Compute, 100, 200, 5, 2),
                                   host(11, tp::SpanKind::Step, 0, 1000, 5)};
  c.addHostSpans(spans);
  const tp::GpuActivity recs[] = {launch(1, 150), gpu(1, "gemm_kernel", 300), launch(2, 500),
                                  gpu(2, "elementwise", 600), gpu(3, "memcpy HtoD", 700, tp::GpuActivityKind::Memcpy)};
  c.addActivities(recs, 0);
  std::vector<tp::GpuCorrelator::Resolved> out;
  c.resolve(0, false, &out);
  ASSERT_EQ(out.size(), 2u);  // #3 has no launch yet: it waits
  EXPECT_EQ(out[0].activity.name, "gemm_kernel");
  EXPECT_EQ(out[0].kind, tp::SpanKind::Kernel);
  EXPECT_EQ(out[0].hostSpan, 10);
  EXPECT_EQ(out[0].layer, 2);
  EXPECT_EQ(out[0].step, 5);
  EXPECT_EQ(out[1].hostSpan, 11);  // launched in the step but outside the layer span
  EXPECT_EQ(c.pending(), 1u);
  const tp::GpuActivity late[] = {launch(3, 120)};
  c.addActivities(late, 0);
  out.clear();
  c.resolve(0, false, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, tp::SpanKind::Memcpy);
  EXPECT_EQ(out[0].hostSpan, 10);
  EXPECT_EQ(c.stats().correlated, 3u);
}

TEST(GpuCorrelator, NcclNeedsBothTheNameAndACommSpan) {
  auto c = makeCorrelator();
  const tp::HostSpanRef spans[] = {
      host(20, tp::SpanKind::Comm, 100, 200),     // the collective's host span
      host(21, tp::SpanKind::Compute, 300, 400),  // plain compute
      host(22, tp::SpanKind::Step, 0, 1000),
  };
  c.addHostSpans(spans);
  const tp::GpuActivity recs[] = {
      launch(1, 150), gpu(1, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 160),
      launch(2, 160), gpu(2, "void my::reduce_kernel<float>(float*)", 170),  // in Comm, not NCCL by name
      launch(3, 350), gpu(3, "ncclLikeButCompute", 360),                     // NCCL name, not in a Comm span
      launch(4, 170), gpu(4, "void at::NCCL_fused_copy()", 180),             // any case, anywhere in the name
  };
  c.addActivities(recs, 0);
  std::vector<tp::GpuCorrelator::Resolved> out;
  c.resolve(0, false, &out);
  std::map<uint32_t, tp::GpuCorrelator::Resolved> byCorr;
  for (auto& r : out) byCorr[r.activity.correlationId] = r;
  ASSERT_EQ(byCorr.size(), 3u);  // #3 waits: an enclosing Comm span might still end later
  EXPECT_EQ(byCorr[1].kind, tp::SpanKind::NcclKernel);
  EXPECT_EQ(byCorr[1].hostSpan, 20);
  EXPECT_EQ(byCorr[2].kind, tp::SpanKind::Kernel);
  EXPECT_EQ(byCorr[4].kind, tp::SpanKind::NcclKernel);
  // After its grace period #3 settles as a plain kernel of its compute span.
  out.clear();
  c.resolve(3'000'000'000, false, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, tp::SpanKind::Kernel);
  EXPECT_EQ(out[0].hostSpan, 21);
  EXPECT_EQ(c.stats().ncclKernels, 2u);
}

TEST(GpuCorrelator, AnNcclKernelWaitsForAnOuterCommSpanThatEndsLater) {
  auto c = makeCorrelator();
  // The launch sits in a compute span nested in a Comm span that has not ended yet.
  const tp::HostSpanRef inner[] = {host(30, tp::SpanKind::Compute, 100, 200)};
  c.addHostSpans(inner);
  const tp::GpuActivity recs[] = {launch(1, 150), gpu(1, "ncclKernel_AllGather", 160)};
  c.addActivities(recs, 0);
  std::vector<tp::GpuCorrelator::Resolved> out;
  c.resolve(0, false, &out);
  EXPECT_TRUE(out.empty());
  const tp::HostSpanRef outer[] = {host(31, tp::SpanKind::Comm, 50, 500)};
  c.addHostSpans(outer);
  c.resolve(10, false, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, tp::SpanKind::NcclKernel);
  EXPECT_EQ(out[0].hostSpan, 30);  // correlation stays with the innermost span
}

TEST(GpuCorrelator, WithoutALaunchARecordIsWrittenUncorrelatedAfterItsGrace) {
  tp::GpuCorrelator::Options o;
  o.graceNs = 1000;
  auto c = makeCorrelator(o);
  const tp::GpuActivity recs[] = {gpu(9, "orphan", 10)};
  c.addActivities(recs, 0);
  std::vector<tp::GpuCorrelator::Resolved> out;
  c.resolve(999, false, &out);
  EXPECT_TRUE(out.empty());
  c.resolve(1000, false, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].hostSpan.has_value());
  EXPECT_EQ(c.stats().uncorrelated, 1u);
}

TEST(GpuCorrelator, TheFinalFlushSettlesEverything) {
  auto c = makeCorrelator();
  const tp::GpuActivity recs[] = {gpu(1, "a", 1), gpu(2, "ncclX", 2), launch(3, 5), gpu(3, "b", 6)};
  c.addActivities(recs, 0);
  std::vector<tp::GpuCorrelator::Resolved> out;
  c.resolve(0, true, &out);
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(c.pending(), 0u);
}

TEST(GpuCorrelator, PendingRecordsAreBoundedAndDropsCounted) {
  tp::GpuCorrelator::Options o;
  o.maxPending = 4;
  auto c = makeCorrelator(o);
  std::vector<tp::GpuActivity> recs;
  for (uint32_t i = 0; i < 10; ++i) recs.push_back(gpu(100 + i, "k", i));
  c.addActivities(recs, 0);
  EXPECT_EQ(c.pending(), 4u);
  EXPECT_EQ(c.stats().dropped, 6u);
}

TEST(GpuCorrelator, OldHostSpansLeaveTheWindow) {
  tp::GpuCorrelator::Options o;
  o.hostWindowNs = 1000;
  auto c = makeCorrelator(o);
  const tp::HostSpanRef old[] = {host(1, tp::SpanKind::Compute, 0, 100)};
  c.addHostSpans(old);
  std::vector<tp::GpuCorrelator::Resolved> out;
  c.resolve(0, false, &out);
  const tp::HostSpanRef recent[] = {host(2, tp::SpanKind::Compute, 5000, 6000)};
  c.addHostSpans(recent);
  c.resolve(0, false, &out);  // prunes the span that ended 5900 ns before the newest
  const tp::GpuActivity recs[] = {launch(1, 50), gpu(1, "k", 60)};
  c.addActivities(recs, 0);
  c.resolve(0, true, &out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].hostSpan.has_value());
}

// ---------------------------------------------------------------------------------------------------------------
// The recorder glue with a fake source, end to end into a rank file.

class FakeSource final : public tp::GpuActivitySource {
 public:
  explicit FakeSource(bool available = true, std::string reason = {})
      : available_(available), reason_(std::move(reason)) {}
  std::string_view name() const override { return "fake"; }
  bool enable(Callback cb) override {
    if (!available_) return false;
    callback_ = std::move(cb);
    return true;
  }
  void disable() override { callback_ = nullptr; }
  void flush() override {
    if (callback_ && !buffered_.empty()) callback_(buffered_);
    buffered_.clear();
  }
  std::string reason() const override { return reason_; }
  // The "GPU": records are delivered at the next flush(), like CUPTI buffers.
  void emit(tp::GpuActivity a) { buffered_.push_back(std::move(a)); }

 private:
  bool available_;
  std::string reason_;
  Callback callback_;
  std::vector<tp::GpuActivity> buffered_;
};

tp::RuntimeOptions options(const std::filesystem::path& dir) {
  tp::RuntimeOptions o;
  o.outDir = dir;
  o.runId = "gpu-test";
  o.installSignalHandlers = false;
  o.flushAtExit = false;
  return o;
}

int64_t tid() { return static_cast<int64_t>(syscall(SYS_gettid)); }

struct GpuRow {
  int kind;
  int thread;
  std::string name;
  std::optional<std::string> hostName;
  std::optional<int> hostKind;
  int step, layer;
};

std::vector<GpuRow> gpuRows(db::Reader& r) {
  std::vector<GpuRow> out;
  const char* sql =
      "SELECT s.kind, s.thread, n.value, hn.value, h.kind, s.step, s.layer FROM spans s JOIN strings n ON n.id = s.name"
      " LEFT JOIN spans h ON h.id = s.correlation LEFT JOIN strings hn ON hn.id = h.name"
      " WHERE s.kind IN (6, 7, 8, 9) ORDER BY s.begin_ns";
  const db::Status s = db::Query(r, sql, "GPU spans").each([&](db::Query& q) {
    GpuRow row;
    row.kind = q.i32(0);
    row.thread = q.i32(1);
    row.name = q.text(2);
    if (!q.isNull(3)) {
      row.hostName = q.text(3);
      row.hostKind = q.i32(4);
    }
    row.step = q.i32(5);
    row.layer = q.i32(6);
    out.push_back(row);
  });
  EXPECT_TRUE(s.isOk()) << s.message();
  return out;
}

TEST(GpuActivityRecorder, FakeRecordsLandCorrelatedOnStreamLanes) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  auto fake = std::make_unique<FakeSource>();
  FakeSource* src = fake.get();
  tp::GpuActivityRecorder gpuRec(std::move(fake));
  ASSERT_TRUE(gpuRec.start());
  EXPECT_TRUE(gpuRec.active());

  uint32_t corr = 0;
  // Launches sit 300 µs inside their spans (and spans 300 µs apart): far beyond the tick calibration's error.
  auto pause = [] { std::this_thread::sleep_for(std::chrono::microseconds(300)); };
  auto launchHere = [&](const std::string& kernel, uint32_t stream, tp::GpuActivityKind kind) {
    pause();
    const int64_t t = tp::monotonicNs();
    tp::GpuActivity l;
    l.kind = tp::GpuActivityKind::Launch;
    l.correlationId = ++corr;
    l.threadId = tid();
    l.startNs = t;
    l.endNs = t + 1000;
    src->emit(l);
    tp::GpuActivity k;
    k.kind = kind;
    k.correlationId = corr;
    k.streamId = stream;
    k.startNs = t + 5000;  // runs on the GPU after the launch (and after its host span ended)
    k.endNs = t + 50'000'000;
    k.name = kernel;
    src->emit(k);
    pause();
  };
  tp::setStep(12);
  {
    TPS_SPAN("train.step", Step, None);
    {
      TPS_SPAN_LAYER("layer.mlp.fwd", Compute, Forward, 3);
      launchHere("void gemm_kernel<float>()", 7, tp::GpuActivityKind::Kernel);
      launchHere("memcpy HtoD", 7, tp::GpuActivityKind::Memcpy);
    }
    {
      TPS_SPAN_LAYER("tp.all_reduce", Comm, Forward, 3);
      launchHere("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 9, tp::GpuActivityKind::Kernel);
    }
    launchHere("ncclDevKernel_Broadcast", 9, tp::GpuActivityKind::Kernel);  // NCCL name, no Comm span
  }
  tp::setStep(-1);
  src->flush();
  gpuRec.stop();
  tp::stop();

  const auto stats = gpuRec.stats();
  EXPECT_EQ(stats.received, 8u);
  EXPECT_EQ(stats.written, 4u);
  EXPECT_EQ(stats.correlated, 4u);
  EXPECT_EQ(stats.ncclKernels, 1u);
  auto reader = db::Reader::open(dir.path() / "rank-0.db");
  ASSERT_TRUE(reader.isOk()) << reader.error();
  const auto rows = gpuRows(**reader);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].kind, 6);
  EXPECT_EQ(rows[0].hostName, "layer.mlp.fwd");
  EXPECT_EQ(rows[0].step, 12);
  EXPECT_EQ(rows[0].layer, 3);
  EXPECT_EQ(rows[1].kind, 7);  // memcpy
  EXPECT_EQ(rows[1].hostName, "layer.mlp.fwd");
  EXPECT_EQ(rows[2].kind, 9);  // NCCL kernel in the Comm span
  EXPECT_EQ(rows[2].hostName, "tp.all_reduce");
  EXPECT_EQ(rows[2].hostKind, 1);
  EXPECT_EQ(rows[3].kind, 6);  // NCCL by name only: a plain kernel, of the step
  EXPECT_EQ(rows[3].hostName, "train.step");
  EXPECT_NE(rows[0].thread, rows[2].thread);  // streams 7 and 9 are different lanes
  auto threads = (*reader)->threads();
  ASSERT_TRUE(threads.isOk());
  int streamLanes = 0;
  for (const auto& t : *threads) {
    if (t.kind == "cuda-stream") {
      ++streamLanes;
      EXPECT_GE(t.thread, 65536);
      EXPECT_EQ(t.name.rfind("cuda0 stream ", 0), 0u) << t.name;
    }
  }
  EXPECT_EQ(streamLanes, 2);
}

TEST(GpuActivityRecorder, TheFinalFlushCollectsWhatTheSourceStillHolds) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  auto fake = std::make_unique<FakeSource>();
  FakeSource* src = fake.get();
  tp::GpuActivityRecorder gpuRec(std::move(fake));
  ASSERT_TRUE(gpuRec.start());
  tp::GpuActivity k;
  k.kind = tp::GpuActivityKind::Kernel;
  k.correlationId = 77;  // its launch never comes
  k.startNs = tp::monotonicNs();
  k.endNs = k.startNs + 10;
  k.name = "late_kernel";
  src->emit(k);
  tp::stop();  // the recorder stops first: its final flush pulls from the source and settles everything
  auto reader = db::Reader::open(dir.path() / "rank-0.db");
  ASSERT_TRUE(reader.isOk());
  const auto rows = gpuRows(**reader);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].name, "late_kernel");
  EXPECT_FALSE(rows[0].hostName.has_value());
  gpuRec.stop();
}

TEST(GpuActivityRecorder, NoGpuMeansOneLineAndHostTimersOnly) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  tp::GpuActivityRecorder gpuRec(std::make_unique<FakeSource>(
      false, "cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) failed: CUPTI_ERROR_UNKNOWN"));
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(gpuRec.start());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("CUPTI_ERROR_UNKNOWN"), std::string::npos) << err;
  EXPECT_NE(err.find("host timers only"), std::string::npos) << err;
  EXPECT_FALSE(gpuRec.active());
  { TPS_SPAN("host.only", Compute, Forward); }
  tp::stop();
  auto reader = db::Reader::open(dir.path() / "rank-0.db");
  ASSERT_TRUE(reader.isOk());
  EXPECT_EQ(*(*reader)->spanCount(), 1);
}

TEST(CuptiSource, WithoutAGpuItDisablesItselfWithOneLine) {
  auto source = tp::makeCuptiSource();
  ASSERT_TRUE(source);
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  tp::GpuActivityRecorder gpuRec(std::move(source));
  ::testing::internal::CaptureStderr();
  const bool on = gpuRec.start();
  const std::string err = ::testing::internal::GetCapturedStderr();
  if (on) {
    gpuRec.stop();
    tp::stop();
    GTEST_SKIP() << "CUPTI is available here (a GPU is present): the fallback does not apply";
  }
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("host timers only"), std::string::npos) << err;
#ifdef TPSCOPE_HAVE_CUPTI
  EXPECT_NE(err.find("cupti"), std::string::npos) << err;  // names the failing CUPTI call
#else
  EXPECT_NE(err.find("without the CUDA toolkit"), std::string::npos) << err;
#endif
  { TPS_SPAN("host.only", Compute, Forward); }
  tp::stop();
  auto reader = db::Reader::open(dir.path() / "rank-0.db");
  ASSERT_TRUE(reader.isOk());
  EXPECT_EQ(*(*reader)->spanCount(), 1);
}

}  // namespace
