// Chrome export throughput: spans/s and MB/s of JSON written, for the large trace imported.
#include <benchmark/benchmark.h>

#include <filesystem>

#include "large_trace.h"
#include "tpscope/formats/chrome_export.h"

namespace tpscope::formats::bench {
namespace {

namespace fs = std::filesystem;

void BM_ChromeExportLarge(benchmark::State& state) {
  const fs::path run = largeTrace().run;
  const fs::path out = run.parent_path() / "large.chrome.json";
  int64_t bytes = 0, spans = 0;
  for (auto _ : state) {
    auto stats = exportChrome(run, out);
    if (!stats) {
      state.SkipWithError(stats.error().c_str());
      return;
    }
    bytes += stats->bytesWritten;
    spans += stats->spans;
  }
  state.SetBytesProcessed(bytes);
  state.SetItemsProcessed(spans);
}
BENCHMARK(BM_ChromeExportLarge)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace
}  // namespace tpscope::formats::bench
