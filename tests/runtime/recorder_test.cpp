// The recorder in one process: completeness under threads, counted drops, the flight recorder, records, metadata.
// These tests exercise the recorder through the probe macros whatever TPSCOPE_PROBES says for the build (the
// compiled-out case has its own TU), so the macros are on in this file.
#undef TPSCOPE_PROBES_ENABLED
#define TPSCOPE_PROBES_ENABLED 1
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <latch>
#include <new>
#include <set>
#include <span>
#include <string_view>
#include <thread>

#include "test_util.h"
#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime.h"
#include "tpscope/probes/runtime_hooks.h"
#include "tpscope/tracedb/reader.h"

namespace tp = tpscope::probes;
namespace db = tpscope::tracedb;

// compiled_out.cpp: the same macros in a TU built with TPSCOPE_PROBES_ENABLED=0.
int compiledOutWork(int n);

// Heap allocations made by the calling thread (this binary replaces the global operator new): a recording probe on
// the training thread must not leave small long-lived blocks in the heap it shares with the tensors.
namespace {
thread_local int64_t t_allocations = 0;
}  // namespace
void* operator new(std::size_t n) {
  ++t_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // this operator new is malloc
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
#pragma GCC diagnostic pop

namespace {

// A float32 all-reduce of `shape` in `group`, as the engine describes one (seq, layer and phase left to the test).
tp::CollectiveDesc allReduce(std::string_view group, std::span<const int> ranks, std::span<const int64_t> shape,
                             std::string_view callsite) {
  tp::CollectiveDesc d;
  d.group = group;
  d.groupRanks = ranks;
  d.op = "all_reduce";
  d.dtype = "float32";
  d.shape = shape;
  d.numel = 1;
  for (int64_t n : shape) d.numel *= n;
  d.bytes = d.numel * 4;
  d.callsite = callsite;
  return d;
}

constexpr tp::Site kSites[4] = {
    {"worker.0", "", __FILE__, __LINE__, tp::SpanKind::Compute, tp::Phase::Forward},
    {"worker.1", "", __FILE__, __LINE__, tp::SpanKind::Comm, tp::Phase::Backward},
    {"worker.2", "", __FILE__, __LINE__, tp::SpanKind::Data, tp::Phase::Data},
    {"worker.3", "", __FILE__, __LINE__, tp::SpanKind::Optimizer, tp::Phase::Optimizer},
};
constexpr tp::Site kMain{"main.span", "", __FILE__, __LINE__, tp::SpanKind::Step, tp::Phase::None};

tp::RuntimeOptions options(const std::filesystem::path& dir) {
  tp::RuntimeOptions o;
  o.outDir = dir;
  o.runId = "test-run";
  o.rank.rank = 2;
  o.rank.worldSize = 4;
  o.installSignalHandlers = false;
  o.flushAtExit = false;
  return o;
}

std::unique_ptr<db::Reader> openRank(const std::filesystem::path& dir, int rank) {
  auto r = db::Reader::open(dir / ("rank-" + std::to_string(rank) + ".db"));
  EXPECT_TRUE(r.isOk()) << r.error();
  return r.isOk() ? std::move(r.value()) : nullptr;
}

// Holds the flusher inside a flush (after it drained the buffers) until released: makes overflow deterministic.
class BlockingParticipant : public tp::FlushParticipant {
 public:
  void onFlush(tp::FlushContext&) noexcept override {
    if (!armed_.exchange(false)) return;
    entered_.store(true);
    while (!released_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void arm() { armed_ = true; }
  void waitEntered() {
    while (!entered_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void release() { released_ = true; }

 private:
  std::atomic<bool> armed_{false}, entered_{false}, released_{false};
};

TEST(Recorder, FourThreadsLoseAndDuplicateNothing) {
  tpscope::testing::TempDir dir;
  auto o = options(dir.path());
  o.flushInterval = std::chrono::milliseconds(20);
  ASSERT_TRUE(tp::start(o).isOk());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 150'000;  // > 2 rings per thread: the flusher drains while they record
  std::latch go(kThreads);
  std::vector<std::thread> threads;
  const uint64_t base = tp::rawTicks();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &go, base] {
      tp::setThreadName("worker-" + std::to_string(t));
      go.arrive_and_wait();
      for (int i = 0; i < kPerThread; ++i) {
        // Span i of a thread begins at base + 100·i ticks with layer i % 1000: after sorting a thread's spans by
        // begin time, span k must have layer k % 1000 and a begin of its own (distinct ticks convert to distinct ns).
        const uint64_t t0 = base + 100 * static_cast<uint64_t>(i);
        tp::emitSpan(&kSites[t], t0, t0 + 50, i % 1000);
        if ((i & 1023) == 1023) {
          // Keep below the ring's size so this test measures completeness, not overflow (tested separately).
          const tp::ThreadBuffer* b = tp::detail::t_buffer;
          while (b->head.load() - b->tail.load() > tp::ThreadBuffer::kCapacity / 2)
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  tp::stop();

  const tp::RecorderStats stats = tp::recorderStats();
  EXPECT_EQ(stats.spansWritten, int64_t{kThreads} * kPerThread);
  EXPECT_EQ(stats.spansDropped, 0);

  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto threadRows = reader->threads();
  ASSERT_TRUE(threadRows.isOk());
  std::map<int, std::string> names;
  for (const auto& th : *threadRows) names[th.thread] = th.name;
  std::map<int, std::vector<std::pair<int64_t, int>>> begins;  // thread → (begin, layer)
  std::map<int, std::string> siteOfThread;
  ASSERT_TRUE(reader
                  ->forEachSpan({},
                                [&](const db::SpanRow& s) {
                                  begins[s.thread].emplace_back(s.beginNs, s.layer);
                                  siteOfThread[s.thread] = reader->string(s.name);
                                  return true;
                                })
                  .isOk());
  ASSERT_EQ(begins.size(), size_t{kThreads});
  std::set<std::string> sites;
  for (auto& [thread, b] : begins) {
    EXPECT_EQ(b.size(), size_t{kPerThread}) << "thread " << thread;
    std::sort(b.begin(), b.end());
    int misplaced = 0, duplicates = 0;
    for (size_t k = 0; k < b.size(); ++k) {
      misplaced += b[k].second != static_cast<int>(k % 1000);
      duplicates += k > 0 && b[k].first == b[k - 1].first;
    }
    EXPECT_EQ(misplaced, 0) << "thread " << thread;
    EXPECT_EQ(duplicates, 0) << "thread " << thread;
    sites.insert(siteOfThread[thread]);
    // The thread row carries the name the thread gave itself, matching the site it recorded.
    EXPECT_EQ(names[thread], "worker-" + siteOfThread[thread].substr(7)) << "thread " << thread;
  }
  EXPECT_EQ(sites.size(), size_t{kThreads});
  auto rs = reader->recorderStats();
  ASSERT_TRUE(rs.isOk());
  ASSERT_FALSE(rs->empty());
  EXPECT_EQ(rs->back().spansWritten, int64_t{kThreads} * kPerThread);
  EXPECT_EQ(rs->back().spansDropped, 0);
  EXPECT_GT(rs->back().flushes, 1);
}

TEST(Recorder, SpansCarryKindPhaseStepLayerAndTime) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  tp::setStep(41);
  {
    TPS_SPAN_LAYER("layer.fwd", Compute, Forward, 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  tp::setStep(-1);
  tp::stop();
  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto spans = reader->spans();
  ASSERT_TRUE(spans.isOk());
  ASSERT_EQ(spans->size(), 1u);
  const db::SpanRow& s = spans->front();
  EXPECT_EQ(reader->string(s.name), "layer.fwd");
  EXPECT_EQ(s.kind, db::SpanKind::Compute);
  EXPECT_EQ(s.phase, db::Phase::Forward);
  EXPECT_EQ(s.step, 41);
  EXPECT_EQ(s.layer, 5);
  EXPECT_EQ(s.rank, 2);
  EXPECT_GE(s.durNs, 19'000'000);
  EXPECT_LT(s.durNs, 200'000'000);
  // Times are ns since the file's epoch (the start): the span began within the session.
  auto ranks = reader->ranks();
  ASSERT_TRUE(ranks.isOk());
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_GE(s.beginNs, *ranks->front().startNs);
  EXPECT_LE(s.endNs(), *ranks->front().endNs);
}

// Where each thread is now (meta open_spans): the spans open on it at the flush, outermost first, with their layer and
// begin on the file's clock; none once they closed. A live watcher reads it (analysis/live_stall.h).
TEST(Recorder, OpenSpansArePublishedAtEachFlushAndGoneWhenClosed) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  std::latch opened(1), closeNow(1);
  std::thread worker([&] {
    TPS_SPAN("outer.step", Step, None);
    TPS_SPAN_LAYER("inner.compute", Compute, Forward, 7);
    opened.count_down();
    closeNow.wait();
  });
  opened.wait();
  tp::flushNow();
  {
    auto reader = openRank(dir.path(), 2);
    ASSERT_TRUE(reader);
    const std::string json = reader->metaValue("open_spans").value_or("<none>");
    const auto outer = json.find("\"name\":\"outer.step\",\"kind\":4,\"layer\":-1");
    const auto inner = json.find("\"name\":\"inner.compute\",\"kind\":0,\"layer\":7");
    EXPECT_NE(outer, std::string::npos) << json;
    EXPECT_NE(inner, std::string::npos) << json;
    EXPECT_LT(outer, inner) << "outermost first: " << json;
  }
  closeNow.count_down();
  worker.join();
  tp::flushNow();
  {
    auto reader = openRank(dir.path(), 2);
    ASSERT_TRUE(reader);
    EXPECT_EQ(reader->metaValue("open_spans").value_or("<none>"), "[]");
  }
  tp::stop();
}

// The flusher sleeps until its next flush; a filling ring wakes it (ThreadBuffer::kDrainAt). With a flush a minute
// away, a thread that records three rings' worth in bursts (1024 spans a millisecond) loses nothing: each half ring is
// drained before the other half fills. Without the wake, the ring overflows in ~70 ms.
TEST(Recorder, AFillingRingWakesTheFlusherLongBeforeItsInterval) {
  tpscope::testing::TempDir dir;
  auto o = options(dir.path());
  o.flushInterval = std::chrono::seconds(60);
  ASSERT_TRUE(tp::start(o).isOk());
  constexpr uint64_t kSpans = 3 * tp::ThreadBuffer::kCapacity;
  std::thread([] {
    for (uint64_t i = 0; i < kSpans; ++i) {
      tp::emitSpan(&kSites[0], i * 10, i * 10 + 5);
      if (i % 1024 == 1023) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }).join();
  const tp::RecorderStats before = tp::recorderStats();  // the flushes the filling ring asked for
  tp::stop();
  EXPECT_GE(before.flushes, 3);
  const tp::RecorderStats stats = tp::recorderStats();
  EXPECT_EQ(stats.spansDropped, 0);
  EXPECT_EQ(stats.spansWritten, static_cast<int64_t>(kSpans));
}

// The wake's threshold, exactly: kDrainAt − 1 events leave the flusher asleep (its flush a minute away), the push of
// the kDrainAt-th wakes it.
TEST(Recorder, ThePushThatFillsARingToItsDrainMarkWakesTheFlusher) {
  tpscope::testing::TempDir dir;
  auto o = options(dir.path());
  o.flushInterval = std::chrono::seconds(60);
  ASSERT_TRUE(tp::start(o).isOk());
  std::thread([] {
    const int64_t base = tp::recorderStats().flushes;
    for (uint64_t i = 0; i + 1 < tp::ThreadBuffer::kDrainAt; ++i) tp::emitSpan(&kSites[0], i * 10, i * 10 + 5);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(tp::recorderStats().flushes, base) << "woken below the mark";
    tp::emitSpan(&kSites[0], 0, 5);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (tp::recorderStats().flushes == base && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    EXPECT_GT(tp::recorderStats().flushes, base) << "the push that reached the mark did not wake the flusher";
  }).join();
  tp::stop();
  EXPECT_EQ(tp::recorderStats().spansWritten, static_cast<int64_t>(tp::ThreadBuffer::kDrainAt));
}

// Idle between flushes: the flusher thread wakes about once per flush interval, not every few milliseconds (each
// wake-up preempts a training thread where every core trains). Counted as its voluntary context switches.
TEST(Recorder, TheFlusherWakesOnlyToFlush) {
  tpscope::testing::TempDir dir;
  auto o = options(dir.path());
  o.flushInterval = std::chrono::milliseconds(50);
  ASSERT_TRUE(tp::start(o).isOk());
  tp::emitSpan(&kMain, tp::rawTicks(), tp::rawTicks());
  tp::flushNow();
  std::filesystem::path status;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name == "tpscope-flush") status = task.path() / "status";
  }
  ASSERT_FALSE(status.empty()) << "no thread named tpscope-flush";
  auto switches = [&status] {
    std::ifstream in(status);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(line.find(':') + 1));
    return -1L;
  };
  const long s0 = switches();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const long woke = switches() - s0;
  const double flushes = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 0.050;
  tp::stop();
  ASSERT_GE(s0, 0);
  // ~12 flushes, each a wake and perhaps a lock or a write that blocks; looking every 5 ms would be ~120.
  EXPECT_LE(woke, 3 * flushes + 5) << woke << " wake-ups in " << flushes << " flush intervals";
  EXPECT_GE(woke, flushes / 2) << "the flusher did not flush at its interval";
}

TEST(Recorder, DropsAreCountedWhenARingOverflows) {
  tpscope::testing::TempDir dir;
  auto o = options(dir.path());
  o.recordQueue = 10;
  o.collectiveRing = 4;
  ASSERT_TRUE(tp::start(o).isOk());
  tp::emitSpan(&kMain, tp::rawTicks(), tp::rawTicks());  // this thread's buffer exists before the flusher is held
  tp::flushNow();

  BlockingParticipant blocker;
  tp::addFlushParticipant(&blocker);
  blocker.arm();
  std::thread flusher([] { tp::flushNow(); });
  blocker.waitEntered();  // the flusher has drained and now waits: nothing is drained until release

  constexpr uint64_t kExtra = 500;
  for (uint64_t i = 0; i < tp::ThreadBuffer::kCapacity + kExtra; ++i) tp::emitSpan(&kMain, i * 10, i * 10 + 5);
  for (int i = 0; i < 15; ++i) tp::counter("queue.test", i);  // 10 fit, 5 dropped
  tp::Sink* sink = tp::sink();
  ASSERT_NE(sink, nullptr);
  const int ranks[] = {0, 1};
  for (int i = 1; i <= 6; ++i) {  // a ring of 4: the first 2 are evicted before they reach the disk
    tp::CollectiveDesc d;
    d.group = "tp-0";
    d.groupRanks = ranks;
    d.seq = static_cast<uint64_t>(i);
    d.op = "all_reduce";
    sink->collectiveEnqueued(d, tp::rawTicks());
  }
  blocker.release();
  flusher.join();
  tp::flushNow();
  tp::removeFlushParticipant(&blocker);
  tp::stop();

  const tp::RecorderStats stats = tp::recorderStats();
  EXPECT_EQ(stats.spansWritten, int64_t{1} + static_cast<int64_t>(tp::ThreadBuffer::kCapacity));
  EXPECT_EQ(stats.spansDropped, static_cast<int64_t>(kExtra));
  EXPECT_EQ(stats.recordsDropped, 5 + 2);
  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto rs = reader->recorderStats();
  ASSERT_TRUE(rs.isOk());
  ASSERT_FALSE(rs->empty());
  EXPECT_EQ(rs->back().spansDropped, static_cast<int64_t>(kExtra));
  EXPECT_EQ(rs->back().recordsDropped, 7);
  EXPECT_GT(rs->back().probeOverheadNs, 0);
  auto count = reader->spanCount();
  ASSERT_TRUE(count.isOk());
  EXPECT_EQ(*count, stats.spansWritten);
  auto counters = reader->counters();
  ASSERT_TRUE(counters.isOk());
  EXPECT_EQ(counters->size(), 10u);
  auto colls = reader->collectives();
  ASSERT_TRUE(colls.isOk());
  ASSERT_EQ(colls->size(), 4u);
  EXPECT_EQ(colls->front().seq, 3);
}

// Recording a collective copies its description into the flight recorder's ring, whose entries got their room when
// the session started: the training thread allocates nothing, on the first lap of the ring and after it, for the
// engine's op names and the functional collectives' long ones alike. (Each
// entry's strings used to be allocated on first use and kept for a lap: a rank's heap grew ~5 MB a step at TP = 2.)
TEST(Recorder, RecordingACollectiveAllocatesNothingOnTheTrainingThread) {
  tpscope::testing::TempDir dir;
  auto o = options(dir.path());
  o.collectiveRing = 256;
  ASSERT_TRUE(tp::start(o).isOk());
  tp::emitSpan(&kMain, tp::rawTicks(), tp::rawTicks());  // this thread's buffer exists
  tp::Sink* sink = tp::sink();
  ASSERT_NE(sink, nullptr);
  const int ranks[] = {0, 1};
  const int64_t shape[] = {4, 256, 512};
  tp::CollectiveDesc d =
      allReduce("tp-0", ranks, shape, "layers.3 mlp down_proj RowParallel forward all_reduce (the partial sums)");
  sink->collectiveEnqueued(d, tp::rawTicks());  // the group is new: its ranks are kept once
  const int64_t before = t_allocations;
  for (uint64_t seq = 2; seq <= 3 * 256; ++seq) {  // three laps of the ring
    d.seq = seq;
    d.op = seq % 2 == 0 ? "all_reduce" : "all_gather_into_tensor_coalesced";  // the longest name Python records
    const uint64_t h = sink->collectiveEnqueued(d, tp::rawTicks());
    sink->collectiveState(h, tp::CollectiveState::Started, tp::rawTicks());
    sink->collectiveState(h, tp::CollectiveState::Completed, tp::rawTicks());
    if (seq % 100 == 0) tp::flushNow();
  }
  const int64_t allocated = t_allocations - before;
  tp::stop();
  EXPECT_EQ(allocated, 0) << "heap allocations on the training thread for 767 collectives";
  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto colls = reader->collectives();
  ASSERT_TRUE(colls.isOk());
  ASSERT_FALSE(colls->empty());
  EXPECT_EQ(colls->back().callsite, std::string(d.callsite));
  EXPECT_EQ(colls->back().shape, (std::vector<int64_t>{4, 256, 512}));
}

TEST(Recorder, FlightRecorderWritesEveryStateChange) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  tp::Sink* sink = tp::sink();
  ASSERT_NE(sink, nullptr);
  const int ranks[] = {2, 3};
  const int64_t shape[] = {4, 1024};
  tp::setStep(7);
  tp::CollectiveDesc d = allReduce("tp-1", ranks, shape, "layer 3 attention output RowParallel forward all-reduce");
  d.layer = 3;
  d.phase = tp::Phase::Forward;
  d.seq = 1;
  const uint64_t a = sink->collectiveEnqueued(d, tp::rawTicks());
  sink->collectiveState(a, tp::CollectiveState::Started, tp::rawTicks());
  sink->collectiveState(a, tp::CollectiveState::Completed, tp::rawTicks());
  d.seq = 2;
  const uint64_t b = sink->collectiveEnqueued(d, tp::rawTicks());
  sink->collectiveState(b, tp::CollectiveState::Started, tp::rawTicks());
  tp::flushNow();

  // The hanging one is on disk as "started" while the process still runs.
  {
    auto reader = openRank(dir.path(), 2);
    ASSERT_TRUE(reader);
    auto colls = reader->collectives();
    ASSERT_TRUE(colls.isOk());
    ASSERT_EQ(colls->size(), 2u);
    EXPECT_EQ((*colls)[0].state, db::CollectiveState::Completed);
    EXPECT_TRUE((*colls)[0].endNs.has_value());
    EXPECT_EQ((*colls)[1].state, db::CollectiveState::Started);
    EXPECT_FALSE((*colls)[1].endNs.has_value());
    EXPECT_EQ((*colls)[1].step, 7);
    EXPECT_EQ((*colls)[1].layer, 3);
    EXPECT_EQ((*colls)[1].callsite, d.callsite);
    EXPECT_EQ((*colls)[1].shape, (std::vector<int64_t>{4, 1024}));
    auto groups = reader->groups();
    ASSERT_TRUE(groups.isOk());
    ASSERT_EQ(groups->size(), 1u);
    EXPECT_EQ(groups->front().name, "tp-1");
    EXPECT_EQ(groups->front().ranks, (std::vector<int>{2, 3}));
  }
  sink->collectiveState(b, tp::CollectiveState::TimedOut, tp::rawTicks());
  tp::putGroup(db::GroupInfo{"tp-1", {2, 3}, "gloo"});
  tp::stop();
  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto colls = reader->collectives();
  ASSERT_TRUE(colls.isOk());
  ASSERT_EQ(colls->size(), 2u);  // upserted, not appended
  EXPECT_EQ((*colls)[1].state, db::CollectiveState::TimedOut);
  ASSERT_TRUE((*colls)[1].startNs && (*colls)[1].endNs);
  EXPECT_LE((*colls)[1].enqueueNs, *(*colls)[1].startNs);
  EXPECT_LE(*(*colls)[1].startNs, *(*colls)[1].endNs);
  auto groups = reader->groups();
  ASSERT_TRUE(groups.isOk());
  ASSERT_EQ(groups->size(), 1u);
  EXPECT_EQ(groups->front().backend, "gloo");
  tp::setStep(-1);
}

TEST(Recorder, RecordsMetaRankAndThreadsReachTheFile) {
  tpscope::testing::TempDir dir;
  auto o = options(dir.path());
  o.epochUnixNs = int64_t{1'700'000'000'000'000'000};
  ASSERT_TRUE(tp::start(o).isOk());
  tp::setMeta("config", R"({"layers":4})");
  db::RankInfo info;
  info.tpRank = 1;
  info.tpSize = 2;
  info.dpRank = 0;
  info.dpSize = 2;
  info.device = "cpu:0";
  tp::setRankInfo(info);
  tp::Sink* sink = tp::sink();
  ASSERT_NE(sink, nullptr);
  const tp::GradStat grads[] = {{"layers.0.w", 0, 1.5, 0.25, 0, 0, 100}, {"layers.1.w", 1, 2.5, 0.5, 3, 1, 100}};
  sink->gradStats(3, grads);
  tp::StepStat st;
  st.step = 3;
  st.loss = 2.0;
  st.lr = 1e-3;
  st.tokens = 512;
  st.t0 = tp::rawTicks();
  st.t1 = tp::rawTicks();
  sink->stepStat(st);
  tp::Alert a;
  a.severity = tp::Severity::Error;
  a.kind = "nonfinite_grad";
  a.step = 3;
  a.layer = 1;
  a.param = "layers.1.w";
  a.message = "NaN in layers.1.w";
  a.evidence = R"({"nan":3})";
  sink->alert(a);
  // An alert about an earlier moment (a forward-pass check read back at the end of the step) keeps that time.
  tp::Alert early = a;
  early.kind = "nonfinite_activation";
  early.ticks = st.t0;
  sink->alert(early);
  tp::counter("tokens_per_s", 1234.5);
  tp::stop();

  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto meta = reader->meta();
  ASSERT_TRUE(meta.isOk());
  EXPECT_EQ((*meta)["run_id"], "test-run");
  EXPECT_EQ((*meta)["epoch_unix_ns"], "1700000000000000000");
  EXPECT_EQ((*meta)["source"], "capture");
  EXPECT_EQ((*meta)["config"], R"({"layers":4})");
  EXPECT_FALSE((*meta)["tool"].empty());
  auto ranks = reader->ranks();
  ASSERT_TRUE(ranks.isOk());
  ASSERT_EQ(ranks->size(), 1u);
  const db::RankInfo& r = ranks->front();
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.worldSize, 4);
  EXPECT_EQ(r.tpRank, 1);
  EXPECT_EQ(r.tpSize, 2);
  EXPECT_EQ(r.device, "cpu:0");
  EXPECT_EQ(r.pid, getpid());
  EXPECT_FALSE(r.host.empty());
  EXPECT_EQ(r.exitReason, "ok");
  ASSERT_TRUE(r.startNs && r.endNs);
  EXPECT_GT(*r.startNs, 0);  // the epoch is in 2023, long before now
  auto g = reader->gradStats();
  ASSERT_TRUE(g.isOk());
  ASSERT_EQ(g->size(), 2u);
  EXPECT_EQ((*g)[1].nanCount, 3);
  EXPECT_EQ((*g)[1].param, "layers.1.w");
  auto steps = reader->stepStats();
  ASSERT_TRUE(steps.isOk());
  ASSERT_EQ(steps->size(), 1u);
  EXPECT_EQ(*steps->front().tokens, 512);
  auto alerts = reader->alerts();
  ASSERT_TRUE(alerts.isOk());
  ASSERT_EQ(alerts->size(), 2u);  // in time order: the early one first
  EXPECT_EQ(alerts->front().kind, "nonfinite_activation");
  ASSERT_TRUE(steps->front().beginNs.has_value());
  EXPECT_EQ(alerts->front().tsNs, *steps->front().beginNs);
  EXPECT_EQ(alerts->back().severity, "error");
  EXPECT_EQ(alerts->back().evidence, R"({"nan":3})");
  EXPECT_LE(alerts->front().tsNs, alerts->back().tsNs);
  auto counters = reader->counters();  // by name: the step's wait for a CPU, then the user's counter
  ASSERT_TRUE(counters.isOk());
  ASSERT_EQ(counters->size(), 2u);
  EXPECT_EQ(counters->front().name, db::counter_names::kRunDelay);
  EXPECT_GE(counters->front().value, 0.0);
  EXPECT_EQ(counters->front().tsNs, *steps->front().endNs) << "read at the end of the step";
  EXPECT_EQ(counters->back().name, "tokens_per_s");
  EXPECT_DOUBLE_EQ(counters->back().value, 1234.5);
}

// A step spent waiting behind a busy thread on the same core shows in the run delay counter.
TEST(Recorder, EachStepRecordsTheTrainingThreadsWaitForACpu) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  tp::Sink* sink = tp::sink();
  ASSERT_NE(sink, nullptr);
  // Pin this thread and a spinning one to the same CPU (the first this process may use): this thread then waits for it.
  cpu_set_t before;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof before, &before), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &before)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
  std::atomic<bool> spin{true};
  std::thread hog([&] {
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    while (spin.load(std::memory_order_relaxed)) {
    }
  });
  for (int step = 0; step < 3; ++step) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(60);
    while (std::chrono::steady_clock::now() < until) {
    }
    tp::StepStat st;
    st.step = step;
    st.t0 = st.t1 = tp::rawTicks();
    sink->stepStat(st);
  }
  spin = false;
  hog.join();
  pthread_setaffinity_np(pthread_self(), sizeof before, &before);
  tp::stop();
  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto counters = reader->counters();
  ASSERT_TRUE(counters.isOk());
  ASSERT_EQ(counters->size(), 3u);
  for (size_t i = 1; i < counters->size(); ++i) {
    EXPECT_EQ((*counters)[i].name, db::counter_names::kRunDelay);
    // 60 ms of work sharing one CPU with a spinning thread: several ms of it waiting (CFS shares it about evenly).
    EXPECT_GT((*counters)[i].value - (*counters)[i - 1].value, 5e6) << "step " << i;
  }
}

// The run delay reads each thread's schedstat file through a descriptor kept open between steps: a thread that exits
// must give its descriptor back, and what it had waited must stay counted (the total never decreases).
TEST(Recorder, RunDelayKeepsNoDescriptorOfAnExitedThreadAndNeverDecreases) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  tp::Sink* sink = tp::sink();
  ASSERT_NE(sink, nullptr);
  auto openDescriptors = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{});
  };
  auto step = [&](int n) {
    tp::StepStat st;
    st.step = n;
    st.t0 = st.t1 = tp::rawTicks();
    sink->stepStat(st);
  };
  step(0);
  const auto before = openDescriptors();
  constexpr int kSteps = 40;
  for (int n = 1; n <= kSteps; ++n) {
    std::latch read(1), done(1);
    std::thread worker([&] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
      while (std::chrono::steady_clock::now() < until) {
      }
      read.count_down();
      done.wait();
    });
    read.wait();
    step(n);  // the worker is alive: its file is opened and read
    done.count_down();
    worker.join();
  }
  step(kSteps + 1);  // the worker of the last step is gone: its descriptor is closed here
  EXPECT_LE(openDescriptors(), before + 4) << "a descriptor per exited thread is leaked";  // 4: SQLite's own files
  tp::stop();
  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto counters = reader->counters();
  ASSERT_TRUE(counters.isOk());
  ASSERT_EQ(counters->size(), static_cast<size_t>(kSteps + 2));
  for (size_t i = 1; i < counters->size(); ++i)
    EXPECT_GE((*counters)[i].value, (*counters)[i - 1].value) << "step " << i;
}

