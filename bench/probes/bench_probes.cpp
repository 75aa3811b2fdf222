// Probe benchmarks.
//   BM_Span/recording       one TPS_SPAN while a recorder runs (two rawTicks + a push into the thread's ring)
//   BM_Span/recording_nvtx  the same after installNvtxMirror() as tpscope-train calls it on CUDA, with no NVTX tool
//                           attached: the mirror then installs nothing (counter mirrored = 0), when built with CUDA
//   BM_Span/no_open_stack   the span as it was before the open-span stack (ThreadBuffer::open, which a live watcher
//                           reads to tell a rank stuck in compute): the same hooks, clock reads and push, no stack.
//                           Its difference to BM_Span/recording, in one run, is the stack's cost
//   BM_Span/off             compiled in, not recording (one relaxed load)
//   BM_Span/compiled_out    TPSCOPE_PROBES_ENABLED=0 (nothing)
//   BM_Ingest/threads:N     end to end: N threads record spans as fast as the recorder drains them (they wait when
//                           their ring is 3/4 full, so nothing is dropped), through the flusher into SQLite, until
//                           stop() has committed and closed the file. Reports spans/s, bytes on disk per span, and
//                           the flusher thread's CPU ns per span (its capacity on one free core).
// Each span function is noinline so the three variants pay the same call.
// The compiled-in variants measure the macros through the probe macros whatever TPSCOPE_PROBES says for the build (the
// compiled-out case has its own TU), so the macros are on in this file.
#undef TPSCOPE_PROBES_ENABLED
#define TPSCOPE_PROBES_ENABLED 1
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <thread>

#include "tpscope/probes/probes.h"
#include "tpscope/probes/runtime.h"
#ifdef TPSCOPE_HAVE_NVTX
#include "tpscope/probes/nvtx.h"
#endif

namespace tp = tpscope::probes;

void spanCompiledOut(int* work);

