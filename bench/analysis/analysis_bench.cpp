// diagnose() and the report on a generated run of 8 ranks × ~1 M spans each (plus ~90 k collective records per
// rank and per-step gradient stats). Targets: ≤ 3 s each (issue 5); diagnose ≤ 1.5 s wall on a file with its
// summaries, as merge and capture write it (issue 17: BM_*/Summarized; the summaries' extra bytes ≤ 10 % of the
// span table). After the benchmarks it prints one line a script can read:
//   diagnose_ms=… report_ms=… summary_write_ms=… summary_bytes_per_span=… span_bytes_per_span=…
// (medians of 3, wall clock, on the summarised file).
//
// The run file is generated on first use by the tests' TP×DP simulator (TP 4 × DP 2, 4 layers, 10 nested compute
// spans per compute phase) and cached at $TPSCOPE_BENCH_RUN (default: <tmp>/tpscope-bench/analysis-8x1M.db).
// It is a merged file (with the query indexes); BM_*_Unindexed use a copy without them, like a raw rank file.
// Times: wall clock (real) and CPU of the whole process (all worker threads).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>
#include <cstdlib>
#include <filesystem>

#include "test_runs.h"
#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/nonfinite.h"
#include "tpscope/analysis/report.h"
#include "tpscope/analysis/summary.h"

namespace {

namespace fs = std::filesystem;
using namespace tpscope;

testing::RunSpec benchSpec(bool indexed) {
  testing::RunSpec s;
  s.tp = 4;
  s.dp = 2;
  s.layers = 4;
  s.extraSpansPerCompute = 10;
  s.steps = static_cast<int>(1'000'000 / testing::spansPerRankStep(s)) + 1;
  s.indexed = indexed;
  s.stragglerRank = 5;  // something to find
  s.stragglerDelayNs = 300'000;
  return s;
}

fs::path runFile(bool indexed);

// The indexed run with its summaries written (what merge and capture produce), made once from runFile(true).
fs::path summarizedFile() {
  const fs::path base = runFile(true);
  const fs::path p(base.string() + ".summarized.db");
  if (!fs::exists(p)) {
    const fs::path tmp(p.string() + ".tmp");
    fs::copy_file(base, tmp, fs::copy_options::overwrite_existing);
    if (auto s = analysis::writeRunSummary(tmp); !s) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      std::exit(1);
    }
    fs::rename(tmp, p);
  }
  return p;
}

fs::path runFile(bool indexed) {
  fs::path base;
  if (const char* env = std::getenv("TPSCOPE_BENCH_RUN")) base = env;
  else base = fs::temp_directory_path() / "tpscope-bench" / "analysis-8x1M.db";
  fs::path p = indexed ? base : fs::path(base.string() + ".unindexed.db");
  if (!fs::exists(p)) {
    fs::create_directories(p.parent_path());
    const auto spec = benchSpec(indexed);
    std::fprintf(stderr, "generating %s: 8 ranks × %lld spans …\n", p.c_str(),
                 static_cast<long long>(spec.steps * testing::spansPerRankStep(spec)));
    const auto tmp = fs::path(p.string() + ".tmp");
    if (auto s = testing::writeRun(tmp, spec); !s) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      std::exit(1);
    }
    fs::rename(tmp, p);
  }
  return p;
}

std::unique_ptr<tracedb::Reader> open(const fs::path& p) {
  auto r = tracedb::Reader::open(p);
  if (!r) {
    std::fprintf(stderr, "%s\n", r.error().c_str());
    std::exit(1);
  }
  return std::move(*r);
}

void setCounters(benchmark::State& state, const fs::path& p) {
  auto r = open(p);
  state.counters["spans"] = static_cast<double>(*r->spanCount());
}

fs::path fileFor(int which) { return which == 2 ? summarizedFile() : runFile(which == 1); }

// which: 0 unindexed (a raw rank file), 1 indexed (merged without summaries: an older tpscope's file), 2 summarised.
void BM_Diagnose(benchmark::State& state, int which) {
  const auto p = fileFor(which);
  size_t findings = 0;
  for (auto _ : state) {
    auto r = open(p);
    auto result = analysis::diagnose(*r);
    if (!result.errors.empty()) state.SkipWithError(result.errors.front().c_str());
    findings = result.findings.size();
  }
  state.counters["findings"] = static_cast<double>(findings);
  setCounters(state, p);
}

void BM_Report(benchmark::State& state, int which) {
  const auto p = fileFor(which);
  for (auto _ : state) {
    auto r = open(p);
    auto report = analysis::buildReport(*r);
    if (!report) state.SkipWithError(report.error().c_str());
    benchmark::DoNotOptimize(report);
  }
  setCounters(state, p);
}

void BM_Breakdown(benchmark::State& state) {
  const auto p = runFile(true);
  for (auto _ : state) {
    auto r = open(p);
    auto b = analysis::computeBreakdown(*r);
    benchmark::DoNotOptimize(b);
  }
}

void BM_Collectives(benchmark::State& state) {
  const auto p = runFile(true);
  for (auto _ : state) {
    auto r = open(p);
    auto info = analysis::loadRunInfo(*r);
    auto c = analysis::analyzeCollectives(*r, *info);
    benchmark::DoNotOptimize(c);
  }
}

void BM_Desync(benchmark::State& state) {
  const auto p = runFile(true);
  for (auto _ : state) {
    auto r = open(p);
    auto info = analysis::loadRunInfo(*r);
    auto d = analysis::analyzeDesync(*r, *info);
    benchmark::DoNotOptimize(d);
  }
}

BENCHMARK_CAPTURE(BM_Diagnose, Summarized, 2)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK_CAPTURE(BM_Report, Summarized, 2)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK_CAPTURE(BM_Diagnose, Indexed, 1)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK_CAPTURE(BM_Report, Indexed, 1)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_Breakdown)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_Collectives)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_Desync)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK_CAPTURE(BM_Diagnose, Unindexed, 0)->Unit(benchmark::kMillisecond)->Iterations(1)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK_CAPTURE(BM_Report, Unindexed, 0)->Unit(benchmark::kMillisecond)->Iterations(1)->MeasureProcessCPUTime()->UseRealTime();

double medianMs(int n, const std::function<void()>& fn) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The one line of issue 17, measured on the summarised file; the summaries' size from the file sizes.
void printSummaryLine() {
  const fs::path base = runFile(true);
  const fs::path p = summarizedFile();
  const double diagnoseMs = medianMs(3, [&] { benchmark::DoNotOptimize(analysis::diagnose(*open(p))); });
  const double reportMs = medianMs(3, [&] { benchmark::DoNotOptimize(analysis::buildReport(*open(p))); });
  const fs::path scratch(base.string() + ".scratch.db");
  const double writeMs = medianMs(1, [&] {
    fs::copy_file(base, scratch, fs::copy_options::overwrite_existing);
    if (auto s = analysis::writeRunSummary(scratch); !s) std::fprintf(stderr, "%s\n", s.message().c_str());
  });
  const double spans = static_cast<double>(*open(base)->spanCount());
  const double extra = static_cast<double>(fs::file_size(scratch)) - static_cast<double>(fs::file_size(base));
  fs::remove(scratch);
  // The whole file per span is an upper bound of the span table's bytes per span.
  std::printf("diagnose_ms=%.0f report_ms=%.0f summary_write_ms=%.0f summary_bytes_per_span=%.3f "
              "file_bytes_per_span=%.1f\n",
              diagnoseMs, reportMs, writeMs, extra / spans, static_cast<double>(fs::file_size(base)) / spans);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  printSummaryLine();
  return 0;
}
