// Fuzz target: a Kineto (PyTorch profiler) trace, plain or gzip, imported into a run file.
// Contract under test: the importer never crashes or hangs on hostile JSON; it either writes a complete run file or
// returns an error and leaves no output behind.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "tpscope/formats/kineto_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  static const fs::path dir = fs::temp_directory_path() / ("tpscope-fuzz-kineto-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path in = dir / "rank-0.json";
  const fs::path out = dir / "run.db";
  if (FILE* f = std::fopen(in.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    return 0;
  }
  const fs::path inputs[] = {in};
  auto stats = tpscope::formats::importKineto(inputs, out);
  if (!stats.isOk() && fs::exists(out)) std::abort();  // a failed import must leave no output
  fs::remove(out, ec);
  fs::remove(in, ec);
  return 0;
}
