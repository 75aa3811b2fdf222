// Kineto import throughput, in MB/s of (uncompressed) JSON: the whole import (read, inflate, parse, model, SQLite
// write, indexes), and the parse alone to show where the time goes. Target (issue 5): >= 100 MB/s.
// bytes_per_second is wall-clock (real time); cpu_MB/s divides by the process's CPU time.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <ctime>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kineto_parse.h"
#include "large_trace.h"
#include "tpscope/formats/kineto_import.h"

namespace tpscope::formats::bench {
namespace {

namespace fs = std::filesystem;

void runImport(benchmark::State& state, std::vector<fs::path> inputs) {
  if (inputs.empty() || inputs.front().empty()) {
    state.SkipWithError("input not found (../shared/testdata/kineto absent?)");
    return;
  }
  const fs::path out = fs::temp_directory_path() / ("tpscope-formats-bench-out-" + std::to_string(::getpid()) + ".db");
  int64_t bytes = 0, spans = 0;
  const std::clock_t cpuStart = std::clock();  // CPU time of the whole process, all threads
  for (auto _ : state) {
    auto stats = importKineto(inputs, out);
    if (!stats) {
      state.SkipWithError(stats.error().c_str());
      return;
    }
    bytes += stats->inputBytes;
    spans = stats->spans;
  }
  state.SetBytesProcessed(bytes);
  state.counters["spans"] = static_cast<double>(spans);
  // MB of JSON per second of process CPU time: what one uncontended core would do per file, independent of the
  // other work on a shared machine (the wall-clock rate is bytes_per_second).
  const double cpuSeconds = static_cast<double>(std::clock() - cpuStart) / CLOCKS_PER_SEC;
  if (cpuSeconds > 0) state.counters["cpu_MB/s"] = bytes / 1e6 / cpuSeconds;
  std::error_code ec;
  fs::remove(out, ec);
}

void BM_KinetoImportLarge(benchmark::State& state) { runImport(state, {largeTrace().json}); }
BENCHMARK(BM_KinetoImportLarge)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

void BM_KinetoImportLargeGzip(benchmark::State& state) { runImport(state, {largeTrace().gzip}); }

// Four ranks of a quarter of the size each: the files are loaded in parallel.
void BM_KinetoImportFourRanks(benchmark::State& state) { runImport(state, largeTrace().ranks); }
BENCHMARK(BM_KinetoImportFourRanks)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_KinetoImportLargeGzip)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

void BM_KinetoParseLarge(benchmark::State& state) {
  const fs::path input = largeTrace().json;
  int64_t bytes = 0;
  for (auto _ : state) {
    auto file = kineto::parseKinetoFile(input);
    if (!file) {
      state.SkipWithError(file.error().c_str());
      return;
    }
    bytes += static_cast<int64_t>(file->buffer.size);
    benchmark::DoNotOptimize(file->spans.data());
  }
  state.SetBytesProcessed(bytes);
}
BENCHMARK(BM_KinetoParseLarge)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

// For comparison: the same file through nlohmann::json's DOM parser (what a straightforward importer would use).
void BM_NlohmannParseLarge(benchmark::State& state) {
  const fs::path input = largeTrace().json;
  std::ifstream in(input, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int64_t bytes = 0;
  for (auto _ : state) {
    nlohmann::json doc = nlohmann::json::parse(text);
    benchmark::DoNotOptimize(doc["traceEvents"].size());
    bytes += static_cast<int64_t>(text.size());
  }
  state.SetBytesProcessed(bytes);
}
BENCHMARK(BM_NlohmannParseLarge)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();

void BM_KinetoImportShared(benchmark::State& state, const char* name) { runImport(state, {sharedTrace(name)}); }
BENCHMARK_CAPTURE(BM_KinetoImportShared, nccl_parser_config, "nccl_parser_config_nccl_data.json.gz")
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_KinetoImportShared, negative_queue_rank0, "negative_queue_length_values_check_rank0.json.gz")
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_KinetoImportShared, trace_filter_sampled_rank0, "trace_filter_sampled_rank-0.json.gz")
    ->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace tpscope::formats::bench
