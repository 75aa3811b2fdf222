// Fuzz target: an arbitrary file opened as a trace and read through every typed query.
// Contract under test: Reader never crashes, hangs or leaks on a damaged or hostile file; it returns errors.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "tpscope/tracedb/reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tpscope::tracedb;
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("tpscope-fuzz-reader-" + std::to_string(::getpid()) + ".db");
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    return 0;
  }
  if (auto reader = Reader::open(path)) {
    Reader& r = **reader;
    (void)r.meta();
    (void)r.ranks();
    (void)r.threads();
    (void)r.groups();
    int64_t n = 0;
    (void)r.forEachSpan({}, [&](const SpanRow& s) {
      (void)r.string(s.name);
      return ++n < 100000;
    });
    (void)r.spanCount();
    (void)r.timeRange();
    (void)r.collectives();
    (void)r.gradStats();
    (void)r.stepStats();
    (void)r.alerts();
    (void)r.counters();
    (void)r.recorderStats();
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return 0;
}
