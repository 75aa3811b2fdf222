// diagnose() and the report on a generated run of 8 ranks × ~1 M spans each (plus ~90 k collective records per
// rank and per-step gradient stats). Target: ≤ 3 s each (issue 5).
//
// The run file is generated on first use by the tests' TP×DP simulator (TP 4 × DP 2, 4 layers, 10 nested compute
// spans per compute phase) and cached at $TPSCOPE_BENCH_RUN (default: <tmp>/tpscope-bench/analysis-8x1M.db).
// It is a merged file (with the query indexes); BM_*_Unindexed use a copy without them, like a raw rank file.
// Times: wall clock (real) and CPU of the whole process (all worker threads).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "test_runs.h"
#include "tpscope/analysis/breakdown.h"
#include "tpscope/analysis/collectives.h"
#include "tpscope/analysis/desync.h"
#include "tpscope/analysis/diagnose.h"
#include "tpscope/analysis/nonfinite.h"
#include "tpscope/analysis/report.h"

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

void BM_Diagnose(benchmark::State& state, bool indexed) {
  const auto p = runFile(indexed);
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

void BM_Report(benchmark::State& state, bool indexed) {
  const auto p = runFile(indexed);
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

BENCHMARK_CAPTURE(BM_Diagnose, Indexed, true)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK_CAPTURE(BM_Report, Indexed, true)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_Breakdown)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_Collectives)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK(BM_Desync)->Unit(benchmark::kMillisecond)->Iterations(3)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK_CAPTURE(BM_Diagnose, Unindexed, false)->Unit(benchmark::kMillisecond)->Iterations(1)->MeasureProcessCPUTime()->UseRealTime();
BENCHMARK_CAPTURE(BM_Report, Unindexed, false)->Unit(benchmark::kMillisecond)->Iterations(1)->MeasureProcessCPUTime()->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
