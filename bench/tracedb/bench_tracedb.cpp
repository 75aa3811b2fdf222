// Trace-format ingest: spans/s through Writer::addSpans and bytes on disk per span.
// Spans look like a recorder's: one rank, a few threads, ~40 distinct names, increasing timestamps of a long run.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "tpscope/tracedb/writer.h"

namespace {

using namespace tpscope::tracedb;

std::vector<SpanRow> makeSpans(size_t n, const std::vector<uint32_t>& names) {
  std::mt19937 rng(7);
  std::vector<SpanRow> spans(n);
  int64_t t = 3'600'000'000'000;  // an hour into the run: timestamps need 6 bytes, as they will in practice
  for (size_t i = 0; i < n; ++i) {
    t += 200 + rng() % 2000;
    spans[i] = SpanRow{0, static_cast<int>(rng() % 4), SpanKind::Compute, names[rng() % names.size()], t,
                       static_cast<int64_t>(100 + rng() % 100000), static_cast<int>(i / 20000),
                       static_cast<int>(rng() % 24), Phase::Forward, {}};
  }
  return spans;
}

void BM_WriterIngest(benchmark::State& state) {
  const size_t perFlush = static_cast<size_t>(state.range(0));
  const auto path = std::filesystem::temp_directory_path() / ("tpscope-bench-" + std::to_string(::getpid()) + ".db");
  int64_t total = 0;
  double bytesPerSpan = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto w = Writer::create(path, CreateOptions{true, "bench", 0, "bench"});
    if (!w) {
      state.SkipWithError(w.error().c_str());
      return;
    }
    std::vector<uint32_t> names;
    for (int i = 0; i < 40; ++i) names.push_back(*(*w)->intern("layer span name " + std::to_string(i)));
    const auto spans = makeSpans(1'000'000, names);
    state.ResumeTiming();
    for (size_t i = 0; i < spans.size(); i += perFlush) {
      (void)(*w)->begin();
      (void)(*w)->addSpans(std::span<const SpanRow>(spans).subspan(i, std::min(perFlush, spans.size() - i)));
      (void)(*w)->commit();
    }
    (void)(*w)->close();
    state.PauseTiming();
    total += static_cast<int64_t>(spans.size());
    bytesPerSpan = static_cast<double>(std::filesystem::file_size(path)) / static_cast<double>(spans.size());
    std::filesystem::remove(path);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(total);
  state.counters["bytes_per_span"] = bytesPerSpan;
}
// Spans per transaction: 250 ms of a busy rank's spans at 2 M/s is 500k; 64k is a flush of a quieter one.
BENCHMARK(BM_WriterIngest)->Arg(4096)->Arg(65536)->Arg(500000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
