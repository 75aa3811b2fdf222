// A large Kineto trace for the benchmarks, built from a real trace's events (the HTA trace in ../shared when present,
// else the small fixture) by repeating them shifted in time, with correlation, External and flow ids kept unique.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace tpscope::formats::bench {

struct LargeTrace {
  std::filesystem::path json;     // plain JSON, object form
  std::filesystem::path gzip;     // the same, gzip level 1
  std::filesystem::path run;      // json imported (for the export benchmark)
  std::vector<std::filesystem::path> ranks;  // 4 ranks' traces, a quarter of the size each (parallel import)
  int64_t jsonBytes = 0;
  int64_t events = 0;
};

// Built once per process under the temp dir (at least minBytes of JSON) and removed at exit.
const LargeTrace& largeTrace(int64_t minBytes = 128 << 20);

// The shared HTA traces, if present ("" otherwise).
std::filesystem::path sharedTrace(const char* name);

}  // namespace tpscope::formats::bench