TEST(Recorder, AnExitedThreadsSpansAreKeptAndItsBufferFreed) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  for (int round = 0; round < 3; ++round) {
    std::thread([] {
      for (int i = 0; i < 1000; ++i) tp::emitSpan(&kSites[0], tp::rawTicks(), tp::rawTicks());
    }).join();
  }
  tp::stop();
  EXPECT_EQ(tp::recorderStats().spansWritten, 3000);
  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto count = reader->spanCount();
  ASSERT_TRUE(count.isOk());
  EXPECT_EQ(*count, 3000);
}

TEST(Recorder, StopThenStartWritesASecondFileAndKeepsThreadIds) {
  tpscope::testing::TempDir a, b;
  ASSERT_TRUE(tp::start(options(a.path())).isOk());
  tp::emitSpan(&kMain, tp::rawTicks(), tp::rawTicks());
  EXPECT_FALSE(tp::start(options(b.path())).isOk());  // already recording
  tp::stop();
  tp::emitSpan(&kMain, tp::rawTicks(), tp::rawTicks());  // not recording: nothing
  ASSERT_TRUE(tp::start(options(b.path())).isOk());
  tp::emitSpan(&kMain, tp::rawTicks(), tp::rawTicks());
  tp::emitSpan(&kMain, tp::rawTicks(), tp::rawTicks());
  tp::stop();
  auto ra = openRank(a.path(), 2);
  auto rb = openRank(b.path(), 2);
  ASSERT_TRUE(ra && rb);
  EXPECT_EQ(*ra->spanCount(), 1);
  EXPECT_EQ(*rb->spanCount(), 2);
  auto sa = ra->spans();
  auto sb = rb->spans();
  ASSERT_TRUE(sa.isOk() && sb.isOk());
  EXPECT_EQ(sa->front().thread, sb->front().thread);
  auto tb = rb->threads();
  ASSERT_TRUE(tb.isOk());
  EXPECT_FALSE(tb->empty());
}