namespace {

__attribute__((noinline)) void spanCompiledIn(int* work) {
  TPS_SPAN("bench.span", Compute, Forward);
  ++*work;
}

// SpanScope without the open-span stack (its body as before the stack was added), for the in-run comparison.
constexpr tp::Site kNoStackSite{"bench.span", "", __FILE__, __LINE__, tp::SpanKind::Compute, tp::Phase::Forward};
__attribute__((noinline)) void spanWithoutOpenStack(int* work) {
  const bool active = tp::recording();
  uint64_t t0 = 0;
  if (active) [[unlikely]] {
    if (auto push = tp::detail::g_rangePush.load(std::memory_order_relaxed)) push(&kNoStackSite, -1);
    t0 = tp::rawTicks();
  }
  ++*work;
  if (active) [[unlikely]] {
    tp::detail::emitSpan(&kNoStackSite, t0, tp::rawTicks(), -1);
    if (auto pop = tp::detail::g_rangePop.load(std::memory_order_relaxed)) pop();
  }
}

std::filesystem::path benchDir() {
  auto dir = std::filesystem::temp_directory_path() / ("tpscope-bench-probes-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

tp::RuntimeOptions benchOptions(const std::filesystem::path& dir) {
  tp::RuntimeOptions o;
  o.outDir = dir;
  o.runId = "bench";
  o.installSignalHandlers = false;
  o.flushAtExit = false;
  return o;
}

// Waits (outside the timed region) until this thread's ring is drained below a quarter.
void waitForDrain() {
  const tp::ThreadBuffer* b = tp::detail::t_buffer;
  if (b == nullptr) return;
  while (b->head.load() - b->tail.load() > tp::ThreadBuffer::kCapacity / 4) std::this_thread::yield();
}

void BM_SpanRecording(benchmark::State& state) {
  const bool nvtx = state.range(0) == 1;
#ifdef TPSCOPE_HAVE_NVTX
  if (nvtx) state.counters["mirrored"] = tp::installNvtxMirror() ? 1 : 0;
#endif
  const auto dir = benchDir();
  if (auto s = tp::start(benchOptions(dir)); !s) {
    state.SkipWithError(s.message().c_str());
    return;
  }
  int work = 0;
  int64_t n = 0;
  void (*span)(int*) = state.range(0) == 2 ? &spanWithoutOpenStack : &spanCompiledIn;
  for (auto _ : state) {
    span(&work);
    if ((++n & 0x7fff) == 0) {  // every 32 Ki spans: let the flusher catch up, untimed (no drops in the figure)
      state.PauseTiming();
      waitForDrain();
      state.ResumeTiming();
    }
  }
  benchmark::DoNotOptimize(work);
  tp::stop();
#ifdef TPSCOPE_HAVE_NVTX
  if (nvtx) tp::uninstallNvtxMirror();
#endif
  const tp::RecorderStats s = tp::recorderStats();
  state.counters["dropped"] = static_cast<double>(s.spansDropped);
  state.counters["calibrated_cost_ns"] = static_cast<double>(s.perSpanCostPs) / 1000.0;
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SpanRecording)->Arg(0)->Name("BM_Span/recording");
BENCHMARK(BM_SpanRecording)->Arg(2)->Name("BM_Span/no_open_stack");
#ifdef TPSCOPE_HAVE_NVTX
// The same with every span mirrored as an NVTX range (no NVTX tool attached: NVTX's no-op stubs).
BENCHMARK(BM_SpanRecording)->Arg(1)->Name("BM_Span/recording_nvtx");
#endif

void BM_SpanOff(benchmark::State& state) {
  int work = 0;
  for (auto _ : state) spanCompiledIn(&work);
  benchmark::DoNotOptimize(work);
}
BENCHMARK(BM_SpanOff)->Name("BM_Span/off");

void BM_SpanCompiledOut(benchmark::State& state) {
  int work = 0;
  for (auto _ : state) spanCompiledOut(&work);
  benchmark::DoNotOptimize(work);
}
BENCHMARK(BM_SpanCompiledOut)->Name("BM_Span/compiled_out");

// 48 span sites, as a transformer's layers and phases would have.
template <size_t... I>
constexpr std::array<tp::Site, sizeof...(I)> makeSites(std::index_sequence<I...>) {
  return {tp::Site{"ingest.site", "", __FILE__, static_cast<uint32_t>(I), static_cast<tp::SpanKind>(I % 6),
                   static_cast<tp::Phase>(I % 4)}...};
}
constexpr auto kSites = makeSites(std::make_index_sequence<48>());

void BM_Ingest(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  constexpr int64_t kSpansPerThread = 2'000'000;
  const auto dir = benchDir();
  double bytesPerSpan = 0, seconds = 0, flusherCpuNsPerSpan = 0;
  int64_t written = 0, dropped = 0;
  for (auto _ : state) {
    if (auto s = tp::start(benchOptions(dir)); !s) {
      state.SkipWithError(s.message().c_str());
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([] {
        for (int64_t i = 0; i < kSpansPerThread; ++i) {
          if ((i & 1023) == 0) {
            tp::setStep(static_cast<int>(i / 20000));
            const tp::ThreadBuffer* b = tp::detail::t_buffer;
            while (b != nullptr && b->head.load() - b->tail.load() > tp::ThreadBuffer::kCapacity * 3 / 4)
              std::this_thread::sleep_for(std::chrono::microseconds(50));
          }
          tp::SpanScope span(&kSites[static_cast<size_t>(i) % kSites.size()], static_cast<int>(i % 24));
        }
      });
    }
    for (auto& w : workers) w.join();
    tp::stop();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const tp::RecorderStats s = tp::recorderStats();
    written = s.spansWritten;
    dropped = s.spansDropped;
    flusherCpuNsPerSpan = static_cast<double>(s.flushCpuNsTotal) / static_cast<double>(written);
    bytesPerSpan = static_cast<double>(std::filesystem::file_size(tp::outputPath())) / static_cast<double>(written);
    state.SetIterationTime(seconds);
  }
  state.SetItemsProcessed(written * static_cast<int64_t>(state.iterations()));
  state.counters["spans_per_s"] = static_cast<double>(written) / seconds;
  state.counters["bytes_per_span"] = bytesPerSpan;
  state.counters["dropped"] = static_cast<double>(dropped);
  // The flusher's own CPU per span, and the rate one core running only the flusher sustains: the figure that does
  // not depend on what else the machine is doing.
  state.counters["flusher_cpu_ns_per_span"] = flusherCpuNsPerSpan;
  state.counters["flusher_capacity_per_s"] = flusherCpuNsPerSpan > 0 ? 1e9 / flusherCpuNsPerSpan : 0;
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_Ingest)->Arg(1)->Arg(4)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(2)->Name("BM_Ingest/threads");

}  // namespace

BENCHMARK_MAIN();