TEST(Recorder, CompiledOutMacrosRecordNothing) {
  tpscope::testing::TempDir dir;
  ASSERT_TRUE(tp::start(options(dir.path())).isOk());
  const int before = tp::currentStep();
  EXPECT_EQ(compiledOutWork(1000), 1000);
  EXPECT_EQ(tp::currentStep(), before);  // TPS_STEP compiled out too
  { TPS_SPAN("compiled.in", Compute, Forward); }  // the control: this TU has probes on
  tp::stop();
  auto reader = openRank(dir.path(), 2);
  ASSERT_TRUE(reader);
  auto spans = reader->spans();
  ASSERT_TRUE(spans.isOk());
  ASSERT_EQ(spans->size(), 1u);
  EXPECT_EQ(reader->string(spans->front().name), "compiled.in");
  auto counters = reader->counters();
  ASSERT_TRUE(counters.isOk());
  EXPECT_TRUE(counters->empty());
}

TEST(Recorder, NotStartedEverythingIsANoOp) {
  EXPECT_FALSE(tp::started());
  EXPECT_FALSE(tp::recording());
  EXPECT_EQ(tp::sink(), nullptr);
  { TPS_SPAN("nobody.listens", Compute, Forward); }
  tp::counter("x", 1);
  tp::flushNow();
  tp::stop();
  SUCCEED();
}

TEST(Recorder, StartFailsCleanlyOnAMissingFolder) {
  auto o = options("/nonexistent/tpscope/folder");
  const auto s = tp::start(o);
  EXPECT_FALSE(s.isOk());
  EXPECT_FALSE(tp::recording());
  EXPECT_FALSE(tp::started());
}

}  // namespace
